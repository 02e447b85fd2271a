"""Build the bundled offline subset of CIFAR-10 (src/paratrain/workloads/data/cifar10-mini.tar.gz).

Class-balanced: 500 training and 100 test images per class, picked at random with a fixed seed
from the JPEG copy of CIFAR-10, copied byte for byte (no re-encoding). Members are sorted and carry
no timestamps or owners, so running this twice gives the same bytes:

    .venv/bin/python scripts/make_bundled_subset.py ../shared/datasets/cifar10-jpg.tar.gz
"""

from __future__ import annotations

import argparse
import gzip
import io
import tarfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "paratrain" / "workloads" / "data" / "cifar10-mini.tar.gz"
PER_CLASS = {"train": 500, "test": 100}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("archive", nargs="?", default=str(ROOT.parent / "shared" / "datasets" / "cifar10-jpg.tar.gz"))
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args()

    members: dict[tuple[str, str], list[tuple[str, bytes]]] = {}
    with tarfile.open(args.archive) as tar:
        for m in tar:
            parts = [x for x in Path(m.name).parts if x != "."]
            if m.isfile() and len(parts) == 3 and parts[0] in PER_CLASS:
                members.setdefault((parts[0], parts[1]), []).append((parts[2], tar.extractfile(m).read()))

    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as out:
        for split, cls in sorted(members):
            files = sorted(members[(split, cls)])
            picks = sorted(rng.choice(len(files), PER_CLASS[split], replace=False).tolist())
            for i, j in enumerate(picks):
                data = files[j][1]
                info = tarfile.TarInfo(f"{split}/{cls}/{i:04d}.jpg")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                out.addfile(info, io.BytesIO(data))
    with open(args.out, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as gz:
        gz.write(buf.getvalue())
    print(f"wrote {args.out} ({Path(args.out).stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
