"""Datasets as in-memory uint8 tensors, decoded once and cached.

Sources, all giving the same `Dataset` (train and test `Split`s of uint8 [N, C, H, W] images):
- CIFAR-10 in its canonical form (Krizhevsky 2009): `cifar-10-python.tar.gz` or the extracted
  `cifar-10-batches-py/` (pickled batches);
- an image tree `train|test/<class>/*.{jpg,png}` as a folder or a `.tar.gz` archive, such as the
  JPEG copy of CIFAR-10 or the bundled offline subset;
- synthetic images of any shape, for throughput work.

Decoding (the only per-image Python work) happens once per source; the tensors are cached with
`torch.save` under a key made of the source's path, size and modification time, and later loads
are a single `torch.load`.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import sys
import tarfile
import urllib.request
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from paratrain.errors import UsageError

PathLike = str | os.PathLike

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR10_FOLDER = "cifar-10-batches-py"
BUNDLED = Path(__file__).parent / "data" / "cifar10-mini.tar.gz"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
CACHE_VERSION = 1


@dataclass
class Split:
    x: torch.Tensor  # uint8 [N, C, H, W]
    y: torch.Tensor  # int64 [N]

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, idx: torch.Tensor) -> Split:
        return Split(self.x[idx].contiguous(), self.y[idx].contiguous())


@dataclass
class Dataset:
    name: str
    train: Split
    test: Split
    classes: list[str]

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.train.x.shape[1:])  # type: ignore[return-value]


def default_cache_dir() -> Path:
    if os.environ.get("PARATRAIN_CACHE"):
        return Path(os.environ["PARATRAIN_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "paratrain"


# -- CIFAR-10 and image trees ------------------------------------------------------------------


def load_cifar10(data_dir: PathLike | None, cache_dir: PathLike | None = None) -> Dataset:
    """CIFAR-10 from `data_dir` in any of the accepted forms; the bundled subset when None."""
    source = Path(data_dir).expanduser() if data_dir is not None else BUNDLED
    if not source.exists():
        raise UsageError(f"--data-dir {source} does not exist; pass a folder with CIFAR-10 or an image-tree archive")
    kind, path = _identify(source)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cached = cache / f"{_fingerprint(kind, path)}.pt"
    if cached.exists():
        try:
            return _from_cache(torch.load(cached, weights_only=True))
        except Exception:
            cached.unlink(missing_ok=True)  # a stale or damaged cache entry is simply rebuilt
    try:
        data = _decode(kind, path)
    except UsageError:
        raise
    except (tarfile.TarError, EOFError, zlib.error, pickle.UnpicklingError, OSError, KeyError, ValueError) as exc:
        raise UsageError(
            f"{path} is corrupt or truncated ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "download or build it again"
        ) from None
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
    torch.save(
        {
            "name": data.name,
            "classes": data.classes,
            "train_x": data.train.x,
            "train_y": data.train.y,
            "test_x": data.test.x,
            "test_y": data.test.y,
        },
        tmp,
    )
    os.replace(tmp, cached)
    return data


def _identify(source: Path) -> tuple[str, Path]:
    """Which layout `source` holds: ('cifar-archive'|'cifar-folder'|'tree-archive'|'tree-folder', path)."""
    if source.is_file():
        if source.name == CIFAR10_ARCHIVE:
            return "cifar-archive", source
        if source.name.endswith((".tar.gz", ".tgz", ".tar")):
            return "tree-archive", source
        raise UsageError(f"--data-dir {source} is a file but not a .tar.gz/.tgz/.tar archive")
    entries = [p for p in source.iterdir() if not p.name.startswith(".")]
    if not entries:
        raise UsageError(
            f"--data-dir {source} is empty; put cifar-10-python.tar.gz or a train/ and test/ image tree in it"
        )
    if (source / "data_batch_1").exists() and (source / "test_batch").exists():
        return "cifar-folder", source
    if (source / CIFAR10_FOLDER).is_dir():
        return "cifar-folder", source / CIFAR10_FOLDER
    if (source / CIFAR10_ARCHIVE).is_file():
        return "cifar-archive", source / CIFAR10_ARCHIVE
    if (source / "train").is_dir() and (source / "test").is_dir():
        return "tree-folder", source
    nested = [p for p in entries if p.is_dir() and (p / "train").is_dir() and (p / "test").is_dir()]
    if len(nested) == 1:
        return "tree-folder", nested[0]
    archives = [p for p in entries if p.is_file() and p.name.endswith((".tar.gz", ".tgz"))]
    if len(archives) == 1:
        return "tree-archive", archives[0]
    raise UsageError(
        f"--data-dir {source} holds neither CIFAR-10 ({CIFAR10_ARCHIVE} or {CIFAR10_FOLDER}/) "
        "nor an image tree with train/<class>/ and test/<class>/ folders"
    )


def _fingerprint(kind: str, path: Path) -> str:
    resolved = path.resolve()
    if path.is_file():
        stat = path.stat()
        parts = [str(resolved), str(stat.st_size), str(stat.st_mtime_ns)]
    else:
        files = sorted(p for p in resolved.rglob("*") if p.is_file())
        parts = [str(resolved), str(len(files))] + [f"{p.relative_to(resolved)}:{p.stat().st_size}" for p in files]
    digest = hashlib.sha256("\n".join([kind, str(CACHE_VERSION), *parts]).encode()).hexdigest()[:20]
    return f"{path.name.split('.')[0]}-{digest}"


def _from_cache(blob: dict) -> Dataset:
    return Dataset(
        blob["name"],
        Split(blob["train_x"], blob["train_y"]),
        Split(blob["test_x"], blob["test_y"]),
        list(blob["classes"]),
    )


def _decode(kind: str, path: Path) -> Dataset:
    if kind == "cifar-archive":
        with tarfile.open(path) as tar:
            members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
            return _cifar_batches(lambda name: _read_member(tar, members, name, path))
    if kind == "cifar-folder":
        return _cifar_batches(lambda name: (path / name).read_bytes())
    if kind == "tree-archive":
        with tarfile.open(path) as tar:
            files = ((m.name, lambda m=m: tar.extractfile(m).read()) for m in tar if m.isfile())
            return _image_tree(files, path)
    files = ((str(p.relative_to(path)), p.read_bytes) for p in sorted(path.rglob("*")) if p.is_file())
    return _image_tree(files, path)


def _read_member(tar: tarfile.TarFile, members: dict, name: str, path: Path) -> bytes:
    if name not in members:
        raise UsageError(f"{path} lacks {name}: not a CIFAR-10 python archive")
    return tar.extractfile(members[name]).read()


def _cifar_batches(read) -> Dataset:
    def batch(name: str) -> tuple[np.ndarray, np.ndarray]:
        d = pickle.loads(read(name), encoding="bytes")
        x = np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        return x, np.asarray(d[b"labels"], dtype=np.int64)

    train = [batch(f"data_batch_{i}") for i in range(1, 6)]
    test_x, test_y = batch("test_batch")
    try:
        meta = pickle.loads(read("batches.meta"), encoding="bytes")
        classes = [c.decode() for c in meta[b"label_names"]]
    except UsageError:
        classes = list(CIFAR10_CLASSES)
    return Dataset(
        "cifar10",
        Split(
            torch.from_numpy(np.concatenate([x for x, _ in train])),
            torch.from_numpy(np.concatenate([y for _, y in train])),
        ),
        Split(torch.from_numpy(test_x), torch.from_numpy(test_y)),
        classes,
    )


def _image_tree(files: Iterable[tuple[str, object]], source: Path) -> Dataset:
    """Decode train/<class>/* and test/<class>/* (file order sorted by path, so it is deterministic)."""
    from PIL import Image, UnidentifiedImageError

    found: dict[str, list[tuple[str, str, object]]] = {"train": [], "test": []}
    for name, read in files:
        parts = [p for p in Path(name).parts if p not in (".", "")]
        if len(parts) >= 3 and parts[-3] in found and Path(parts[-1]).suffix.lower() in IMAGE_SUFFIXES:
            found[parts[-3]].append((parts[-2], "/".join(parts[-3:]), read))
    if not found["train"] or not found["test"]:
        raise UsageError(
            f"{source} holds no train/<class>/ and test/<class>/ images; expected an image tree such as CIFAR-10's"
        )
    train_classes = sorted({c for c, _, _ in found["train"]})
    test_classes = sorted({c for c, _, _ in found["test"]})
    if train_classes != test_classes:
        raise UsageError(
            f"{source}: train and test have different classes "
            f"({', '.join(sorted(set(train_classes) ^ set(test_classes)))})"
        )
    classes = list(CIFAR10_CLASSES) if sorted(CIFAR10_CLASSES) == train_classes else train_classes
    index = {c: i for i, c in enumerate(classes)}
    splits = {}
    for split, items in found.items():
        items.sort(key=lambda item: item[1])
        images, labels = [], []
        shape = None
        for cls, name, read in _progress(items, f"decoding {source.name} ({split})"):
            try:
                with Image.open(io.BytesIO(read())) as img:
                    array = np.asarray(img.convert("RGB"))
            except (UnidentifiedImageError, OSError) as exc:
                raise UsageError(f"{source}: {name} is not a readable image ({exc})") from None
            if shape is None:
                shape = array.shape
            elif array.shape != shape:
                raise UsageError(
                    f"{source}: images differ in size ({name} is {array.shape[1]}x{array.shape[0]}, "
                    f"others {shape[1]}x{shape[0]}); resize them to one size first"
                )
            images.append(array)
            labels.append(index[cls])
        x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()
        splits[split] = Split(x, torch.tensor(labels, dtype=torch.int64))
    return Dataset(source.name.split(".")[0], splits["train"], splits["test"], classes)


def _progress(items: list, description: str) -> Iterable:
    """A progress bar on an interactive terminal: decoding all of CIFAR-10 takes a while, once."""
    if len(items) < 10000 or not sys.stderr.isatty():
        return items
    from rich.console import Console
    from rich.progress import track

    return track(items, description=description, console=Console(stderr=True), transient=True)


# -- synthetic ---------------------------------------------------------------------------------


def load_synthetic(
    num_samples: int, shape: tuple[int, int, int], num_classes: int, seed: int = 0, test_samples: int | None = None
) -> Dataset:
    """Random images whose class is learnable: each class has its own mean image, plus noise."""
    if num_samples <= 0 or num_classes <= 1 or len(shape) != 3 or min(shape) <= 0:
        raise UsageError("synthetic data needs samples > 0, classes > 1 and a C,H,W shape")
    g = torch.Generator().manual_seed(seed)
    means = torch.randint(64, 192, (num_classes, *shape), generator=g, dtype=torch.int16)
    test_samples = test_samples if test_samples is not None else max(1, num_samples // 5)

    def split(n: int) -> Split:
        y = torch.randint(0, num_classes, (n,), generator=g)
        noise = torch.randint(-64, 64, (n, *shape), generator=g, dtype=torch.int16)
        return Split((means[y] + noise).clamp_(0, 255).to(torch.uint8), y)

    return Dataset("synthetic", split(num_samples), split(test_samples), [f"class{i}" for i in range(num_classes)])


# -- subsets -----------------------------------------------------------------------------------


def balanced_subset(y: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """n indices with the classes as equal as possible, each class's picks random; shuffled.

    Datasets stored by class (like the shared CIFAR-10 archive) make "the first n" a subset of a
    few classes; this never does.
    """
    g = torch.Generator().manual_seed(seed)
    if n >= len(y):
        return torch.randperm(len(y), generator=g)
    classes = torch.unique(y)
    pools = [torch.nonzero(y == c).flatten() for c in classes.tolist()]
    pools = [p[torch.randperm(len(p), generator=g)] for p in pools]
    take = [0] * len(pools)
    remaining = n
    # Water-filling: give every class an equal share, capped by what it has, until n are taken.
    while remaining > 0:
        open_classes = [i for i, p in enumerate(pools) if take[i] < len(p)]
        share, extra = divmod(remaining, len(open_classes))
        order = torch.randperm(len(open_classes), generator=g).tolist()
        for rank, j in enumerate(order):
            i = open_classes[j]
            want = share + (1 if rank < extra else 0)
            got = min(want, len(pools[i]) - take[i])
            take[i] += got
            remaining -= got
    picked = torch.cat([p[:k] for p, k in zip(pools, take)])
    return picked[torch.randperm(len(picked), generator=g)]


def stratified_split(y: torch.Tensor, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train_idx, val_idx): per class, round(fraction x count) random samples go to validation.

    Both index tensors come back sorted, so the training split keeps its original order.
    """
    if not 0 < fraction < 1:
        raise UsageError(f"--val-split must be between 0 and 1 (got {fraction})")
    g = torch.Generator().manual_seed(seed)
    val = []
    for c in torch.unique(y).tolist():
        pool = torch.nonzero(y == c).flatten()
        pool = pool[torch.randperm(len(pool), generator=g)]
        val.append(pool[: round(fraction * len(pool))])
    val_idx = torch.sort(torch.cat(val)).values
    mask = torch.ones(len(y), dtype=torch.bool)
    mask[val_idx] = False
    return torch.nonzero(mask).flatten(), val_idx


# -- download ----------------------------------------------------------------------------------


def download_cifar10(dest_dir: PathLike, url: str = CIFAR10_URL, md5: str = CIFAR10_MD5) -> Path:
    """Fetch the canonical archive into dest_dir, verify its md5, and return its path.

    Streams to a `.part` file and renames it only after the checksum matches, so an interrupted or
    corrupted download never looks like a good archive.
    """
    dest = Path(dest_dir).expanduser()
    dest.mkdir(parents=True, exist_ok=True)
    final = dest / CIFAR10_ARCHIVE
    if final.exists() and _md5(final) == md5:
        return final
    part = final.with_name(final.name + ".part")
    digest = hashlib.md5()
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(part, "wb") as out:
            for chunk in iter(lambda: response.read(1 << 20), b""):
                digest.update(chunk)
                out.write(chunk)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise UsageError(f"cannot download {url} ({exc}); download it by hand into {dest}") from None
    if digest.hexdigest() != md5:
        part.unlink(missing_ok=True)
        raise UsageError(f"the download from {url} has md5 {digest.hexdigest()}, expected {md5}; try again")
    os.replace(part, final)
    return final


def _md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
