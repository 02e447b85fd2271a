"""Hugging Face Accelerate training whose disabled debug logging still formats tensors at every step.

Mistake: the loop logs through accelerate.logging.get_logger with f-strings:
`logger.debug(f"step {step} loss {loss} logits {logits} labels {labels}")` and, after backward, one
`logger.debug(f"{name}: weight norm {p.norm()} grad norm {p.grad.norm()}")` per parameter. The logger is at
its default level (WARNING), so nothing is printed, but an f-string is built *before* the call: every
micro-step computes ~50 parameter and gradient norms and renders four tensors, including the 64 x 10
logits, through torch's tensor repr (Python formatting of every element), only for logging to discard
the strings.
Source: https://github.com/NOAA-OWP/lstm/pull/62 ("The debug logging statements were converting the numpy
arrays to string even if debug logging was not enabled"; ~2x faster once fixed),
https://github.com/NVIDIA-NeMo/Emerging-Optimizers/pull/255 (tensor in an f-string in logging.debug) and
https://docs.python.org/3/howto/logging.html#optimization (guard expensive log arguments with
isEnabledFor).
Fix (--fix): guard the debug block with `if logger.isEnabledFor(logging.DEBUG):` (and use lazy %-style
arguments); nothing else changes, and nothing is logged in either case.
Expected diagnosis: host (Python) time outside forward/backward at every micro-step, in tensor
formatting (torch._tensor_str) and per-parameter norm computations from the f-string debug-log lines in
main's training loop, although DEBUG is disabled; guard them or use lazy logging arguments.
"""

import gc
import logging
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.logging import get_logger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

logger = get_logger(__name__)

FEATURES, WIDTH, BLOCKS, CLASSES = 64, 128, 12, 10


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return x + F.silu(self.fc(self.norm(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(FEATURES, WIDTH)
        self.blocks = nn.Sequential(*[Block() for _ in range(BLOCKS)])
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


def synthetic_tabular(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=g)
    w = torch.randn(FEATURES, CLASSES, generator=g)
    return x, (x @ w + 0.5 * torch.randn(samples, CLASSES, generator=g)).argmax(1)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--accumulate", type=int, default=2)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accumulate)
    x, y = synthetic_tabular(2 * 80 * args.batch_size)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, drop_last=True)
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    meter, samples, done, step = Meter(args), 0, False, 0
    while not done:
        correct = total = 0
        for xb, yb in loader:
            with accelerator.accumulate(model):
                logits = model(xb)
                loss = F.cross_entropy(logits, yb)
                if args.fix:
                    if logger.isEnabledFor(logging.DEBUG):
                        logger.debug("step %d loss %s logits %s labels %s", step, loss, logits, yb)
                else:
                    logger.debug(f"step {step} loss {loss} logits {logits} labels {yb}")
                accelerator.backward(loss)
                if args.fix:
                    if logger.isEnabledFor(logging.DEBUG):
                        for name, p in model.named_parameters():
                            logger.debug("%s: weight norm %s grad norm %s", name, p.norm(), p.grad.norm())
                else:
                    for name, p in model.named_parameters():
                        logger.debug(f"{name}: weight norm {p.norm()} grad norm {p.grad.norm()}")
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            step += 1
            correct += int((logits.argmax(1) == yb).sum())
            total += len(yb)
            samples += len(yb)
            if accelerator.sync_gradients:
                done, samples = meter.step(samples), 0
                if done:
                    break
        accelerator.print(f"train accuracy {correct / max(total, 1):.3f}")
        done = meter.end_epoch() or done
    meter.report()
    del model, optimizer
    gc.collect()
    accelerator.end_training()


if __name__ == "__main__":
    main()
