"""Long-document classifier with activation-checkpointed nn.MultiheadAttention blocks left at need_weights=True.

Mistake: the encoder blocks call `attn_out, _ = self.attn(h, h, h)` and throw the attention weights away,
but nn.MultiheadAttention's need_weights defaults to True. To return (head-averaged) weights it cannot use
scaled_dot_product_attention's fused kernel, so every block materialises the batch x heads x 1024 x 1024
score matrix, runs softmax over it, averages it over heads, and, because the blocks are checkpointed
(torch.utils.checkpoint, needed for 1,024-token documents), does all of that twice per step, plus the
backward through the materialised matrix.
Source: https://github.com/pytorch/pytorch/issues/100347 ("nn.MultiheadAttention doesn't use efficient
scaled_dot_product_attention": "The default forward() of nn.MultiheadAttention has need_weights==True ...
silently uses the native implementation") and https://github.com/lyuwenyu/RT-DETR/issues/678 (the
weights are discarded at every call site; fixed in PR #680 by passing need_weights=False).
Fix (--fix): self.attn(h, h, h, need_weights=False); same parameters, same outputs (up to float rounding).
Expected diagnosis: forward/backward (and checkpoint recompute) dominated by the unfused attention math
(bmm, softmax, head-averaging over T x T matrices) in Block.forward because need_weights defaults to True;
pass need_weights=False so that MHA uses the fused SDPA kernel.
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

VOCAB, DIM, HEADS, LAYERS, SEQ, CLASSES = 2048, 64, 2, 2, 1024, 4


class Block(nn.Module):
    def __init__(self, need_weights: bool):
        super().__init__()
        self.need_weights = need_weights
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = nn.MultiheadAttention(DIM, HEADS, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        h = self.ln1(x)
        if self.need_weights:
            attn_out, _ = self.attn(h, h, h)
        else:
            attn_out, _ = self.attn(h, h, h, need_weights=False)
        x = x + attn_out
        return x + self.mlp(self.ln2(x))


class DocClassifier(nn.Module):
    def __init__(self, need_weights: bool):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(0.02 * torch.randn(SEQ, DIM))
        self.blocks = nn.ModuleList([Block(need_weights) for _ in range(LAYERS)])
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens):
        x = self.emb(tokens) + self.pos
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(x.mean(1))


def synthetic_documents(samples: int, seed: int = 0):
    """Each class has its own token distribution; a document is 1,024 tokens drawn from its class's."""
    g = torch.Generator().manual_seed(seed)
    class_logits = 2.0 * torch.randn(CLASSES, VOCAB, generator=g)
    labels = torch.randint(0, CLASSES, (samples,), generator=g)
    probs = torch.softmax(class_logits[labels], dim=1)
    return torch.multinomial(probs, SEQ, replacement=True, generator=g), labels


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    tokens, labels = synthetic_documents(2 * 12 * args.batch_size)
    dataset = TensorDataset(tokens, labels)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    model = DDP(DocClassifier(need_weights=not args.fix))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        losses = []
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
            if meter.step(len(yb)):
                break
        if dist.get_rank() == 0:
            print(f"epoch {epoch} loss {float(torch.stack(losses).mean()):.4f}", flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
