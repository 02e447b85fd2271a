"""The resume identity, pinned (issue #25): what must refuse a resume (anything that shapes the
trajectory) and what must not (where to write, how often to log, the device kind's name, and for
fsdp how the same global batch is split over the ranks)."""

import pytest

from paratrain.config import RUN_CONTROL_FIELDS, TrainConfig

BASE = dict(workload="synthetic-cnn", workers=2, batch_size=32, lr=0.1, epochs=3)


def identity(**changes) -> str:
    return TrainConfig(**{**BASE, **changes}).identity()


@pytest.mark.parametrize(
    "field,value",
    [
        ("run_dir", "elsewhere"),
        ("log_every", 7),
        ("checkpoint_every", 3),
        ("quiet", True),
        ("monitor_hz", 10),
        ("max_restarts", 2),
        ("device", "cpu"),
        ("memory_limit", "2G"),
    ],
)
def test_run_control_does_not_refuse_a_resume(field, value):
    assert identity(**{field: value}) == identity()


@pytest.mark.parametrize(
    "field,value",
    [
        ("lr", 0.2),
        ("epochs", 4),
        ("seed", 1),
        ("batch_size", 16),
        ("workers", 1),
        ("optimizer", "adam"),
        ("lr_scaling", "sqrt"),
        ("warmup_epochs", 1),
    ],
)
def test_what_shapes_the_trajectory_refuses_a_resume(field, value):
    assert identity(**{field: value}) != identity()


def test_a_default_given_explicitly_is_the_same_run():
    # fields at their defaults are left out: an option added later with a default keeps old checkpoints valid
    assert identity(seed=TrainConfig.model_fields["seed"].default) == identity()


def test_fsdp_may_resume_on_other_ranks_with_the_same_global_batch():
    fsdp = dict(strategy="fsdp", base_batch_size=32)
    assert identity(**fsdp, workers=4, batch_size=16) == identity(**fsdp)  # 2 x 32 = 4 x 16
    assert identity(**fsdp, workers=4, batch_size=32) != identity(**fsdp)  # the global batch changed
    # the LR's reference batch must stay: 32 before, 64 now
    assert identity(strategy="fsdp", base_batch_size=64) != identity(**fsdp)
    # without --base-batch-size the reference is the per-rank batch, which the split changes: refused
    assert identity(strategy="fsdp", workers=4, batch_size=16) != identity(strategy="fsdp")
    # ddp does not reshard: other ranks, same global batch, is another run
    assert identity(workers=4, batch_size=16) != identity()


def test_run_control_fields_listed():
    assert {"run_dir", "resume", "log_every", "checkpoint_every", "nodes", "rdzv"} <= set(RUN_CONTROL_FIELDS)
