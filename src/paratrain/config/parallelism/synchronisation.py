"""How data-parallel ranks average: DDP's buckets and all-reduce path, local SGD, gradient compression,
a synchronous parameter server, and async-ps (a synchronisation mode of its own)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from paratrain.config.flags import flag

if TYPE_CHECKING:
    from paratrain.config.train import TrainConfig

AllReduce = Literal["auto", "shm", "backend"]
GradCompression = Literal["none", "fp16", "bf16", "powersgd"]
Reduce = Literal["allreduce", "ps"]


class SynchronisationOptions(BaseModel):
    allreduce: AllReduce = Field(
        "auto",
        description="how CPU ranks on one host average gradients: shm (shared memory, x86-64 Linux), backend (the "
        "process group, e.g. gloo), auto (shm where it works)",
    )
    bucket_cap_mb: float = Field(
        25.0,
        gt=0,
        description="DDP gradient bucket size in MB (DDP's default 25); smaller buckets start averaging earlier in "
        "backward",
    )

    # Synchronising less, sending less, waiting less (engine/strategies/ddp.py, async_ps.py; docs/synchronisation.md).
    sync_every: int = Field(
        1,
        gt=0,
        description="ddp: local SGD: each rank steps on its own gradients and the parameters are averaged every H "
        "optimizer steps (1: gradients averaged every step, plain DDP)",
    )
    sync_warmup: int = Field(
        0,
        ge=0,
        description="ddp with --sync-every > 1: average gradients every step for the first S optimizer steps, then "
        "local SGD",
    )
    grad_compression: GradCompression = Field(
        "none",
        description="ddp: compress gradients before averaging: fp16 or bf16 (half the bytes; bf16 needs a CUDA "
        "build of torch), powersgd (low-rank, --powersgd-rank)",
    )
    powersgd_rank: int = Field(
        2,
        gt=0,
        description="--grad-compression powersgd: rank of each gradient matrix's approximation (2: one of the ranks "
        "Vogels et al. report on CIFAR-10)",
    )
    powersgd_start: int = Field(
        10,
        gt=1,
        description="--grad-compression powersgd: optimizer steps of uncompressed averaging first (at least 2: DDP "
        "rebuilds its buckets after step 1)",
    )
    reduce: Reduce = Field(
        "allreduce",
        description="ddp: allreduce (every rank sums), or ps: gradients reduced to rank 0, which broadcasts the "
        "average back (a synchronous parameter server)",
    )
    ps_ranks: int = Field(
        1,
        gt=0,
        description="async-ps: ranks that hold the parameters (sharded across them when > 1); the other --workers "
        "train",
    )
    max_staleness: int | None = Field(
        None,
        ge=0,
        description="async-ps: a worker more than S updates ahead of the slowest waits (stale-synchronous, Ho et al. "
        "2013); default: fully asynchronous",
    )


def check(config: TrainConfig) -> None:
    """--sync-every, --grad-compression and --reduce change DDP's averaging; --ps-ranks and
    --max-staleness lay out async-ps. Each applies where it means something, one at a time."""
    name, defaults = config.strategy_name, type(config).model_fields
    given = [
        f
        for f in (
            "sync_every",
            "sync_warmup",
            "grad_compression",
            "reduce",
            "powersgd_rank",
            "powersgd_start",
            "ps_ranks",
            "max_staleness",
        )
        if getattr(config, f) != defaults[f].default
    ]
    if config.reduce == "ps" and name in ("zero1", "fsdp"):
        raise ValueError(
            f"--reduce ps sends whole gradients to rank 0, and --strategy {name} shards them; use --strategy "
            "ddp --reduce ps"
        )
    ps_only = [f for f in given if f in ("ps_ranks", "max_staleness")]
    if name == "async-ps":
        if config.workers < 2:
            raise ValueError(
                f"--strategy async-ps needs at least 2 ranks (--ps-ranks servers and at least one worker); "
                f"use --workers {config.ps_ranks + 1} or more"
            )
        if config.ps_ranks >= config.workers:
            raise ValueError(
                f"--ps-ranks {config.ps_ranks} leaves none of --workers {config.workers} to train; use --ps-ranks "
                f"{config.workers - 1} or fewer (or more --workers)"
            )
        if config.checkpoint_every:
            raise ValueError(
                "--checkpoint-every: async-ps keeps the optimizer state on its servers, which checkpoints do not "
                "hold; drop --checkpoint-every"
            )
        wrong = [f for f in given if f not in ps_only]
        if wrong:
            raise ValueError(
                f"{flag(wrong[0])} changes DDP's averaging and async-ps does not average; use --strategy ddp"
            )
        return
    if ps_only:
        raise ValueError(
            f"{flag(ps_only[0])} lays out a parameter server; it applies to --strategy async-ps, not {name}"
        )
    if given and name != "ddp":
        raise ValueError(f"{flag(given[0])} changes DDP's gradient averaging; it applies to --strategy ddp, not {name}")
    if config.sync_warmup and config.sync_every == 1:
        raise ValueError(
            f"--sync-warmup {config.sync_warmup} is the synchronous start of local SGD; add --sync-every H (H > 1)"
        )
    if config.sync_every > 1 and (config.grad_compression != "none" or config.reduce != "allreduce"):
        other = "--grad-compression" if config.grad_compression != "none" else "--reduce ps"
        raise ValueError(
            f"--sync-every {config.sync_every} averages parameters, not gradients, after its warm-up; {other} "
            "would only touch the warm-up: choose one of them"
        )
    if config.grad_compression == "powersgd" and config.reduce == "ps":
        raise ValueError(
            "--grad-compression powersgd all-reduces its low-rank factors and has no reduce-to-one form; "
            "drop --reduce ps (or use --grad-compression fp16)"
        )
    if config.grad_compression != "powersgd" and {"powersgd_rank", "powersgd_start"} & set(given):
        raise ValueError(
            f"{flag(next(f for f in given if f.startswith('powersgd')))} applies to --grad-compression powersgd"
        )
