"""Plain DDP whose metric-averaging helper creates a new process group on every call.

Mistake: the training loop averages its loss and accuracy over the data-parallel ranks with a helper
copied from a model-parallel codebase, `reduce_mean(t)`, which builds its group with
`dist.new_group(ranks=data_parallel_ranks)` on every call. new_group is itself a collective: every rank
registers in the store and gloo opens fresh connections between all pairs of ranks, for a group used for
a single 8-byte all_reduce. It runs twice per step (and leaks the groups' resources).
Source: https://github.com/facebookresearch/fairscale/pull/678 ("add and use get_process_group_cached":
"Separate process groups also reduce the training speed") and https://github.com/pytorch/pytorch/issues/40400
(groups created repeatedly with dist.new_group leak memory).
Fix (--fix): create the data-parallel group once and reuse it (functools.cache on the group factory);
same model, data, logged values.
Expected diagnosis: each step spends long in process-group setup (new_group: store round trips and gloo
connection set-up) outside forward/backward, in reduce_mean/data_parallel_group called from the step
loop; create the group once.
"""

import functools
import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, SmallCNN, arguments, synthetic_cifar


def data_parallel_group():
    """In the original codebase this picked the ranks of one data-parallel replica set."""
    return dist.new_group(ranks=list(range(dist.get_world_size())))


def reduce_mean(value: torch.Tensor, group_factory) -> torch.Tensor:
    value = value.detach().clone()
    group = group_factory()
    dist.all_reduce(value, group=group)
    return value / dist.get_world_size(group)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    group_factory = functools.cache(data_parallel_group) if args.fix else data_parallel_group
    images, labels = synthetic_cifar(1024)
    dataset = TensorDataset(images, labels)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    model = DDP(SmallCNN())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        history = []
        for x, y in loader:
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            accuracy = (logits.argmax(1) == y).float().mean()
            history.append((reduce_mean(loss, group_factory), reduce_mean(accuracy, group_factory)))
            if meter.step(len(y)):
                break
        if dist.get_rank() == 0 and epoch % 5 == 0:
            print(f"epoch {epoch} loss {float(torch.stack([h[0] for h in history]).mean()):.3f}", flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
