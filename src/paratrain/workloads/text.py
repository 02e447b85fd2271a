"""Text as bytes: the corpus of the `gpt` workloads, decoded once and cached as a uint8 tensor.

Tokens are the bytes of the UTF-8 text (vocabulary 256), so no tokenizer is needed and nothing is
downloaded. Sources:
- by default, the Python standard library's own `.py` sources as the running interpreter ships
  them (its test suites left out): offline, about 12.6 MB for CPython 3.11, under the PSF
  licence. The interpreter's version, the number of files and a sha256 of their contents are
  recorded, so a run says exactly which text it trained on;
- `--data-dir`: a text file, or a folder of text files (every file that decodes as UTF-8 and holds
  no NUL byte; others are skipped).

Documents are whole files. About 10 % of them (at least one) are held out as the test split,
chosen by a hash of their relative path: the split is fixed by document, the same for every seed
and run, and no held-out file ever leaks into training. A single file is one document; its last
10 % of bytes is held out instead.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from paratrain.errors import UsageError
from paratrain.workloads.datasets import PathLike, Split, default_cache_dir

HELD_OUT_FRACTION = 0.1
TEXT_CACHE_VERSION = 1
SKIPPED_PARTS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


@dataclass
class TokenStream:
    """The training text as one uint8 tensor; an epoch is `samples_per_epoch` random windows of
    `seq_len + 1` bytes (inputs and the same bytes shifted by one as targets)."""

    tokens: torch.Tensor  # uint8 [N]
    seq_len: int
    samples_per_epoch: int

    def __len__(self) -> int:
        return self.samples_per_epoch


@dataclass
class Corpus:
    documents: list[tuple[str, bytes]]  # (name, bytes), sorted by name
    info: dict[str, Any]  # where the text came from, recorded in config.json


def load_corpus(
    data_dir: PathLike | None, cache_dir: PathLike | None = None
) -> tuple[torch.Tensor, torch.Tensor, list[int], dict[str, Any]]:
    """(train bytes, held-out bytes, lengths of the training documents, info), cached after the first load."""
    if data_dir is None:
        root = Path(sysconfig.get_paths()["stdlib"])
        files = _python_sources(root)
        kind = f"python-stdlib {sys.version.split()[0]}"
    else:
        root = Path(data_dir).expanduser()
        if not root.exists():
            raise UsageError(f"--data-dir {root} does not exist; pass a text file or a folder of text files")
        files = (
            [root]
            if root.is_file()
            else sorted(
                p
                for p in root.rglob("*")
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
            )
        )
        kind = "text"
    listing = [f"{_name(p, root)}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]
    key = hashlib.sha256(
        "\n".join([kind, str(root.resolve()), str(TEXT_CACHE_VERSION), *listing]).encode()
    ).hexdigest()[:20]
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cached = cache / f"text-{root.name.split('.')[0]}-{key}.pt"
    if cached.exists():
        try:
            blob = torch.load(cached, weights_only=True)
            return blob["train"], blob["held_out"], list(blob["train_lengths"]), blob["info"]
        except Exception:
            cached.unlink(missing_ok=True)  # a damaged cache entry is simply rebuilt
    corpus = _read(root, files, kind, data_dir is None)
    train, held_out, lengths = _split_by_document(corpus.documents)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
    torch.save({"train": train, "held_out": held_out, "train_lengths": lengths, "info": corpus.info}, tmp)
    os.replace(tmp, cached)
    return train, held_out, lengths, corpus.info


def _python_sources(root: Path) -> list[Path]:
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_PARTS)
        files += [Path(folder) / n for n in names if n.endswith(".py")]
    return sorted(files)


def _name(path: Path, root: Path) -> str:
    return path.name if path == root else str(path.relative_to(root))


def _read(root: Path, files: list[Path], kind: str, stdlib: bool) -> Corpus:
    documents = []
    for path in files:
        data = path.read_bytes()
        if not data or b"\0" in data:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        documents.append((_name(path, root), data))
    if not documents:
        what = "is empty" if root.is_file() and root.stat().st_size == 0 else "holds no UTF-8 text"
        raise UsageError(f"--data-dir {root} {what}; pass a UTF-8 text file or a folder with some")
    digest = hashlib.sha256()
    for name, data in documents:
        digest.update(name.encode() + b"\0" + data)
    info = {
        "source": kind,
        "path": str(root),
        "documents": len(documents),
        "bytes": sum(len(d) for _, d in documents),
        "sha256": digest.hexdigest(),
    }
    if stdlib:
        info["python"] = sys.version.split()[0]
        info["licence"] = "PSF (Python Software Foundation License)"
    return Corpus(documents, info)


def _split_by_document(documents: list[tuple[str, bytes]]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    if len(documents) == 1:
        data = documents[0][1]
        cut = len(data) - max(1, math.ceil(len(data) * HELD_OUT_FRACTION))
        return _tensor([data[:cut]]), _tensor([data[cut:]]), [cut]
    # Order by a hash of the name: a fixed, seed-independent, well-mixed choice of held-out files.
    ranked = sorted(documents, key=lambda doc: hashlib.sha256(doc[0].encode()).hexdigest())
    held = max(1, round(len(documents) * HELD_OUT_FRACTION))
    held_names = {name for name, _ in ranked[:held]}
    train = [d for n, d in documents if n not in held_names]
    return _tensor(train), _tensor([d for n, d in documents if n in held_names]), [len(d) for d in train]


def _tensor(parts: list[bytes]) -> torch.Tensor:
    return torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)


def carve_validation(
    tokens: torch.Tensor, lengths: list[int], fraction: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, val): `--val-split` of the training documents (seeded choice) become a validation text."""
    if not 0 < fraction < 1:
        raise UsageError(f"--val-split must be between 0 and 1 (got {fraction})")
    if len(lengths) < 2:
        raise UsageError("--val-split needs at least two training documents; pass a folder of text files")
    g = torch.Generator().manual_seed(seed)
    picked = set(torch.randperm(len(lengths), generator=g)[: max(1, round(fraction * len(lengths)))].tolist())
    if len(picked) == len(lengths):
        picked.pop()
    docs = torch.split(tokens, lengths)
    return (
        torch.cat([d for i, d in enumerate(docs) if i not in picked]),
        torch.cat([d for i, d in enumerate(docs) if i in picked]),
    )


def eval_windows(tokens: torch.Tensor, seq_len: int, count: int) -> Split:
    """`count` non-overlapping windows spread evenly over a held-out text: the same every epoch.

    x: uint8 [N, seq_len] inputs, y: int64 [N, seq_len] next-byte targets.
    """
    available = (len(tokens) - 1) // seq_len
    n = min(count, available)
    starts = (torch.arange(n) * available // n) * seq_len
    offsets = torch.arange(seq_len)
    x = tokens[starts[:, None] + offsets]
    y = tokens[starts[:, None] + offsets + 1].long()
    return Split(x, y)


def check_length(tokens: torch.Tensor, seq_len: int, what: str) -> None:
    if len(tokens) < seq_len + 2:
        raise UsageError(
            f"the {what} text has {len(tokens)} bytes, too few for one window of --seq-len {seq_len}; "
            "pass more text or a smaller --seq-len"
        )
