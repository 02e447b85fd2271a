"""Links and commbench's fit, pinned exactly (issue #25): the figures a plan is made of and the
alpha-beta fit that replaces them. Expected values are worked out by hand in the comments."""

import json
import math

import pytest
import torch

from paratrain.commbench import BUS_FACTOR, fit_alpha_beta, fit_regimes, lag_share, regime_for
from paratrain.errors import UsageError
from paratrain.plan.links import (
    LINKS,
    NCCL_BASE_LATENCY_S,
    SHM_LATENCY_S,
    commbench_link,
    custom_link,
    get_link,
    shm_link,
)


@pytest.mark.parametrize(
    "name,gbytes,latency_us,kind",
    [
        ("nvlink3", 300, 3.4, "NVLink"),
        ("nvlink4", 450, 3.4, "NVLink"),
        ("pcie4", 31.5, 5.7, "PCIe"),
        ("ib-hdr", 25.0, 9.6, "network"),
        ("25gbe", 3.125, 9.6, "network"),
    ],
)
def test_table_links_are_per_direction_bytes_and_nccls_step_latency(name, gbytes, latency_us, kind):
    link = get_link(name)
    # the plan prints the link's name and where each figure comes from
    assert link.name == name and link.source.endswith(f"hwLat {kind} {latency_us:g} us per step")
    assert link.bandwidth == pytest.approx(gbytes * 1e9, rel=1e-12)
    assert link.latency == pytest.approx(latency_us * 1e-6, rel=1e-12)
    assert link.base_latency == NCCL_BASE_LATENCY_S == pytest.approx(8.4e-6, rel=1e-12)


def test_unknown_link_names_the_choices():
    with pytest.raises(UsageError, match=r"unknown interconnect 'nvlink9'.*nvlink1"):
        get_link("nvlink9")
    assert len(LINKS) == 12


def test_shared_memory_link_is_half_the_copy_bandwidth_and_one_latency_a_collective():
    link = shm_link(10e9)
    assert (link.bandwidth, link.latency, link.base_latency) == (5e9, 0.0, SHM_LATENCY_S)
    assert link.name == "shm" and link.source.startswith("bandwidth: half the core's measured copy bandwidth")
    assert SHM_LATENCY_S == pytest.approx(0.17e-3, rel=1e-12)


def test_custom_links_are_gigabits_over_8_with_nvlink_or_network_latency():
    intra, inter = custom_link("intra-node", 100), custom_link("inter-node", 200)
    assert intra.bandwidth == pytest.approx(12.5e9, rel=1e-12) and intra.latency == pytest.approx(3.4e-6, rel=1e-12)
    assert inter.bandwidth == pytest.approx(25e9, rel=1e-12) and inter.latency == pytest.approx(9.6e-6, rel=1e-12)
    assert intra.base_latency == NCCL_BASE_LATENCY_S
    assert (intra.name, inter.name) == ("intra-node", "inter-node")
    assert intra.source.startswith("bandwidth: given on the command line (100 Gb/s); latency: NVIDIA/nccl")


@pytest.mark.parametrize(
    "op,n,factor",
    [
        ("all_reduce", 2, 1.0),
        ("all_reduce", 4, 1.5),
        ("all_reduce", 8, 1.75),
        ("all_gather", 2, 0.5),
        ("all_gather", 4, 0.75),
        ("reduce_scatter", 8, 0.875),
        ("broadcast", 8, 1.0),
    ],
)
def test_commbench_bus_factors_per_collective_and_rank_count(op, n, factor):
    # nccl-tests PERFORMANCE.md: 2(n-1)/n for all-reduce, (n-1)/n for all-gather / reduce-scatter, 1 for broadcast
    assert BUS_FACTOR[op](n) == pytest.approx(factor, rel=1e-12)


def write(tmp_path, data) -> str:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    return path


def test_commbench_link_is_the_fit_times_the_all_reduce_bus_factor(tmp_path):
    # algorithm bandwidth 1 GB/s on 4 ranks: the ring's link carries 2(3)/4 = 1.5 GB/s; alpha is
    # charged once a collective, no per-step latency
    link = commbench_link(write(tmp_path, {"fit": {"alpha_s": 2e-5, "beta_bytes_per_s": 1e9, "ranks": 4}}), 1e6)
    assert link.bandwidth == pytest.approx(1.5e9, rel=1e-12)
    assert (link.latency, link.base_latency) == (0.0, 2e-5)
    assert link.name == "commbench:bench.json"
    assert link.source.endswith("bench.json (alpha 20.0 us, 4 ranks)")  # one line: no regime named
    # no ranks in the file: 2 (factor 1); the fit at the top level is read too
    two = commbench_link(write(tmp_path, {"alpha_s": 1e-5, "beta_bytes_per_s": 3e9}), 1e6)
    assert two.bandwidth == pytest.approx(3e9, rel=1e-12)
    # ranks beside the fit, not in it
    eight = commbench_link(write(tmp_path, {"ranks": 8, "fit": {"alpha_s": 1e-5, "beta_bytes_per_s": 1e9}}), 1e6)
    assert eight.bandwidth == pytest.approx(1.75e9, rel=1e-12)


def test_commbench_link_takes_the_regime_of_the_step_s_message(tmp_path):
    fit = {
        "alpha_s": 9.0,
        "beta_bytes_per_s": 9.0,
        "ranks": 2,
        "regimes": [
            {"up_to_bytes": 2**20, "alpha_s": 1e-5, "beta_bytes_per_s": 1e8},
            {"up_to_bytes": None, "alpha_s": 1e-4, "beta_bytes_per_s": 1e9},
        ],
    }
    path = write(tmp_path, {"fit": fit})
    small, exactly, large = (commbench_link(path, size) for size in (1e3, 2**20, 2**20 + 1))
    assert (small.bandwidth, small.base_latency) == (1e8, 1e-5)
    assert (exactly.bandwidth, exactly.base_latency) == (1e8, 1e-5)  # a regime includes its largest size
    assert (large.bandwidth, large.base_latency) == (1e9, 1e-4)
    assert exactly.source.endswith("(alpha 10.0 us, 2 ranks, the regime of 1.0 MiB messages)")
    # a fit of one regime names none
    single = write(tmp_path, {"fit": {"alpha_s": 1e-5, "beta_bytes_per_s": 1e8, "regimes": fit["regimes"][1:]}})
    assert commbench_link(single, 1e3).source.endswith("(alpha 100.0 us, 2 ranks)")


def test_commbench_link_without_a_bandwidth_term_is_latency_bound(tmp_path):
    link = commbench_link(write(tmp_path, {"fit": {"alpha_s": 3e-5, "beta_bytes_per_s": None}}), 1e6)
    assert link.bandwidth == math.inf and link.base_latency == 3e-5


@pytest.mark.parametrize("content", ['{"fit": {"alpha_s": 1}}', "[1, 2]", "not json"])
def test_commbench_link_refuses_what_is_not_a_fit(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(UsageError, match="--interconnect"):
        commbench_link(path, 1e6)


# -- commbench's fit ----------------------------------------------------------------------------


def test_alpha_beta_fit_recovers_an_exact_line():
    points = [(n, 1e-4 + n / 1e9) for n in (1024, 4096, 65536, 2**20)]
    fit = fit_alpha_beta(points)
    assert fit["alpha_s"] == pytest.approx(1e-4, rel=1e-9)
    assert fit["beta_bytes_per_s"] == pytest.approx(1e9, rel=1e-9)
    assert max(map(abs, fit["errors"])) < 1e-9


def test_alpha_beta_fit_with_a_negative_latency_refits_through_zero():
    # (1000 B, 1 us), (2000 B, 3 us): the free line is -1 us + 2 ns/B. In relative error, with alpha
    # at 0: rows x = n / t = 1e9 and 2e9/3; g = sum(x) / sum(x^2) = (5e9/3) / (13e18/9) = 15 / 13e9
    fit = fit_alpha_beta([(1000, 1e-6), (2000, 3e-6)])
    assert fit["alpha_s"] == 0.0
    assert fit["beta_bytes_per_s"] == pytest.approx(13e9 / 15, rel=1e-9)


def test_alpha_beta_fit_with_a_negative_slope_is_latency_only():
    # (1000 B, 20 us), (2000 B, 10 us): the free slope is negative; alpha alone: rows 1/t = 5e4, 1e5;
    # alpha = sum(1/t) / sum(1/t^2) = 1.5e5 / 1.25e10 = 12 us; no bandwidth term
    fit = fit_alpha_beta([(1000, 2e-5), (2000, 1e-5)])
    assert fit["alpha_s"] == pytest.approx(1.2e-5, rel=1e-9)
    assert fit["beta_bytes_per_s"] is None


def test_regimes_one_line_when_it_fits_and_a_cut_where_it_does_not():
    line = [(n, 1e-4 + n / 1e9) for n in (2**10, 2**12, 2**14, 2**16, 2**18, 2**20)]
    one = fit_regimes(line)
    assert len(one["regimes"]) == 1 and one["regimes"][0]["up_to_bytes"] is None
    assert one["regimes"][0]["alpha_s"] == pytest.approx(1e-4, rel=1e-9)
    # three sizes on a latency-bound line (1 ms), three on a bandwidth-bound one that starts below
    # it (64 KiB in 0.66 ms): no line fits both within 15 %, and the only allowed cut (3 sizes a
    # regime) is after the third
    small = [(n, 1e-3 + n / 1e11) for n in (2**10, 2**12, 2**14)]
    large = [(n, 1e-5 + n / 1e8) for n in (2**16, 2**18, 2**20)]
    two = fit_regimes(large + small)  # any order: sorted first
    assert [r["up_to_bytes"] for r in two["regimes"]] == [2**14, None]
    assert two["regimes"][0]["alpha_s"] == pytest.approx(1e-3, rel=1e-6)
    assert two["regimes"][0]["beta_bytes_per_s"] == pytest.approx(1e11, rel=1e-6)
    assert two["regimes"][1]["beta_bytes_per_s"] == pytest.approx(1e8, rel=1e-6)
    assert max(map(abs, two["errors"])) < 1e-6


def test_regime_for_takes_the_first_whose_largest_size_it_does_not_exceed():
    regimes = [{"up_to_bytes": 100, "id": 0}, {"up_to_bytes": 1000, "id": 1}, {"up_to_bytes": None, "id": 2}]
    assert [regime_for(regimes, n)["id"] for n in (1, 100, 101, 1000, 1001, 1e12)] == [0, 0, 1, 1, 2, 2]


def _line(sizes, alpha, beta):
    return [(n, alpha + n / beta) for n in sizes]


def _regime_lengths(points, result):
    """How many of the measured sizes each regime covers."""
    sizes = sorted(n for n, _ in points)
    ends = [
        sizes.index(r["up_to_bytes"]) + 1 if r["up_to_bytes"] is not None else len(sizes) for r in result["regimes"]
    ]
    return [b - a for a, b in zip([0, *ends], ends)]


def test_regimes_three_when_two_do_not_fit_and_never_more_than_three():
    # Three lines of three sizes each, 10x apart in latency and bandwidth: two lines cannot fit
    # all nine within 15 %, three fit exactly, cut after the third and the sixth size.
    sizes = [2**k for k in range(10, 19)]
    points = _line(sizes[:3], 1e-3, 1e12) + _line(sizes[3:6], 1e-4, 1e10) + _line(sizes[6:], 1e-5, 1e8)
    three = fit_regimes(points)
    assert _regime_lengths(points, three) == [3, 3, 3] and max(map(abs, three["errors"])) < 1e-6
    # Four such lines over twelve sizes: at most three regimes, the best split of three (its worst size
    # off by more than 15 %), never a fourth.
    sizes = [2**k for k in range(10, 22)]
    points = (
        _line(sizes[:3], 1e-2, 1e13)
        + _line(sizes[3:6], 1e-3, 1e11)
        + _line(sizes[6:9], 1e-4, 1e9)
        + _line(sizes[9:], 1e-5, 1e7)
    )
    capped = fit_regimes(points)
    assert len(capped["regimes"]) == 3 and max(map(abs, capped["errors"])) > 0.15


def test_regimes_keep_three_sizes_each_even_around_an_outlier():
    # Seven sizes on one line, the fourth measured 3x slow: a regime of that size alone would fit
    # perfectly, but a regime has at least three sizes.
    points = _line([2**k for k in range(10, 17)], 1e-4, 1e9)
    points[3] = (points[3][0], 3 * points[3][1])
    result = fit_regimes(points)
    assert all(length >= 3 for length in _regime_lengths(points, result))


def test_regimes_stop_at_the_fewest_lines_that_fit():
    # Within 6 % of one line at every size: one regime, though two would fit closer.
    points = [
        (n, t * (1.06 if i % 2 else 0.94)) for i, (n, t) in enumerate(_line([2**k for k in range(10, 16)], 1e-4, 1e9))
    ]
    assert len(fit_regimes(points)["regimes"]) == 1
    # Fewer sizes than a regime needs: still one line through them.
    assert len(fit_regimes([(1000, 1e-6), (2000, 2e-6)])["regimes"]) == 1


def test_message_sizes_double_from_the_smallest_up_to_the_largest():
    from paratrain.commbench import message_sizes

    assert message_sizes(4, 64) == [4, 8, 16, 32, 64]
    assert message_sizes(4, 63) == [4, 8, 16, 32]
    assert message_sizes(8, 8) == [8]


def test_the_arrival_lag_is_the_median_groups_so_that_one_stretch_of_cores_apart_does_not_stand_for_the_machine():
    """2 ranks, 6 calls in 3 groups of 2, rank 0 computing 100 ms before each. Rank 1 arrives 2 ms later (the last
    arrival 1 ms after the mean, whose compute is 101 ms) but for calls 3 and 4, 40 ms later (20 ms after a mean
    of 120 ms). Group shares: (1 + 1) / 202 = 1.0 %; 40 / 240 = 17 %; 1.0 %: the median 1.0 %. Pooled over all six,
    as before: (4 x 1 + 2 x 20) / (4 x 101 + 2 x 120) = 6.8 %."""
    begun = torch.zeros(2, 6, dtype=torch.float64)
    late = torch.tensor([0.002, 0.002, 0.040, 0.040, 0.002, 0.002], dtype=torch.float64)
    arrived = torch.stack([torch.full((6,), 0.1, dtype=torch.float64), 0.1 + late])
    # each rank's compute: 100 ms and 100 ms + lateness; the mean's compute (100 + late / 2) ms
    assert lag_share(begun, arrived, 3) == pytest.approx(0.001 / 0.101)
    assert lag_share(begun, arrived, 1) == pytest.approx((4 * 0.001 + 2 * 0.020) / (6 * 0.1 + 4 * 0.001 + 2 * 0.020))
