"""One process, no communication: the baseline every speedup is measured against."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paratrain.config import TrainConfig
from paratrain.engine.distributed import RankContext
from paratrain.engine.strategies.base import WholeModelStrategy
from paratrain.errors import UsageError


class SingleProcess(WholeModelStrategy):
    name = "single"

    def __init__(self, cfg: TrainConfig, ctx: RankContext, stamp: Callable[[], Any]):
        if ctx.world_size != 1:
            raise UsageError("strategy 'single' runs one worker; use --strategy ddp for more")
        super().__init__(cfg, ctx, stamp)
