"""The parallelism section of the train config: one module per parallelism, each holding its options and
its checks (the engine applies each in engine/strategies/, the planner costs each in plan/)."""

from __future__ import annotations

from paratrain.config.parallelism.layout import LayoutOptions
from paratrain.config.parallelism.pipeline import PipelineOptions
from paratrain.config.parallelism.placement import PlacementOptions
from paratrain.config.parallelism.sharded import ShardedOptions
from paratrain.config.parallelism.synchronisation import SynchronisationOptions
from paratrain.config.parallelism.tensor import TensorParallelOptions


class ParallelismOptions(
    SynchronisationOptions, PlacementOptions, ShardedOptions, PipelineOptions, TensorParallelOptions, LayoutOptions
):
    """The layout, then each parallelism's options, then where the ranks run and how they synchronise (in
    `--help` order: pydantic takes the bases' fields last to first)."""
