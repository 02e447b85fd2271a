"""Plain DDP face-embedding model whose class centres are an nn.ParameterList of 300 separate vectors.

Mistake: the classifier head (a cosine-softmax / "centre" head over 300 identities) keeps one learnable
centre per class as `nn.ParameterList([nn.Parameter(torch.randn(EMBED)) for _ in range(CLASSES)])` and
stacks them in every forward. The maths is one 300 x 128 matrix, but the model now has 300 extra
parameter tensors of 128 floats: the forward's torch.stack and its backward's unbind, DDP's bucketing of
300 tiny gradients, zero_grad, and above all AdamW's per-tensor step (about a dozen small ops per
parameter tensor, i.e. >3,600 tiny ops per step) dominate a step whose real arithmetic is a few small
matmuls.
Source: https://github.com/pytorch/pytorch/issues/3929 ("Our current optimizers are terribly slow when
dealing with large sets of relatively small parameters"), https://github.com/roboflow/rf-detr/pull/1409
(one optimizer parameter group per tensor "kills that batching completely ... one single-tensor kernel
launch per parameter"), https://github.com/explosion/thinc/pull/348 ("Optimizing lots of small arrays also
makes our optimizer quite slow").
Fix (--fix): one nn.Parameter of shape (300, 128) initialised with the same values (torch.stack of the same
randn draws); same model, same data, same updates.
Expected diagnosis: the step is dominated by per-tensor overhead in the optimizer step (AdamW's
single-tensor loop over ~300 tiny parameters: thousands of small ops) plus the stack/unbind and DDP
bucketing of those tensors, from the nn.ParameterList of class centres in CentreHead; store the centres
as one (classes x dim) parameter.
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

FEATURES, EMBED, CLASSES = 128, 128, 300


class CentreHead(nn.Module):
    """Cosine-softmax head: logits = scale * cos(embedding, class centre)."""

    def __init__(self, one_matrix: bool):
        super().__init__()
        init = [torch.randn(EMBED) for _ in range(CLASSES)]
        self.one_matrix = one_matrix
        if one_matrix:
            self.centres = nn.Parameter(torch.stack(init))
        else:
            self.centres = nn.ParameterList([nn.Parameter(c) for c in init])

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        centres = self.centres if self.one_matrix else torch.stack(list(self.centres))
        return 16.0 * F.normalize(z, dim=1) @ F.normalize(centres, dim=1).t()


class FaceEmbedder(nn.Module):
    def __init__(self, one_matrix: bool):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, EMBED))
        self.head = CentreHead(one_matrix)

    def forward(self, x):
        return self.head(self.encoder(x))


def synthetic_identities(samples: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(CLASSES, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (samples,), generator=g)
    return prototypes[y] + 0.7 * torch.randn(samples, FEATURES, generator=g), y


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    x, y = synthetic_identities(2 * 24 * args.batch_size)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    model = DDP(FaceEmbedder(one_matrix=args.fix))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        correct = total = 0
        for xb, yb in loader:
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
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
