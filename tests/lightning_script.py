"""A plain Lightning script (no paratrain import), as a user writes one to run under a launcher: the
Trainer's device count comes from the launcher's WORLD_SIZE, so the same script runs on 1 or N ranks
(`paratrain launch -n N`, `paratrain scale --script --workers 1,N`). argv[1]: `healthy`, or `data`
(a Dataset whose samples come from a slow disk, read in the rank's own process). argv[2], optional: a
device count written into the script instead, the mistake Lightning's world-size check catches."""

import os
import sys
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

fault = sys.argv[1] if len(sys.argv) > 1 else "healthy"
STEPS = 24


class Images(Dataset):
    def __init__(self, n, slow=False):
        g = torch.Generator().manual_seed(0)
        self.x, self.y, self.slow = (
            torch.randn(n, 3, 32, 32, generator=g),
            torch.randint(0, 10, (n,), generator=g),
            slow,
        )

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.slow:
            time.sleep(0.006)  # reading a sample from a slow disk
        return self.x[i], self.y[i]


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, 10),
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


# the launcher's ranks, whatever their number
world = int(sys.argv[2]) if len(sys.argv) > 2 else int(os.environ.get("WORLD_SIZE", "1"))
trainer = L.Trainer(
    accelerator="cpu",
    devices=world,
    num_nodes=1,
    strategy="ddp" if world > 1 else "auto",
    max_steps=STEPS,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(Classifier(), DataLoader(Images(2 * STEPS * 32 * world, slow=fault == "data"), batch_size=32))
print(f"rank {trainer.global_rank} done")
