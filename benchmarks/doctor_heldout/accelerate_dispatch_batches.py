"""Hugging Face Accelerate with dispatch_batches=True: rank 0 loads and preprocesses every rank's batch.

Mistake: the user's Accelerator (training with accelerator.accumulate) is built with
`DataLoaderConfiguration(dispatch_batches=True)` (copied from a streaming-dataset config, or from the
Trainer's old --dispatch_batches flag) for an ordinary map-style dataset. accelerator.prepare then wraps
the loader in a DataLoaderDispatcher: process 0 fetches world_size batches per step (running every
sample's log-mel feature extraction), concatenates them and broadcasts the slices, while the other ranks
sit in the broadcast waiting. The data work that should be split across ranks runs serially on rank 0.
Source: https://github.com/huggingface/accelerate/issues/1245 ("`DataLoaderShard` would only read data
from rank 0 and distribute the data to other ranks ... it is quite hard to locate") and
https://github.com/huggingface/transformers/issues/24999 (Accelerate's dispatch_batches building the batch
on process 0); https://github.com/huggingface/accelerate/issues/2162 discusses the cost.
Fix (--fix): `DataLoaderConfiguration(dispatch_batches=False)` (the default for map-style datasets): each
process loads its own shard of every global batch; same samples per step, same model.
Expected diagnosis: rank 0's data loading is the bottleneck (rank 0 spends about twice the data time, the
other rank waits in the batch broadcast): Accelerate's dispatch_batches=True (DataLoaderConfiguration in
main()) centralises loading on the main process; let each rank load its own batches.
"""

import gc
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator, DataLoaderConfiguration
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

SAMPLE_RATE, CLIP, CLASSES, N_FFT, HOP, MELS = 16_000, 16_000, 8, 400, 160, 40


def mel_filterbank():
    freqs = torch.linspace(0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    mel = 2595 * torch.log10(1 + freqs / 700)
    centers = torch.linspace(mel.min(), mel.max(), MELS + 2)
    lower, mid, upper = centers[:-2, None], centers[1:-1, None], centers[2:, None]
    return torch.clamp(torch.minimum((mel - lower) / (mid - lower), (upper - mel) / (upper - mid)), min=0)


class KeywordClips(Dataset):
    """Synthetic one-second clips: a class-specific tone in noise; features computed per sample."""

    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.labels = torch.randint(0, CLASSES, (n,), generator=g)
        self.noise = torch.randn(n, CLIP, generator=g) * 0.5
        self.t = torch.arange(CLIP) / SAMPLE_RATE
        self.fbank, self.window = mel_filterbank(), torch.hann_window(N_FFT)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        wave = self.noise[i] + torch.sin(2 * torch.pi * (300 + 250 * self.labels[i]) * self.t)
        spec = torch.stft(wave, N_FFT, HOP, window=self.window, return_complex=True).abs().pow(2)
        logmel = torch.log(self.fbank @ spec + 1e-6)
        return (logmel - logmel.mean()) / (logmel.std() + 1e-5), self.labels[i]


class KeywordNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d((4, 4)),
            nn.Flatten(),
            nn.Linear(32 * 16, CLASSES),
        )

    def forward(self, x):
        return self.net(x.unsqueeze(1))


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--accumulate", type=int, default=2)
    args = parser.parse_args()
    accelerator = Accelerator(
        cpu=True,
        gradient_accumulation_steps=args.accumulate,
        dataloader_config=DataLoaderConfiguration(dispatch_batches=not args.fix),
    )
    torch.manual_seed(0)
    model = KeywordNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(KeywordClips(1536), batch_size=args.batch_size, shuffle=True, drop_last=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    meter, samples, done = Meter(args), 0, False
    while not done:
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            samples += len(x)
            if accelerator.sync_gradients:
                done, samples = meter.step(samples), 0
                if done:
                    break
        done = meter.end_epoch() or done
    meter.report()
    del model, optimizer
    gc.collect()
    accelerator.end_training()


if __name__ == "__main__":
    main()
