"""Each parallelism is one module per layer (#29): a parallelism's flags, its validation, how it is applied and
its cost for the planner each come from one named place, which config, launch, engine, scale and plan all read.

The layers (config -> engine -> plan, pyproject.toml's import-linter contract) forbid one Python module per
parallelism holding all four: config may not import the torch code that applies a parallelism, and the planner
sits above both. So a parallelism is one module per layer, and this test holds the map of them itself, as the
table PARALLELISMS (a registry in src/ would be code only a test reads). Per parallelism it pins:

1. flags: each of its `paratrain train` flags (generated from the config's fields) is declared in the body of its
   Options class in config/parallelism/<name>.py, and in no other config class (another command's flag of its
   own under the same name is listed, with why, in OWN_FLAGS_OF_OTHER_COMMANDS);
2. validation: the config values its checks refuse are refused by a `raise` inside its config module, and the
   refusals that need the model or the device (at launch, before anything is written) inside its engine module;
3. application: the torch API that applies it is called only in its engine module(s) and imported nowhere else
   but the modules listed as reading it (an AST scan of every file of the package); the strategy registry builds
   each of its strategies from its module;
4. planner cost: plan/step_time.py's and plan/memory.py's figures for a layout that uses it go through its named
   cost functions, and a layout that does not use it does not reach them.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

import paratrain
from paratrain.config import TrainConfig
from paratrain.config.command_line import add_config_flags
from paratrain.config.parallelism import ParallelismOptions
from paratrain.config.parallelism.layout import LayoutOptions
from paratrain.config.parallelism.pipeline import PipelineOptions
from paratrain.config.parallelism.placement import PlacementOptions
from paratrain.config.parallelism.sharded import ShardedOptions
from paratrain.config.parallelism.synchronisation import SynchronisationOptions
from paratrain.config.parallelism.tensor import TensorParallelOptions
from paratrain.errors import UsageError
from paratrain.plan.devices import Device
from paratrain.plan.links import Link
from paratrain.plan.memory import Layout
from paratrain.plan.profile import ModelProfile, TensorParallelProfile

# The planner's modules (`paratrain.plan.step_time` is also the name of the function the package exports).
step_time = importlib.import_module("paratrain.plan.step_time")
memory = importlib.import_module("paratrain.plan.memory")

# The package as imported: the scans read the files the tests import.
SRC = Path(paratrain.__file__).resolve().parent


# Refusals at launch: the checks that need the model or the device, as launch/builtin.py calls them.
def _split_a_layer_four_ways(cfg: TrainConfig) -> None:
    import torch

    from paratrain.engine.strategies.tensor import check_tensor_parallel

    class SixOutputs(torch.nn.Module):  # a colwise layer of 6 outputs: 4 ranks cannot split it evenly
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 6)

        def tensor_parallel_plan(self, degree: int) -> dict[str, str]:
            return {"fc": "colwise"}

    check_tensor_parallel(cfg, SixOutputs)


def _cut_into_stages(cfg: TrainConfig) -> None:
    from paratrain.engine.strategies.pipeline_split import check_pipeline_split
    from paratrain.workloads import load_data

    check_pipeline_split(cfg, load_data(cfg))


def _fsdp_on_cpu(cfg: TrainConfig) -> None:
    from paratrain.engine.strategies import check_fsdp

    check_fsdp(cfg, None, "cpu")


def _synchronise_on_cpu(cfg: TrainConfig) -> None:
    from paratrain.engine.strategies.ddp import check_synchronisation

    check_synchronisation(cfg, "cpu")


def _serve_on_gpus(cfg: TrainConfig) -> None:
    from paratrain.engine.strategies.async_ps import check_async_ps

    check_async_ps(cfg, "cuda")


@dataclass(frozen=True)
class LaunchRefusal:
    values: dict[str, Any]  # the train config
    check: Callable[[TrainConfig], None]
    words: str  # of the refusal
    raised_in: str  # the engine module that raises it, under src/paratrain


@dataclass(frozen=True)
class Api:
    """A torch API that applies a parallelism (a qualified name: a package stands for everything in it): the
    modules that apply it, and those that import it only to recognise or time what it applied, each with why."""

    names: tuple[str, ...]
    applied_in: tuple[str, ...]
    read_in: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Cost:
    """A planner cost function ("step_time.name" or "memory.name") and the LAYOUTS that do and do not reach it."""

    function: str
    used_by: tuple[str, ...]
    not_used_by: tuple[str, ...]


@dataclass(frozen=True)
class Parallelism:
    options: type[BaseModel]  # its config module's Options class, mixed into TrainConfig
    flags: tuple[str, ...]  # the fields its Options class declares, each a `paratrain train` flag
    refused: tuple[tuple[dict[str, Any], str], ...]  # config values its module's checks refuse, and their words
    refused_at_launch: tuple[LaunchRefusal, ...] = ()
    strategies: dict[str, str] = field(default_factory=dict)  # name in the registry -> the engine module
    apis: tuple[Api, ...] = ()
    costs: tuple[Cost, ...] = ()


ENGINE_STRATEGIES = "engine/strategies"

PARALLELISMS: dict[str, Parallelism] = {
    "tensor": Parallelism(
        TensorParallelOptions,
        ("tp", "tp_plan", "sequence_parallel", "loss_parallel"),
        refused=(
            (dict(tp_plan="user_factories:widening_plan"), "--tp-plan goes with tensor parallelism"),
            (dict(sequence_parallel=True), "--sequence-parallel goes with tensor parallelism"),
            (dict(loss_parallel=True), "--loss-parallel goes with tensor parallelism"),
            (
                dict(tp=2, workers=2, loss_parallel=True, loss="user_factories:mse"),
                "--loss-parallel computes the built-in cross-entropy",
            ),
            (dict(strategy="tp", workers=2), "--strategy tp is set by --tp N"),
            (dict(tp=2, workers=2, strategy="ddp"), "--tp 2 does not combine with --strategy ddp"),
            (dict(tp=2, workers=4), "--tp 2 needs --workers 2"),
            (dict(tp=2, workers=3, strategy="fsdp"), "--tp 2 does not divide --workers 3"),
            (dict(tp=2, workers=2, precision="fp16"), "--precision fp16 is not supported with --tp"),
            (dict(tp=2, workers=2, compile=True), "--compile true is not supported with --tp"),
        ),
        # The degree against the model's layers: the model is needed (a head count is the model's own
        # plan's to refuse, workloads/gpt.py; the layers' widths engine/strategies/tensor.py's).
        refused_at_launch=(
            LaunchRefusal(
                dict(tp=4, workers=4), _split_a_layer_four_ways, "which 4 ranks cannot split evenly", "tensor.py"
            ),
        ),
        strategies={"tp": "tensor.py"},
        apis=(
            Api(
                ("torch.distributed.tensor.parallel",),
                applied_in=("tensor.py",),
            ),
        ),
        costs=(
            Cost("step_time._tensor_parallel", ("tp", "fsdp+tp"), ("ddp", "fsdp", "pipeline", "pp+tp")),
            Cost("memory._tensor_parallel", ("tp", "fsdp+tp"), ("ddp", "fsdp", "pipeline", "pp+tp")),
            # the group's collectives, whether the split layers are the whole model's or a stage's
            Cost("step_time._split_collectives_s", ("tp", "fsdp+tp", "pp+tp"), ("ddp", "fsdp", "pipeline", "hybrid")),
        ),
    ),
    "pipeline": Parallelism(
        PipelineOptions,
        ("stages", "dp", "microbatches", "pipeline_schedule", "split"),
        refused=(
            (dict(stages=2, workers=2), "--stages lays out pipeline stages"),
            (dict(strategy="pipeline", workers=2, dp=1), "--dp replicates a pipeline"),
            (dict(strategy="hybrid", workers=4), "--strategy hybrid needs its layout"),
            (dict(strategy="pipeline", workers=2, stages=3), "needs 3 workers and --workers is 2"),
            (dict(strategy="pipeline", workers=1), "splits the model into at least 2 stages"),
            (dict(strategy="pipeline", workers=2, batch_size=6, microbatches=4), "does not divide --batch-size 6"),
            (dict(strategy="pipeline", workers=4, batch_size=4, microbatches=2), "at least one micro-batch per stage"),
            (dict(strategy="model-parallel", workers=2, microbatches=2), "runs the whole batch as one micro-batch"),
            (dict(strategy="hybrid", workers=6, dp=3, stages=2, dp_shard=2), "--dp-shard 2 shards each stage"),
            (dict(strategy="pipeline", workers=2, grad_accum=2), "accumulates gradients over its micro-batches"),
            (dict(strategy="pipeline", workers=2, compile=True), "--compile true is not supported with --strategy"),
        ),
        # More stages than the model has blocks: the model is needed.
        refused_at_launch=(
            LaunchRefusal(
                dict(workload="synthetic-cnn", synthetic_samples=64, strategy="pipeline", workers=8, microbatches=8),
                _cut_into_stages,
                "too few for 8 stages",
                "pipeline_split.py",
            ),
        ),
        strategies={"pipeline": "pipeline.py", "model-parallel": "model_parallel.py", "hybrid": "hybrid.py"},
        apis=(Api(("torch.distributed.pipelining",), applied_in=("pipeline.py",)),),
        costs=(
            Cost("step_time._pipeline", ("pipeline", "hybrid", "pp+fsdp", "pp+tp"), ("ddp", "fsdp", "tp")),
            Cost("memory._largest_stage", ("pipeline", "hybrid", "pp+fsdp", "pp+tp"), ("ddp", "fsdp", "tp")),
        ),
    ),
    # Sharded data parallelism: FSDP (and HSDP with --dp-replicate), and ZeRO-1, which shards only the
    # optimizer state (config/parallelism/sharded.py says so).
    "sharded": Parallelism(
        ShardedOptions,
        ("dp_replicate", "shard_unit", "reshard_after_forward", "cpu_offload"),
        refused=(
            (dict(dp_replicate=2, workers=2, strategy="ddp"), "it applies to --strategy fsdp (this run uses ddp)"),
            (dict(dp_replicate=2, workers=3, strategy="fsdp"), "--dp-replicate (2) does not divide --workers 3"),
            (dict(shard_unit="Linear", workers=2), "--shard-unit applies to --strategy fsdp (this run uses ddp)"),
            (dict(reshard_after_forward=False, workers=2), "--reshard-after-forward applies to --strategy fsdp"),
            (dict(strategy="fsdp", workers=2, precision="fp16"), "would need a sharded loss scaler"),
        ),
        # Where the ranks compute (resolved at launch). Raised in the registry's module rather than fsdp.py, as
        # its docstring says, so that checking a run of another strategy does not import FSDP.
        refused_at_launch=(
            LaunchRefusal(
                dict(strategy="fsdp", workers=2, cpu_offload=True),
                _fsdp_on_cpu,
                "CPU ranks hold them in host memory already",
                "__init__.py",
            ),
        ),
        strategies={"fsdp": "fsdp.py", "zero1": "zero1.py"},
        apis=(
            Api(
                (
                    "torch.distributed.fsdp.fully_shard",
                    "torch.distributed._composable.fsdp.fully_shard",
                    "torch.distributed.fsdp.FullyShardedDataParallel",  # FSDP1: nowhere (an empty applied_in fails)
                ),
                # hybrid.py's sharded stages reuse fsdp.py's shard_in_units, the plan's profile its shard_units
                applied_in=("fsdp.py",),
            ),
            Api(
                ("torch.distributed.optim.ZeroRedundancyOptimizer",),
                applied_in=("zero1.py",),
                read_in={"engine/memory.py": "counts a rank's optimizer state, which ZeRO keeps in its own optimizer"},
            ),
        ),
        costs=(
            # the gathers and the reduce-scatter (fsdp), the broadcast of the updated parameters (zero1)
            Cost("step_time._data_parallel_comm", ("fsdp", "zero1"), ("tp", "pipeline", "pp+fsdp")),
            # FSDP's gathered parameters in 16 bits under --precision bf16
            Cost("memory.gathered_scale", ("fsdp",), ("ddp", "zero1")),
            # FSDP's split of the parameters, gradients and optimizer state, whether of the whole model, of a
            # tensor-parallel rank's pieces or of a pipeline stage; ZeRO's of the optimizer state
            Cost(
                "memory._sharded", ("fsdp", "fsdp+tp", "pp+fsdp", "hsdp"), ("ddp", "zero1", "tp", "pipeline", "pp+tp")
            ),
            # each unit's gathers and reduce-scatter over a shard group (and HSDP's all-reduce across its
            # replicas) against the compute beside them; a sharded stage's, per micro-batch
            Cost(
                "step_time._sharded_comm",
                ("fsdp", "fsdp+tp", "hsdp"),
                ("ddp", "zero1", "tp", "pipeline", "hybrid", "pp+tp", "pp+fsdp"),
            ),
            Cost(
                "step_time._sharded_collectives_s",
                ("pp+fsdp",),
                ("ddp", "zero1", "tp", "pipeline", "hybrid", "pp+tp", "fsdp", "fsdp+tp", "hsdp"),
            ),
            Cost("memory._zero1", ("zero1",), ("ddp", "fsdp", "tp")),
        ),
    ),
    # Replicated data parallelism: how the replicas average (DDP's buckets, local SGD, compression, a
    # synchronous parameter server) and async-ps, a synchronisation of its own.
    "synchronisation": Parallelism(
        SynchronisationOptions,
        (
            "allreduce",
            "bucket_cap_mb",
            "sync_every",
            "sync_warmup",
            "grad_compression",
            "powersgd_rank",
            "powersgd_start",
            "reduce",
            "ps_ranks",
            "max_staleness",
        ),
        refused=(
            (dict(reduce="ps", strategy="fsdp", workers=2), "--reduce ps sends whole gradients to rank 0"),
            (dict(strategy="async-ps", workers=1), "--strategy async-ps needs at least 2 ranks"),
            (dict(strategy="async-ps", workers=2, ps_ranks=2), "--ps-ranks 2 leaves none of --workers 2"),
            (dict(strategy="async-ps", workers=3, checkpoint_every=1), "async-ps keeps the optimizer state"),
            (dict(strategy="async-ps", workers=3, sync_every=2), "async-ps does not average"),
            (dict(ps_ranks=2, workers=2), "--ps-ranks lays out a parameter server"),
            (dict(sync_every=2, strategy="zero1", workers=2), "it applies to --strategy ddp, not zero1"),
            (dict(sync_warmup=5, workers=2), "the synchronous start of local SGD"),
            (dict(sync_every=2, grad_compression="fp16", workers=2), "averages parameters, not gradients"),
            (dict(grad_compression="powersgd", reduce="ps", workers=2), "has no reduce-to-one form"),
            (dict(powersgd_rank=4, workers=2), "--powersgd-rank applies to --grad-compression powersgd"),
        ),
        # What the process group and the device can carry: resolved at launch.
        refused_at_launch=(
            LaunchRefusal(
                dict(workers=2, sync_every=2, allreduce="shm"),
                _synchronise_on_cpu,
                "--allreduce shm cannot carry --sync-every",
                "ddp.py",
            ),
            LaunchRefusal(
                dict(strategy="async-ps", workers=2), _serve_on_gpus, "async-ps runs on CPU ranks", "async_ps.py"
            ),
        ),
        strategies={"ddp": "ddp.py", "async-ps": "async_ps.py"},
        apis=(
            Api(
                ("torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"),
                applied_in=(
                    "ddp.py",
                    # hybrid composes pipeline and data parallelism: each stage is plain DDP over its replicas'
                    # group, which torch's PipelineStage drives (no_sync); ddp.py's wrapper is a whole model's,
                    # with the synchronisation options that synchronisation.check keeps to --strategy ddp.
                    "hybrid.py",
                ),
                read_in={
                    "engine/strategies/pipeline.py": "runs hybrid's DDP stage's shape-inferring forward in no_sync",
                    "engine/script_schedule.py": "recognises a user's script's DDP model to hook its all-reduce",
                    "launch/probe/hooks.py": "times the all-reduce of a user's script's DDP model without changing it",
                },
            ),
            Api(
                (
                    "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook",
                    "torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook",
                    "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_wrapper",
                    "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.bf16_compress_wrapper",
                    "torch.distributed.algorithms.model_averaging",
                ),
                applied_in=("ddp.py",),
            ),
            Api(("torch.distributed.rpc",), applied_in=("async_ps.py",)),
        ),
        costs=(
            # the all-reduce of the gradients (hybrid's of a stage's is the pipeline's: inside _pipeline)
            Cost("step_time._data_parallel_comm", ("ddp",), ("tp", "pipeline", "hybrid")),
            # the whole model on every replica, which zero1 and fsdp then split
            Cost("memory._whole_model", ("ddp", "zero1", "fsdp"), ("tp", "fsdp+tp", "pipeline", "pp+fsdp")),
        ),
    ),
    # The layout of the ranks: how many, which strategy, and the same as torchtitan's mesh (--dp-shard, --pp),
    # turned into the strategies' own flags before the other checks run.
    "layout": Parallelism(
        LayoutOptions,
        ("workers", "strategy", "dp_shard", "pp"),
        refused=(
            (dict(dp_shard=3, workers=4), "--dp-shard 3 x --tp 1 x --pp 1 is 3 ranks and --workers is 4"),
            (dict(pp=2, stages=2, workers=2), "lay the ranks out themselves; drop --stages 2"),
            (dict(dp_replicate=2, tp=2, pp=1, workers=6), "--dp-shard 1 x --tp 2 x --pp 1 is 4 ranks"),
            (dict(dp_shard=0, workers=4), "each dimension of the layout"),
            (dict(strategy="single", workers=2), "strategy 'single' runs one worker"),
            (dict(strategy="hsdp", workers=2), "--strategy hsdp replicates FSDP's shards: give --dp-replicate R"),
        ),
        strategies={"single": "single.py"},
    ),
    # Not a parallelism: where the ranks run. Listed so that every field of the parallelism section is mapped.
    "placement": Parallelism(
        PlacementOptions,
        (
            "memory_limit",
            "device",
            "backend",
            "threads_per_worker",
            "allow_oversubscribe",
            "nodes",
            "node_rank",
            "rdzv",
            "rdzv_backend",
            "rdzv_timeout",
            "max_restarts",
            "timeout",
        ),
        refused=(
            (dict(nodes=2, workers=2), "--nodes 2 needs --node-rank"),
            (dict(node_rank=1), "is for runs across machines"),
            (dict(nodes=2, node_rank=2, rdzv="h:1", workers=2), "--node-rank 2 is out of range"),
            (dict(rdzv="nohost"), "is not HOST:PORT"),
            (dict(max_restarts=-1), "must be 0"),
        ),
    ),
}

# Other commands' flags of their own under the name of a parallelism section's field ("Class.field": why). A
# command that takes a parallelism's option itself reuses its declaration (`TrainConfig.model_fields[name]`).
OWN_FLAGS_OF_OTHER_COMMANDS = {
    "ScaleConfig.workers": "the worker counts a scaling study runs, a list",
    "ScaleConfig.strategy": "the strategies a study compares, a list",
    "RecommendConfig.workers": "the worker count the recommendation is for, required",
    "LaunchConfig.workers": "the ranks `launch` starts for a user's script (-n)",
    "CommbenchConfig.workers": "the ranks of a benchmark of collectives, at least 2",
    "PlanConfig.strategy": "the strategies the planner prices, a list (pp+fsdp among them)",
    "PlanConfig.tp": "the degree the planner prices its tensor-parallel rows at, beside the others",
    "PlanConfig.device": "an accelerator of the planner's table, or this machine's cpu",
    "PlanConfig.nodes": "the nodes to plan",
    "PlanConfig.dp_replicate": "a dimension of the one layout plan prices, whose product is its devices (no --workers)",
    "PlanConfig.dp_shard": "a dimension of the one layout plan prices, whose product is its devices (no --workers)",
    "PlanConfig.pp": "a dimension of the one layout plan prices, whose product is its devices (no --workers)",
    "SlurmConfig.nodes": "the nodes a job may span at most",
    "SweepConfig.timeout": "the seconds a sweep starts trials for",
    "SweepConfig.allow_oversubscribe": "more concurrent trials than cores or GPUs",
    "LaunchConfig.threads_per_worker": "a user's script's threads, pinned to their own cores",
}

LAYOUTS = {
    "ddp": Layout("ddp", 2, 2, 1, 1, 8),
    "zero1": Layout("zero1", 2, 2, 1, 1, 8),
    "fsdp": Layout("fsdp", 2, 2, 1, 1, 8),
    "tp": Layout("tp", 2, 1, 1, 1, 8, tp=2),
    "fsdp+tp": Layout("fsdp+tp", 4, 2, 1, 1, 8, tp=2),
    "pipeline": Layout("pipeline", 2, 1, 2, 4, 8),
    "hybrid": Layout("hybrid", 4, 2, 2, 4, 8),
    "pp+fsdp": Layout("pp+fsdp", 4, 2, 2, 4, 8, shard=2),
    "pp+tp": Layout("pp+tp", 4, 1, 2, 4, 8, tp=2),
    "hsdp": Layout("fsdp", 4, 4, 1, 1, 8, shard=2),
}


def _cases(kind: str) -> list[Any]:
    return [
        pytest.param(name, case, id=f"{name}-{i}")
        for name, p in PARALLELISMS.items()
        for i, case in enumerate(getattr(p, kind))
    ]


def _path(module: Any) -> str:
    return Path(module.__file__).resolve().relative_to(SRC).as_posix()


def _engine(path: str) -> str:
    """A path under src/paratrain; a bare file name is one of engine/strategies/."""
    return path if "/" in path else f"{ENGINE_STRATEGIES}/{path}"


# 1. Flags


@cache
def train_flags() -> dict[str, str]:
    """`paratrain train`'s flags as the CLI generates them from TrainConfig: field -> its option string."""
    parser = argparse.ArgumentParser()
    add_config_flags(parser, TrainConfig)
    return {a.dest: a.option_strings[-1] for a in parser._actions if a.option_strings}


def test_every_field_of_the_parallelism_section_belongs_to_one_row_of_the_map():
    mapped = [f for p in PARALLELISMS.values() for f in p.flags]
    assert sorted(mapped) == sorted(ParallelismOptions.model_fields)
    assert {p.options for p in PARALLELISMS.values()} == {
        c for c in ParallelismOptions.__mro__[1:] if issubclass(c, BaseModel) and c is not BaseModel
    }


@pytest.mark.parametrize("name", PARALLELISMS)
def test_each_flag_is_declared_in_its_options_class_and_in_no_other_section(name):
    own = PARALLELISMS[name].options
    sections = [c for c in TrainConfig.__mro__ if issubclass(c, BaseModel) and c not in (own, BaseModel)]
    declared = [f for f in inspect.get_annotations(own) if f in own.model_fields]
    assert sorted(declared) == sorted(PARALLELISMS[name].flags), f"{own.__name__} declares other fields"
    for flag in PARALLELISMS[name].flags:
        assert train_flags()[flag] == "--" + flag.replace("_", "-"), f"{flag} is not a plain train flag"
        assert flag in inspect.get_annotations(own), f"{flag} is not declared in {own.__name__}'s body"
        also = [c.__name__ for c in sections if flag in inspect.get_annotations(c)]
        assert also == [], f"{flag} is declared in {also} besides {own.__name__}"


def _declarations(names: set[str]) -> dict[str, str]:
    """Every field named in `names` a class of the config package declares: "Class.field" -> "own" (a
    declaration) or "reused" (TrainConfig's, `TrainConfig.model_fields[...]`)."""
    found = {}
    for path in sorted((SRC / "config").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            for statement in node.body:
                if isinstance(statement, ast.AnnAssign) and getattr(statement.target, "id", None) in names:
                    value = ast.unparse(statement.value) if statement.value else ""
                    reused = value.startswith("TrainConfig.model_fields[")
                    found[f"{node.name}.{statement.target.id}"] = "reused" if reused else "own"
    return found


def test_no_other_config_class_declares_a_parallelism_flag_of_its_own():
    owners = {f"{p.options.__name__}.{flag}" for p in PARALLELISMS.values() for flag in p.flags}
    flags = {flag for p in PARALLELISMS.values() for flag in p.flags}
    own = {name for name, how in _declarations(flags).items() if how == "own"}
    assert sorted(own - owners - set(OWN_FLAGS_OF_OTHER_COMMANDS)) == [], "declared besides the parallelism's own"
    assert sorted(set(OWN_FLAGS_OF_OTHER_COMMANDS) - own) == [], "no longer declared: drop them from the table"
    assert owners <= own


# 2. Validation


@pytest.mark.parametrize("name, case", _cases("refused"))
def test_a_bad_configuration_is_refused_by_a_raise_inside_its_parallelisms_config_module(name, case):
    values, words = case
    with pytest.raises(ValidationError) as caught:
        TrainConfig(**values)
    error = caught.value.errors()[0]
    refusal = error.get("ctx", {}).get("error")
    assert isinstance(refusal, ValueError), error  # raised by a check, not one of pydantic's constraints
    assert words in str(refusal)
    # The innermost frame of the refusal's traceback is the `raise` (pydantic keeps the ValueError it caught).
    raised_in = Path(traceback.extract_tb(refusal.__traceback__)[-1].filename).resolve()
    module = inspect.getmodule(PARALLELISMS[name].options)
    assert raised_in == Path(module.__file__).resolve(), f"{words!r} is raised in {raised_in}"


@pytest.mark.parametrize("name, refusal", _cases("refused_at_launch"))
def test_a_refusal_that_needs_the_model_or_device_is_raised_inside_its_engine_module(name, refusal):
    cfg = TrainConfig(**refusal.values)
    with pytest.raises(UsageError, match=refusal.words) as caught:
        refusal.check(cfg)
    raised_in = Path(caught.traceback[-1].path).resolve()
    assert raised_in == SRC / _engine(refusal.raised_in)


# 3. Application


def _qualified(node: ast.expr, bound: dict[str, str]) -> str | None:
    """`fsdp.fully_shard` -> "torch.distributed.fsdp.fully_shard" when `fsdp` is an imported name."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _qualified(node.value, bound)
        return f"{base}.{node.attr}" if base else None
    return None


@cache
def torch_uses(root: Path = SRC) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """Per file under `root` (the package): the qualified names it imports or refers to, and those it calls."""
    uses = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        bound: dict[str, str] = {}
        named: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    named.add(alias.name)
                    top = alias.name.partition(".")[0]
                    bound[alias.asname or top] = alias.name if alias.asname else top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    named.add(f"{node.module}.{alias.name}")  # a star import: "module.*", inside the module
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        referred = {_qualified(n, bound) for n in ast.walk(tree) if isinstance(n, (ast.Name, ast.Attribute))}
        called = {_qualified(n.func, bound) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        uses[path.relative_to(root).as_posix()] = (frozenset(named | referred) - {None}, frozenset(called) - {None})
    return uses


@cache
def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def _touches(names: frozenset[str], api: Api, calls: bool = False) -> bool:
    """Whether `names` hold one of the API's names or, but for calls of a class's methods (`DDP.register_comm_hook`
    is not DDP applied), something inside it."""

    def inside(name: str, of: str) -> bool:
        return name == of or (name.startswith(of + ".") and (not calls or _is_module(of)))

    stars = [n.removesuffix(".*") for n in names if n.endswith(".*")]
    return any(inside(n, a) for n in names for a in api.names) or any(inside(a, s) for s in stars for a in api.names)


@pytest.mark.parametrize("name, api", _cases("apis"))
def test_the_torch_api_that_applies_a_parallelism_is_used_only_in_its_engine_modules(name, api):
    """Applied: called (a class constructed, a function or anything of a package called). Imported: named at all,
    as an isinstance check or a patch of its methods names it."""
    applied_in = {_engine(p) for p in api.applied_in}
    calling = {path for path, (_, called) in torch_uses().items() if _touches(called, api, calls=True)}
    importing = {path for path, (named, _) in torch_uses().items() if _touches(named, api)}
    assert calling == applied_in, f"{api.names[0]} is applied in {sorted(calling)}"
    assert importing == applied_in | set(api.read_in), f"{api.names[0]} is imported by {sorted(importing)}"


@pytest.mark.parametrize(
    "text, imported, called",
    [
        ("from torch.distributed.fsdp import fully_shard as shard\nshard(m)", True, True),
        ("import torch.distributed.fsdp as fsdp\nfsdp.fully_shard(m)", True, True),
        ("import torch\ntorch.distributed.fsdp.fully_shard(m)", True, True),
        ("from torch.distributed.fsdp import *", True, False),
        ("from torch.distributed.fsdp import FSDPModule\nisinstance(m, FSDPModule)", False, False),
        # an attribute of the API called: the API read, not applied (as launch/probe/hooks.py patches DDP's methods)
        ("from torch.distributed import fsdp\nfsdp.fully_shard.state(m)", True, False),
    ],
)
def test_the_scan_finds_an_api_however_it_is_imported(text, imported, called, tmp_path):
    (tmp_path / "m.py").write_text(text)
    names, calls = torch_uses(tmp_path)["m.py"]
    api = Api(("torch.distributed.fsdp.fully_shard",), applied_in=())
    assert (_touches(names, api), _touches(calls, api, calls=True)) == (imported, called)


@pytest.mark.parametrize("name", [n for n, p in PARALLELISMS.items() if p.strategies])
def test_the_registry_builds_each_strategy_from_its_parallelisms_engine_module(name):
    from paratrain.engine.strategies import STRATEGIES as REGISTRY

    for strategy, path in PARALLELISMS[name].strategies.items():
        where = inspect.getclosurevars(REGISTRY[strategy]).nonlocals  # _imported_when_built's module and class
        built = getattr(importlib.import_module(where["module"]), where["name"])
        assert _path(inspect.getmodule(built)) == _engine(path)
        assert built.name == strategy


def test_every_registered_strategy_is_in_the_map():
    from paratrain.engine.strategies import STRATEGIES as REGISTRY

    mapped = [s for p in PARALLELISMS.values() for s in p.strategies]
    assert sorted(mapped) == sorted(REGISTRY)


# 4. Planner cost


# each pipeline unit saving as much for backward as the others (what a stage's activations are a share of)
SAVED_ALIKE = dict(saved_bytes_per_sample=1e3, input_saved_bytes_per_sample=0)


def hand_profile() -> ModelProfile:
    """Four pipeline units of 1 MFLOP a sample, and the model split two ways (as test_formulas_step_time's)."""
    units = [
        dict(name=f"u{i}", param_bytes=p, flops_per_sample=1e6, output_bytes_per_sample=1e3, **SAVED_ALIKE)
        for i, p in enumerate([1e6, 2e6, 5e5, 5e5])
    ]
    toy = ModelProfile("toy", 1_000_000, 4_000_000, 10, 0, 4_000_000, 1e3, 0.0, 2_000_000, units)
    toy.tensor_parallel = TensorParallelProfile(
        degree=2,
        param_bytes=2_500_000,
        param_tensors=10,
        activation_bytes_per_sample=1e3,
        activation_bytes_fixed=0.0,
        allreduces=8,
        allreduce_bytes_per_sample=8e3,
        split_flops_share=0.75,
        unit_param_bytes=(6e5, 1.2e6, 3.5e5, 3.5e5),
        unit_split_flops_per_sample=(7.5e5,) * 4,
    )
    return toy


def plan_figures(layout: Layout) -> dict[str, float]:
    """The planner's step time and memory per device of `layout`, on a made-up device and link."""
    link = Link("intra", 1e8, 1e-4, "test", base_latency=1e-3)
    device = Device("test", {"fp32": 1e9}, 1e10, 1e9, "intra", {"fp32": 0.5}, overlap=False)
    topology = step_time.Topology(per_node=8, intra=link, inter=link)
    profile = hand_profile()
    seconds = step_time.step_time(profile, layout, device, "fp32", "sgd", topology, step_time.Efficiency(compute=0.5))
    return seconds | memory.memory_per_device(profile, layout, "sgd", "fp32")


def _doubled(value: Any) -> Any:
    """Every figure in a cost function's result twice over (a number, or tuples and dicts of them)."""
    if isinstance(value, tuple):
        return tuple(_doubled(v) for v in value)
    if isinstance(value, dict):
        return {k: _doubled(v) for k, v in value.items()}
    return 2 * value


def _cost_cases() -> list[Any]:
    return [
        pytest.param(cost.function, layout, layout in cost.used_by, id=f"{name}-{cost.function}-{layout}")
        for name, p in PARALLELISMS.items()
        for cost in p.costs
        for layout in (*cost.used_by, *cost.not_used_by)
    ]


@pytest.mark.parametrize("function, layout, reached", _cost_cases())
def test_the_planners_figures_for_a_layout_come_through_its_parallelisms_cost_functions(
    function, layout, reached, monkeypatch
):
    """With the cost function's result doubled, the figures of a layout that uses the parallelism change, and
    those of a layout that does not stay as they were."""
    module_name, _, function_name = function.partition(".")
    module = {"step_time": step_time, "memory": memory}[module_name]
    original = getattr(module, function_name)
    as_planned = plan_figures(LAYOUTS[layout])
    monkeypatch.setattr(module, function_name, lambda *args, **kwargs: _doubled(original(*args, **kwargs)))
    changed = sorted(k for k, v in plan_figures(LAYOUTS[layout]).items() if v != as_planned[k])
    assert bool(changed) == reached, f"{layout}: {function} changes {changed or 'nothing'}"
