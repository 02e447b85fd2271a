"""Lightning Fabric training with torchmetrics created with dist_sync_on_step=True.

Mistake: the user tracks training accuracy, F1, precision and recall with a torchmetrics MetricCollection
and, wanting the per-step numbers to be "global", builds every metric with dist_sync_on_step=True. Each
metric's forward() then synchronises each of its states across ranks on every step (torchmetrics'
gather_all_tensors: a barrier plus all_gathers per state), dozens of tiny collectives per step, although
the epoch values that get reported are synchronised once in compute() anyway.
Source: https://github.com/Lightning-AI/torchmetrics/issues/67 ("syncing each step will be incredibly
expensive"), https://github.com/Lightning-AI/torchmetrics/pull/2943 and
https://github.com/sb-ai-lab/RePlay/pull/100 (per-step metric syncs removed from the hot path).
Fix (--fix): dist_sync_on_step=False (the default): step values are the local batch's, the epoch values
from compute() are still synchronised across ranks, so what is reported per epoch is identical.
Expected diagnosis: many small collectives (barrier/all_gather) in every step outside backward, from the
metrics' per-step synchronisation (MetricCollection built with dist_sync_on_step=True in make_metrics);
sync once per epoch.
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.fabric import Fabric
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassPrecision, MulticlassRecall

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, SmallCNN, arguments, synthetic_cifar


def make_metrics(sync_on_step: bool) -> MetricCollection:
    kwargs = {"num_classes": 10, "dist_sync_on_step": sync_on_step}
    return MetricCollection(
        {
            "acc": MulticlassAccuracy(**kwargs),
            "f1": MulticlassF1Score(**kwargs),
            "precision": MulticlassPrecision(**kwargs),
            "recall": MulticlassRecall(**kwargs),
        }
    )


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    fabric = Fabric(accelerator="cpu", strategy="ddp", devices=2)
    fabric.launch()
    images, labels = synthetic_cifar(1024)
    dataset = torch.utils.data.TensorDataset(images, labels)
    loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True))
    torch.manual_seed(0)
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    metrics = make_metrics(sync_on_step=not args.fix)
    meter, epoch = Meter(args), 0
    while True:
        for x, y in loader:
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            optimizer.zero_grad(set_to_none=True)
            fabric.backward(loss)
            optimizer.step()
            step_values = metrics(logits.detach(), y)  # noqa: F841 (what a logger would receive)
            if meter.step(len(y)):
                break
        epoch_values = metrics.compute()
        metrics.reset()
        if fabric.global_rank == 0 and epoch % 5 == 0:
            print(f"epoch {epoch} acc {float(epoch_values['acc']):.3f}", flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
