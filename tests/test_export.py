"""TensorBoard and MLflow exports, read back with their own readers."""

import pytest
from conftest import synthetic

import paratrain
from paratrain.runs import RunDir


def test_tensorboard_events_are_written_while_training(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = synthetic(tmp_path, workers=2, tensorboard=tmp_path / "tb", log_every=2)
    paratrain.train(cfg)
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "test/accuracy", "step_time/comm_s"} <= tags
    steps = [e for e in RunDir(cfg["run_dir"]).read_metrics() if e["event"] == "step"]
    logged = acc.Scalars("train/loss")
    assert [s.step for s in logged] == [e["step"] for e in steps]
    assert [s.value for s in logged] == pytest.approx([e["loss"] for e in steps], rel=1e-6)


def test_mlflow_gets_params_metrics_and_the_report(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.chdir(tmp_path)  # MLflow puts artifacts of a SQLite store in ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = synthetic(tmp_path, workers=1, mlflow=uri, mlflow_experiment="paratrain-test")
    summary = paratrain.train(cfg)
    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["batch_size"] == "32" and run.data.params["resolved.strategy"] == "single"
    assert run.data.metrics["final_samples_per_s"] == pytest.approx(summary["samples_per_s"])
    history = client.get_metric_history(run.info.run_id, "train_loss")
    steps = [e for e in RunDir(cfg["run_dir"]).read_metrics() if e["event"] == "step"]
    assert sorted(m.step for m in history) == [e["step"] for e in steps]
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["report.html"]
    assert RunDir(cfg["run_dir"]).read_summary()["mlflow_run_id"] == run.info.run_id
