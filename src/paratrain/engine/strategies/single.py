"""One process, no communication: the baseline every speedup is measured against."""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Callable, Optional

from torch import nn

from paratrain.config import TrainConfig
from paratrain.engine.distributed import RankContext
from paratrain.errors import UsageError


class SingleProcess:
    name = "single"
    allreduce = None

    def __init__(self, cfg: TrainConfig, ctx: RankContext, stamp: Callable[[], Any]):
        if ctx.world_size != 1:
            raise UsageError("strategy 'single' runs one worker; use --strategy ddp for more")

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def no_sync(self, model: nn.Module) -> AbstractContextManager:
        return nullcontext()

    def comm_started(self) -> Optional[Any]:
        return None

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model
