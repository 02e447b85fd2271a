"""Mixed precision ported from a CUDA script to CPU with dtype=torch.float16 kept.

Mistake: the user's AMP code was written for GPUs (`torch.autocast(device_type, dtype=torch.float16)` plus
a GradScaler); on the CPU cluster only device_type became "cpu". CPU autocast accepts float16, but this CPU
(like most) has no native fp16 matmul/conv kernels: every autocast op converts to fp16, runs a slow
fallback (or converts back to fp32 around the GEMM), and the step becomes many times slower than fp32,
while bf16 (which this CPU supports natively with AVX512-BF16) would be faster than fp32.
Source: https://github.com/pytorch/pytorch/issues/146508 ("Something very wrong with float16 CPU
implementation": 40-500x slower matmuls) and https://github.com/huggingface/transformers/issues/34692
("CPU processing is extremely slow for models loaded with torch_dtype = torch.float16").
Fix (--fix): `torch.autocast("cpu", dtype=torch.bfloat16)` and no loss scaling (bf16 has fp32's range);
same model, same data, same optimizer.
Expected diagnosis: compute (forward and backward) far slower than the model's FLOPs warrant: float16
autocast on a CPU without fp16 kernels (the torch.autocast(..., dtype=torch.float16) in the training loop);
use bfloat16 (or fp32).
"""

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


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    device_type = "cpu"
    amp_dtype = torch.bfloat16 if args.fix else torch.float16
    torch.manual_seed(0)
    model = DDP(SmallCNN())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler(device_type, enabled=amp_dtype == torch.float16)

    images, labels = synthetic_cifar(1024)
    dataset = TensorDataset(images, labels)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        epoch += 1
        for x, y in loader:
            with torch.autocast(device_type, dtype=amp_dtype):
                loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if meter.step(len(x)):
                break
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
