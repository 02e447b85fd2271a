"""Plain DDP text classifier whose collate_fn pads every batch to the longest text in the whole dataset.

Mistake: the user's collate_fn pads each batch to `max_len`, the length of the longest document in the
dataset (the Hugging Face `padding="max_length"` habit), although most documents are short. Every
batch then runs attention and the MLPs over ~256 positions, most of them padding that the attention mask
and the masked mean pooling throw away again.
Source: https://ai.lefebvre-sarrut.eu/2020/05/20/divide-hugging-face-transformers-training-time-by-2-or-more-with-dynamic-padding-and-uniform-length-batching/
("Divide Hugging Face Transformers training time by 2 or more with dynamic padding": 4 h 38 min to
1 h 01 min for max length 493) and the Hugging Face course's dynamic-padding chapter, whose notes
(https://github.com/xue-qi-yao/HuggingFace_coures_learning_notebook) contrast padding="max_length" for
the whole dataset with padding each batch to its longest sentence.
Fix (--fix): pad each batch to its own longest document (dynamic padding). Padding positions are masked
in attention and pooling, so the model computes the same function on the same data.
Expected diagnosis: compute-bound forward and backward on mostly padding tokens: Collate pads to the
dataset-wide maximum length (Collate(pad_to=max_len) in main); pad to the batch maximum.
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

VOCAB, DIM, HEADS, LAYERS, CLASSES = 4000, 64, 4, 2, 4


def make_corpus(samples: int, seed: int = 0) -> list[tuple[torch.Tensor, int]]:
    """Documents with a long-tailed length distribution: most 8-48 tokens, 1 % long (100-256)."""
    g = torch.Generator().manual_seed(seed)
    docs = []
    for _ in range(samples):
        long_doc = torch.rand((), generator=g) < 0.01
        low, high = (100, 257) if long_doc else (8, 49)
        length = int(torch.randint(low, high, (), generator=g))
        tokens = torch.randint(1, VOCAB, (length,), generator=g)
        docs.append((tokens, int(tokens[:8].sum()) % CLASSES))
    return docs


class Collate:
    def __init__(self, pad_to: int | None):
        self.pad_to = pad_to  # None: the batch's own longest document

    def __call__(self, batch):
        width = self.pad_to or max(len(tokens) for tokens, _ in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        for row, (tokens, _) in enumerate(batch):
            ids[row, : len(tokens)] = tokens
        return ids, ids != 0, torch.tensor([label for _, label in batch])


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x, keep):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
        x = x + self.out(att.transpose(1, 2).reshape(b, t, DIM))
        return x + self.mlp(self.ln2(x))


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM, padding_idx=0)
        self.pos = nn.Embedding(256, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, ids, keep):
        x = self.emb(ids) + self.pos(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x, keep)
        pooled = (x * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)
        return self.head(pooled)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    corpus = make_corpus(512)
    max_len = max(len(tokens) for tokens, _ in corpus)
    sampler = DistributedSampler(corpus, shuffle=True, seed=0)
    collate = Collate(pad_to=None if args.fix else max_len)
    loader = DataLoader(corpus, batch_size=args.batch_size, sampler=sampler, collate_fn=collate, drop_last=True)
    torch.manual_seed(0)
    model = DDP(Classifier())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        for ids, keep, labels in loader:
            loss = F.cross_entropy(model(ids, keep), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if meter.step(len(labels)):
                break
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
