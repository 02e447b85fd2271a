"""`paratrain.train`: validate, prepare the run directory, launch the ranks of paratrain's own
training loop, write the summary (script.py launches a user's script).

Everything that can be wrong with the input is checked here, before the run directory is touched
and before any rank starts, so bad input leaves nothing behind.
"""

from __future__ import annotations

import datetime as _dt
import shutil
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from paratrain.config import RUN_CONTROL_FIELDS, STAGED_LAYOUT_FIELDS, STAGED_STRATEGIES, TrainConfig, validate
from paratrain.engine.checkpoint import CHECKPOINT_NAME, load_checkpoint
from paratrain.engine.distributed import Placement
from paratrain.engine.preflight import check_loss
from paratrain.engine.strategies import check_fsdp, check_strategy, check_tensor_parallel
from paratrain.engine.strategies.async_ps import check_async_ps
from paratrain.engine.strategies.ddp import check_synchronisation
from paratrain.engine.strategies.pipeline_split import check_pipeline_split
from paratrain.errors import Interrupted, TrainingDiverged, UsageError
from paratrain.launch.load import LoadMeter
from paratrain.launch.local import RanksFailed, RendezvousFailed
from paratrain.launch.nodes import Tasks, adopt_tasks, default_run_dir, run_ranks, task_placement, writes_run_dir
from paratrain.launch.placement import plan_placement
from paratrain.measure.monitor import monitor_run, ranks_by_log
from paratrain.runs import RunDir, json_records, write_json
from paratrain.runs.exports import check_exports, export_run
from paratrain.runs.lock import run_dir_entries, run_dir_lock
from paratrain.runs.records import Summary, checked
from paratrain.runs.tensorboard import check_tensorboard


def train(config: TrainConfig | dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    """Train as `paratrain train` does and return the run summary (also in RUN_DIR/summary.json).

    `config` is a TrainConfig or a dict of its fields; keyword arguments override single fields:
    `paratrain.train(workers=2, epochs=5)`. Ranks are spawned as fresh processes, so this works
    in a notebook; from a script, call it under `if __name__ == "__main__":` as multiprocessing
    requires.
    """
    from paratrain.workloads import check_model, load_data

    command_started = time.perf_counter()
    values = config.model_dump() if isinstance(config, TrainConfig) else dict(config or {})
    cfg: TrainConfig = validate(TrainConfig, {**values, **overrides})
    cfg, tasks = adopt_tasks(cfg)  # inside srun or mpirun: their ranks, world size and rank 0's host (launch/nodes.py)
    placement = task_placement(cfg, tasks) if tasks is not None else plan_placement(cfg)
    if cfg.tensorboard is not None:
        check_tensorboard()
    check_exports(cfg)
    check_model(cfg)
    check_strategy(cfg.strategy_name)
    prepare_started = time.perf_counter()
    data = load_data(cfg)  # decodes and caches once here, so ranks only read the cache
    prepare_s = time.perf_counter() - prepare_started
    if cfg.limit_train is not None and cfg.limit_train > len(data.train) + (
        len(data.val) if data.val is not None else 0
    ):
        raise UsageError(f"--limit-train {cfg.limit_train} exceeds the {len(data.train)} training samples available")
    if cfg.global_batch_size > len(data.train):
        fits = len(data.train) // (cfg.workers * cfg.grad_accum)
        hint = f"use --batch-size {fits} or less" if fits else "use fewer --workers or a smaller --grad-accum"
        raise UsageError(
            f"the global batch ({cfg.workers} workers x {cfg.batch_size} x grad-accum {cfg.grad_accum} = "
            f"{cfg.global_batch_size}) is larger than the {len(data.train)} training samples; {hint}"
        )
    if cfg.early_stop and data.val is None:
        raise UsageError(
            "--early-stop watches the validation loss and this run has no validation split; add --val-split 0.1 "
            "(stopping on the test split would choose by it)"
        )
    check_loss(cfg, data)
    check_pipeline_split(cfg, data)
    check_fsdp(cfg, data, placement.device_type)
    check_tensor_parallel(cfg, data)
    check_synchronisation(cfg, placement.device_type)
    check_async_ps(cfg, placement.device_type)
    if cfg.memory_limit is not None and placement.device_type == "cuda":
        raise UsageError("--memory-limit bounds CPU ranks' host memory, not a GPU's; drop it, or use --device cpu")

    run = RunDir(cfg.run_dir or default_run_dir(cfg, tasks) or _default_run_dir(cfg))
    cfg.run_dir = run.path
    writes = writes_run_dir(cfg, tasks)
    if writes:
        _prepare_run_dir(run, cfg, placement.device_type, data)
    existed = run.path.exists()
    # Held until the run ends, so a second run into this directory is refused (runs/lock.py). Node 0
    # writes the run directory; the other nodes of a run only take part.
    try:
        with run_dir_lock(run.path, fresh=not cfg.resume) if writes else nullcontext():
            return _launch(cfg, run, placement, data, prepare_s, command_started, tasks)
    except RendezvousFailed:
        # The nodes never met and nothing ran: bad input leaves nothing behind. Only node 0 removes
        # what it made; another node may share node 0's directory (a shared file system).
        if writes and not existed:
            shutil.rmtree(run.path, ignore_errors=True)
        raise


def _launch(
    cfg: TrainConfig,
    run: RunDir,
    placement: Placement,
    data: Any,
    prepare_s: float,
    command_started: float,
    tasks: Tasks | None = None,
) -> dict[str, Any]:
    """Write config.json, run the ranks under the monitor, write summary.json."""
    from paratrain.workloads import workload_of

    if not writes_run_dir(cfg, tasks):
        # Global rank 0's process (on node 0) writes the run directory; this one runs its ranks,
        # which add their logs, and says where the summary is.
        run_ranks(cfg, placement, run.path, tasks)
        role = f"rank {tasks.rank}" if tasks is not None else f"node {cfg.node_rank}"
        return {
            "status": "completed",
            "workers": cfg.workers,
            "role": role,
            "run_dir": str(run.path),
            "wall_time_s": time.perf_counter() - command_started,
        }
    (run.path / "logs").mkdir(parents=True, exist_ok=True)
    if not cfg.resume:
        write_json(run.config, _resolved_config(cfg, placement, data))

    load = LoadMeter(placement.cpu_sets)  # what else ran on the run's cores meanwhile
    started = time.perf_counter()
    # The monitor samples this machine's GPU ranks: the whole run's on one node, this node's share
    # across nodes, and under srun or mpirun this process's machine's tasks (as this process sees them).
    local_ranks = tasks.local_size if tasks is not None else cfg.workers_per_node
    try:
        with monitor_run(
            run.path, cfg.monitor_hz, ranks_by_log(run.path), local_ranks if placement.device_type == "cuda" else 0
        ):
            summary = run_ranks(cfg, placement, run.path, tasks)
    except (RanksFailed, KeyboardInterrupt) as exc:
        interrupted = isinstance(exc, KeyboardInterrupt)
        failed = {
            "status": "failed",
            "error": "interrupted" if interrupted else str(exc),
            "workers": cfg.workers,
            "strategy": cfg.strategy_name,
            "prepare_s": prepare_s,
            "wall_time_s": time.perf_counter() - command_started,
        }
        write_json(run.summary, checked(Summary, failed))
        if interrupted:
            raise Interrupted(_what_was_kept(cfg, run)) from None
        raise
    assert summary is not None, "rank 0 returned no summary"
    # wall_time_s is the whole command, data preparation (prepare_s: decoding, caching) included.
    names = workload_of(cfg)  # what was trained, by its own names (a user's model is not "cifar10-cnn")
    summary = {
        **summary,
        "model": names.model,
        "dataset": names.dataset,
        "prepare_s": prepare_s,
        "launch_and_train_s": time.perf_counter() - started,
        "wall_time_s": time.perf_counter() - command_started,
        "run_dir": str(run.path),
        "machine_load": load.finish(),
    }
    write_json(run.summary, checked(Summary, summary))
    if summary["status"] == "diverged":
        raise TrainingDiverged(summary["error"])
    exported = export_run(cfg, run.path)
    if exported:
        summary.update(exported)
        write_json(run.summary, checked(Summary, summary))
    return summary


def _what_was_kept(cfg: TrainConfig, run: RunDir) -> str:
    """A run stopped with Ctrl-C: the epochs it finished and whether a checkpoint keeps them, and how
    to keep them next time or continue now."""
    epochs = sum(1 for event in json_records(run.metrics) if event.get("event") == "epoch")
    done = f"interrupted after {epochs} of {cfg.epochs} epoch(s)"
    if (run.path / CHECKPOINT_NAME).exists():
        return f"{done}; its checkpoint keeps its work: the same command with --resume continues from it"
    if cfg.checkpoint_every:
        return (
            f"{done}, before its first checkpoint (--checkpoint-every {cfg.checkpoint_every}): a shorter interval "
            "keeps more, and the same command with --resume continues from it"
        )
    return (
        f"{done}, with no checkpoint to continue from; --checkpoint-every 1 (or Nsteps) keeps one, and then "
        "the same command with --resume continues an interrupted run"
    )


def _resolved_config(cfg: TrainConfig, placement: Placement, data: Any) -> dict[str, Any]:
    """config.json: every TrainConfig field as given, and `resolved`, what the launcher decided
    (strategy, batch, backend, device, threads and cores per rank, sample counts, the identity)."""
    return {
        **cfg.model_dump(mode="json"),
        "resolved": {
            "strategy": cfg.strategy_name,
            "global_batch_size": cfg.global_batch_size,
            "reference_batch_size": cfg.reference_batch_size,
            "backend": placement.backend,
            "device": placement.device_type,
            "threads_per_worker": placement.threads_per_worker,
            "cpu_sets": placement.cpu_sets,
            "identity": cfg.identity(),
            "train_samples": len(data.train),
            "test_samples": len(data.test),
            "val_samples": len(data.val) if data.val is not None else 0,
            **({"data": data.info} if data.info else {}),
        },
    }


def _default_run_dir(cfg: TrainConfig) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{cfg.workload}-w{cfg.workers}"


def _check_saved_model(cfg: TrainConfig, data: Any, sharded: Path) -> None:
    """A sharded checkpoint holds the model this run builds: the same parameter names. (The configuration's
    identity does not cover a model's code: a factory edited since, or gpt before q, k and v were split.)"""
    import torch
    from torch.distributed.checkpoint import FileSystemReader

    from paratrain.workloads import build_model

    keys = FileSystemReader(sharded).read_metadata().state_dict_metadata
    saved = {k[len("model.") :] for k in keys if k.startswith("model.")}
    with torch.device("meta"):
        names = [name for name, _ in build_model(cfg, data).named_parameters()]
    missing = [name for name in names if name not in saved]
    if missing:
        fused = (
            " (it was written before paratrain split gpt's fused qkv projection)"
            if any(".attn.qkv." in k for k in saved)
            else ""
        )
        raise UsageError(
            f"--resume: the checkpoint in {sharded.parent.parent} holds a different model: it has no {missing[0]}"
            f"{fused}; resume it with the code that wrote it, or start a new --run-dir"
        )


def _prepare_run_dir(run: RunDir, cfg: TrainConfig, device_type: str, data: Any) -> None:
    path = run.path
    if cfg.resume:
        if not run.is_run():
            raise UsageError(f"--resume: {path} holds no run to resume; run without --resume first")
        if _finished(run) and not (path / CHECKPOINT_NAME).exists():
            raise UsageError(f"--resume: {path} holds a finished run, with nothing to resume; choose a new --run-dir")
        ckpt = load_checkpoint(path / CHECKPOINT_NAME)
        before = run.read_config()
        # A sharded checkpoint, or a pipeline's (the whole model), also resumes at another layout of the same run
        # (TrainConfig.resumes_at_another_layout).
        if ckpt["identity"] != cfg.identity() and not (
            ("dcp" in ckpt or "pipeline" in ckpt) and cfg.resumes_at_another_layout(before, ckpt["identity"])
        ):
            now = cfg.model_dump(mode="json")
            # What may change for this kind of checkpoint is not named: the layout of a pipeline's, the ranks of fsdp's.
            relaid = (
                STAGED_LAYOUT_FIELDS
                if "pipeline" in ckpt and cfg.strategy_name in STAGED_STRATEGIES
                else cfg.reshardable_fields()
            )
            changed = [k for k in now if k not in (*RUN_CONTROL_FIELDS, "device", *relaid) and before.get(k) != now[k]]
            diffs = [f"--{k.replace('_', '-')} {before.get(k)} -> {now[k]}" for k in changed]
            if relaid:  # the ranks or the layout may change, the global batch and its LR may not
                resolved = before.get("resolved", {})
                diffs += [
                    f"the {k.replace('_', ' ')} {resolved.get(k)} -> {getattr(cfg, k)}"
                    for k in ("global_batch_size", "reference_batch_size")
                    if resolved.get(k) != getattr(cfg, k)
                ]
            what = ", ".join(diffs) or "the configuration"
            raise UsageError(
                f"--resume: the checkpoint in {path} was written by a different configuration ({what}); "
                "rerun the original command with --resume"
            )
        if "dcp" in ckpt:
            _check_saved_model(cfg, data, path / ckpt["dcp"])
        # Random-number generator states and the fp16 grad scaler are device-specific: a checkpoint
        # resumes only on the kind of device that wrote it (older checkpoints did not say: CPU).
        written_on = ckpt.get("device", "cpu")
        if written_on != device_type:
            raise UsageError(
                f"--resume: the checkpoint in {path} was written by {written_on} ranks and this run would use "
                f"{device_type}; resume with --device {written_on} on a machine that has it, or start a new --run-dir"
            )
        return
    if path.exists() and (not path.is_dir() or run_dir_entries(path)):
        if _finished(run):
            raise UsageError(f"{path} holds a finished run; choose a new --run-dir for this one")
        if (path / CHECKPOINT_NAME).exists():
            raise UsageError(
                f"{path} holds a run that did not finish; pass --resume to continue it from its checkpoint, or "
                "choose a new --run-dir"
            )
        if run.is_run():
            raise UsageError(
                f"{path} holds a run that did not finish, with no checkpoint to resume; choose a new --run-dir"
            )
        raise UsageError(f"{path} already exists and is not empty; choose a new --run-dir")


def _finished(run: RunDir) -> bool:
    """Whether the run directory holds a run that completed (a damaged summary.json: not known to)."""
    try:
        return run.summary.is_file() and run.read_summary().get("status") == "completed"
    except (ValueError, AttributeError):
        return False
