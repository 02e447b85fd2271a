"""Plain DDP churn classifier on tabular customer records (dicts, as parsed from JSON lines), whose
Dataset audits every record it serves on rank 0 for a data-quality report.

Mistake: the user added a data-quality audit to the Dataset (schema and range checks, e-mail and id
patterns, timestamp parsing, non-finite sensor readings, a running mean/variance of every reading for drift,
and duplicate detection by hashing the record's canonical JSON) and, so that the report is printed once and
not once per rank, enabled it on rank 0 only: `audit=(rank == 0)`. `__getitem__` then runs the audit for
every record rank 0 serves, every epoch, in the main process (num_workers=0): rank 0's batches take far
longer to produce than rank 1's, and rank 1 waits for rank 0 in every gradient all-reduce. The records do
not change between epochs, so every epoch after the first re-checks the same records.
Source: https://github.com/mir-dataset-loaders/mirdata/issues/127 ("We run validation every time
`dataset.load()` is called ... validation can be quite slow, should we consider taking it out"),
https://github.com/weecology/DeepForest/pull/1373 (validation that opens every image each run: "it seems
really heavy every time"), https://github.com/meta-pytorch/torchtune/issues/2452 (validation checks "at a
message instance level as we iterate over our dataset"; a dry run before training instead).
Fix (--fix): rank 0 audits the whole dataset once, before training (the same checks over every record,
a fraction of a second), prints the report, and `__getitem__` serves records without re-auditing them.
Expected diagnosis: a straggler: rank 0's steps are longer because its data loading (`__getitem__` →
`audit`, on rank 0 only) does extra per-sample work rank 1 does not, and rank 1 spends that time waiting in
the gradient all-reduce; run the audit once up front (or on a sample), not per record per epoch on one rank.
"""

import gc
import hashlib
import json
import math
import random
import re
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doctor_faults"))
from common import Meter, arguments

COUNTRIES = ["DE", "FR", "GB", "US", "ES", "IT", "NL", "PL", "SE", "JP"]
PLANS = ["free", "basic", "pro", "team"]
READINGS, WIDTH = 24, 384
ID_RE = re.compile(r"C-\d{6}")
EMAIL_RE = re.compile(r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}")
SAMPLES = 2 * 40 * 128  # 40 batches of 128 per rank and epoch
FEATURES = 2 + len(COUNTRIES) + len(PLANS) + 2 + READINGS


def make_records(samples: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    records = []
    for i in range(samples):
        readings = [rng.gauss(0.0, 1.0) for _ in range(READINGS)]
        if rng.random() < 0.01:
            readings[rng.randrange(READINGS)] = float("nan")
        plan = rng.choice(PLANS)
        churn = int(sum(readings[:4]) + (plan == "free") * 1.5 + rng.gauss(0.0, 1.0) > 1.0)
        records.append(
            {
                "id": f"C-{i:06d}",
                "age": rng.randint(16, 90),
                "income": round(rng.lognormvariate(10.5, 0.6), 2),
                "country": rng.choice(COUNTRIES),
                "email": f"user{i}@example.{rng.choice(['com', 'org', 'de'])}",
                "signup": f"20{rng.randint(15, 24)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T"
                f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00",
                "plan": plan,
                "readings": readings,
                "churn": churn,
            }
        )
    return records


class RecordAudit:
    """Data-quality checks of one record, with counters, running reading statistics and duplicate detection."""

    def __init__(self):
        self.problems: Counter = Counter()
        self.seen: dict[str, str] = {}  # content digest -> the first id with that content
        self.count, self.mean, self.m2 = 0, [0.0] * READINGS, [0.0] * READINGS

    def check(self, record: dict) -> None:
        if not ID_RE.fullmatch(record["id"]):
            self.problems["bad id"] += 1
        if not isinstance(record["age"], int) or not 18 <= record["age"] <= 100:
            self.problems["age out of range"] += 1
        if not isinstance(record["income"], float) or record["income"] <= 0:
            self.problems["bad income"] += 1
        if record["country"] not in COUNTRIES:
            self.problems["unknown country"] += 1
        if record["plan"] not in PLANS:
            self.problems["unknown plan"] += 1
        if not EMAIL_RE.fullmatch(record["email"]):
            self.problems["bad email"] += 1
        try:
            if datetime.fromisoformat(record["signup"]).year < 2015:
                self.problems["signup too early"] += 1
        except ValueError:
            self.problems["bad signup"] += 1
        self.count += 1
        for k, value in enumerate(record["readings"]):
            if not math.isfinite(value):
                self.problems["non-finite reading"] += 1
                continue
            delta = value - self.mean[k]
            self.mean[k] += delta / self.count
            self.m2[k] += delta * (value - self.mean[k])
            if self.count > 100 and abs(value - self.mean[k]) > 5 * math.sqrt(self.m2[k] / (self.count - 1)):
                self.problems["reading outlier"] += 1
        content = dict(record)
        del content["id"]
        digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
        if self.seen.setdefault(digest, record["id"]) != record["id"]:
            self.problems["duplicate"] += 1

    def report(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.problems.items())) or "clean"


def featurize(record: dict) -> list[float]:
    readings = [v if math.isfinite(v) else 0.0 for v in record["readings"]]
    hour = int(record["signup"][11:13])
    return [
        record["age"] / 100.0,
        math.log1p(record["income"]) / 12.0,
        *(float(record["country"] == c) for c in COUNTRIES),
        *(float(record["plan"] == p) for p in PLANS),
        math.sin(2 * math.pi * hour / 24),
        math.cos(2 * math.pi * hour / 24),
        *readings,
    ]


class CustomerRecords(Dataset):
    def __init__(self, records: list[dict], audit: RecordAudit | None):
        self.records, self.audit = records, audit

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int):
        record = self.records[index]
        if self.audit is not None:
            self.audit.check(record)
        return torch.tensor(featurize(record)), record["churn"]


def main():
    parser = arguments(__doc__)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    records = make_records(SAMPLES)
    audit = RecordAudit()
    if args.fix:
        if rank == 0:
            for record in records:
                audit.check(record)
            print(f"data audit (once, {audit.count} records): {audit.report()}", flush=True)
        dataset = CustomerRecords(records, audit=None)
    else:
        dataset = CustomerRecords(records, audit=audit if rank == 0 else None)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(FEATURES, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 2))
    model = DDP(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    meter, epoch = Meter(args), 0
    while True:
        sampler.set_epoch(epoch)
        total = torch.zeros(3)
        for x, y in loader:
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item() * len(y), (logits.argmax(1) == y).sum().item(), len(y)])
            if meter.step(len(y)):
                break
        dist.all_reduce(total)
        if rank == 0:
            line = f"epoch {epoch} loss {total[0] / total[2]:.4f} accuracy {total[1] / total[2]:.3f}"
            if not args.fix:
                line += f" | data audit ({audit.count} records): {audit.report()}"
            print(line, flush=True)
        epoch += 1
        if meter.end_epoch():
            break
    meter.report()
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
