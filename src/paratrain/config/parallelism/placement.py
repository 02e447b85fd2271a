"""Where the ranks run: the device, the process group's backend, the cores per rank, the nodes, and how
failures are handled. None of it changes the trajectory (train.RUN_CONTROL_FIELDS)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field, field_validator

from paratrain.config.flags import parse_size

if TYPE_CHECKING:
    from paratrain.config.train import TrainConfig

Backend = Literal["auto", "gloo", "nccl", "mpi"]
Device = Literal["auto", "cpu", "cuda"]


class PlacementOptions(BaseModel):
    memory_limit: str | None = Field(
        None,
        description="bound each CPU rank's memory, e.g. 2G or 512M: a rank that needs more fails with an out-of-memory "
        "error",
    )
    device: Device = Field(
        "auto",
        description="where ranks compute: cuda (one GPU per rank), cpu (cores per rank, even on a GPU host), auto "
        "(cuda when GPUs are visible)",
    )
    backend: Backend = Field("auto", description="torch.distributed backend: nccl on GPUs and gloo on CPU by default")
    threads_per_worker: int | None = Field(None, gt=0, description="CPU threads per rank (default: cores // workers)")
    allow_oversubscribe: bool = Field(False, description="allow more threads than cores (slow; for testing only)")

    # Across nodes, and surviving a lost worker (launch/nodes.py, docs/cluster.md).
    nodes: int = Field(
        1, gt=0, description="machines taking part; --workers counts the ranks of all of them and is split evenly"
    )
    node_rank: int | None = Field(
        None,
        ge=0,
        description="this machine's index, 0 .. --nodes - 1; node 0 hosts the rendezvous, holds global rank 0 and "
        "writes the run directory",
    )
    rdzv: str | None = Field(
        None,
        description="HOST:PORT of the rendezvous, an address of node 0 that every node can reach (needs --nodes > 1)",
    )
    rdzv_backend: Literal["c10d"] = Field(
        "c10d", description="torch elastic rendezvous backend (c10d: a TCP store hosted by node 0's agent)"
    )
    rdzv_timeout: float = Field(
        900.0, gt=0, description="seconds to wait for the rendezvous to be reached and for every node to join"
    )
    max_restarts: int = Field(
        0,
        description="when a rank dies, restart every rank up to this many times; each restart resumes from the last "
        "checkpoint",
    )
    timeout: float = Field(
        600.0,
        gt=0,
        description="seconds a collective may wait for a peer before the run fails naming the rank and what it was "
        "doing",
    )

    @field_validator("memory_limit")
    @classmethod
    def _a_size(cls, value: str | None) -> str | None:
        if value is not None:
            parse_size(value)
        return value

    @field_validator("max_restarts")
    @classmethod
    def _restarts(cls, value: int) -> int:
        if value < 0:
            raise ValueError(
                "must be 0 (a rank that dies ends the run) or more (restarts, each resuming from the last checkpoint)"
            )
        return value

    @field_validator("rdzv")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is not None:
            host, sep, port = value.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(
                    f"{value!r} is not HOST:PORT; give node 0's address and a free port, e.g. 10.0.0.1:29400"
                )
        return value

    # Derived values: computed here once so config.json, the ranks and the analysis agree.
    @property
    def workers_per_node(self) -> int:
        return self.workers // self.nodes

    @property
    def memory_limit_bytes(self) -> int | None:
        return parse_size(self.memory_limit) if self.memory_limit is not None else None


def check(config: TrainConfig) -> None:
    """--nodes, --node-rank and --rdzv go together, and the ranks split evenly over the nodes."""
    if config.nodes > 1:
        if config.node_rank is None or config.rdzv is None:
            raise ValueError(
                f"--nodes {config.nodes} needs --node-rank (0 .. {config.nodes - 1}, this machine's index) and "
                "--rdzv HOST:PORT (node 0's address) on every node"
            )
        if config.node_rank >= config.nodes:
            raise ValueError(
                f"--node-rank {config.node_rank} is out of range for --nodes {config.nodes}; number the nodes "
                f"0 .. {config.nodes - 1}"
            )
        if config.workers % config.nodes:
            raise ValueError(
                f"--workers {config.workers} (the ranks of all nodes) does not split evenly over --nodes "
                f"{config.nodes}; use a multiple of {config.nodes}, e.g. --workers {config.nodes}"
            )
    elif config.node_rank or config.rdzv is not None:
        given = "--rdzv" if config.rdzv is not None else f"--node-rank {config.node_rank}"
        raise ValueError(
            f"{given} is for runs across machines; add --nodes N (and the other nodes' commands), or drop it"
        )
