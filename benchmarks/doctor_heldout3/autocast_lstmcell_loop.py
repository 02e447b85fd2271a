"""bf16-autocast DDP sequence classifier that steps an nn.LSTMCell in a Python loop over 128 time steps.

Mistake: the encoder was written as a per-time-step loop over nn.LSTMCell (as in attention-decoder
tutorials), although it needs nothing but the final hidden state of a plain one-layer LSTM. Each step
issues a dozen small operators (two matmuls, gate non-linearities, autocast casts) from Python, so the
forward and the backward are 128 x dozens of tiny ops and autograd nodes, instead of one fused nn.LSTM
call (oneDNN's RNN kernel on CPU, which also does the input projection of all steps in one GEMM).
Source: https://github.com/pytorch/pytorch/issues/20060 (custom LSTM cells stepped in a Python loop are
much slower than the fused implementation), https://pytorch.org/blog/optimizing-cuda-rnn-with-torchscript/
(per-time-step LSTM loops are dominated by per-operator overhead) and
https://github.com/sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning/issues/181 ("why use LSTMCell not use
LSTM directly": the cell loop is only needed when each step needs custom logic).
Fix (--fix): nn.LSTM(batch_first=True) with the cell's weights copied in (same parameters, same gate
layout, same function); everything else unchanged, still under bf16 autocast.
Expected diagnosis: forward/backward dominated by per-operator overhead (thousands of tiny ops and
autograd nodes per step) from the time-step loop in Encoder.forward (nn.LSTMCell called 128 times); use
the fused nn.LSTM.
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

FEATURES, HIDDEN, STEPS, CLASSES = 32, 64, 128, 6


class Encoder(nn.Module):
    def __init__(self, fused: bool):
        super().__init__()
        cell = nn.LSTMCell(FEATURES, HIDDEN)
        self.fused = fused
        if fused:
            self.lstm = nn.LSTM(FEATURES, HIDDEN, batch_first=True)
            with torch.no_grad():
                self.lstm.weight_ih_l0.copy_(cell.weight_ih)
                self.lstm.weight_hh_l0.copy_(cell.weight_hh)
                self.lstm.bias_ih_l0.copy_(cell.bias_ih)
                self.lstm.bias_hh_l0.copy_(cell.bias_hh)
        else:
            self.cell = cell
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):  # x: (batch, time, features)
        if self.fused:
            _, (h, _) = self.lstm(x)
            return self.head(h[-1])
        h = x.new_zeros(x.shape[0], HIDDEN)
        c = x.new_zeros(x.shape[0], HIDDEN)
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
        return self.head(h)


def synthetic_signals(samples: int, seed: int = 0):
    """Noisy multichannel signals whose class sets the frequency of a hidden oscillation."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (samples,), generator=g)
    t = torch.arange(STEPS).float()
    freq = 0.05 + 0.03 * labels.float()
    mixing = torch.randn(2, FEATURES, generator=g)
    wave = torch.stack([torch.sin(freq[:, None] * t), torch.cos(freq[:, None] * t)], dim=-1)
    x = wave @ mixing + 0.5 * torch.randn(samples, STEPS, FEATURES, generator=g)
    return x, labels


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    x, y = synthetic_signals(2 * 30 * args.batch_size)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    model = DDP(Encoder(fused=args.fix))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        correct = total = 0
        for xb, yb in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(xb)
            loss = F.cross_entropy(logits.float(), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            correct += int((logits.argmax(1) == yb).sum())
            total += len(yb)
            if meter.step(len(yb)):
                break
        if dist.get_rank() == 0:
            print(f"epoch {epoch} train accuracy {correct / max(total, 1):.3f}", flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
