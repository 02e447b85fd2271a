"""The train config is composed of sections (#28), each a model in its own module with its own checks
(#29: one module per parallelism): every train field belongs to exactly one section, the sections are
`paratrain train --help`'s groups in order, and a config's faults are told in one fixed order."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
from pydantic import BaseModel, ValidationError

import paratrain.config.parallelism
from paratrain.cli import build_parser
from paratrain.config import TrainConfig
from paratrain.config.compute import ComputeOptions
from paratrain.config.optimisation import OptimisationOptions
from paratrain.config.parallelism import ParallelismOptions
from paratrain.config.run import RunOptions
from paratrain.config.workload import WorkloadOptions

SECTIONS = (WorkloadOptions, ParallelismOptions, OptimisationOptions, ComputeOptions, RunOptions)


def test_every_train_field_is_in_exactly_one_section_in_help_order():
    fields = [name for section in SECTIONS for name in section.model_fields]
    assert fields == list(TrainConfig.model_fields)  # none twice, none outside a section, --help's order
    # each --help group starts at its section's first field
    starts = [next(iter(section.model_fields)) for section in SECTIONS]
    assert [s for s in starts if s in TrainConfig.flag_sections] == list(TrainConfig.flag_sections)


def test_each_parallelism_module_holds_its_options_and_their_check():
    modules = {
        info.name: importlib.import_module(f"paratrain.config.parallelism.{info.name}")
        for info in pkgutil.iter_modules(paratrain.config.parallelism.__path__)
    }
    assert {"tensor", "sharded", "pipeline", "synchronisation", "layout", "placement"} <= set(modules)
    for name, module in modules.items():
        options = [
            v
            for v in vars(module).values()
            if isinstance(v, type) and issubclass(v, BaseModel) and v.__module__ == module.__name__
        ]
        assert len(options) == 1, name  # one options model per module
        assert set(options[0].model_fields) <= set(ParallelismOptions.model_fields), name
        assert callable(getattr(module, "check", None)), name


def test_train_help_groups_the_flags_by_section():
    parser = build_parser().commands["train"]
    groups = {g.title: [a.dest for a in g._group_actions] for g in parser._action_groups}
    assert groups["parallelism"][:2] == ["workers", "strategy"]
    assert set(groups["parallelism"]) == set(ParallelismOptions.model_fields)
    assert set(groups["compute"]) == set(ComputeOptions.model_fields)


@pytest.mark.parametrize(
    ("values", "told"),
    [
        # a tensor-parallel fault and a pipeline fault: the tensor parallelism's check runs first
        ({"workers": 3, "tp": 2, "strategy": "fsdp", "stages": 3}, "--tp 2 does not divide"),
        # a placement fault before a synchronisation fault
        ({"workers": 2, "rdzv": "h:1", "sync_warmup": 2}, "--rdzv is for runs across machines"),
        # the range test's rule (optimisation) before local SGD's (synchronisation)
        ({"workers": 2, "schedule": "range-test", "sync_warmup": 2}, "--schedule range-test and --lr-end"),
    ],
)
def test_a_config_with_several_faults_is_told_the_same_one_first(values, told):
    with pytest.raises(ValidationError, match=told):
        TrainConfig(**values)
