"""The planner's walk of a step's collectives beside its compute (plan/overlap.py, issue #59), on hand-computed
timelines with round numbers: each case's link and compute are written out in the comments."""

import pytest

from paratrain.plan.overlap import ShardedUnit, ddp_comm_s, ddp_exposed_s, fsdp_exposed_s

MiB = 2**20


def test_units_whose_compute_outlasts_their_collectives_expose_only_the_ends():
    # root: gather 1, scatter 1, no compute; two units: gather 1, scatter 1, forward 10, backward 20.
    # forward: root's gather [0, 1]; unit 0's gather issued at 0 runs [1, 2], its forward [2, 12]; unit 1's gather
    # issued as unit 0 starts (2) runs [2, 3], its forward [12, 22]. backward: unit 1's gather issued at 22 runs
    # [22, 23], its backward [23, 43] (the root's backward is empty: nothing hides that gather); unit 0's gather
    # [23, 24] is hidden; unit 1's scatter [43, 44]; unit 0's backward [43, 63], its scatter [63, 64], the root's
    # [64, 65]. 65 - 60 of compute: the root's and unit 0's gathers, unit 1's gather in backward, two scatters.
    root = ShardedUnit(1.0, 1.0, 0.0, 0.0)
    unit = ShardedUnit(1.0, 1.0, 10.0, 20.0)
    assert fsdp_exposed_s(root, [unit, unit], reshard_after_forward=True) == pytest.approx(5.0)
    # without resharding backward gathers nothing: unit 1's backward [22, 42], scatter [42, 43]; unit 0's
    # backward [42, 62], scatter [62, 63]; the root's [63, 64]
    assert fsdp_exposed_s(root, [unit, unit], reshard_after_forward=False) == pytest.approx(4.0)


def test_units_whose_collectives_outlast_their_compute_expose_nearly_all_of_them():
    # root: gather 10, scatter 10; two units: gather 10, scatter 10, forward 1, backward 2.
    # forward: root's gather [0, 10]; unit 0's [10, 20], forward [20, 21]; unit 1's gather [20, 30], forward
    # [30, 31]. backward: unit 1's gather [31, 41], backward [41, 43]; unit 0's gather (issued at 41) [41, 51];
    # unit 1's scatter (issued at 43) [51, 61]; unit 0's backward [51, 53], scatter [61, 71]; the root's [71, 81].
    # The link idles only in [30, 31]: 81 - 6 of compute.
    root = ShardedUnit(10.0, 10.0, 0.0, 0.0)
    unit = ShardedUnit(10.0, 10.0, 1.0, 2.0)
    assert fsdp_exposed_s(root, [unit, unit], reshard_after_forward=True) == pytest.approx(75.0)


def test_the_roots_compute_hides_the_last_units_backward_gather():
    # as the first case, with the root computing forward 5 (after the units) and backward 10 (before them):
    # forward ends at 27; unit 1's backward gather [27, 28] hides behind the root's backward [27, 37]; unit 1's
    # backward [37, 57] (unit 0's gather hidden), scatter [57, 58]; unit 0's backward [57, 77], scatter [77, 78];
    # the root's [78, 79]. 79 - 75 of compute: the two gathers before any compute and two scatters.
    root = ShardedUnit(1.0, 1.0, 5.0, 10.0)
    unit = ShardedUnit(1.0, 1.0, 10.0, 20.0)
    assert fsdp_exposed_s(root, [unit, unit], reshard_after_forward=True) == pytest.approx(4.0)


def ten_ms_a_mib(size: float) -> float:
    return 0.01 * size / MiB


def test_ddp_buckets_are_all_reduced_as_backward_fills_them():
    # 55 MiB of gradients: buckets of 1, 25, 25 and 4 MiB, filled over a 1 s backward at 55 MiB/s. The 1 MiB one
    # fills at 1/55 s and takes 10 ms; the 25 MiB ones fill at 26/55 and 51/55 s and take 250 ms each: the second
    # waits for the first, to 0.7227 s, and ends at 51/55 + 0.25 = 1.1773 s; the last 4 MiB, filled at 1 s, waits
    # for it and ends 40 ms later.
    assert ddp_exposed_s(55 * MiB, ten_ms_a_mib, 1.0) == pytest.approx(51 / 55 + 0.25 + 0.04 - 1.0)
    assert ddp_comm_s(55 * MiB, ten_ms_a_mib) == pytest.approx(0.55)
    # a 10 s backward fills a 25 MiB bucket every 4.5 s: only the last bucket, filled as backward ends, is exposed
    assert ddp_exposed_s(55 * MiB, ten_ms_a_mib, 10.0) == pytest.approx(0.04)
    # gradients under 1 MiB: one bucket, all-reduced once backward is done
    assert ddp_exposed_s(MiB / 2, ten_ms_a_mib, 1.0) == pytest.approx(0.005)
    assert ddp_exposed_s(0.0, ten_ms_a_mib, 1.0) == ddp_comm_s(0.0, ten_ms_a_mib) == 0.0


def test_each_bucket_pays_its_own_latency():
    # 1 ms a call whatever its size: 1 + 2 + 1 buckets for 1 MiB + 2 x 25 MiB + 1 B
    assert ddp_comm_s(51 * MiB + 1, lambda size: 1e-3) == pytest.approx(4e-3)
