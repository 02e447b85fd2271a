"""Lightning Fabric training with a torch.profiler schedule that never ends (repeat defaults to 0).

Mistake: to look at a few steps, the user wrapped the loop in torch.profiler.profile with
schedule(wait=1, warmup=1, active=3), record_shapes/profile_memory/with_stack, and
on_trace_ready=tensorboard_trace_handler(...), then left it in. schedule()'s repeat defaults to 0, which
means "repeat the cycle until the profiler exits": every 5 steps the profiler records 3 steps with Python
stacks and allocation events and then writes a multi-megabyte Chrome trace to disk, for the whole run.
Source: https://github.com/mosaicml/composer/pull/50 ("Added repeat ... This makes it possible to profile
only N times per epoch. Profiling slows down the training process significantly!"),
https://github.com/pytorch/pytorch/pull/51630 (repeat=0: "the cycles will continue until the profiling is
finished") and https://github.com/pytorch/pytorch/pull/95242 (docs changed to repeat=1), plus
https://github.com/facebookresearch/dlrm/issues/197 (training slower with profiling enabled).
Fix (--fix): schedule(..., repeat=1): one 5-step profiling window at the start and none after; Fabric,
model, data and the profiler settings are otherwise unchanged.
Expected diagnosis: periodic stalls every few steps (trace export and recording overhead) from the
torch.profiler in main() whose schedule repeats forever (repeat=0 by default) with tensorboard_trace_handler;
set repeat=1 (or remove the profiler).
"""

import gc
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.fabric import Fabric
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

VOCAB, DIM, HEADS, LAYERS = 512, 128, 4, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, DIM)
        x = x + self.out(att)
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx):
        return self.head(self.blocks(self.emb(idx)))


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args()
    fabric = Fabric(accelerator="cpu", strategy="ddp", devices=2)
    fabric.launch()
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model, optimizer = fabric.setup(model, optimizer)
    corpus = torch.randint(0, VOCAB, (200_000,), generator=torch.Generator().manual_seed(1))

    trace_dir = Path(os.environ.get("PARATRAIN_RUN_DIR", tempfile.gettempdir())) / "profiler"
    profiler = profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=3, repeat=1 if args.fix else 0),
        on_trace_ready=tensorboard_trace_handler(str(trace_dir)),
        record_shapes=True,
        profile_memory=True,
        with_stack=True,
    )
    steps_per_epoch = 20
    meter, epoch = Meter(args), 0
    with profiler:
        while True:
            g = torch.Generator().manual_seed(1000 * epoch + fabric.global_rank)
            for _ in range(steps_per_epoch):
                starts = torch.randint(0, len(corpus) - args.seq_len - 1, (args.batch_size, 1), generator=g)
                tokens = corpus[starts + torch.arange(args.seq_len + 1)]
                logits = model(tokens[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
                optimizer.zero_grad(set_to_none=True)
                fabric.backward(loss)
                optimizer.step()
                profiler.step()
                if meter.step(args.batch_size):
                    break
            epoch += 1
            if meter.end_epoch():
                break
        meter.report()
    del model, optimizer, profiler
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
