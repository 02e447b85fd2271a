"""The scaling table (scale/__init__.py) against hand-computed cases: each row's medians, ranges,
speed-up, efficiency and flags from run directories written here, and each point's configuration
(batch per replica in weak and strong scaling, threads, run directories, the order of the points)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from paratrain.config import ScaleConfig
from paratrain.errors import UsageError
from paratrain.runs import RunDir, write_json
from paratrain.scale import point_config, scaling_rows, study_points, study_spec


def run(
    root: Path,
    name: str,
    workers: int,
    epoch_times: list[float] | None,
    rate: float,
    threads: int | None = 1,
    config: dict[str, Any] | None = None,
    **summary: Any,
) -> RunDir:
    """A finished run: `threads` None is the one process on all (2) cores."""
    r = RunDir(root / name)
    r.path.mkdir(parents=True)
    resolved = {"device": "cpu", "threads_per_worker": threads or 2}
    write_json(
        r.config,
        {"workload": "m", "workers": workers, "threads_per_worker": threads, "resolved": resolved, **(config or {})},
    )
    write_json(
        r.summary,
        {
            "status": "completed",
            "workers": workers,
            "strategy": "ddp" if workers > 1 else "single",
            "batch_size": 32,
            "global_batch_size": 32 * workers,
            "lr": 0.1,
            "samples_per_s": rate,
            **({"epoch_times_s": epoch_times} if epoch_times is not None else {}),
            **summary,
        },
    )
    return r


def weak_study(root: Path) -> list[RunDir]:
    return [
        run(root, "w1-r0", 1, [9.0, 4.0, 4.0], 100.0, val_accuracy=0.5, breakdown={"data_s": 0.1, "compute_s": 0.3}),
        run(root, "w2-r0", 2, [9.0, 2.0, 2.0], 210.0, val_accuracy=0.4, machine_load={"contended": True}),
        run(root, "ref-r0", 1, [9.0, 3.0, 3.0], 140.0, threads=None, val_accuracy=0.55),
        run(root, "w1-r1", 1, [9.0, 4.4, 4.4], 95.0, val_accuracy=0.6, breakdown={"data_s": 0.3, "compute_s": 0.5}),
        run(root, "w2-r1", 2, [9.0, 2.5, 2.5], 168.0, val_accuracy=0.44),
    ]


def test_each_row_is_the_median_of_its_repeats_against_the_smallest_point(tmp_path):
    # Steady epochs: 1 worker 4.0 and 4.4 s (median 4.2), 2 workers 2.0 and 2.5 s (2.25); the one
    # process on all cores 3.0 s. Speed-up of 2 workers: 4.2 / 2.25 = 1.867 (1.68 to 2.1 over the
    # repeats), efficiency 0.933; against all cores 3 / 2.25 = 1.333.
    w1, w2, ref = scaling_rows(weak_study(tmp_path))
    assert (w1["point"], w2["point"], ref["point"]) == ("scaling", "scaling", "all_cores_reference")
    assert w1["epoch_time_s"] == pytest.approx(4.2) and w1["epoch_time_s_range"] == [4.0, 4.4]
    assert w1["speedup"] == pytest.approx(1.0) and w1["efficiency"] == pytest.approx(1.0)
    assert w1["speedup_range"] == pytest.approx([4.2 / 4.4, 4.2 / 4.0])
    assert w1["samples_per_s"] == pytest.approx(97.5) and w1["samples_per_s_range"] == [95.0, 100.0]
    assert w2["speedup"] == pytest.approx(4.2 / 2.25) and w2["efficiency"] == pytest.approx(4.2 / 2.25 / 2)
    assert w2["speedup_range"] == pytest.approx([4.2 / 2.5, 4.2 / 2.0])
    assert w2["speedup_vs_all_cores"] == pytest.approx(3 / 2.25)
    assert w2["speedup_vs_all_cores_range"] == pytest.approx([3 / 2.5, 3 / 2.0])
    # the reference: 1 worker of 2 threads: speed-up 4.2 / 3 = 1.4 for 2 base workers' cores, efficiency 0.7
    assert (ref["workers"], ref["threads_per_worker"]) == (1, 2)
    assert ref["speedup"] == pytest.approx(1.4) and ref["efficiency"] == pytest.approx(0.7)
    assert ref["speedup_vs_all_cores"] == pytest.approx(1.0)
    assert [r["speedup_basis"] for r in (w1, w2, ref)] == ["epoch_time_s"] * 3


def test_rows_carry_their_repeats_flags_accuracy_and_breakdown(tmp_path):
    w1, w2, ref = scaling_rows(weak_study(tmp_path))
    # 210 / 168 = 1.25 > 1.15: the repeats disagree; one of the two runs was contended
    assert w2["flags"] == ["contended", "repeats_disagree"] and w2["contended_runs"] == 1
    assert w2["repeat_spread"] == pytest.approx(1.25) and w1["flags"] == [] and w1["contended_runs"] == 0
    assert (w1["repeats"], ref["repeats"]) == (2, 1)
    assert w1["run_dirs"] == [str(tmp_path / "w1-r0"), str(tmp_path / "w1-r1")] and w1["run_dir"] == w1["run_dirs"][0]
    assert w1["val_accuracy"] == pytest.approx(0.55) and w1["val_split"] == "test"
    # each phase's median over the repeats that timed it; an older summary's partial breakdown reads
    assert w1["breakdown"] == pytest.approx({"data_s": 0.2, "compute_s": 0.4})
    assert w2["breakdown"] is None
    assert (w2["workload"], w2["strategy"], w2["global_batch_size"], w2["batch_size"], w2["lr"]) == (
        "m",
        "ddp",
        64,
        32,
        0.1,
    )
    assert w2["tokens_per_s"] is None and w2["mfu"] is None


def test_tokens_mfu_and_accuracy_are_medians_only_when_every_repeat_has_them(tmp_path):
    rows = scaling_rows(
        [
            run(tmp_path, "a", 1, [2.0, 1.0], 10.0, tokens_per_s=1000.0, mfu=0.2, val_accuracy=0.5),
            run(tmp_path, "b", 1, [2.0, 1.0], 10.0, tokens_per_s=2000.0, mfu=0.4),
            run(tmp_path, "c", 1, [2.0, 1.0], 10.0, tokens_per_s=4000.0, mfu=0.3, val_accuracy=0.7),
        ]
    )
    (row,) = rows
    assert row["tokens_per_s"] == 2000.0 and row["mfu"] == pytest.approx(0.3) and row["val_accuracy"] is None


def test_a_single_epoch_includes_start_up_and_unfinished_runs_are_left_out(tmp_path):
    runs = [
        run(tmp_path, "one", 1, [5.0], 10.0),
        run(tmp_path, "two", 2, [5.0, 2.0], 20.0),
        run(tmp_path, "failed", 2, [5.0, 1.0], 40.0, status="failed"),
        run(tmp_path, "unmeasured", 2, [5.0, 1.0], 40.0),
    ]
    summary = runs[3].read_summary()
    del summary["samples_per_s"]
    write_json(runs[3].summary, summary)
    one, two = scaling_rows(runs)
    assert one["flags"] == ["includes_startup"] and two["flags"] == []
    assert two["repeats"] == 1 and two["speedup"] == pytest.approx(5.0 / 2.0)  # 1 worker's only epoch: 5 s


def test_a_script_is_compared_by_samples_per_second(tmp_path):
    script = {"script": "train.py"}
    rows = scaling_rows(
        [
            run(tmp_path, "w1", 1, None, 100.0, config=script),
            run(tmp_path, "w2", 2, None, 180.0, config=script),
            run(tmp_path, "w2b", 2, None, 160.0, config=script),
        ]
    )
    w1, w2 = rows
    assert (w1["workload"], w2["speedup_basis"]) == ("train.py", "samples_per_s")
    # the time of a sample: 1/100 s at 1 worker, the median of 1/180 and 1/160 s at 2
    assert w2["speedup"] == pytest.approx(0.01 / ((1 / 180 + 1 / 160) / 2))
    assert w2["speedup_range"] == pytest.approx([1.6, 1.8]) and w2["samples_per_s"] == 170.0
    assert w2["epoch_time_s"] is None and w2["epoch_time_s_range"] is None


def test_a_strategy_axis_gives_each_strategy_its_line_from_the_same_base(tmp_path):
    runs = [
        run(tmp_path, "w1", 1, [3.0, 4.0], 100.0),
        run(tmp_path, "ddp", 2, [3.0, 2.5], 160.0),
        run(tmp_path, "fsdp", 2, [3.0, 3.2], 125.0, strategy="fsdp"),
        run(tmp_path, "ref", 1, [3.0, 2.0], 200.0, threads=None),
    ]
    rows = scaling_rows(runs, ["ddp", "fsdp"])
    assert [(r["workload"], r["workers"], r["point"]) for r in rows] == [
        ("m · ddp", 1, "scaling"),
        ("m · ddp", 2, "scaling"),
        ("m · ddp", 1, "all_cores_reference"),
        ("m · fsdp", 1, "scaling"),
        ("m · fsdp", 2, "scaling"),
        ("m · fsdp", 1, "all_cores_reference"),
    ]
    assert rows[1]["speedup"] == pytest.approx(4.0 / 2.5) and rows[4]["speedup"] == pytest.approx(4.0 / 3.2)
    # without the axis, the same runs are one line whose 2-worker row takes both strategies' runs
    plain = scaling_rows(runs)
    assert [r["workers"] for r in plain] == [1, 2, 1] and plain[1]["repeats"] == 2


def test_hsdp_runs_on_the_axis_are_a_line_of_their_own_though_their_summaries_say_fsdp(tmp_path):
    """--strategy hsdp runs as fsdp --dp-replicate R: its summary's strategy is fsdp, its layout replicated. Beside
    fsdp on the axis it was taken for a repeat of fsdp's point."""
    mesh = {"dp_replicate": 2, "dp_shard": 1, "tp": 1, "pp": 1}
    runs = [
        run(tmp_path, "w1", 1, [3.0, 4.0], 100.0),
        run(tmp_path, "fsdp", 2, [3.0, 3.2], 125.0, strategy="fsdp", layout={**mesh, "dp_replicate": 1, "dp_shard": 2}),
        run(tmp_path, "hsdp", 2, [3.0, 2.5], 160.0, strategy="fsdp", layout=mesh),
    ]
    rows = scaling_rows(runs, ["fsdp", "hsdp"])
    lines = {(r["workload"], r["workers"]): r for r in rows}
    assert lines[("m · fsdp", 2)]["repeats"] == lines[("m · hsdp", 2)]["repeats"] == 1
    assert lines[("m · hsdp", 2)]["speedup"] == pytest.approx(4.0 / 2.5)
    # an axis of fsdp alone keeps every fsdp run, replicated or not, on fsdp's line
    assert {r["workload"] for r in scaling_rows(runs, ["fsdp"])} == {"m · fsdp"}


def test_a_replaced_model_or_dataset_names_the_row_and_workloads_keep_their_order(tmp_path):
    runs = [
        run(tmp_path / "b", "w1", 1, [2.0, 1.0], 10.0, config={"workload": "zeta"}),
        run(tmp_path / "a", "w1", 1, [2.0, 1.0], 10.0, config={"model": "pkg:Net", "dataset": "mine"}, model="Net"),
    ]
    assert [r["workload"] for r in scaling_rows(runs)] == ["zeta", "Net on mine"]


# -- the points ---------------------------------------------------------------------------------------


def study(tmp_path: Path, **fields: Any) -> ScaleConfig:
    workload = {} if "script" in fields else {"workload": ["synthetic-cnn"]}
    return ScaleConfig(out=tmp_path, **({"workers": [1, 2, 4]} | workload | fields))


def test_strong_scaling_splits_one_global_batch_and_keeps_its_lr(tmp_path):
    strong = study(tmp_path, mode="strong", train={"batch_size": 32})
    assert [(point_config(strong, "synthetic-cnn", n, 0)["batch_size"]) for n in (1, 2, 4)] == [32, 16, 8]
    assert point_config(strong, "synthetic-cnn", 4, 0)["base_batch_size"] == 32
    given = study(tmp_path, mode="strong", workers=[2, 4], train={"batch_size": 48})  # not the default 32
    assert point_config(given, "synthetic-cnn", 4, 0)["batch_size"] == 24
    odd = study(tmp_path, mode="strong", workers=[1, 3], train={"batch_size": 32})
    with pytest.raises(UsageError, match="global batch 32 over 3 data-parallel replicas"):
        point_config(odd, "synthetic-cnn", 3, 0)


def test_weak_scaling_keeps_the_batch_per_worker_and_a_pipelines_replicas_share_it(tmp_path):
    weak = study(tmp_path, train={"batch_size": 32}, strategy=["ddp", "hybrid"])
    ddp = point_config(weak, "synthetic-cnn", 4, 1, strategy="ddp")
    assert (ddp["batch_size"], "base_batch_size" in ddp, ddp["threads_per_worker"]) == (32, False, 1)
    assert ddp["run_dir"] == str(tmp_path / "runs" / "synthetic-cnn-ddp-w4-r1")
    # hybrid on 4 workers: 2 replicas (its default) of 2 stages: each replica takes 2 workers' batches
    hybrid = point_config(weak, "synthetic-cnn", 4, 0, strategy="hybrid")
    assert (hybrid["dp"], hybrid["batch_size"], hybrid["base_batch_size"]) == (2, 64, 32)
    reference = point_config(weak, "synthetic-cnn", 1, 0, all_cores=True)
    assert reference["threads_per_worker"] is None and reference["run_dir"].endswith("synthetic-cnn-w1-all-cores-r0")


def test_points_alternate_over_the_repeats_with_the_reference_last_and_a_spec_without_quiet(tmp_path):
    points = study_points(study(tmp_path, workers=[1, 2], repeats=2, quiet=True), on_cpu=True)
    names = [Path(cfg["run_dir"]).name for *_, cfg in points]
    assert names == [
        "synthetic-cnn-w1-r0",
        "synthetic-cnn-w2-r0",
        "synthetic-cnn-w1-all-cores-r0",
        "synthetic-cnn-w1-r1",
        "synthetic-cnn-w2-r1",
        "synthetic-cnn-w1-all-cores-r1",
    ]
    assert [p[:3] for p in points[:3]] == [("synthetic-cnn", 1, 0), ("synthetic-cnn", 2, 0), ("synthetic-cnn", 1, 0)]
    assert all(cfg["quiet"] for *_, cfg in points)
    assert len(study_points(study(tmp_path, workers=[1, 2]), on_cpu=False)) == 2  # no reference off CPU
    spec = study_spec(study(tmp_path, workers=[1, 2], train={"quiet": True, "lr": 0.1, "epochs": 2}))
    assert spec == {
        "mode": "weak",
        "workers": [1, 2],
        "repeats": 1,
        "workload": ["synthetic-cnn"],
        "train": {"epochs": 2, "lr": 0.1},
    }


def test_a_script_study_launches_each_point_with_its_mode_and_one_core_a_worker(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('samples_per_s=1')\n")
    points = study_points(
        study(tmp_path, workers=[1, 2], script=script, script_args=["--epochs", "2"], mode="strong", probe=False),
        on_cpu=True,
    )
    w1, w2, ref = (cfg for *_, cfg in points)
    assert [p[0] for p in points] == ["train.py"] * 3
    assert (w2["workers"], w2["threads_per_worker"], ref["threads_per_worker"]) == (2, 1, None)
    assert w2["env"] == {"PARATRAIN_SCALE_MODE": "strong"} and w2["probe"] is False
    assert w2["script"] == str(script) and w2["script_args"] == ["--epochs", "2"]
    assert [Path(c["run_dir"]).name for c in (w1, w2, ref)] == ["train-w1-r0", "train-w2-r0", "train-w1-all-cores-r0"]
    spec = study_spec(study(tmp_path, workers=[1, 2], script=script))
    assert (spec["workload"], spec["script"], spec["script_args"]) == (["train.py"], str(script), [])


def test_a_strategy_axis_gives_each_strategy_its_layout_flags_only(tmp_path):
    layout = {"dp": 2, "stages": 2, "microbatches": 4, "pipeline_schedule": "1f1b"}
    axis = study(tmp_path, workers=[1, 4], train={"batch_size": 32, **layout}, strategy=["ddp", "hybrid", "pipeline"])
    fields = ("dp", "stages", "microbatches", "pipeline_schedule")

    def kept(strategy):
        cfg = point_config(axis, "synthetic-cnn", 1 if strategy is None else 4, 0, strategy=strategy)
        return {k: cfg[k] for k in fields if k in cfg}, cfg["batch_size"]

    assert kept("ddp") == ({}, 32) and kept(None) == ({}, 32)
    assert kept("hybrid") == (layout, 64)  # 2 replicas of 2 stages
    assert kept("pipeline") == ({"microbatches": 4, "pipeline_schedule": "1f1b"}, 128)  # one replica of 4
    staged = study(tmp_path, workers=[1, 4], train={"stages": 4}, strategy=["hybrid"])
    assert "dp" not in point_config(staged, "synthetic-cnn", 4, 0, strategy="hybrid")  # stages given: no default dp
    one_replica = study(tmp_path, workers=[1, 4], train={"dp": 1}, strategy=["hybrid"])
    assert point_config(one_replica, "synthetic-cnn", 4, 0, strategy="hybrid")["dp"] == 1  # dp given: kept
    # the points of the axis: one 1-worker run for every strategy, then each strategy's own
    names = [
        Path(cfg["run_dir"]).name
        for *_, cfg in study_points(study(tmp_path, workers=[1, 2], strategy=["ddp", "fsdp"]), False)
    ]
    assert names == ["synthetic-cnn-w1-r0", "synthetic-cnn-ddp-w2-r0", "synthetic-cnn-fsdp-w2-r0"]
    assert study_spec(study(tmp_path, strategy=["ddp", "fsdp"]))["strategy"] == ["ddp", "fsdp"]
    with pytest.raises(UsageError, match="unknown strategy 'bogus'"):
        study_points(study(tmp_path, workers=[1, 2], strategy=["bogus"]), False)


def test_a_strategy_axis_lays_out_tensor_parallel_points(tmp_path):
    axis = study(
        tmp_path,
        workload=["gpt-tiny"],
        strategy=["ddp", "tp", "fsdp"],
        train={"tp": 2, "sequence_parallel": True, "loss_parallel": True, "dp_replicate": 1, "batch_size": 8},
    )
    points = {Path(cfg["run_dir"]).name: cfg for *_, cfg in study_points(axis, False)}
    # tp: every rank of the point splits each layer, and its one replica takes the global batch (4 x 8)
    tp = [points[f"gpt-tiny-tp-w{n}-r0"] for n in (2, 4)]
    assert [
        (c["tp"], c["sequence_parallel"], c["loss_parallel"], c["batch_size"], c["base_batch_size"]) for c in tp
    ] == [
        (2, True, True, 16, 8),
        (4, True, True, 32, 8),
    ]
    # fsdp takes --tp 2: FSDP over 2-rank tensor-parallel groups, 2 replicas of the batch at 4 workers
    fsdp = [points[f"gpt-tiny-fsdp-w{n}-r0"] for n in (2, 4)]
    assert [(c["tp"], c["dp_replicate"], c["batch_size"]) for c in fsdp] == [(2, 1, 16), (2, 1, 16)]
    # ddp and the one-worker base split no layer
    for name in ("gpt-tiny-ddp-w4-r0", "gpt-tiny-w1-r0"):
        assert not {"tp", "sequence_parallel", "loss_parallel", "dp_replicate"} & set(points[name]), name


def test_a_strategy_axis_of_fsdp_and_hsdp_gives_the_replicas_to_hsdp_alone(tmp_path):
    axis = study(tmp_path, workers=[1, 2, 4], strategy=["fsdp", "hsdp"], train={"dp_replicate": 2})
    points = {Path(cfg["run_dir"]).name: cfg for *_, cfg in study_points(axis, False)}
    assert [points[f"synthetic-cnn-hsdp-w{n}-r0"]["dp_replicate"] for n in (2, 4)] == [2, 2]
    assert not any("dp_replicate" in points[f"synthetic-cnn-fsdp-w{n}-r0"] for n in (2, 4))
    # without hsdp in the axis, fsdp takes --dp-replicate itself, as before
    alone = study(tmp_path, workers=[1, 4], strategy=["fsdp"], train={"dp_replicate": 2})
    assert [cfg.get("dp_replicate") for *_, cfg in study_points(alone, False)][-1] == 2


def test_each_point_gets_its_tensorboard_run_whole_batches_and_the_default_batch(tmp_path):
    from paratrain.config import TrainConfig

    tb = study(tmp_path, train={"tensorboard": str(tmp_path / "tb")})
    assert point_config(tb, "synthetic-cnn", 2, 1)["tensorboard"] == str(tmp_path / "tb" / "synthetic-cnn-w2-r1")
    default = TrainConfig.model_fields["batch_size"].default
    strong = point_config(study(tmp_path, mode="strong", workers=[2, 4]), "synthetic-cnn", 4, 0)
    assert strong["batch_size"] == default // 2 and type(strong["batch_size"]) is int
    axis = study(tmp_path, workers=[1, 4], train={"batch_size": 32}, strategy=["pipeline"])
    assert type(point_config(axis, "synthetic-cnn", 4, 0, strategy="pipeline")["batch_size"]) is int


def test_a_script_study_passes_on_only_the_launch_flags(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('samples_per_s=1')\n")
    given = {"threads_per_worker": 2, "allow_oversubscribe": True}  # (train flags are refused with --script)
    (*_, w2), *_ = [p for p in study_points(study(tmp_path, workers=[2], script=script, train=given), on_cpu=False)]
    assert w2["threads_per_worker"] == 2 and w2["allow_oversubscribe"] is True


def test_the_reference_is_one_cpu_process_on_the_default_threads():
    from paratrain.scale import _threads, is_all_cores_reference

    cpu = {"workers": 1, "resolved": {"device": "cpu"}, "threads_per_worker": None}
    assert is_all_cores_reference(cpu)
    assert not is_all_cores_reference({k: v for k, v in cpu.items() if k != "threads_per_worker"})
    assert not is_all_cores_reference({k: v for k, v in cpu.items() if k != "resolved"})
    assert not is_all_cores_reference({**cpu, "workers": 2})
    assert _threads({"resolved": {"threads_per_worker": 4}, "threads_per_worker": 1}) == 4
    assert _threads({"resolved": {"threads_per_worker": None}, "threads_per_worker": 3}) == 3
    assert _threads({}) == 1


def test_rows_from_the_smallest_point_when_it_is_not_one_worker_and_a_reference_alone(tmp_path):
    # Workers 2 and 4 (no 1-worker point): speed-up in units of 2 workers, 2 x 6 / 4 = 3 at 4 workers;
    # a failed run listed first is skipped, not the end of the table.
    runs = [
        run(tmp_path, "failed", 2, [9.0, 1.0], 50.0, status="failed"),
        run(tmp_path, "w2", 2, [9.0, 6.0], 50.0),
        run(tmp_path, "w4", 4, [9.0, 4.0], 75.0),
    ]
    w2, w4 = scaling_rows(runs)
    assert w2["speedup"] == pytest.approx(2.0) and w4["speedup"] == pytest.approx(3.0)
    assert w4["efficiency"] == pytest.approx(0.75)
    (alone,) = scaling_rows([run(tmp_path / "ref", "ref", 1, [9.0, 3.0], 140.0, threads=None)])
    assert alone["point"] == "all_cores_reference" and alone["speedup"] == pytest.approx(1.0)
    # a strategy axis without a 1-worker run: each line starts from the reference
    axis = [
        run(tmp_path / "axis", "ddp", 2, [9.0, 2.0], 50.0),
        run(tmp_path / "axis", "ref", 1, [9.0, 3.0], 40.0, threads=None),
    ]
    ddp, ref = scaling_rows(axis, ["ddp", "fsdp"])  # fsdp never ran: no line of its own
    assert (
        ddp["workload"] == "m · ddp" and ddp["speedup"] == pytest.approx(1.5) and ref["point"] == "all_cores_reference"
    )


def test_a_scripts_reference_row_is_timed_by_samples_and_repeats_flagged_above_115_percent(tmp_path):
    script = {"script": "train.py"}
    w1, ref = scaling_rows(
        [
            run(tmp_path, "w1", 1, None, 100.0, config=script),
            run(tmp_path, "w1b", 1, None, 115.0, config=script),
            run(tmp_path, "ref", 1, None, 200.0, threads=None, config=script),
        ]
    )
    assert ref["speedup"] == pytest.approx(200 / 107.5, rel=0.02) and ref["speedup_basis"] == "samples_per_s"
    assert w1["repeat_spread"] == pytest.approx(1.15) and w1["flags"] == []  # 115 / 100: at the limit, not past it


def test_a_replaced_model_or_dataset_alone_still_names_both(tmp_path):
    runs = [
        run(tmp_path / "a", "w1", 1, [2.0, 1.0], 10.0, config={"model": "pkg:Net"}, dataset="cifar10"),
        run(tmp_path / "b", "w1", 1, [2.0, 1.0], 10.0, config={"dataset": "mine"}, model="cnn"),
    ]
    assert [r["workload"] for r in scaling_rows(runs)] == ["pkg:Net on cifar10", "cnn on mine"]
