"""Live TensorBoard event files, written by rank 0 beside metrics.jsonl (`--tensorboard DIR`).

Fed the same events as metrics.jsonl, under TensorBoard's usual tags (train/loss, eval/accuracy,
...), with the optimizer step as the x axis. Needs the `tensorboard` package (the
`paratrain[tensorboard]` extra).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paratrain.errors import UsageError


def check_tensorboard() -> None:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise UsageError("--tensorboard needs the tensorboard package: pip install 'paratrain[tensorboard]'") from None


class TensorBoardSink:
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, event: str, **fields: Any) -> None:
        step = fields.get("step", 0)
        if event == "step":
            for key in ("loss", "accuracy", "lr", "samples_per_s"):
                self.writer.add_scalar(f"train/{key}", fields[key], step)
        elif event == "epoch":
            self.writer.add_scalar("epoch/train_loss", fields["train_loss"], step)
            self.writer.add_scalar("epoch/samples_per_s", fields["samples_per_s"], step)
            self.writer.add_scalar("epoch/epoch_time_s", fields["epoch_time_s"], step)
            for phase, seconds in fields["breakdown"].items():
                self.writer.add_scalar(f"step_time/{phase}", seconds, step)
        elif event == "eval":
            self.writer.add_scalar(f"{fields['split']}/loss", fields["loss"], step)
            self.writer.add_scalar(f"{fields['split']}/accuracy", fields["accuracy"], step)
        elif event == "batch":
            self.writer.add_scalar("batch/global_batch", fields["global_batch"], step)
        elif event == "noise":  # adaptive's reading at every log point: what the batch's next doubling weighed
            for key in ("noise_scale", "goodput_gain"):
                if key in fields:
                    self.writer.add_scalar(f"batch/{key}", fields[key], step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
