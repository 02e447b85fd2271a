"""Model parallel, the naive way: the layers split across ranks as a pipeline's are, but the whole
batch goes through as one micro-batch, so one stage computes while the others wait.

The same stages as `pipeline` (engine/strategies/pipeline.py) run by ScheduleGPipe with M = 1:
its bubble is (K−1)/K of the step, measured and reported the same way. It is the baseline that
shows what micro-batching buys: with `pipeline` and M micro-batches it falls to (K−1)/(M+K−1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paratrain.config import TrainConfig
from paratrain.engine.distributed import RankContext
from paratrain.engine.strategies.pipeline import PipelineParallel


class ModelParallel(PipelineParallel):
    name = "model-parallel"

    def __init__(self, cfg: TrainConfig, ctx: RankContext, stamp: Callable[[], Any]):
        super().__init__(cfg, ctx, stamp)
        self.microbatches = 1
        self.schedule_name = "gpipe"
