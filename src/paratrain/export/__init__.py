"""Export a finished run directory to MLflow (`--mlflow URI`): params, metrics, the HTML report.

Reads only the run directory, like every analysis tool, so it can export any run after the fact:
`paratrain.export.to_mlflow(run_dir, "sqlite:///mlflow.db")`. Needs the `paratrain[mlflow]` extra.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from paratrain.errors import UsageError
from paratrain.runs import RunDir
from paratrain.runs.exports import Exporter


def check_mlflow() -> None:
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise UsageError("--mlflow needs the mlflow package: pip install 'paratrain[mlflow]'") from None


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config -> MLflow params ("resolved.backend": "gloo")."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    return out


def to_mlflow(run_dir: Path, tracking_uri: str, experiment: str = "paratrain") -> str:
    """Log the run to MLflow and return the MLflow run id."""
    import mlflow
    from mlflow.entities import Metric, Param

    from paratrain.reporting import write_report

    run = RunDir(run_dir)
    config, summary = run.read_config(), run.read_summary()
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    ml_run = client.create_run(
        experiment_id, run_name=Path(run_dir).name, tags={"paratrain.run_dir": str(Path(run_dir).resolve())}
    )
    rid = ml_run.info.run_id

    params = _flatten(config)
    metrics = []
    for event in run.read_metrics():
        # MLflow's timestamp is wall-clock milliseconds; the run's own clock is seconds since start.
        ms = int(event.get("time", event.get("time_end", 0)) * 1000)
        if event["event"] == "step":
            metrics += [
                Metric(f"train_{k}", float(event[k]), ms, event["step"])
                for k in ("loss", "accuracy", "lr", "samples_per_s")
            ]
        elif event["event"] == "eval":
            metrics += [
                Metric(f"{event['split']}_{k}", float(event[k]), ms, event["step"]) for k in ("loss", "accuracy")
            ]
    final = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    final.update({f"breakdown_{k}": v for k, v in summary.get("breakdown", {}).items()})
    last_step = summary.get("steps", 0)
    metrics += [Metric(f"final_{k}", float(v), 0, last_step) for k, v in final.items()]
    param_list = [Param(k[:250], v[:6000]) for k, v in params.items()]
    for i in range(0, max(len(param_list), 1), 100):
        client.log_batch(rid, params=param_list[i : i + 100])
    for i in range(0, len(metrics), 900):
        client.log_batch(rid, metrics=metrics[i : i + 900])
    report = write_report([Path(run_dir)])
    client.log_artifact(rid, str(report))
    client.set_terminated(rid, status="FINISHED" if summary.get("status") == "completed" else "FAILED")
    return rid


def _check_config(config: Any) -> None:
    if config.mlflow is not None:
        check_mlflow()


def _export_config(config: Any, run_dir: Path) -> dict[str, Any]:
    if config.mlflow is None:
        return {}
    return {"mlflow_run_id": to_mlflow(run_dir, config.mlflow, config.mlflow_experiment)}


# What `paratrain.train` runs after each run whose config names --mlflow (registered by the package
# root: runs/exports.py says why the launcher does not import this module).
MLFLOW = Exporter(check=_check_config, export=_export_config)
