"""Style: the smallest Hugging Face Accelerate script, with and without `cpu=True` (no paratrain import).

A plain `Accelerator()` on CPU ranks joins the launcher's process group but trains every rank alone: no DDP, no
sharded loader, so N ranks are N independent copies of the training. `--cpu` passes `Accelerator(cpu=True)`, which
wraps the model in DDP and gives each rank its share of the data. An MLP on 2,048 random 32-float vectors, 2 classes
(is the sum positive), SGD, batch 32 per rank.

Flags:
  --cpu          Accelerator(cpu=True): the ranks train one model together
  --epochs N     passes over the data (default 2)

Prints on rank 0 at the end: `STEPS <n>` (optimizer steps the rank took) and `LOSS <last training loss>`.

Run:
  paratrain launch -n 2 --run-dir DIR tests/script_styles/accelerate_mlp.py          # 2 independent copies
  paratrain launch -n 2 --run-dir DIR tests/script_styles/accelerate_mlp.py --cpu    # one model on 2 ranks
"""

import argparse

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description="Accelerate on CPU ranks, with or without cpu=True")
parser.add_argument("--cpu", action="store_true", help="Accelerator(cpu=True)")
parser.add_argument("--epochs", type=int, default=2, help="passes over the data")
args = parser.parse_args()

accelerator = Accelerator(cpu=args.cpu)
torch.manual_seed(0)
x = torch.randn(2048, 32)
y = (x.sum(1) > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

steps = 0
for _ in range(args.epochs):
    for xb, yb in loader:
        loss = nn.functional.cross_entropy(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        steps += 1

if accelerator.is_main_process:
    print(f"STEPS {steps}", flush=True)
    print(f"LOSS {loss.item():.4f}", flush=True)
accelerator.free_memory()  # drops the accelerator's references to the prepared model before the group goes
del model, optimizer
accelerator.end_training()
