"""Steps that keep slowing down, or got slower at one step (launch/step_trend.py, doctor/growth.py), on hand-made
steps: the line or the jump fitted through the medians of runs of a phase's steady steps, and the saving of that
phase held at the line's time at the first step, or at its level before the jump. Each case is computed by hand."""

import pytest
from test_formulas_causes import findings, step
from test_formulas_doctor import probed_run, with_machine_load

from paratrain.launch.probe_summary import rank_record
from paratrain.launch.step_trend import trends


def growth(used):
    return trends(used).get("growing")


def steps(forward, count=40, first=10):
    """Steady steps numbered from `first`: forward(k) seconds at step k, backward 10 ms."""
    return [
        {"step": k, "forward": forward(k), "backward": 0.01, "wall_s": forward(k) + 0.01}
        for k in range(first, first + count)
    ]


def test_a_phase_on_a_rising_line_is_fitted_back_to_the_runs_first_step():
    # forward 2 ms + 0.5 ms a step, steps 10-49: the line at step 0 is 2 ms, at step 49 26.5 ms, R² 1
    found = growth(steps(lambda k: 0.002 + 0.0005 * k))
    assert list(found) == ["forward"]
    assert found["forward"] == pytest.approx([0.002, 0.0265, 1.0])


def test_flat_noisy_short_or_small_growth_is_no_growth():
    assert growth(steps(lambda k: 0.01)) is None  # flat
    # noise: the runs' medians (4 steps each, 10 to 14 ms alternately) are 12 ms all, no line
    assert growth(steps(lambda k: 0.01 + (0.004 if k % 2 else 0.0))) is None
    # 2 ms, but 30 ms at the last 5 steps (a slow tail): one run's median at 30 ms, nine at 2: no line (R² 0.27), and
    # no jump either (a new level needs two runs)
    assert trends(steps(lambda k: 0.03 if k >= 45 else 0.002)) == {}
    assert growth(steps(lambda k: 0.03 if k >= 45 else 0.002)) is None
    assert growth(steps(lambda k: 0.002 + 0.0005 * k, count=19)) is None  # fewer than 20 steps
    # from 20 ms at step 0 to 20 + 49 x 0.04 = 21.96 ms: under 1.5 times
    assert growth(steps(lambda k: 0.02 + 0.00004 * k)) is None
    # 1 ms + 0.02 ms a step: 1.98 ms at step 49, 1.98x, but under 2 ms longer
    assert growth(steps(lambda k: 0.001 + 0.00002 * k)) is None


def test_a_machine_slowing_down_is_no_growth_but_a_phase_growing_beyond_it_is():
    # the VM slows through the run: forward and backward both 16 ms + 0.2 ms a step (R² 1; 1.61x from the line at
    # step 0 to step 49, growth on its own): backward drifted 1.43x from step 10 to 49, and 1.61 < 1.5 x 1.43
    def slowing(k):
        return {"step": k, "forward": 0.016 + 0.0002 * k, "backward": 0.016 + 0.0002 * k}

    assert growth([slowing(k) for k in range(10, 50)]) is None
    # forward 2 ms + 0.5 ms a step (26.5 ms at step 49, 13x) while backward drifts 1.43x: it grows beyond the drift
    grows = [{**slowing(k), "forward": 0.002 + 0.0005 * k} for k in range(10, 50)]
    assert list(growth(grows)) == ["forward"]
    # steps 0-39, forward 2 to 21.5 ms; backward 0.05 to 0.83 ms (16.6x): a drift under a millisecond of work is
    # too small to read, and forward's own growth is no drift of the machine: forward grows
    tiny = [{"step": k, "forward": 0.002 + 0.0005 * k, "backward": 0.00005 + 0.00002 * k} for k in range(40)]
    assert list(growth(tiny)) == ["forward"]


def test_a_rank_record_keeps_its_growing_phases():
    records = [
        {
            "kind": "step",
            "samples": 8,
            "micro": 1,
            "data_cpu": 0.0,
            "eval": 0.0,
            "checkpoint": 0.0,
            "ddp_overhead": 0.0,
            **s,
        }
        for s in steps(lambda k: 0.002 + 0.0005 * k, first=0)
    ]
    assert rank_record(0, records)["growing"]["forward"][2] == pytest.approx(1.0)
    flat = [{**r, "forward": 0.01} for r in records]
    assert "growing" not in rank_record(0, flat)


def test_the_growth_costs_the_phases_mean_less_its_first_steps_time(tmp_path):
    # forward's mean 30 ms, 5 ms at the first step: 25 ms of a 100 ms step, 25 % saved
    phases = {"forward": 0.03, "backward": 0.05, "optimizer": 0.02}
    rank = step(phases, growing={"forward": [0.005, 0.055, 0.9]})
    found = findings(probed_run(tmp_path / "grows", [rank] * 2))["growing_steps"]
    assert found["saving"] == pytest.approx(0.25) and found["explains"] == {"forward": pytest.approx(0.025)}
    assert "register hooks once" in found["remedy"] and "5.0 ms" in found["finding"]
    # on one rank of two: half of it
    one = findings(probed_run(tmp_path / "one", [rank, step(phases)]))["growing_steps"]
    assert one["saving"] == pytest.approx(0.125)
    # 4.9 ms of 100: under 5 %, nothing said
    little = step(phases, growing={"forward": [0.0251, 0.035, 0.9]})
    assert "growing_steps" not in findings(probed_run(tmp_path / "little", [little] * 2))


def test_on_a_contended_machine_growth_stands_above_the_caveat_only_beyond_the_contention(tmp_path):
    """The first steps against the last are timed at different moments: other work that grew through the run
    makes a phase grow too. The growth (25 % of the step) stands above the caveat at 20 % contention; at 40 %
    it ranks after it."""

    from paratrain.doctor import diagnose

    phases = {"forward": 0.03, "backward": 0.05, "optimizer": 0.02}

    def above(name, other):
        run = probed_run(tmp_path / name, [step(phases, growing={"forward": [0.005, 0.055, 0.9]})] * 2)
        with_machine_load(run, other)
        checks = [f["check"] for f in diagnose(run)["findings"]]
        return checks.index("growing_steps") < checks.index("contended")

    assert above("some", 0.2) and not above("most", 0.4)


def test_a_jump_to_a_new_level_is_no_growth_and_says_where_it_began():
    # forward 2 ms until step 29, 30 ms from step 30 (steps 10-49): the runs' medians jump once, R² 1
    jumped = trends(steps(lambda k: 0.03 if k >= 30 else 0.002))
    assert jumped == {"jumped": {"forward": [30, 0.002, 0.03, 1.0]}}
    # a jump of 30 ms at step 30 on a ramp of 0.4 ms a step: a line fits the medians well (R² 0.85), the jump
    # better (0.99): a jump
    assert list(trends(steps(lambda k: 0.002 + 0.0004 * k + (0.03 if k >= 30 else 0.0)))) == ["jumped"]
    # a ramp is a line, no jump (the jump's R² is lower); outliers (100 ms every 7th step) move no run's median much
    ramp = steps(lambda k: 0.002 + 0.0005 * k + (0.1 if k % 7 == 0 else 0.0))
    assert list(trends(ramp)) == ["growing"] and list(trends(ramp)["growing"]) == ["forward"]

    # the machine slowed at once: forward and backward both 1.6x from step 30, nothing jumped beyond it
    def slowed(k):
        return 0.016 * (1.6 if k >= 30 else 1)

    assert trends([{"step": k, "forward": slowed(k), "backward": slowed(k)} for k in range(10, 50)]) == {}
    # waiting for the other ranks jumps when their work does: no cause here
    comm = [{"step": k, "forward": 0.01, "comm": 0.03 if k >= 30 else 0.002} for k in range(10, 50)]
    assert trends(comm) == {}


def test_the_jump_costs_the_phases_mean_less_its_level_before_a_bound(tmp_path):
    # other's mean 30 ms, 5 ms before step 200: 25 ms of a 100 ms step, up to 25 % saved; the profiled steps (up to
    # step 8) came before it
    phases = {"forward": 0.03, "backward": 0.04, "other": 0.03}
    rank = step(phases, jumped={"other": [200, 0.005, 0.045, 0.98]})
    found = findings(probed_run(tmp_path / "jumps", [rank] * 2))["slower_from_step"]
    assert (
        found["saving"] == pytest.approx(0.25)
        and found["bound"]
        and found["explains"] == {"other": pytest.approx(0.025)}
    )
    assert "step 200" in found["remedy"] and "came before it" in found["evidence"]
    one = findings(probed_run(tmp_path / "one", [rank, step(phases)]))["slower_from_step"]
    assert one["saving"] == pytest.approx(0.125)
    little = step(phases, jumped={"other": [200, 0.0251, 0.035, 0.98]})
    assert "slower_from_step" not in findings(probed_run(tmp_path / "little", [little] * 2))
