"""HF Accelerate (cpu=True) training whose per-step metrics logger adds a new logging handler at every call.

Mistake: the user's `metrics_logger()` helper configures the "train.metrics" logger (a StreamHandler on
the run's metrics file, a formatter, propagate=False) and returns it; the loop calls it at every step to
get the logger it writes the step's loss to. Loggers are process-wide singletons, so every call adds one
more handler to the same logger: after k steps each `log.info(...)` is formatted and written (and
flushed) k times, the metrics file gets k copies of the line, and the step's host time grows linearly.
Source: https://github.com/scikit-learn-contrib/hiclass/pull/46 ("adds a new StreamHandler to the logger
every time ... on the nth iteration ... every log line in the console is repeated n times"),
https://github.com/neuralmagic/sparseml/pull/1483 ("loggers were creating too many handlers and thus
logging the same information multiple times"), https://github.com/huggingface/transformers/pull/16669
("we keep adding more handlers without actually removing them").
Fix (--fix): configure the logger once before the loop and reuse it (same lines written, once each).
The metrics file lives in a per-rank temporary directory that is removed at the end.
Expected diagnosis: host time per step grows linearly with the step count, outside forward/backward and
the optimizer, in Python logging (Logger.callHandlers -> StreamHandler.emit/flush, Formatter.format, file
writes) because metrics_logger() calls addHandler on the same logger at every step in main's loop;
configure the handler once.
"""

import gc
import logging
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

FEATURES, WIDTH, CLASSES = 64, 128, 10


def metrics_logger(stream) -> logging.Logger:
    logger = logging.getLogger("train.metrics")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def synthetic_tabular(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w1, w2 = torch.randn(FEATURES, 32, generator=g), torch.randn(32, CLASSES, generator=g)
    return x, (torch.tanh(x @ w1) @ w2).argmax(1)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"metrics-rank{accelerator.process_index}-"))
    metrics_file = open(workdir / "metrics.log", "w")
    x, y = synthetic_tabular(2 * 40 * args.batch_size)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, drop_last=True)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(FEATURES, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, CLASSES)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    log = metrics_logger(metrics_file) if args.fix else None
    meter, epoch, step, done = Meter(args), 0, 0, False
    while not done:
        total_loss = steps = 0
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            value = loss.item()
            if not args.fix:
                log = metrics_logger(metrics_file)
            log.info(f"epoch {epoch} step {step} loss {value:.4f}")
            total_loss += value
            steps += 1
            done = meter.step(len(yb))
            if done:
                break
        accelerator.print(f"epoch {epoch} train loss {total_loss / max(steps, 1):.4f}")
        epoch += 1
        done = meter.end_epoch() or done
    meter.report()
    metrics_file.close()
    shutil.rmtree(workdir, ignore_errors=True)
    del model, optimizer
    gc.collect()
    accelerator.end_training()


if __name__ == "__main__":
    main()
