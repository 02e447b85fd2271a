"""The doctor's predicted gains for launched scripts, pinned by hand (issue #25): each check of
doctor/script_checks.py on a probe block written by hand (`probed_run`: no run is launched), and the
shared helpers of doctor/finding.py. Each expected number is worked out in the comment above it from
the check's stated model (its docstring, docs/doctor.md's table), never copied from the code's output.
Fast: scripts/mutate.py runs it for every mutant of those two modules."""

import json

import pytest


def with_machine_load(run, other):
    """The run's summary as the launcher writes it when other work took `other` of its 2 cores over 10 s."""
    summary = json.loads((run / "summary.json").read_text())
    summary["machine_load"] = {
        "cores": 2,
        "wall_s": 10.0,
        "run_cpu_s": 20 * (1 - other),
        "other_cpu_s": 20 * other,
        "steal_s": 0.0,
        "other_fraction": other,
        "contended": True,
    }
    (run / "summary.json").write_text(json.dumps(summary))


def probed_run(tmp_path, ranks, config=None, probe=None):
    """A run directory whose summary holds the probe block of `ranks` (seconds per step by phase);
    `config`: entries added to its config.json; `probe`: to the probe block."""
    from paratrain.launch.probe import PHASES

    full = [
        {
            "rank": i,
            "steps": 100,
            "steady_steps": 90,
            "threads": 1,
            "cpu_affinity": 1,
            "ddp": True,
            "rounds_per_step": 1.0,
            "micro_per_step": 1.0,
            "data_cpu_s": 0.0,
            "checkpoint_steps": 0,
            "gradient_bytes": 2**20,
            "ddp_overhead_s": 0.0,
            **r,
            "phases_s": {p: r["phases_s"].get(p, 0.0) for p in PHASES},
            "step_s": sum(r["phases_s"].values()),
        }
        for i, r in enumerate(ranks)
    ]
    tmp_path.mkdir()
    (tmp_path / "config.json").write_text(
        json.dumps({"script": "train.py", "workers": len(ranks), "resolved": {}, **(config or {})})
    )
    (tmp_path / "summary.json").write_text(
        json.dumps(
            {
                "status": "completed",
                "workers": len(ranks),
                "breakdown": {"data_s": 0.0},
                "probe": {
                    "status": "on",
                    "ranks": full,
                    "phases_s": {p: sum(r["phases_s"][p] for r in full) / len(full) for p in PHASES},
                    **(probe or {}),
                },
            }
        )
    )
    return tmp_path


def test_predicted_gains_of_the_probed_checks_by_hand(tmp_path):
    from paratrain.doctor import rank_checks as rc
    from paratrain.doctor import script_checks as sc
    from paratrain.doctor.evidence import read_run

    # data: 40 ms a step of which 10 ms CPU, no spare core: the 30 ms of waiting overlaps -> 30/100.
    ev = read_run(
        probed_run(
            tmp_path / "a", [{"phases_s": {"data": 0.04, "forward": 0.03, "backward": 0.03}, "data_cpu_s": 0.01}] * 2
        )
    )
    assert sc.data_wait(ev).saving == pytest.approx(0.03 / 0.10)
    # exposed all-reduce: the least-waiting rank's 30 ms of a 100 ms step; k=4 is the first with comm <= 10 %
    # (30 / (4 x 70 + 30) = 9.7 %; k=2: 17.6 %): per 4 micro-steps 4 x 70 + 30 = 310 ms against 400 ms.
    ev = read_run(
        probed_run(
            tmp_path / "b",
            [
                {"phases_s": {"forward": 0.03, "backward": 0.04, "comm": 0.03}},
                {"phases_s": {"forward": 0.03, "backward": 0.02, "comm": 0.05}},
            ],
        )
    )
    assert sc.exposed_communication(ev).saving == pytest.approx(1 - 0.31 / 0.4)
    # four rounds per step, 40 ms exposed (least of the ranks): three of four go -> 30/100.
    ev = read_run(
        probed_run(
            tmp_path / "c",
            [
                {
                    "phases_s": {"forward": 0.03, "backward": 0.03, "comm": 0.04},
                    "rounds_per_step": 4.0,
                    "micro_per_step": 4.0,
                }
            ]
            * 2,
        )
    )
    assert sc.all_reduce_every_micro_step(ev).saving == pytest.approx(0.03 / 0.10)
    # rank 1 works 80 ms against rank 0's 50 ms (which waits 30 ms): the 30 ms go -> 30/80 (mean step 80 ms).
    ev = read_run(
        probed_run(tmp_path / "d", [{"phases_s": {"forward": 0.05, "comm": 0.03}}, {"phases_s": {"forward": 0.08}}])
    )
    assert rc.straggler(ev).saving == pytest.approx(0.03 / 0.08)
    # the waiting rank ran its forward slower (60 ms against the straggler's 40): with equal work each phase
    # takes the fastest rank's time, 40 ms, plus the all-reduce's own 5 ms (the straggler's comm), against the
    # mean step of 98 ms.
    ev = read_run(
        probed_run(
            tmp_path / "d2",
            [
                {"phases_s": {"forward": 0.06, "comm": 0.04}},
                {"phases_s": {"forward": 0.04, "other": 0.051, "comm": 0.005}},
            ],
        )
    )
    assert rc.straggler(ev).saving == pytest.approx(1 - 0.045 / 0.098)
    # the same with the probe's step-by-step all-reduce, 3 ms: 43 ms against 98
    d2 = json.loads((tmp_path / "d2" / "summary.json").read_text())
    d2["probe"]["all_reduce_s"] = 0.003
    (tmp_path / "d2" / "summary.json").write_text(json.dumps(d2))
    assert rc.straggler(read_run(tmp_path / "d2")).saving == pytest.approx(1 - 0.043 / 0.098)
    # ...but not when the other rank's own evaluation or checkpoint (here 12 ms of saving, against an excess of
    # 6 ms) explains why the waiting rank ran cold: the checkpoint check names that cause.
    ev = read_run(
        probed_run(
            tmp_path / "d3",
            [
                {"phases_s": {"forward": 0.016, "checkpoint": 0.012, "comm": 0.006}},
                {"phases_s": {"forward": 0.022, "comm": 0.012}},
            ],
        )
    )
    assert rc.straggler(ev) is None
    # rank 1 runs the same batch with forward (50 ms against 40) and backward (100 against 80) both 1.25x
    # slower: a slower core, not more work. The same model predicts the gain (40 + 80 + 5 ms of rank 1's
    # comm against the step of 155 ms); it is named slow_rank and ranked after the run's own findings.
    ev = read_run(
        probed_run(
            tmp_path / "d4",
            [
                {"phases_s": {"forward": 0.04, "backward": 0.08, "comm": 0.035}, "samples_per_step": 32.0},
                {"phases_s": {"forward": 0.05, "backward": 0.10, "comm": 0.005}, "samples_per_step": 32.0},
            ],
        )
    )
    slow = rc.straggler(ev)
    assert slow.check == "slow_rank" and "1.25x slower" in slow.finding
    assert slow.saving == pytest.approx(1 - 0.125 / 0.155)
    from paratrain.doctor import rank
    from paratrain.doctor.finding import Finding

    smaller = Finding("host_syncs", "", "", "", "", "", 0.05)
    assert [f.check for f in rank([slow, smaller])] == ["host_syncs", "slow_rank"]
    # ...and before advice (docs/doctor.md's order), which had ranked above it.
    advice = Finding("idle_devices", "", "", "", "", "", None, "advice")
    assert [f.check for f in rank([advice, slow, smaller])] == ["host_syncs", "slow_rank", "idle_devices"]
    # ...but extra work in backward alone (forward as fast as the others'), or a bigger batch, is a straggler.
    for name, extra in (
        ("d5", {"phases_s": {"forward": 0.04, "backward": 0.11, "comm": 0.005}, "samples_per_step": 32.0}),
        ("d6", {"phases_s": {"forward": 0.05, "backward": 0.10, "comm": 0.005}, "samples_per_step": 40.0}),
    ):
        ev = read_run(
            probed_run(
                tmp_path / name,
                [{"phases_s": {"forward": 0.04, "backward": 0.08, "comm": 0.035}, "samples_per_step": 32.0}, extra],
            )
        )
        assert rc.straggler(ev).check == "straggler", name
    # rank 0 evaluates 40 ms a step alone on 2 ranks: sharded, half of it goes -> 20/100.
    ev = read_run(
        probed_run(
            tmp_path / "e",
            [{"phases_s": {"forward": 0.06, "eval": 0.04}}, {"phases_s": {"forward": 0.06, "comm": 0.04}}],
        )
    )
    found = sc.evaluation(ev)
    assert found.check == "rank0_alone" and found.saving == pytest.approx(0.02 / 0.10)
    # ...and when the steps holding that evaluation took 50 ms a step longer than plain ones, half of that goes.
    ev = read_run(
        probed_run(
            tmp_path / "e2",
            [
                {"phases_s": {"forward": 0.06, "eval": 0.04}, "eval_excess_s": 0.05},
                {"phases_s": {"forward": 0.06, "comm": 0.04}},
            ],
        )
    )
    assert sc.evaluation(ev).saving == pytest.approx(0.025 / 0.10)
    # checkpoints every 2 steps, 20 ms a step, on rank 0: every 100 steps keeps 2/100 of it -> 19.6/100.
    ev = read_run(
        probed_run(
            tmp_path / "f",
            [
                {"phases_s": {"forward": 0.08, "checkpoint": 0.02}, "checkpoint_steps": 45},
                {"phases_s": {"forward": 0.08, "comm": 0.02}},
            ],
        )
    )
    assert sc.checkpoints(ev).saving == pytest.approx(0.02 * (1 - 2 / 100) / 0.10)
    # threads: the layers ran 2x slower on 4 threads than on 1, a matrix product 1.5x: forward and backward's
    # 60 ms lose half, the optimizer's 20 ms a third -> (30 + 20/3)/100.
    ev = read_run(
        probed_run(
            tmp_path / "t",
            [
                {
                    "phases_s": {"forward": 0.03, "backward": 0.03, "optimizer": 0.02, "other": 0.02},
                    "threads": 4,
                    "fair_threads": 1,
                    "thread_penalty": 1.5,
                    "layer_thread_penalty": 2.0,
                }
            ]
            * 2,
        )
    )
    assert sc.threads(ev).saving == pytest.approx((0.03 + 0.02 / 3) / 0.1)
    # small batch: 2 samples, the layers grow 1 ms a sample (timed at 2 and 32), so 2 of the 20 ms of forward and
    # backward grow (90 % fixed). With the 30 ms of data, 32 ms grow and 68 ms do not: k=8 is the first with
    # 68 / (100 + 7 x 32) <= 25 % (k=4: 35 %): 324 ms per 8 x 2 samples against 800 ms.
    small = {"samples_per_step": 2.0, "batch_slope_s": 0.001, "batch_slope_between": [2, 32]}
    ev = read_run(
        probed_run(
            tmp_path / "g",
            [
                {
                    "phases_s": {
                        "data": 0.03,
                        "forward": 0.01,
                        "backward": 0.01,
                        "comm": 0.03,
                        "optimizer": 0.01,
                        "other": 0.01,
                    },
                    **small,
                }
            ]
            * 2,
        )
    )
    found = sc.small_batch(ev)
    assert found.saving == pytest.approx(1 - 0.324 / 0.8) and "batch_size=16 per rank (8x)" in found.remedy
    # ...no further than the timed range: without the data, 96 ms stay fixed and k stops at 32 / 2 = 16.
    ev = read_run(
        probed_run(
            tmp_path / "h",
            [
                {
                    "phases_s": {
                        "data": 0.002,
                        "forward": 0.01,
                        "backward": 0.01,
                        "comm": 0.05,
                        "optimizer": 0.02,
                        "other": 0.008,
                    },
                    **small,
                }
            ]
            * 2,
        )
    )
    assert sc.small_batch(ev).saving == pytest.approx(1 - (0.1 + 15 * 0.004) / 1.6)
    # host syncs on a GPU rank: 10 reads a step, 30 ms of the 100 ms step waiting in them, the device's phases
    # 50 ms (CUDA events): the host's own 70 ms set the step without the reads -> 30/100. Without device
    # times: advice, no gain; and nothing when the device's phases alone take the whole step.
    sync = {"phases_s": {"forward": 0.05, "backward": 0.03, "other": 0.02}, "syncs_per_step": 10.0, "sync_wait_s": 0.03}
    ev = read_run(probed_run(tmp_path / "s", [{**sync, "device_phases_s": {"forward": 0.02, "backward": 0.03}}] * 2))
    assert sc.host_syncs(ev).saving == pytest.approx(0.3)
    found = sc.host_syncs(read_run(probed_run(tmp_path / "s2", [sync] * 2)))
    assert found.saving is None and found.severity == "advice"
    assert (
        sc.host_syncs(read_run(probed_run(tmp_path / "s3", [{**sync, "device_phases_s": {"forward": 0.1}}] * 2)))
        is None
    )
    # find_unused_parameters: DDP's forward took 3 ms beyond the model's of a 100 ms step. DDP saw no unused
    # parameter: a free remedy, named from 0.1 % -> 3/100; not knowing, only from 5 %; with unused ones, never.
    flag = {"phases_s": {"forward": 0.06, "backward": 0.04}, "find_unused_parameters": True, "ddp_overhead_s": 0.003}
    ev = read_run(probed_run(tmp_path / "u", [{**flag, "unused_parameter_bytes": 0}] * 2))
    assert sc.find_unused_parameters(ev).saving == pytest.approx(0.03)
    assert sc.find_unused_parameters(read_run(probed_run(tmp_path / "u2", [flag] * 2))) is None
    assert sc.find_unused_parameters(
        read_run(probed_run(tmp_path / "u3", [{**flag, "ddp_overhead_s": 0.006}] * 2))
    ).saving == pytest.approx(0.06)
    assert (
        sc.find_unused_parameters(
            read_run(probed_run(tmp_path / "u4", [{**flag, "ddp_overhead_s": 0.02, "unused_parameter_bytes": 80}] * 2))
        )
        is None
    )
    # a step that mostly grows with the batch is no small-batch problem: 2 x 30 ms of its 100 ms grow (40 % fixed).
    ev = read_run(
        probed_run(
            tmp_path / "i",
            [{"phases_s": {"forward": 0.04, "backward": 0.04, "comm": 0.02}, **small, "batch_slope_s": 0.03}] * 2,
        )
    )
    assert sc.small_batch(ev) is None
    # ...while a step whose forward and backward grow but whose all-reduce does not is one: 88 ms of 100 fixed,
    # k = 16 (the timed range): 100 + 15 x 12 = 280 ms for 16 x 2 samples against 1,600 ms.
    ev = read_run(
        probed_run(
            tmp_path / "j",
            [{"phases_s": {"forward": 0.01, "backward": 0.01, "comm": 0.08}, **small, "batch_slope_s": 0.006}] * 2,
        )
    )
    assert sc.small_batch(ev).saving == pytest.approx(1 - 0.28 / 1.6)


def test_accumulation_runs_the_optimizer_once_per_optimizer_step():
    from paratrain.doctor.finding import accumulation

    # 70 ms per micro-step, 10 ms optimizer, 20 ms all-reduce: g=2 leaves 20/170 = 11.8 %, g=4 20/310 = 6.5 %.
    g, new, saving = accumulation(0.07, 0.01, 0.02)
    assert (g, new, saving) == (4, pytest.approx(0.31), pytest.approx(1 - 0.31 / 0.40))


# -- further hand cases (issue #25's mutation run: each pins a line a mutant changed unseen) -------------------------


def probed(tmp_path, name, ranks, drop=(), status=None, config=None, reason=None):
    """read_run of probed_run(tmp_path / name, ranks, config): `drop` removes per-rank keys (a probe that did
    not record them), `status` replaces the probe's "on", with `reason`."""
    from paratrain.doctor.evidence import read_run

    run = probed_run(tmp_path / name, ranks, config)
    summary = json.loads((run / "summary.json").read_text())
    for r in summary["probe"]["ranks"]:
        for key in drop:
            r.pop(key, None)
    if status:
        summary["probe"]["status"] = status
    if reason:
        summary["probe"]["reason"] = reason
    (run / "summary.json").write_text(json.dumps(summary))
    return read_run(run)


def test_severity_and_speedup_of_a_finding_follow_its_saving():
    from paratrain.doctor.finding import Finding

    def finding(saving, severity=""):
        return Finding("c", "", "", "", "", "", saving, severity)

    # high from 30 % saved, medium from 10 %, low below; advice without a saving; a given severity is kept
    assert [finding(s).severity for s in (0.5, 0.3, 0.29, 0.1, 0.09, 0.0)] == [
        "high",
        "high",
        "medium",
        "medium",
        "low",
        "low",
    ]
    assert finding(None).severity == "advice" and finding(0.5, "advice").severity == "advice"
    # saving s is 1 / (1 - s) times the speed: half the time saved is 2x, three quarters 4x; the time left is
    # floored at 0.5 %, so a saving of all or nearly all of it reads 1 / 0.005 = 200x
    assert finding(0.5).predicted_speedup == 2.0 and finding(0.75).predicted_speedup == 4.0
    assert finding(1.0).predicted_speedup == pytest.approx(200) and finding(0.999).predicted_speedup == pytest.approx(
        200
    )
    assert finding(0.0).predicted_speedup == 1.0 and finding(None).predicted_speedup is None
    d = finding(0.5).as_dict()
    assert d["predicted_speedup"] == 2.0 and d["saving"] == 0.5 and d["check"] == "c" and d["severity"] == "high"


def test_the_texts_numbers_ms_pct_and_speedup():
    from paratrain.formatting import ms, pct, speedup

    # below 100 ms one decimal; from 100 ms whole milliseconds with thousands separators
    assert [ms(0.09), ms(0.0999), ms(0.1), ms(1.5)] == ["90.0 ms", "99.9 ms", "100 ms", "1,500 ms"]
    # whole percent from 1 %, one decimal below
    assert [pct(0.25), pct(0.01), pct(0.005)] == ["25%", "1%", "0.5%"]
    # 1 / (1 - s): half saved is 2x, 99 % saved 100x; from 99.5 % saved (200x) no figure
    assert [speedup(0.5), speedup(0.99), speedup(0.995)] == ["2.00x faster", "100.00x faster", "more than 100x faster"]


def test_a_throughput_keeps_three_figures_below_a_hundred_and_none_after_the_point_above():
    from paratrain.formatting import rate

    # a 405B plan's 0.76 samples/s is not "1"; 48.9 keeps its decimal; 1,234.5 is written whole
    assert [rate(0.7594), rate(48.93), rate(99.94), rate(100.4), rate(1234.5)] == [
        "0.759",
        "48.9",
        "99.9",
        "100",
        "1,234",
    ]


def test_accumulation_stops_at_the_first_factor_that_brings_the_all_reduce_to_10_percent():
    from paratrain.doctor.finding import accumulation

    # 450 ms a micro-step, no optimizer, 100 ms all-reduce: g=2 takes 2 x 450 + 100 = 1,000 ms, of which the
    # all-reduce is exactly 10 %: g=2, against 2 x 550 ms now -> 1 - 1000/1100.
    g, new, saving = accumulation(0.45, 0.0, 0.1)
    assert (g, new, saving) == (2, pytest.approx(1.0), pytest.approx(1 - 1.0 / 1.1))
    # 10 ms micro-steps, 100 ms all-reduce: even g=8 (8 x 10 + 100 = 180 ms, 56 % all-reduce) misses 10 %; g stays
    # at the largest, 8: 180 ms against 8 x 110 ms.
    g, new, saving = accumulation(0.01, 0.0, 0.1)
    assert (g, new, saving) == (8, pytest.approx(0.18), pytest.approx(1 - 0.18 / 0.88))


def test_the_step_breakdown_in_the_evidence_and_the_code_change_remedy(tmp_path):
    from paratrain.doctor import script_checks as sc

    # a 2 s step: phases from 0.05 % of it (1 ms) are shown, in the probe's order; eval (0 ms) is not
    ev = probed(tmp_path, "a", [{"phases_s": {"forward": 1.0, "backward": 0.999, "other": 0.001}}] * 2)
    assert sc._steps_text(ev) == "step 2,000 ms (mean of 2 ranks): forward 1,000 ms, backward 999 ms, other 1.0 ms"
    assert sc._code_change("do this", ev) == "code change in train.py: do this"
    del ev.config["script"]
    assert sc._code_change("do this", ev) == "code change in the script: do this"


def test_no_probed_check_speaks_without_a_working_probe(tmp_path):
    from paratrain.doctor import rank_checks as rc
    from paratrain.doctor import script_checks as sc
    from paratrain.doctor.causes import CAUSES

    # a probe that fell back has no per-rank figures: every check is silent (none divides by a zero step)
    ev = probed(
        tmp_path,
        "a",
        [
            {
                "phases_s": {"data": 0.05, "eval": 0.05, "checkpoint": 0.05, "collective": 0.05, "comm": 0.05},
                "thread_penalty": 2.0,
                "steps": 10,
            }
        ]
        * 2,
        status="fell back",
    )
    checks = (*sc.SCRIPT_CHECKS, *rc.RANK_CHECKS, *CAUSES)
    assert [check(ev) for check in checks] == [None] * len(checks)


def test_probe_status_says_what_the_diagnosis_rests_on(tmp_path):
    from paratrain.doctor import script_checks as sc

    ranks = [{"phases_s": {"forward": 0.1}}]
    fell = sc.probe_status(probed(tmp_path, "a", ranks, status="fell back", reason="ValueError: boom"))
    assert (fell.check, fell.saving, fell.severity) == ("probe_off", None, "advice")
    assert fell.evidence == "ValueError: boom" and fell.finding == "no step breakdown: the probe is fell back"
    assert fell.cause.startswith("the findings rest on the monitor's samples")
    assert fell.remedy.startswith("report the fallback's error")
    off = sc.probe_status(probed(tmp_path, "b", ranks, status="off"))
    assert off.evidence == ""  # no reason recorded: none shown
    assert off.remedy.startswith("paratrain launch -n 1 ") and off.remedy.endswith("train.py (without --no-probe)")
    assert sc.probe_status(probed(tmp_path, "c", ranks)) is None
    # a built-in run (no script) is no business of this check
    ev = probed(tmp_path, "d", ranks, status="off")
    del ev.config["script"]
    assert sc.probe_status(ev) is None


def test_threads_without_layer_timings_and_the_launch_flag_as_remedy(tmp_path):
    from paratrain.doctor import script_checks as sc

    phases = {"forward": 0.03, "backward": 0.03, "optimizer": 0.02, "other": 0.02}
    # no layer could be timed: the matrix product's 2x slow-down stands for all: forward, backward and the
    # optimizer (80 ms) run twice as fast, 40 ms go of 100 (one rank).
    found = sc.threads(
        probed(tmp_path, "a", [{"phases_s": phases, "threads": 4, "fair_threads": 1, "thread_penalty": 2.0}])
    )
    assert found.saving == pytest.approx(0.4)
    # the script set its threads (launch gave none): a code change, nothing for --verify to rerun
    assert found.remedy.startswith("code change in train.py") and found.rerun is None
    # launch gave the 4 threads: its own flag is the remedy, 1 thread a rank
    found = sc.threads(
        probed(
            tmp_path,
            "b",
            [{"phases_s": phases, "threads": 4, "fair_threads": 1, "thread_penalty": 2.0}] * 2,
            config={"resolved": {"threads_per_worker": 4}},
        )
    )
    assert found.rerun == {"threads_per_worker": 1, "allow_oversubscribe": None}
    assert found.remedy.startswith("paratrain launch -n 2 --threads-per-worker 1 --run-dir ")
    # layers faster on more threads (0.8x) and the product no slower (1.0x): nothing to gain, not a negative gain
    found = sc.threads(
        probed(
            tmp_path,
            "c",
            [{"phases_s": phases, "threads": 4, "fair_threads": 1, "thread_penalty": 1.0, "layer_thread_penalty": 0.8}]
            * 2,
        )
    )
    assert found.saving == 0.0
    # no rank measured a penalty: nothing said
    assert sc.threads(probed(tmp_path, "d", [{"phases_s": phases, "threads": 4}] * 2)) is None


def test_data_wait_with_spare_cores_its_line_and_its_workers(tmp_path):
    from paratrain.doctor import script_checks as sc

    phases = {"data": 0.04, "forward": 0.03, "backward": 0.03}
    # 2 cores a rank for 1 thread: the loader workers hide the whole 40 ms of data, CPU part included -> 40/100;
    # 2 workers now, the remedy doubles them
    found = sc.data_wait(
        probed(tmp_path, "a", [{"phases_s": phases, "data_cpu_s": 0.01, "cpu_affinity": 2, "loader_workers": 2}] * 2)
    )
    assert found.saving == pytest.approx(0.4)
    assert "num_workers=4," in found.remedy and "cores are all in use" not in found.remedy
    # no spare core: the 10 ms of CPU stay, and the remedy says how to hide them too; no workers now -> 2
    found = sc.data_wait(probed(tmp_path, "b", [{"phases_s": phases, "data_cpu_s": 0.01}] * 2))
    assert found.saving == pytest.approx(0.3)
    assert "num_workers=2," in found.remedy and "cores are all in use" in found.remedy
    # cores and threads not recorded count as 1 core for 1 thread (no spare core)...
    ev = probed(tmp_path, "c", [{"phases_s": phases, "data_cpu_s": 0.01}] * 2, drop=("cpu_affinity", "threads"))
    assert sc.data_wait(ev).saving == pytest.approx(0.3)
    # ...and 2 recorded cores with the threads not recorded are a spare core
    ev = probed(tmp_path, "d", [{"phases_s": phases, "data_cpu_s": 0.01, "cpu_affinity": 2}] * 2, drop=("threads",))
    assert sc.data_wait(ev).saving == pytest.approx(0.4)
    # the line: data at exactly 15 % of a 1 s step is named (150 ms overlap, no CPU part); 12.5 % is not
    ev = probed(tmp_path, "e", [{"phases_s": {"data": 0.15, "forward": 0.85}}] * 2)
    assert sc.data_wait(ev).saving == 0.15
    assert sc.data_wait(probed(tmp_path, "f", [{"phases_s": {"data": 0.125, "forward": 0.875}}] * 2)) is None


def test_exposed_communication_with_an_optimizer_and_its_lines(tmp_path):
    from paratrain.doctor import script_checks as sc

    # 100 ms: 60 ms forward and backward, 10 ms optimizer, 30 ms all-reduce. A micro-step is the 60 ms; k micro-
    # steps take k x 60 + 10 + 30: k=2 160 ms (all-reduce 18.8 %), k=4 280 ms (10.7 %), k=8 520 ms (5.8 %) -> k=8,
    # 520 ms against 8 x 100.
    ev = probed(tmp_path, "a", [{"phases_s": {"forward": 0.03, "backward": 0.03, "optimizer": 0.01, "comm": 0.03}}] * 2)
    found = sc.exposed_communication(ev)
    assert found.saving == pytest.approx(1 - 0.52 / 0.8)
    assert "accumulate 8 micro-steps per optimizer step, the first 7 under" in found.remedy
    assert "1.0 MiB of gradients all-reduced per step" in found.evidence
    # the lines: an all-reduce of exactly 20 % is named, at up to 1.5 rounds a step (accumulation that does
    # skip its all-reduces): k=2 takes 2 x 800 + 200 = 1,800 ms (11 % all-reduce), k=4 3,400 ms (5.9 %) -> 1 - 3.4/4.
    # 10 % is not named, nor 2 rounds a step (no_sync_missing's business).
    at_line = {"phases_s": {"forward": 0.8, "comm": 0.2}, "rounds_per_step": 1.5}
    assert sc.exposed_communication(probed(tmp_path, "b", [at_line] * 2)).saving == pytest.approx(1 - 3.4 / 4)
    assert sc.exposed_communication(probed(tmp_path, "c", [{**at_line, "rounds_per_step": 2.0}] * 2)) is None
    assert sc.exposed_communication(probed(tmp_path, "d", [{"phases_s": {"forward": 0.9, "comm": 0.1}}] * 2)) is None
    # one rank, or a rank without DDP: no gradient all-reduce to accumulate over
    assert sc.exposed_communication(probed(tmp_path, "e", [at_line])) is None
    assert sc.exposed_communication(probed(tmp_path, "f", [at_line, {**at_line, "ddp": False}])) is None


def test_the_all_reduce_own_time_is_the_probes_step_by_step_figure_when_it_has_one(tmp_path):
    """Each rank's mean comm holds its waits for the others; the probe's all_reduce_s (the least-waiting rank
    in each step) is the all-reduce's own time. A run directory without it falls back to the least mean."""
    from paratrain.doctor import script_checks as sc
    from paratrain.doctor.evidence import read_run

    # 30 ms mean comm a rank in a 100 ms step, 5 ms of it the all-reduce's own: not an exposed all-reduce.
    ranks = [{"phases_s": {"forward": 0.03, "backward": 0.03, "optimizer": 0.01, "comm": 0.03}}] * 2
    assert sc.exposed_communication(read_run(probed_run(tmp_path / "a", ranks, probe={"all_reduce_s": 0.005}))) is None
    assert sc.exposed_communication(read_run(probed_run(tmp_path / "b", ranks))) is not None
    # At 25 ms own (25 %) the other 5 ms of waits stay in a micro-step: k micro-steps take k x 65 + 10 + 25
    # (k=2 165 ms, 15.2 % all-reduce; k=4 295 ms, 8.5 %) -> k=4, 295 ms against 4 x 100.
    found = sc.exposed_communication(read_run(probed_run(tmp_path / "c", ranks, probe={"all_reduce_s": 0.025})))
    assert found.saving == pytest.approx(1 - 0.295 / 0.4)
    # four rounds a step, 40 ms own of a 100 ms step (the mean comm 60): three of four rounds go -> 30/100.
    rounds = [
        {"phases_s": {"forward": 0.02, "comm": 0.06, "backward": 0.02}, "rounds_per_step": 4.0, "micro_per_step": 4}
    ] * 2
    ev = read_run(probed_run(tmp_path / "d", rounds, probe={"all_reduce_s": 0.04}))
    assert sc.all_reduce_every_micro_step(ev).saving == pytest.approx(0.3)


def test_small_batch_micro_steps_eval_the_cap_on_compute_and_its_lines(tmp_path):
    from paratrain.doctor import script_checks as sc

    small = {"samples_per_step": 2.0, "batch_slope_s": 0.001, "batch_slope_between": [2, 32]}
    phases = {"data": 0.03, "forward": 0.01, "backward": 0.01, "comm": 0.03, "optimizer": 0.01, "other": 0.01}
    # 4 samples an optimizer step in 2 micro-steps of 2: the layers grow 1 ms a sample x 4 = 4 ms, with the 30 ms
    # of data 34 ms grow, 66 ms do not (66 %). k=2: 66 / (100 + 34) = 49 %, k=4: 66 / 202 = 33 %, k=8: 66 / 338 =
    # 20 % -> 338 ms against 800; the batch a micro-step holds, 2, times 8 = 16
    micro = {**small, "samples_per_step": 4.0, "micro_per_step": 2.0}
    found = sc.small_batch(probed(tmp_path, "a", [{"phases_s": phases, **micro}] * 2))
    assert found.saving == pytest.approx(1 - 0.338 / 0.8) and "batch_size=16 per rank (8x)" in found.remedy
    # a probe that did not record micro-steps counts one: the batch is the 4 samples, 8 x 4 = 32
    found = sc.small_batch(probed(tmp_path, "b", [{"phases_s": phases, **micro}] * 2, drop=("micro_per_step",)))
    assert found.saving == pytest.approx(1 - 0.338 / 0.8) and "batch_size=32 per rank (8x)" in found.remedy
    # the slope says 2 x 10 ms = 20 ms grow, but forward and backward take 10 ms in all: 10 ms grow, 90 ms of
    # 100 do not. k=2: 90/110, 4: 90/130, 8: 90/170 (53 %), then the timed range stops k at 16:
    # 100 + 15 x 10 = 250 ms against 1,600
    capped = {
        "phases_s": {"forward": 0.005, "backward": 0.005, "comm": 0.08, "optimizer": 0.01},
        **small,
        "batch_slope_s": 0.01,
    }
    assert sc.small_batch(probed(tmp_path, "c", [capped] * 2)).saving == pytest.approx(1 - 0.25 / 1.6)
    # evaluation per step grows with the batch too (k x fewer steps an epoch): 2 ms of layers + 20 ms of eval
    # grow, 78 ms do not. k=2: 78/122, 4: 78/166, 8: 78/254 (31 %), 16: stop -> 100 + 15 x 22 = 430 against 1,600
    evals = {"phases_s": {"forward": 0.01, "backward": 0.01, "eval": 0.02, "comm": 0.05, "optimizer": 0.01}, **small}
    assert sc.small_batch(probed(tmp_path, "d", [evals] * 2)).saving == pytest.approx(1 - 0.43 / 1.6)
    # the lines, on a 1.75 s step: 250 ms of layers (125 ms a sample x 2) and 500 ms of data grow, 1 s does not
    # (57 %). k=2: 1 / (1.75 + 0.75) = 40 %; k=4: 1 / (1.75 + 3 x 0.75) = 1/4, exactly the 25 % target: k=4,
    # 4 s against 4 x 1.75 -> 3/7
    line = {
        "phases_s": {"data": 0.5, "forward": 0.125, "backward": 0.125, "comm": 1.0},
        **small,
        "batch_slope_s": 0.125,
    }
    found = sc.small_batch(probed(tmp_path, "e", [line] * 2))
    assert found.saving == pytest.approx(3 / 7) and "(4x)" in found.remedy
    # exactly half of a 1 s step fixed (the layers' 500 ms all grow, the 500 ms all-reduce does not) is named:
    # k=2: 0.5 / 1.5 = 33 %, k=4: 0.5 / 2.5 = 20 % -> 2.5 s against 4 s
    half = {"phases_s": {"forward": 0.25, "backward": 0.25, "comm": 0.5}, **small, "batch_slope_s": 0.25}
    assert sc.small_batch(probed(tmp_path, "f", [half] * 2)).saving == pytest.approx(1 - 2.5 / 4)
    # no forward or backward time: nothing measured to grow, nothing said
    idle = {"phases_s": {"comm": 0.08, "optimizer": 0.02}, **small}
    assert sc.small_batch(probed(tmp_path, "g", [idle] * 2)) is None
    # the samples per step not recorded: nothing said
    assert (
        sc.small_batch(probed(tmp_path, "h", [{"phases_s": phases, **small}] * 2, drop=("samples_per_step",))) is None
    )


def test_small_batch_goes_no_further_than_the_timed_batches(tmp_path):
    from paratrain.doctor import script_checks as sc

    # 96 ms of a 100 ms step fixed at any k up to 32 (the target is never met), so k is the timed range:
    phases = {"data": 0.002, "forward": 0.01, "backward": 0.01, "comm": 0.05, "optimizer": 0.02, "other": 0.008}

    def saving(name, samples, between):
        return sc.small_batch(
            probed(
                tmp_path,
                name,
                [
                    {
                        "phases_s": phases,
                        "samples_per_step": samples,
                        "batch_slope_s": 0.001,
                        "batch_slope_between": between,
                    }
                ]
                * 2,
            )
        ).saving

    # timed at 3 and 25 samples: 25 // 3 = 8x. 3 ms of layers + 2 ms of data grow: 100 + 7 x 5 = 135 ms for 8 steps
    assert saving("a", 3.0, [3, 25]) == pytest.approx(1 - 0.135 / 0.8)
    # timed at 2 and 3: less than 2x, still one doubling: 100 + 4 = 104 ms against 200
    assert saving("b", 2.0, [2, 3]) == pytest.approx(1 - 0.104 / 0.2)
    # timed at 1 and 64: no further than 32x. 1 + 2 ms grow: 100 + 31 x 3 = 193 ms against 3,200
    assert saving("c", 1.0, [1, 64]) == pytest.approx(1 - 0.193 / 3.2)
    # timed at 3 and 30: 10x, so the last doubling within it is 8x, not 16x: 135 ms against 800, as in "a"
    assert saving("d", 3.0, [3, 30]) == pytest.approx(1 - 0.135 / 0.8)


def test_no_sync_missing_at_its_line_and_on_one_rank(tmp_path):
    from paratrain.doctor import script_checks as sc

    # 2 rounds a step, 40 ms exposed of 100: one of the two goes -> 20/100
    two = {"phases_s": {"forward": 0.03, "backward": 0.03, "comm": 0.04}, "rounds_per_step": 2.0}
    assert sc.all_reduce_every_micro_step(probed(tmp_path, "a", [two] * 2)).saving == pytest.approx(0.2)
    # 1.5 rounds a step is still accumulation that skips its all-reduces; one rank has no all-reduce
    assert sc.all_reduce_every_micro_step(probed(tmp_path, "b", [{**two, "rounds_per_step": 1.5}] * 2)) is None
    assert sc.all_reduce_every_micro_step(probed(tmp_path, "c", [{**two, "rounds_per_step": 4.0}])) is None


def test_the_scripts_own_collectives_are_their_own_time_not_the_waits_in_them(tmp_path):
    """Rank 0 evaluates alone 20 ms a step and rank 1 waits for it at a barrier: rank 1's 21 ms of
    'collective' is the evaluation's wait (rank0_alone's business); the barrier's own time is rank 0's 1 ms,
    under the 10 % line. (A flake loop saw host_sync_stalls outrank rank0_alone on the planted fault.)"""
    from paratrain.doctor.evidence import read_run
    from paratrain.doctor.script_collectives import script_collectives

    ranks = [
        {"phases_s": {"forward": 0.079, "eval": 0.02, "collective": 0.001}},
        {"phases_s": {"forward": 0.079, "collective": 0.021}},
    ]
    assert script_collectives(probed(tmp_path, "a", ranks)) is None  # the least of the ranks' means
    # the probe's step-by-step figure, when the run directory has it, is the one read
    ev = read_run(probed_run(tmp_path / "b", ranks, probe={"collective_own_s": 0.015}))
    assert script_collectives(ev).saving == pytest.approx(0.015 * 49 / 50 / 0.1)


def test_the_scripts_own_collectives_and_their_line(tmp_path):
    from paratrain.doctor.script_collectives import script_collectives

    # 20 ms of a 100 ms step in the script's own collectives; every 50 steps keeps 1/50 -> 20 x 49/50 / 100
    ev = probed(tmp_path, "a", [{"phases_s": {"forward": 0.08, "collective": 0.02}}] * 2)
    found = script_collectives(ev)
    assert found.check == "host_sync_stalls" and found.saving == pytest.approx(0.02 * 49 / 50 / 0.1)
    # exactly 10 % of a 1 s step is named (100 x 49/50 ms); 5 % is not
    ev = probed(tmp_path, "b", [{"phases_s": {"forward": 0.9, "collective": 0.1}}] * 2)
    assert script_collectives(ev).saving == pytest.approx(0.098)
    assert script_collectives(probed(tmp_path, "c", [{"phases_s": {"forward": 0.95, "collective": 0.05}}] * 2)) is None


def test_host_syncs_at_one_read_a_step_and_without_the_wait_timed(tmp_path):
    from paratrain.doctor import script_checks as sc

    device = {"forward": 0.02, "backward": 0.03}
    sync = {
        "phases_s": {"forward": 0.05, "backward": 0.03, "other": 0.02},
        "sync_wait_s": 0.03,
        "device_phases_s": device,
    }
    # one read a step is named: the host's own 70 ms against the device's 50 set the step -> 30/100
    found = sc.host_syncs(probed(tmp_path, "a", [{**sync, "syncs_per_step": 1.0}] * 2))
    assert found.check == "host_syncs" and found.saving == pytest.approx(0.3)
    # half a read a step (one every other step) is not; nor a probe that counted none
    assert sc.host_syncs(probed(tmp_path, "b", [{**sync, "syncs_per_step": 0.5}] * 2)) is None
    assert sc.host_syncs(probed(tmp_path, "c", [sync] * 2)) is None
    # the wait inside the reads not timed: the host's own work is the whole 100 ms step, nothing to gain
    assert sc.host_syncs(probed(tmp_path, "d", [{**sync, "syncs_per_step": 3.0}] * 2, drop=("sync_wait_s",))) is None
    # without device times: advice, named host_syncs
    found = sc.host_syncs(probed(tmp_path, "e", [{**sync, "syncs_per_step": 3.0}] * 2, drop=("device_phases_s",)))
    assert (found.check, found.saving, found.severity) == ("host_syncs", None, "advice")


def test_evaluation_on_every_rank_one_rank_alone_and_the_lines(tmp_path):
    from paratrain.doctor import script_checks as sc

    # every rank evaluates 30 ms of a 100 ms step: evaluating 1/8 of the set keeps 1/8 -> 30 x 7/8 / 100
    both = {"phases_s": {"forward": 0.07, "eval": 0.03}}
    found = sc.evaluation(probed(tmp_path, "a", [both] * 2))
    assert found.check == "evaluation_share" and found.saving == pytest.approx(0.03 * 7 / 8 / 0.1)
    assert found.finding == "evaluation takes 30% of the run"
    # the steps holding one took 40 ms a step more than plain steps: that is what 7/8 is taken of
    found = sc.evaluation(probed(tmp_path, "b", [{**both, "eval_excess_s": 0.04}] * 2))
    assert found.saving == pytest.approx(0.04 * 7 / 8 / 0.1)
    # one rank: it is not alone (nobody waits for it) -> the same 30 x 7/8 / 100
    found = sc.evaluation(probed(tmp_path, "c", [both]))
    assert found.check == "evaluation_share" and found.saving == pytest.approx(0.03 * 7 / 8 / 0.1)
    # rank 1 of 3 evaluates 40 ms alone: sharded over 3, two thirds go -> 40 x 2/3 / 100
    alone = [
        {"phases_s": {"forward": 0.06, "comm": 0.04}},
        {"phases_s": {"forward": 0.06, "eval": 0.04}},
        {"phases_s": {"forward": 0.06, "comm": 0.04}},
    ]
    found = sc.evaluation(probed(tmp_path, "d", alone))
    assert found.check == "rank0_alone" and found.saving == pytest.approx(0.04 * 2 / 3 / 0.1)
    assert found.finding.startswith("rank 1 evaluates alone")
    # the other rank evaluates exactly a tenth of the largest (1 s against 100 ms): not alone, both evaluate;
    # the mean of 1 s and 100 ms, 550 ms, of the 2 s step, 7/8 of it goes
    ev = probed(
        tmp_path,
        "e",
        [{"phases_s": {"forward": 1.0, "eval": 1.0}}, {"phases_s": {"eval": 0.1, "forward": 1.0, "comm": 0.9}}],
    )
    found = sc.evaluation(ev)
    assert found.check == "evaluation_share" and found.saving == pytest.approx(0.55 / 2 * 7 / 8)
    # exactly 20 % of a 1 s step is named (200 x 7/8 ms); 10 % is not
    ev = probed(tmp_path, "f", [{"phases_s": {"forward": 0.8, "eval": 0.2}}] * 2)
    assert sc.evaluation(ev).saving == pytest.approx(0.175)
    assert sc.evaluation(probed(tmp_path, "g", [{"phases_s": {"forward": 0.09, "eval": 0.01}}] * 2)) is None


def test_checkpoints_every_ten_times_rarer_or_every_100_steps_and_the_line(tmp_path):
    from paratrain.doctor import script_checks as sc

    def saving(name, saver, other=None, phases=None):
        phases = phases or {"forward": 0.08, "checkpoint": 0.02}
        other = other or {"phases_s": {"forward": 0.08, "comm": 0.02}, "steady_steps": 90, "checkpoint_steps": 0}
        found = sc.checkpoints(probed(tmp_path, name, [other, {"phases_s": phases, **saver}]))
        return found and found.saving

    # rank 1 saves on 4 of its 80 steps, every 20: ten times rarer (every 200, past 100) keeps 1/10 of its
    # 20 ms -> 18/100
    assert saving("a", {"steady_steps": 80, "checkpoint_steps": 4}) == pytest.approx(0.018 / 0.1)
    # one save in 8 steps: every 100 keeps 8/100 of it -> 20 x 0.92 / 100
    assert saving("b", {"steady_steps": 8, "checkpoint_steps": 1}) == pytest.approx(0.02 * 0.92 / 0.1)
    # exactly 10 % of a 1 s step is named (every 2 steps -> every 100: 100 x 0.98 ms); 5 % is not
    every_2 = {"steady_steps": 90, "checkpoint_steps": 45}
    assert saving(
        "c", every_2, {"phases_s": {"forward": 0.9, "comm": 0.1}}, {"forward": 0.9, "checkpoint": 0.1}
    ) == pytest.approx(0.098)
    assert (
        saving("d", every_2, {"phases_s": {"forward": 0.95, "comm": 0.05}}, {"forward": 0.95, "checkpoint": 0.05})
        is None
    )


def test_straggler_lines_and_when_it_is_silent(tmp_path):
    from paratrain.doctor import rank_checks as rc

    def straggler(name, ranks):
        return rc.straggler(probed(tmp_path, name, ranks))

    # rank 1 busy 600 ms against 500: exactly 1.2x, named. The step is 600 ms; with equal work 500 ms of forward
    # and no all-reduce of its own (rank 1's comm is 0) -> 1 - 500/600
    found = straggler("a", [{"phases_s": {"forward": 0.5, "comm": 0.1}}, {"phases_s": {"forward": 0.6}}])
    assert found.check == "straggler" and found.saving == pytest.approx(1 - 0.5 / 0.6)
    # the excess at exactly 10 % of the step: 625 ms against 500 (1.25x), 125 ms of a 1.25 s step; with equal
    # work 500 ms plus the all-reduce's own 625 ms -> 1 - 1.125/1.25
    found = straggler(
        "b", [{"phases_s": {"forward": 0.5, "comm": 0.75}}, {"phases_s": {"forward": 0.625, "comm": 0.625}}]
    )
    assert found.saving == pytest.approx(0.1)
    # 1.15x the other's work, although 13 % of the step: not named (both lines must hold)
    assert straggler("c", [{"phases_s": {"forward": 0.4, "comm": 0.06}}, {"phases_s": {"forward": 0.46}}]) is None
    # the other rank's own evaluation and checkpoint (62.5 + 62.5 ms) exactly as large as the 125 ms excess
    # explain it: silent
    assert (
        straggler(
            "d",
            [{"phases_s": {"forward": 0.5, "eval": 0.0625, "checkpoint": 0.0625}}, {"phases_s": {"forward": 0.625}}],
        )
        is None
    )
    # different step counts (130 against 100: 1.13x their mean) are uneven_shards' business; one rank has no others
    assert (
        straggler(
            "e",
            [
                {"phases_s": {"forward": 0.05, "comm": 0.03}, "steps": 100},
                {"phases_s": {"forward": 0.08}, "steps": 130},
            ],
        )
        is None
    )
    assert straggler("f", [{"phases_s": {"forward": 0.08}}]) is None


def test_slow_rank_samples_and_the_same_work_lines(tmp_path):
    from paratrain.doctor import rank_checks as rc

    fast = {"phases_s": {"forward": 0.04, "backward": 0.08, "comm": 0.035}}
    slow = {"phases_s": {"forward": 0.05, "backward": 0.10, "comm": 0.005}}
    # forward and backward both 1.25x slower: the same work on a slower core even where the probe recorded no
    # samples (none on either rank is the same)...
    assert rc.straggler(probed(tmp_path, "a", [fast, slow])).check == "slow_rank"
    # ...and with 101 samples against 100, within 1 %
    found = rc.straggler(
        probed(tmp_path, "b", [{**fast, "samples_per_step": 100.0}, {**slow, "samples_per_step": 101.0}])
    )
    assert found.check == "slow_rank"

    def rank(data=0.0, forward=0.0, backward=0.0, other=0.0):
        return {
            "phases_s": {"data": data, "forward": forward, "backward": backward, "optimizer": 0.0, "other": other},
            "samples_per_step": 32.0,
        }

    # forward 1.25x and backward 1.0x: exactly the 1.25 spread allowed -> their mean, 1.125
    assert rc._same_work_slower([rank(forward=0.5, backward=1.0), rank(forward=0.625, backward=1.0)], 1) == 1.125
    # 1.5 s of the 4.5 s excess in data, 3 s in forward and backward (both 1.5x): exactly 2/3 in compute -> 1.5
    assert rc._same_work_slower([rank(forward=2.0, backward=4.0), rank(data=1.5, forward=3.0, backward=6.0)], 1) == 1.5
    # the excess in the loop's own Python ("other", where rank-specific work lands) is no slower core
    assert rc._same_work_slower([rank(forward=2.0, backward=4.0), rank(other=1.5, forward=3.0, backward=6.0)], 1) == 1.5
    assert (
        rc._same_work_slower([rank(forward=2.0, backward=4.0), rank(other=3.1, forward=3.0, backward=6.0)], 1) is None
    )
    # no excess at all: not a slower rank
    assert rc._same_work_slower([rank(forward=0.5, backward=1.0), rank(forward=0.5, backward=1.0)], 1) is None
    # a CI run of the small-batch fault: rank 1 ran data 1.42x, forward 1.33x, backward 1.25x and its Python 1.35x
    # slower (a third of its excess outside forward and backward): a slower core, at its own work's 4.3 / 3.0 ms...
    fast, slower = rank(0.33, 1.12, 0.62, 0.93), rank(0.47, 1.49, 0.775, 1.255)
    assert rc._same_work_slower([fast, slower], 1) == pytest.approx(3.99 / 3.0)
    # ...while the same excess with its Python 2x slower, or its data left as fast, is more work
    assert rc._same_work_slower([fast, rank(0.47, 1.49, 0.775, 1.86)], 1) is None
    assert rc._same_work_slower([fast, rank(0.33, 1.49, 0.775, 1.255)], 1) is None
    # a phase under a tenth of the others' own work is left out of the comparison, and not where the excess may lie
    assert rc._same_work_slower([rank(0.2, 1.12, 0.62, 0.93), rank(0.4, 1.49, 0.775, 1.255)], 1) is not None
    assert rc._same_work_slower([rank(0.2, 1.12, 0.62, 0.93), rank(1.4, 1.49, 0.775, 1.255)], 1) is None


def test_a_slow_rank_that_other_work_on_its_own_core_explains_is_left_to_the_caveat(tmp_path):
    """Rank 1 runs the same work 2x slower (forward and backward). When other work took 45 % of its core over the run
    (the monitor's samples: its tree at 55 % of core 1), that explains a 2x slowdown whole: the contended caveat,
    which names rank 1's share, says it, and slow_rank ranks after it (on the busy catalogue it ranked first, above
    the script's own cause). Other work taking a tenth of its core explains 1.11x, not 2x: slow_rank stands."""
    from paratrain.doctor import rank, tempered
    from paratrain.doctor import rank_checks as rc
    from paratrain.doctor.checks import contended
    from paratrain.doctor.evidence import read_run
    from paratrain.doctor.finding import Finding
    from paratrain.measure.monitor import SYSTEM_FILE

    fast = {"phases_s": {"forward": 0.04, "backward": 0.08, "comm": 0.125}, "samples_per_step": 32.0}
    slow = {"phases_s": {"forward": 0.08, "backward": 0.16, "comm": 0.005}, "samples_per_step": 32.0}

    def run(name, rank1_tree, slow=slow):
        path = probed_run(tmp_path / name, [fast, slow])
        lines = []
        for t in range(6):
            lines.append({"time": t, "kind": "host", "cpu_percent": [100.0, 100.0]})
            lines.append({"time": t, "kind": "rank", "rank": 0, "tree_cpu_percent": 100.0, "cores": [0]})
            lines.append({"time": t, "kind": "rank", "rank": 1, "tree_cpu_percent": rank1_tree, "cores": [1]})
        (path / SYSTEM_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
        return read_run(path)

    half = run("half", 55.0)
    assert half.core_contention[1] == pytest.approx(0.45)
    slow_rank = rc.straggler(half)
    assert slow_rank.check == "slow_rank" and "2.00x slower" in slow_rank.finding and slow_rank.contention_explains
    # the slow rank's finding saves 49 % of the step (each phase at the fastest rank's, plus 5 ms of all-reduce), more
    # than the caveat's 45 %: it would stand above the caveat, as it did on the busy catalogue; explained, it ranks
    # after it, and the run's own cause, below the caveat, comes before it
    assert slow_rank.saving == pytest.approx(1 - 0.125 / 0.245)
    # a cause in the machine: medium at most, though it saves more than the 30 % that makes a run's own finding high
    assert slow_rank.severity == "medium"
    caveat = contended(half)
    own = Finding("host_sync_stalls", "", "", "", "", "", 0.2, share=0.2)
    ranked = rank(tempered([slow_rank, caveat, own], contention_change=0.0))
    assert [f.check for f in ranked] == ["contended", "host_sync_stalls", "slow_rank"]
    assert not rc.straggler(run("tenth", 90.0)).contention_explains
    # 1.6x (0.375 of the step) with 30 % of the core taken: within the slack of 0.10; 1.6x with 20 % taken: not
    slower = {**slow, "phases_s": {"forward": 0.064, "backward": 0.128, "comm": 0.005}}
    assert rc.straggler(run("within", 70.0, slower)).contention_explains
    assert not rc.straggler(run("beyond", 80.0, slower)).contention_explains


def test_uneven_steps_at_its_line(tmp_path):
    from paratrain.doctor import rank_checks as rc

    def uneven(name, steps):
        return rc.uneven_steps(probed(tmp_path, name, [{"phases_s": {"forward": 0.1}, "steps": s} for s in steps]))

    # 11 and 9 steps: the most is exactly 1.1x the mean of 10; with 10 each -> 1 - 10/11
    assert uneven("a", [11, 9]).saving == pytest.approx(1 - 10 / 11)
    # 140 and 100: 140 against a mean of 120 -> 1 - 120/140
    assert uneven("b", [140, 100]).saving == pytest.approx(1 - 120 / 140)
    assert uneven("c", [105, 100]) is None and uneven("d", [100, 100]) is None and uneven("e", [100]) is None


def test_find_unused_parameters_at_its_lines(tmp_path):
    from paratrain.doctor import script_checks as sc

    flag = {"find_unused_parameters": True}
    # of a 1 s step, exactly 0.1 % when DDP found no unused parameter, exactly 5 % when that is not known: named
    ev = probed(
        tmp_path,
        "a",
        [
            {
                "phases_s": {"forward": 0.999, "backward": 0.001},
                **flag,
                "ddp_overhead_s": 0.001,
                "unused_parameter_bytes": 0,
            }
        ]
        * 2,
    )
    assert sc.find_unused_parameters(ev).saving == pytest.approx(0.001)
    below = [{"phases_s": {"forward": 0.9995, "backward": 0.0005}, **flag, "ddp_overhead_s": 0.0005}]
    assert sc.find_unused_parameters(probed(tmp_path, "a2", [{**below[0], "unused_parameter_bytes": 0}] * 2)) is None
    ev = probed(tmp_path, "b", [{"phases_s": {"forward": 0.95, "backward": 0.05}, **flag, "ddp_overhead_s": 0.05}] * 2)
    assert sc.find_unused_parameters(ev).saving == pytest.approx(0.05)
    # one rank saw none unused and the other did not say: not known, 3 % is below the 5 % line
    ev = probed(
        tmp_path,
        "c",
        [
            {
                "phases_s": {"forward": 0.06, "backward": 0.04},
                **flag,
                "ddp_overhead_s": 0.003,
                "unused_parameter_bytes": 0,
            },
            {"phases_s": {"forward": 0.06, "backward": 0.04}, **flag, "ddp_overhead_s": 0.003},
        ],
    )
    assert sc.find_unused_parameters(ev) is None
    # without the flag, nothing
    assert (
        sc.find_unused_parameters(probed(tmp_path, "d", [{"phases_s": {"forward": 0.1}, "ddp_overhead_s": 0.05}] * 2))
        is None
    )


def one_finding_per_check(tmp_path):
    """A case that fires each check (host_syncs twice: with and without device times; evaluation as
    evaluation_share and rank0_alone; straggler as straggler and slow_rank)."""
    from paratrain.doctor import rank_checks as rc
    from paratrain.doctor import script_checks as sc
    from paratrain.doctor.script_collectives import script_collectives

    small = {"samples_per_step": 2.0, "batch_slope_s": 0.001, "batch_slope_between": [2, 32]}
    cases = [
        (
            sc.threads,
            [{"phases_s": {"forward": 0.05, "backward": 0.05}, "threads": 4, "fair_threads": 1, "thread_penalty": 2.0}]
            * 2,
        ),
        (sc.data_wait, [{"phases_s": {"data": 0.04, "forward": 0.06}}] * 2),
        (sc.exposed_communication, [{"phases_s": {"forward": 0.07, "comm": 0.03}}] * 2),
        (sc.small_batch, [{"phases_s": {"forward": 0.01, "backward": 0.01, "comm": 0.08}, **small}] * 2),
        (
            sc.all_reduce_every_micro_step,
            [{"phases_s": {"forward": 0.06, "comm": 0.04}, "rounds_per_step": 4.0, "micro_per_step": 4.0}] * 2,
        ),
        (script_collectives, [{"phases_s": {"forward": 0.08, "collective": 0.02}}] * 2),
        (
            sc.host_syncs,
            [
                {
                    "phases_s": {"forward": 0.1},
                    "syncs_per_step": 2.0,
                    "sync_wait_s": 0.03,
                    "device_phases_s": {"forward": 0.05},
                }
            ]
            * 2,
        ),
        (sc.host_syncs, [{"phases_s": {"forward": 0.1}, "syncs_per_step": 2.0}] * 2),
        (sc.evaluation, [{"phases_s": {"forward": 0.07, "eval": 0.03}}] * 2),
        (sc.evaluation, [{"phases_s": {"forward": 0.06, "eval": 0.04}}, {"phases_s": {"forward": 0.06, "comm": 0.04}}]),
        (sc.checkpoints, [{"phases_s": {"forward": 0.08, "checkpoint": 0.02}, "checkpoint_steps": 45}] * 2),
        (rc.straggler, [{"phases_s": {"forward": 0.05, "comm": 0.03}}, {"phases_s": {"forward": 0.08}}]),
        (
            rc.straggler,
            [
                {"phases_s": {"forward": 0.04, "backward": 0.08, "comm": 0.035}},
                {"phases_s": {"forward": 0.05, "backward": 0.10, "comm": 0.005}},
            ],
        ),
        (rc.uneven_steps, [{"phases_s": {"forward": 0.1}, "steps": 140}, {"phases_s": {"forward": 0.1}, "steps": 100}]),
        (
            sc.find_unused_parameters,
            [
                {
                    "phases_s": {"forward": 0.1},
                    "find_unused_parameters": True,
                    "ddp_overhead_s": 0.01,
                    "unused_parameter_bytes": 0,
                }
            ]
            * 2,
        ),
    ]
    return [check(probed(tmp_path, str(i), ranks)) for i, (check, ranks) in enumerate(cases)]


def test_every_finding_says_what_why_what_to_do_and_its_gain(tmp_path):
    from paratrain.doctor import script_checks as sc
    from paratrain.formatting import speedup

    seen = []
    for found in one_finding_per_check(tmp_path):
        seen.append(found.check)
        texts = [found.check, found.finding, found.evidence, found.cause, found.remedy, found.predicted_gain]
        assert all(isinstance(t, str) and t for t in texts), texts
        # the gain's text opens with the saving as a speed-up; advice has neither
        if found.saving is None:
            assert found.severity == "advice" and found.predicted_gain.startswith("not predicted")
        else:
            assert found.predicted_gain.startswith(speedup(found.saving)), found.predicted_gain
    assert seen == [
        "oversubscription",
        "data_wait",
        "exposed_communication",
        "small_batch",
        "no_sync_missing",
        "host_sync_stalls",
        "host_syncs",
        "host_syncs",
        "evaluation_share",
        "rank0_alone",
        "checkpoint_share",
        "straggler",
        "slow_rank",
        "uneven_shards",
        "find_unused_parameters",
    ]
    off = sc.probe_status(probed(tmp_path, "off", [{"phases_s": {"forward": 0.1}}], status="off"))
    assert all(isinstance(t, str) and t for t in (off.finding, off.cause, off.remedy, off.predicted_gain))


def test_each_remedy_names_its_fix_and_the_evidence_its_counts(tmp_path):
    # what each remedy tells the user to do (the opening words of the code change), on the cases above: the
    # script set 4 threads itself; no loader workers and no spare core; 70 ms micro-steps against a 30 ms
    # all-reduce -> k=4 (17.6 % at k=2, 9.7 % at 4); 98 ms of 100 fixed never reach 25 % -> the timed 16x of
    # 2 samples; saves every 2 steps -> every 100
    fixes = {
        "oversubscription": "the script sets 4 threads: drop its torch.set_num_threads(4)",
        "data_wait": "DataLoader(..., num_workers=2, persistent_workers=True); the ranks' cores are all in use, so "
        "the CPU part stays",
        "exposed_communication": "accumulate 4 micro-steps per optimizer step, the first 3 under "
        "`with model.no_sync():`",
        "small_batch": "batch_size=32 per rank (16x), the learning rate scaled 16x with a warm-up",
        "no_sync_missing": "wrap every micro-step but the last in `with model.no_sync():` (torch's DDP idiom;",
        "host_sync_stalls": "keep running sums on the device and reduce them every 50 steps",
        "host_syncs": "keep running values on the device (loss_sum += loss.detach()) and read them every 50 steps",
        "evaluation_share": "evaluate 1/8 of the held-out set",
        "rank0_alone": "evaluate on every rank: a DistributedSampler over the held-out set, then all_reduce",
        "checkpoint_share": "save every 100 steps",
        "straggler": "give every rank the same work per step (equal shards from a DistributedSampler",
        "uneven_shards": "split the data evenly: a DistributedSampler (drop_last=True",
        "find_unused_parameters": "DistributedDataParallel(model, find_unused_parameters=False) when every "
        "parameter is used",
    }
    found = {}
    for f in one_finding_per_check(tmp_path):
        found.setdefault(f.check, f)
        if f.check in fixes:
            assert f.remedy.startswith("code change in train.py: " + fixes[f.check]), f.remedy
    assert found["slow_rank"].remedy.startswith("not in the script: see what else runs on rank 1's core or device")
    assert found["host_syncs"].cause.startswith("each read waits until the device has run everything queued")
    # the evidence's counts: 4 micro-steps and 4 rounds a step; each rank's own work (50 and 80 ms)
    assert (
        "; 4 forward/backward micro-steps and 4 all-reduce rounds per optimizer step"
        in found["no_sync_missing"].evidence
    )
    assert "; each rank's own work per step: rank 0 50.0 ms, rank 1 80.0 ms" in found["straggler"].evidence


def test_threads_evaluation_a_product_faster_on_more_threads_and_the_flag_that_allowed_it(tmp_path):
    from paratrain.doctor import script_checks as sc

    four = {"threads": 4, "fair_threads": 1}
    # evaluation is sped up like the optimizer (a matrix product's 2x): forward and backward's 60 ms and the
    # evaluation's 20 ms lose half -> 40/100
    ev = probed(
        tmp_path,
        "a",
        [{"phases_s": {"forward": 0.03, "backward": 0.03, "eval": 0.02, "other": 0.02}, **four, "thread_penalty": 2.0}]
        * 2,
    )
    found = sc.threads(ev)
    assert found.saving == pytest.approx(0.4)
    assert "a matrix product 2.0x slower (the model's layers could not be timed alone)" in found.evidence
    # layers 2x, product 1.5x: the evidence names both
    ev = probed(
        tmp_path,
        "b",
        [{"phases_s": {"forward": 0.05, "backward": 0.05}, **four, "thread_penalty": 1.5, "layer_thread_penalty": 2.0}]
        * 2,
    )
    assert "the model's layers 2.0x slower, a matrix product 1.5x" in sc.threads(ev).evidence
    # both faster on 4 threads (0.8x): nothing gained, and no negative gain either
    ev = probed(
        tmp_path,
        "c",
        [
            {
                "phases_s": {"forward": 0.03, "backward": 0.03, "optimizer": 0.02, "eval": 0.02},
                **four,
                "thread_penalty": 0.8,
                "layer_thread_penalty": 0.8,
            }
        ]
        * 2,
    )
    assert sc.threads(ev).saving == 0.0
    # launch ran 4 threads with --allow-oversubscribe: the rerun drops that flag with the threads
    ev = probed(
        tmp_path,
        "d",
        [{"phases_s": {"forward": 0.1}, **four, "thread_penalty": 2.0}] * 2,
        config={"resolved": {"threads_per_worker": 4}, "allow_oversubscribe": True},
    )
    found = sc.threads(ev)
    assert "--threads-per-worker 1" in found.remedy and "--allow-oversubscribe" not in found.remedy


def test_exposed_communication_without_the_gradient_size_recorded(tmp_path):
    from paratrain.doctor import script_checks as sc

    # the gain does not need it (30 ms of a 100 ms step, k=4 as in the remedy test above); the evidence says 0 MiB
    ev = probed(tmp_path, "a", [{"phases_s": {"forward": 0.07, "comm": 0.03}}] * 2, drop=("gradient_bytes",))
    found = sc.exposed_communication(ev)
    assert found.saving == pytest.approx(1 - 0.31 / 0.4) and "; 0.0 MiB of gradients all-reduced" in found.evidence


def test_data_wait_counts_a_core_per_thread(tmp_path):
    from paratrain.doctor import script_checks as sc

    phases = {"data": 0.04, "forward": 0.03, "backward": 0.03}
    # 2 cores for 2 threads: none spare, the 10 ms of CPU stay -> 30/100
    ev = probed(tmp_path, "a", [{"phases_s": phases, "data_cpu_s": 0.01, "cpu_affinity": 2, "threads": 2}] * 2)
    assert sc.data_wait(ev).saving == pytest.approx(0.3)
    # 2 cores for 1 thread: the whole 40 ms, and the remedy is the DataLoader alone
    ev = probed(tmp_path, "b", [{"phases_s": phases, "data_cpu_s": 0.01, "cpu_affinity": 2, "threads": 1}] * 2)
    found = sc.data_wait(ev)
    assert found.saving == pytest.approx(0.4) and found.remedy.endswith("persistent_workers=True)")


def test_the_straggler_is_whichever_rank_works_longest(tmp_path):
    from paratrain.doctor import rank_checks as rc

    # rank 0 works 80 ms, rank 1 50 ms and waits 30: the 30 ms go -> 30/80 (mean step 80 ms); rank 0 is named
    found = rc.straggler(
        probed(tmp_path, "a", [{"phases_s": {"forward": 0.08}}, {"phases_s": {"forward": 0.05, "comm": 0.03}}])
    )
    assert found.saving == pytest.approx(0.03 / 0.08) and found.finding.startswith("rank 0 is a straggler")
    # of three ranks, rank 1 is slow (1.25x in forward and backward): it is the one named
    fast = {"phases_s": {"forward": 0.04, "backward": 0.08, "comm": 0.035}}
    found = rc.straggler(
        probed(tmp_path, "b", [fast, {"phases_s": {"forward": 0.05, "backward": 0.10, "comm": 0.005}}, fast])
    )
    assert found.check == "slow_rank" and found.finding.startswith("rank 1 runs the same work 1.25x slower")


def test_verify_refuses_a_machine_cause_in_one_line_naming_it(tmp_path):
    # A slow core is no code change either: the refusal says it is in the machine, with the remedy to look.
    from paratrain.doctor.verify import verify
    from paratrain.errors import UsageError

    run = probed_run(
        tmp_path / "run",
        [
            {"phases_s": {"forward": 0.04, "backward": 0.08, "comm": 0.035}, "samples_per_step": 32.0},
            {"phases_s": {"forward": 0.05, "backward": 0.10, "comm": 0.005}, "samples_per_step": 32.0},
        ],
    )
    with pytest.raises(UsageError, match=r"the top finding \(slow_rank\) is in the machine, not the run") as refused:
        verify(run)
    assert "code change" not in str(refused.value) and not (tmp_path / "run-verify").exists()


# The worker pause of test_loader_workers_on_the_ranks_cores_by_hand: forward and backward 20 ms a micro-step with the
# 4 workers running, 16 ms with them stopped; a batch prepared in the rank 2 ms, by a worker 5 ms of CPU.
LOADER_PAUSE = {
    "paused_steps": 3,
    "fb_per_micro_s": 0.020,
    "paused_fb_per_micro_s": 0.016,
    "inline_load_s": 0.002,
    "loader_cpu_per_batch_s": 0.005,
    "loader_workers": 4,
}


def test_loader_workers_on_the_ranks_cores_by_hand(tmp_path):
    from paratrain.doctor import diagnose
    from paratrain.doctor import script_checks as sc
    from paratrain.doctor.evidence import read_run

    # A 30 ms step, 4 ms of it the data phase; forward and backward 20 ms a micro-step with the workers
    # running, 16 ms with them stopped; a batch prepared in the rank 2 ms. One thread on one core, so the
    # remedy is num_workers=0: 30 - 4 - 4 + 2 = 24 ms -> 1 - 24/30 = 20 % saved.
    pause = LOADER_PAUSE
    phases = {"data": 0.004, "forward": 0.012, "backward": 0.008, "comm": 0.006}
    run = probed_run(tmp_path / "a", [{"phases_s": phases, **pause}] * 2)
    found = sc.loader_workers(read_run(run))
    assert found.saving == pytest.approx(1 - 0.024 / 0.030)
    assert found.check == "loader_workers" and found.remedy.startswith(
        "code change in train.py: DataLoader(..., num_workers=0)"
    )
    assert "4 DataLoader workers per rank share its 1 core(s) with torch's 1 thread(s)" == found.finding
    assert "16.0 ms a micro-step against 20.0 ms" in found.evidence and "took 2.0 ms" in found.evidence
    # It is a root cause (it slows every phase), so it comes first; the data wait's remedy (more workers)
    # would add to it, so that check says nothing here.
    assert sc.data_wait(read_run(run)) is None
    assert diagnose(run)["findings"][0]["check"] == "loader_workers"
    # Two micro-steps a step: the stall and the loading both count twice: 30 - 4 - 8 + 4 = 22 ms.
    two = probed_run(tmp_path / "b", [{"phases_s": phases, **pause, "micro_per_step": 2.0}] * 2)
    assert sc.loader_workers(read_run(two)).saving == pytest.approx(1 - 0.022 / 0.030)
    # No batch prepared in the rank (an iterable dataset): the workers' 5 ms per batch stands for it.
    no_inline = {**pause, "inline_load_s": None}
    ev = read_run(probed_run(tmp_path / "c", [{"phases_s": phases, **no_inline}] * 2))
    assert sc.loader_workers(ev).saving == pytest.approx(1 - 0.027 / 0.030)
    assert "the workers' CPU per batch stands for it" in sc.loader_workers(ev).evidence
    # Two cores, one thread: one worker on the free core, hidden while it keeps up: the step without the
    # stall and the data wait, plus the rank's own receiving (1 ms): 30 - 4 - 4 + 1 = 23 ms, and the
    # worker's 5 ms a batch fits under it.
    spare = probed_run(tmp_path / "d", [{"phases_s": phases, **pause, "cpu_affinity": 2, "data_cpu_s": 0.001}] * 2)
    found = sc.loader_workers(read_run(spare))
    assert found.saving == pytest.approx(1 - 0.023 / 0.030) and "num_workers=1" in found.remedy
    # ...unless that one worker cannot keep up: its 28 ms of CPU a batch is then the step.
    slow = probed_run(
        tmp_path / "e", [{"phases_s": phases, **pause, "cpu_affinity": 2, "loader_cpu_per_batch_s": 0.028}] * 2
    )
    assert sc.loader_workers(read_run(slow)).saving == pytest.approx(1 - 0.028 / 0.030)
    # Preparing the batch in the rank costs what the workers cost it: under 2 % saved, nothing is said.
    even = probed_run(tmp_path / "f", [{"phases_s": phases, **pause, "inline_load_s": 0.0075}] * 2)
    assert sc.loader_workers(read_run(even)) is None  # 30 - 8 + 7.5 = 29.5 ms: 1.7 % saved
    # Without steps run with the workers stopped there is no measurement, and no finding.
    bare = probed_run(tmp_path / "g", [{"phases_s": phases, "loader_workers": 4}] * 2)
    assert sc.loader_workers(read_run(bare)) is None


def test_the_worker_pause_summary_by_hand():
    from paratrain.launch.probe_summary import rank_record

    def step(n, fb, micro=1, **pause):
        return {
            "kind": "step",
            "step": n,
            "wall_s": 0.03,
            "data": 0.001,
            "forward": fb * 0.6,
            "backward": fb * 0.4,
            "comm": 0.0,
            "collective": 0.0,
            "optimizer": 0.0,
            "eval": 0.0,
            "checkpoint": 0.0,
            "other": 0.0,
            "data_cpu": 0.0,
            "ddp_overhead": 0.0,
            "samples": 8,
            "micro": micro,
            "rounds": 1,
            **pause,
        }

    # 30 steps: forward + backward 20 ms a micro-step (the 2 micro-step steps 40 ms), 23 ms in step 25;
    # three pauses of two DataLoader iterators (a new one each epoch), the workers stopped for the first
    # micro-step only in step 20 (8 ms of 2 micro-steps' 40 ms: their second fetch resumed them).
    records = [step(n, 0.020) for n in range(1, 31)]
    records[24] = step(25, 0.023)
    records[9] = step(10, 0.040, micro=2)
    records[10] = step(
        11,
        0.020,
        loader_id=7,
        loader_cpu_s=1.00,
        loader_batches=11,
        inline_load_s=0.004,
        paused_fb=0.012,
        paused_micro=1,
    )
    records[19] = step(
        20,
        0.040,
        micro=2,
        loader_id=7,
        loader_cpu_s=1.45,
        loader_batches=26,
        inline_load_s=0.006,
        paused_fb=0.014,
        paused_micro=1,
    )
    records[26] = step(
        27,
        0.020,
        loader_id=9,
        loader_cpu_s=0.20,
        loader_batches=3,
        inline_load_s=0.005,
        paused_fb=0.016,
        paused_micro=1,
    )
    out = rank_record(0, records)
    # the paused steps are kept apart: 30 steps, 3 warm-up, 3 paused
    assert out["steady_steps"] == 24 and out["paused_steps"] == 3
    assert out["fb_per_micro_s"] == pytest.approx(0.020)  # the median, over steps 4-30 but 11, 20, 27
    assert out["paused_fb_per_micro_s"] == pytest.approx(0.014)  # 12, 14, 16 ms
    # iterator 7: 0.45 s of the workers' CPU over 15 batches; iterator 9 has one reading: no interval
    assert out["loader_cpu_per_batch_s"] == pytest.approx(0.45 / 15)
    assert out["inline_load_s"] == pytest.approx(0.005)
    # a pause in which no training micro-step began (an evaluation loader's) is no measurement
    records[26] = step(
        27, 0.020, loader_id=9, loader_cpu_s=0.2, loader_batches=3, inline_load_s=0.5, paused_fb=0.0, paused_micro=0
    )
    out = rank_record(0, records)
    assert out["paused_steps"] == 2 and out["paused_fb_per_micro_s"] == pytest.approx(0.013)
    assert out["inline_load_s"] == pytest.approx(0.005)
    # no pause at all: no such fields
    assert "paused_steps" not in rank_record(0, [step(n, 0.02) for n in range(1, 31)])


def test_contention_is_a_caveat_beside_the_causes_it_cannot_explain(tmp_path):
    """The same exposed all-reduce, 50 % of a 100 ms step: on a quiet machine it is high; with other work on
    30 % of the run's cores it still stands above the contention caveat (30 % of the cores cannot make a wait of
    half the step), high, with a range; with other work on 60 % it ranks after the caveat, medium at most.
    Oversubscription, the run's own fault, stays high whatever the contention."""
    from paratrain.doctor import diagnose

    # a 100 ms step of which 50 ms is the all-reduce: k=8 micro-steps take 8 x 50 + 50 = 450 ms against 800
    comm = [{"phases_s": {"forward": 0.02, "backward": 0.03, "comm": 0.05}}] * 2
    quiet = probed_run(tmp_path / "quiet", comm)

    def contended(name, other):
        run = probed_run(tmp_path / name, comm)
        with_machine_load(run, other)
        return diagnose(run)

    def severities(found):
        return {f["check"]: f["severity"] for f in found}

    assert severities(diagnose(quiet)["findings"])["exposed_communication"] == "high"
    some = contended("some", 0.3)["findings"]
    assert [f["check"] for f in some][:2] == ["exposed_communication", "contended"]
    assert severities(some)["exposed_communication"] == "high"
    saving = 1 - 0.45 / 0.8
    assert {f["check"]: f["saving"] for f in some}["exposed_communication"] == pytest.approx(saving)
    low = 1 / (1 - (saving - 0.3) / 0.7)  # the contention made as much of the wait as it could
    assert f"at least {low:.2f}x" in some[0]["predicted_gain"]
    most = contended("most", 0.6)
    assert [f["check"] for f in most["findings"]][:2] == ["contended", "exposed_communication"]
    assert severities(most["findings"])["exposed_communication"] == "medium"
    assert most["verdict"].startswith("read with care")
    from paratrain.doctor import tempered
    from paratrain.doctor.finding import Finding

    kept = tempered(
        [
            Finding("contended", "", "", "", "", "", None, share=0.6),
            Finding("oversubscription", "", "", "", "", "", 0.5),
        ],
        contention_change=0.0,
    )
    assert [f.severity for f in kept] == ["advice", "high"]


def test_other_work_on_one_ranks_core_is_the_caveats_share(tmp_path):
    """The exposed all-reduce of 50 % of a 100 ms step: with other work on 30 % of the run's cores it stands
    above the caveat; when the monitor saw 60 % of rank 1's own core taken (its core busy 100 %, the rank and its
    children 40 %), rank 1 ran at 40 % speed and rank 0's wait may be that: the caveat takes that share and the
    all-reduce ranks after it. Other work on one core above 20 % marks a run contended whose average is under
    10 %; ranks sharing their cores get no figure of their own."""
    from paratrain.doctor import diagnose
    from paratrain.measure.monitor import SYSTEM_FILE

    comm = [{"phases_s": {"forward": 0.02, "backward": 0.03, "comm": 0.05}}] * 2

    def run(name, other, tree, cores=([0], [1])):
        path = probed_run(tmp_path / name, comm)
        summary = json.loads((path / "summary.json").read_text())
        summary["machine_load"] = {"cores": 2, "wall_s": 10.0, "other_fraction": other, "contended": other > 0.1}
        (path / "summary.json").write_text(json.dumps(summary))
        lines = []
        for t in range(4):
            lines.append({"time": t, "kind": "host", "cpu_percent": [100.0, 100.0]})
            for r in (0, 1):
                # half of each rank's CPU in its children (DataLoader workers): its own work all the same
                sample = {"time": t, "kind": "rank", "rank": r, "cpu_percent": tree[r] / 2, "tree_cpu_percent": tree[r]}
                lines.append({**sample, "cores": cores[r]})
        (path / SYSTEM_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
        return diagnose(path)["findings"]

    found = run("one", 0.3, (100.0, 40.0))
    assert [f["check"] for f in found][:2] == ["contended", "exposed_communication"]
    caveat = found[0]
    assert "30% of the run's cores and 60% of rank 1's" in caveat["finding"], caveat["finding"]
    assert "rank 0's 0.0%, rank 1's 60%" in caveat["evidence"], caveat["evidence"]
    # every rank's tree 100 %: nothing else on their cores, the run's 30 % stays the bar
    even = run("even", 0.3, (100.0, 100.0))
    assert [f["check"] for f in even][:2] == ["exposed_communication", "contended"]
    # 25 % of rank 1's core, the run's 8 %: contended; 20 % exactly is not
    assert "contended" in {f["check"] for f in run("core", 0.08, (100.0, 75.0))}
    assert "contended" not in {f["check"] for f in run("edge", 0.08, (100.0, 80.0))}
    # rank 0's core the busy one (not the last rank's): named as such
    zero = run("zero", 0.3, (40.0, 100.0))[0]
    assert "60% of rank 0's" in zero["finding"], zero["finding"]
    # nothing measured over the run's cores (0 %), 25 % of rank 1's: the caveat's share is 25 %, under the all-reduce
    assert [f["check"] for f in run("alone", 0.0, (100.0, 75.0))][:2] == ["exposed_communication", "contended"]
    # both ranks on both cores: no rank's own cores to read
    shared = run("shared", 0.08, (100.0, 50.0), cores=([0, 1], [0, 1]))
    assert "contended" not in {f["check"] for f in shared}


def test_what_the_probe_could_not_record_is_said_in_one_finding(tmp_path):
    """A trace the probe could not take (the script profiles itself; torch.profiler failed) and a run directory
    with no probe block are each named, with what to do; a rank that has its trace needs no such note."""
    from paratrain.doctor import diagnose

    phases = {"forward": 0.05, "backward": 0.05}
    own = "the script runs torch.profiler itself at this step: the probe left it its profiler"
    mine = diagnose(probed_run(tmp_path / "own", [{"phases_s": phases, "trace_missing": own}] * 2))["findings"]
    note = next(f for f in mine if f["check"] == "trace_missing")
    assert "the script runs torch.profiler itself" in note["finding"] and "rank 0: " + own in note["evidence"]
    assert note["remedy"].startswith("code change in train.py: remove the script's profiler")
    failed = "torch.profiler could not record or write the trace: OSError: disk full"
    broke = diagnose(probed_run(tmp_path / "broke", [{"phases_s": phases, "trace_missing": failed}] * 2))
    note = next(f for f in broke["findings"] if f["check"] == "trace_missing")
    assert "torch.profiler failed" in note["finding"] and "OSError: disk full" in note["evidence"]
    traced = {"phases_s": phases, "trace_missing": failed, "trace": {"steps": 2, "phases": {}}}
    assert "trace_missing" not in {
        f["check"] for f in diagnose(probed_run(tmp_path / "traced", [traced] * 2))["findings"]
    }
    # the probe block gone from summary.json
    bare = probed_run(tmp_path / "bare", [{"phases_s": phases}] * 2)
    summary = json.loads((bare / "summary.json").read_text())
    del summary["probe"]
    (bare / "summary.json").write_text(json.dumps(summary))
    note = next(f for f in diagnose(bare)["findings"] if f["check"] == "probe_off")
    assert note["finding"] == "no step breakdown: the probe is missing" and "no probe block" in note["evidence"]


SYNC_WHERE = ".item(), .tolist(), .cpu(), .numpy() or torch.cuda.synchronize() in the step"


def test_each_finding_names_where_its_time_goes_and_how_much_it_explains_by_hand(tmp_path):
    """`where` (the code the time goes to), `explains` (seconds a step of which measured phase the finding accounts
    for: what the doctor's ledger leaves unexplained is the rest) and the global batch factor of each script check,
    on one_finding_per_check's cases; each figure from the check's model, worked out in its comment."""
    found = one_finding_per_check(tmp_path)
    expected = {
        # threads: 4 threads on 1 core, penalty 2 for everything (no layer timings): half of forward's and
        # backward's 50 ms goes; no optimizer or evaluation time to explain
        0: ("torch.set_num_threads(4)", {"forward": 0.025, "backward": 0.025, "optimizer": 0.0, "eval": 0.0}, None),
        1: ("the DataLoader (num_workers=0)", {"data": 0.04}, None),  # no spare core, no CPU in the rank: all hidden
        # 70 ms of micro-step work, 30 ms all-reduce: 4 micro-steps bring it to 30 / 310 < 10 %
        2: ("DistributedDataParallel's gradient all-reduce", {"comm": 0.03}, 4),
        # 98 of 100 ms fixed; doubling until under 25 % stops at 16, the timed batches' ratio (32 / 2)
        3: ("batch_size=2 per rank", {"optimizer": 0.0, "comm": 0.08}, 16),
        4: ("the micro-steps before the last, outside model.no_sync()", {"comm": 0.04 * 3 / 4}, None),  # 3 of 4 go
        5: ("the script's own torch.distributed calls between the phases", {"collective": 0.02}, None),
        6: (SYNC_WHERE, {"other": 0.03}, None),
        7: (SYNC_WHERE, {"other": 0.0}, None),
        8: ("evaluation in the training loop", {"eval": 0.03}, None),
        9: ("evaluation on rank 0 only", {"eval": 0.02}, None),  # 40 ms on rank 0, none on rank 1: 20 ms a rank
        10: ("torch.save every 2 steps", {"checkpoint": 0.02}, None),  # 45 saves in 90 steps
        14: ("DistributedDataParallel(find_unused_parameters=True)", {"ddp_forward": 0.01}, None),
    }
    for i, (where, explains, factor) in expected.items():
        f = found[i]
        assert (f.where, f.global_batch_factor) == (where, factor), (i, f.check)
        assert f.explains == pytest.approx(explains), (i, f.check, f.explains)


def test_the_figures_of_threads_data_wait_and_small_batch_beyond_the_common_case(tmp_path):
    from paratrain.doctor import script_checks as sc

    # Launch gave the 4 threads (its flag is where); the layers 2x slower, a matrix product 1.5x: forward and
    # backward lose half of 40 ms each, optimizer and evaluation a third of 10 ms each.
    phases = {"forward": 0.04, "backward": 0.04, "optimizer": 0.01, "eval": 0.01}
    slow = {"threads": 4, "fair_threads": 1, "thread_penalty": 1.5, "layer_thread_penalty": 2.0}
    ev = probed(tmp_path, "threads", [{"phases_s": phases, **slow}] * 2, config={"resolved": {"threads_per_worker": 4}})
    found = sc.threads(ev)
    assert found.where == "--threads-per-worker 4"
    assert found.explains == pytest.approx({"forward": 0.02, "backward": 0.02, "optimizer": 0.01 / 3, "eval": 0.01 / 3})
    assert found.saving == pytest.approx((0.08 / 2 + 0.02 / 3) / 0.1)
    # A matrix product no slower on 4 threads: optimizer and evaluation are not among what it explains.
    even = {**slow, "thread_penalty": 1.0}
    found = sc.threads(probed(tmp_path, "even", [{"phases_s": phases, **even}] * 2))
    assert found.explains == pytest.approx({"forward": 0.02, "backward": 0.02})
    # Data: 40 ms of a 100 ms step, 10 ms of it CPU in the rank's thread.
    data = {"phases_s": {"data": 0.04, "forward": 0.06}, "data_cpu_s": 0.01}
    # one core, no spare: only the waiting (30 ms) hides; two workers already: where names them
    found = sc.data_wait(probed(tmp_path, "busy", [{**data, "loader_workers": 2}] * 2))
    assert (found.where, found.explains) == ("the DataLoader (num_workers=2)", {"data": pytest.approx(0.03)})
    # a spare core: all 40 ms hide, even where the workers were paused (they do not crowd the rank's cores)
    spare = {**data, "loader_workers": 2, "cpu_affinity": 2, "paused_steps": 3}
    assert sc.data_wait(probed(tmp_path, "spare", [spare] * 2)).explains == {"data": pytest.approx(0.04)}
    # no spare core and workers paused: loader_workers measured that more workers would wait longer
    assert sc.data_wait(probed(tmp_path, "crowded", [{**spare, "cpu_affinity": 1}] * 2)) is None
    # a probe that did not record the workers: none
    assert sc.data_wait(probed(tmp_path, "unknown", [data] * 2, drop=("loader_workers",))).where.endswith("=0)")
    # Small batch with an optimizer: both once-a-step costs are what the finding explains.
    small = {"samples_per_step": 2.0, "batch_slope_s": 0.001, "batch_slope_between": [2, 32]}
    phases = {"forward": 0.01, "backward": 0.01, "optimizer": 0.02, "comm": 0.06}
    found = sc.small_batch(probed(tmp_path, "small", [{"phases_s": phases, **small}] * 2))
    assert found.explains == pytest.approx({"optimizer": 0.02, "comm": 0.06})
    # Host syncs without device times: the time waited in them is what they explain, though no gain is predicted.
    reads = {"phases_s": {"forward": 0.1}, "syncs_per_step": 2.0, "sync_wait_s": 0.02}
    found = sc.host_syncs(probed(tmp_path, "reads", [reads] * 2))
    assert (found.where, found.explains, found.saving) == (SYNC_WHERE, {"other": 0.02}, None)


def test_loader_workers_reads_the_cores_and_threads_of_the_ranks_that_paused(tmp_path):
    from paratrain.doctor import script_checks as sc

    pause = LOADER_PAUSE
    phases = {"data": 0.004, "forward": 0.012, "backward": 0.008, "comm": 0.006}
    # As test_loader_workers_on_the_ranks_cores_by_hand: 30 ms, num_workers=0 gives 24 ms. It explains the data
    # phase and the 4 ms stall in forward and backward.
    found = sc.loader_workers(probed(tmp_path, "a", [{"phases_s": phases, **pause}] * 2))
    assert found.where == "DataLoader(num_workers=4)"
    assert found.explains == pytest.approx({"data": 0.004, "forward": 0.004})
    # Only ranks that paused their workers count: rank 1 did not (its stall, 12 ms, would change the figures).
    other = {**pause, "paused_steps": 0, "paused_fb_per_micro_s": 0.008}
    found = sc.loader_workers(probed(tmp_path, "b", [{"phases_s": phases, **pause}, {"phases_s": phases, **other}]))
    assert found.explains["forward"] == pytest.approx(0.004)
    # A batch timed in the rank but not the workers' CPU (no psutil reading): still measured.
    ev = probed(tmp_path, "c", [{"phases_s": phases, **pause, "loader_cpu_per_batch_s": None}] * 2)
    assert sc.loader_workers(ev).saving == pytest.approx(1 - 0.024 / 0.030)
    # Rank 0's cores: 3 cores, 1 thread -> 2 spare workers; a worker's 28 ms a batch over 2 is 14 ms, under the
    # 23 ms of the step left (30 - 4 - 4 + 1 ms received), so 23 ms. Rank 1 with one core changes nothing.
    wide = {**pause, "cpu_affinity": 3, "data_cpu_s": 0.001, "loader_cpu_per_batch_s": 0.028}
    ranks = [{"phases_s": phases, **wide}, {"phases_s": phases, **wide, "cpu_affinity": 1}]
    found = sc.loader_workers(probed(tmp_path, "d", ranks))
    assert found.saving == pytest.approx(1 - 0.023 / 0.030) and "num_workers=2" in found.remedy
    # Threads not recorded: one; cores not recorded: one (so no spare core, num_workers=0).
    two_cores = {**pause, "cpu_affinity": 2, "data_cpu_s": 0.001}
    found = sc.loader_workers(probed(tmp_path, "e", [{"phases_s": phases, **two_cores}] * 2, drop=("threads",)))
    assert "num_workers=1" in found.remedy
    found = sc.loader_workers(probed(tmp_path, "f", [{"phases_s": phases, **pause}] * 2, drop=("cpu_affinity",)))
    assert "num_workers=0" in found.remedy and found.saving == pytest.approx(1 - 0.024 / 0.030)
    # Workers not recorded: none.
    found = sc.loader_workers(probed(tmp_path, "g", [{"phases_s": phases, **pause}] * 2, drop=("loader_workers",)))
    assert found.where == "DataLoader(num_workers=0)"
    # 2 threads on 3 cores leave one core: one worker.
    found = sc.loader_workers(
        probed(tmp_path, "h", [{"phases_s": phases, **two_cores, "cpu_affinity": 3, "threads": 2}] * 2)
    )
    assert "num_workers=1" in found.remedy


def test_the_step_text_shows_each_phase_down_to_a_two_thousandth_of_the_step_and_a_missing_probe_block(tmp_path):
    from paratrain.doctor import script_checks as sc
    from paratrain.doctor.evidence import read_run

    # A 100 ms step: 1 ms of data is shown (over 0.05 ms), 0.04 ms of optimizer is not.
    ev = probed(tmp_path, "a", [{"phases_s": {"data": 0.001, "forward": 0.09896, "optimizer": 0.00004}}] * 2)
    assert sc._steps_text(ev) == "step 100 ms (mean of 2 ranks): data 1.0 ms, forward 99.0 ms"
    # A launched script's summary without a probe block: its ranks ended before writing it.
    run = probed_run(tmp_path / "b", [{"phases_s": {"forward": 0.1}}] * 2)
    summary = json.loads((run / "summary.json").read_text())
    del summary["probe"]
    (run / "summary.json").write_text(json.dumps(summary))
    found = sc.probe_status(read_run(run))
    assert (found.finding, found.evidence) == (
        "no step breakdown: the probe is missing",
        "summary.json holds no probe block: a run whose ranks ended before writing it",
    )


def test_small_batch_leaves_the_waits_for_other_ranks_out_of_the_fixed_part(tmp_path):
    from paratrain.doctor import script_checks as sc

    # a 100 ms step whose all-reduce takes 60 ms a rank, 10 ms of it its own (the least rank's in each step): the
    # 50 ms of waiting lasts as long as another rank's work runs over, which grows with the batch; the step without
    # it is 50 ms, of which 20 ms (2 samples x 10 ms of layers) grow and 30 ms do not (60 %). k=2: 30/70, 4: 30/110,
    # 8: 30/190 (16 %) -> 50 + 7 x 20 = 190 ms against 8 x 50 = 400. Counted as fixed, the waits made it 80 % of
    # the step and k=16: 1 - 0.4/1.6 = 0.75
    phases = {"forward": 0.01, "backward": 0.01, "comm": 0.06, "optimizer": 0.01, "other": 0.01}
    small = {"samples_per_step": 2.0, "batch_slope_s": 0.01, "batch_slope_between": [2, 32]}
    ev = read_run_of(probed_run(tmp_path / "waits", [{"phases_s": phases, **small}] * 2, probe={"all_reduce_s": 0.01}))
    assert sc.small_batch(ev).saving == pytest.approx(1 - 0.19 / 0.4)
    assert "both without the 50.0 ms a step the ranks wait" in sc.small_batch(ev).predicted_gain
    # the script's own collectives' waits too: 50 ms of a barrier, 0 of it its own, the all-reduce all its own
    barrier = {**phases, "comm": 0.01, "collective": 0.05}
    ev = read_run_of(
        probed_run(
            tmp_path / "barrier",
            [{"phases_s": barrier, **small}] * 2,
            probe={"all_reduce_s": 0.01, "collective_own_s": 0.0},
        )
    )
    assert sc.small_batch(ev).saving == pytest.approx(1 - 0.19 / 0.4)


def read_run_of(run):
    from paratrain.doctor.evidence import read_run

    return read_run(run)


def test_a_comparison_of_two_moments_stands_above_contention_that_stayed_put(tmp_path):
    """Growth over a run (or a jump, or the layers timed at step 3 against the steps) read while other work took
    60 % of a core: the same share all run long slowed the early steps as much as the late ones, so the finding
    stands above the caveat; other work that rose from none to all of rank 1's core could have made the trend, and
    the finding ranks after it. The change is read from the monitor's samples, the first third against the last."""
    from paratrain.doctor import tempered
    from paratrain.doctor.evidence import read_run
    from paratrain.doctor.finding import Finding
    from paratrain.measure.monitor import SYSTEM_FILE

    caveat = Finding("contended", "", "", "", "", "", None, share=0.6)
    growth = Finding("growing_steps", "", "", "", "", "", 0.3, share=0.3)
    steady = {f.check: f for f in tempered([caveat, growth], contention_change=0.05)}
    assert steady["growing_steps"].above_contention and steady["growing_steps"].severity == "high"
    moving = {f.check: f for f in tempered([caveat, growth], contention_change=0.10)}
    assert not moving["growing_steps"].above_contention and moving["growing_steps"].severity == "medium"
    # a waiting finding is tempered whatever the contention did
    wait = Finding("straggler", "", "", "", "", "", 0.3, share=0.3)
    assert not tempered([caveat, wait], contention_change=0.0)[1].above_contention

    def run(name, rank1_tree):
        path = probed_run(tmp_path / name, [{"phases_s": {"forward": 0.05, "backward": 0.05}}] * 2)
        lines = []
        for t, tree in enumerate(rank1_tree):
            lines.append({"time": t, "kind": "host", "cpu_percent": [100.0, 100.0]})
            lines.append({"time": t, "kind": "rank", "rank": 0, "tree_cpu_percent": 100.0, "cores": [0]})
            lines.append({"time": t, "kind": "rank", "rank": 1, "tree_cpu_percent": tree, "cores": [1]})
        (path / SYSTEM_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
        return read_run(path)

    # rank 1 at 40 % of its core throughout: 60 % other work, steady
    assert run("steady", [40.0] * 6).contention_change == pytest.approx(0.0)
    # other work on rank 1's core: 0, 0 | 50, 50 | 100, 100 % (the rank's tree 100, 100, 50, 50, 0, 0): first third
    # none, last third all of it
    assert run("rising", [100.0, 100.0, 50.0, 50.0, 0.0, 0.0]).contention_change == pytest.approx(1.0)
    # no samples of a rank's own cores: unknown, and a comparison of two moments is tempered as before
    assert run("none", []).contention_change is None
    assert not tempered([caveat, growth], contention_change=None)[1].above_contention
