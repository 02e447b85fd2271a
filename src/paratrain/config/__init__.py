"""The typed inputs of every command.

One pydantic model per command. Each field is a flag of its command: its name, type, default and
description are the flag's, so the model is the single place a flag is declared. The CLI is
generated from the models (`add_config_flags`, command_line.py), config files (YAML, TOML, JSON) use the same
keys, and a model with a `train` field takes every train flag too, less those it sets itself
(`train_flags_left_out`). A field that is not a plain `--name VALUE` says how it appears with
`json_schema_extra=cli(...)`. Validation failures become one-line UsageErrors naming the flag.

The train config is composed of sections, each a model in its own module: workload.py (what to
train), parallelism/ (one module per parallelism, each with its options and checks), optimisation.py,
compute.py and run.py; train.py composes them. commands.py holds every other command's model,
command_line.py the generator of every command's argparse flags, and flags.py how a field declares
its flag, the config-file reader and the one-line validation errors.
"""

from paratrain.config.commands import (
    ACROSS_NODES,
    BATCH_COMMAND_OWNED,
    PLAN_STRATEGIES,
    SCRIPT_STUDY_FLAGS,
    CacheConfig,
    CommbenchConfig,
    CompareConfig,
    DoctorConfig,
    DownloadConfig,
    FindBatchConfig,
    LaunchConfig,
    LRFindConfig,
    NoiseScaleConfig,
    PlanConfig,
    PlanPrecision,
    RecommendConfig,
    ReportConfig,
    ScaleConfig,
    SlurmConfig,
    SweepConfig,
    WorkloadsConfig,
)
from paratrain.config.compute import Precision
from paratrain.config.flags import (
    CommandText,
    cli,
    cli_options,
    comma_separated,
    flag,
    load_config_file,
    parse_size,
    validate,
)
from paratrain.config.optimisation import LRScaling, Optimizer, Schedule
from paratrain.config.parallelism.layout import (
    LAYOUT_FIELDS,
    SHARDED_CHECKPOINTS,
    STAGED_LAYOUT_FIELDS,
    STAGED_STRATEGIES,
    STRATEGY_PRESETS,
)
from paratrain.config.parallelism.pipeline import PipelineSchedule
from paratrain.config.parallelism.placement import Backend, Device
from paratrain.config.parallelism.synchronisation import AllReduce, GradCompression, Reduce
from paratrain.config.train import RUN_CONTROL_FIELDS, TrainConfig

__all__ = [
    "ACROSS_NODES",
    "BATCH_COMMAND_OWNED",
    "LAYOUT_FIELDS",
    "PLAN_STRATEGIES",
    "RUN_CONTROL_FIELDS",
    "SCRIPT_STUDY_FLAGS",
    "SHARDED_CHECKPOINTS",
    "STAGED_LAYOUT_FIELDS",
    "STAGED_STRATEGIES",
    "STRATEGY_PRESETS",
    "AllReduce",
    "Backend",
    "CacheConfig",
    "CommandText",
    "CommbenchConfig",
    "CompareConfig",
    "Device",
    "DoctorConfig",
    "DownloadConfig",
    "FindBatchConfig",
    "GradCompression",
    "LRFindConfig",
    "LRScaling",
    "LaunchConfig",
    "NoiseScaleConfig",
    "Optimizer",
    "PipelineSchedule",
    "PlanConfig",
    "PlanPrecision",
    "Precision",
    "RecommendConfig",
    "Reduce",
    "ReportConfig",
    "ScaleConfig",
    "Schedule",
    "SlurmConfig",
    "SweepConfig",
    "TrainConfig",
    "WorkloadsConfig",
    "cli",
    "cli_options",
    "comma_separated",
    "flag",
    "load_config_file",
    "parse_size",
    "validate",
]
