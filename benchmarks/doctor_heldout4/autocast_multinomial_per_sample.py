"""bf16-autocast skip-gram (word2vec) that draws each example's negatives with its own multinomial call.

Mistake: SkipGramNS.forward draws the 5 negative words of every (center, context) pair separately,
`torch.stack([torch.multinomial(self.noise, NEGATIVES, replacement=True) for _ in range(batch)])`.
torch.multinomial rebuilds the cumulative distribution over the whole 100,000-word noise distribution on
every call, so each step pays 512 O(vocabulary) passes (plus 512 tiny ops) to draw 2,560 integers; the
embedding look-ups and the bf16 dot products of the actual model are a small fraction of that.
Source: https://github.com/pytorch/pytorch/issues/30968 ("Categorical.sample(shape) calls _shape_ times
torch.multinomial(probas, 1, True). This is slow ... Shouldn't be slower than a single call to
torch.multinomial"), https://github.com/berenslab/contrastive-ne/issues/2 ("Using torch.multinomial is an
expensive operation ... for sampling negative edges"), https://github.com/theeluwin/pytorch-sgns/issues/9
(the batched form: one t.multinomial(self.weights, batch_size * context_size * n_negs) per batch).
Fix (--fix): one call for the whole batch, `torch.multinomial(self.noise, batch * NEGATIVES,
replacement=True).view(batch, NEGATIVES)`: same noise distribution, same model, same data (here even the
same draws: one generator stream, consumed in the same order).
Expected diagnosis: forward dominated by hundreds of torch.multinomial calls per step (each an O(vocab)
cumulative sum over the noise distribution) in SkipGramNS.forward's per-example loop, not by the model's
embedding/bmm work; sample all negatives of the batch in one call.
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

VOCAB, DIM, NEGATIVES = 100_000, 32, 5


class SkipGramNS(nn.Module):
    def __init__(self, counts: torch.Tensor, batched_sampling: bool):
        super().__init__()
        self.batched_sampling = batched_sampling
        self.center = nn.Embedding(VOCAB, DIM)
        self.context = nn.Embedding(VOCAB, DIM)
        nn.init.uniform_(self.center.weight, -0.5 / DIM, 0.5 / DIM)
        nn.init.zeros_(self.context.weight)
        self.register_buffer("noise", counts.pow(0.75) / counts.pow(0.75).sum(), persistent=False)

    def sample_negatives(self, batch: int) -> torch.Tensor:
        if self.batched_sampling:
            return torch.multinomial(self.noise, batch * NEGATIVES, replacement=True).view(batch, NEGATIVES)
        return torch.stack([torch.multinomial(self.noise, NEGATIVES, replacement=True) for _ in range(batch)])

    def forward(self, center: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        negatives = self.sample_negatives(len(center))
        targets = torch.cat([context[:, None], negatives], 1)  # batch x (1 + NEGATIVES)
        scores = torch.bmm(self.context(targets), self.center(center)[:, :, None]).squeeze(2)
        labels = torch.zeros_like(scores, dtype=torch.float32)
        labels[:, 0] = 1.0
        return F.binary_cross_entropy_with_logits(scores.float(), labels, reduction="sum") / len(center)


def synthetic_pairs(samples: int, seed: int = 0):
    """Zipf-distributed word pairs whose context is a noisy function of the center word."""
    g = torch.Generator().manual_seed(seed)
    counts = 1.0 / torch.arange(1, VOCAB + 1, dtype=torch.float64)
    center = torch.multinomial(counts, samples, replacement=True, generator=g)
    context = (center + torch.randint(1, 4, (samples,), generator=g)) % VOCAB
    return center, context, counts.float()


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=512)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    center, context, counts = synthetic_pairs(2 * 20 * args.batch_size)
    dataset = TensorDataset(center, context)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    model = DDP(SkipGramNS(counts, batched_sampling=args.fix))
    optimizer = torch.optim.SGD(model.parameters(), lr=10.0)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        total_loss = steps = 0
        for cb, xb in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(cb, xb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
            steps += 1
            if meter.step(len(cb)):
                break
        if dist.get_rank() == 0:
            print(f"epoch {epoch} train loss {total_loss / max(steps, 1):.4f}", flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
