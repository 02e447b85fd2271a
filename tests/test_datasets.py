"""Dataset loading on archives the tests build: canonical CIFAR-10, image trees, cache, subsets."""

import hashlib
import io
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from paratrain.errors import UsageError
from paratrain.workloads import datasets
from paratrain.workloads.datasets import (
    CIFAR10_CLASSES,
    balanced_subset,
    download_cifar10,
    load_cifar10,
    stratified_split,
)

PER_BATCH = 20


def _batch(seed: int, n: int) -> dict:
    rng = np.random.default_rng(seed)
    return {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"labels": [int(i % 10) for i in range(n)]}


def _canonical_files() -> dict[str, bytes]:
    files = {f"data_batch_{i}": pickle.dumps(_batch(i, PER_BATCH)) for i in range(1, 6)}
    files["test_batch"] = pickle.dumps(_batch(9, 10))
    files["batches.meta"] = pickle.dumps({b"label_names": [c.encode() for c in CIFAR10_CLASSES]})
    return files


def _canonical_archive(path: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in _canonical_files().items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _check_canonical(data):
    assert data.train.x.shape == (5 * PER_BATCH, 3, 32, 32) and data.train.x.dtype == torch.uint8
    assert data.test.x.shape == (10, 3, 32, 32)
    first = _batch(1, PER_BATCH)[b"data"][3].reshape(3, 32, 32)  # CHW, as the format stores it
    assert torch.equal(data.train.x[3], torch.from_numpy(first))
    last = _batch(5, PER_BATCH)[b"data"][0].reshape(3, 32, 32)  # batches concatenated in order
    assert torch.equal(data.train.x[4 * PER_BATCH], torch.from_numpy(last))
    assert data.train.y[:12].tolist() == [i % 10 for i in range(12)]
    assert data.classes == CIFAR10_CLASSES


def test_canonical_archive_loads_in_each_form(tmp_path):
    archive = _canonical_archive(tmp_path / "cifar-10-python.tar.gz")
    _check_canonical(load_cifar10(archive, tmp_path / "c1"))
    _check_canonical(load_cifar10(tmp_path, tmp_path / "c2"))
    folder = tmp_path / "extracted" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name, data in _canonical_files().items():
        (folder / name).write_bytes(data)
    _check_canonical(load_cifar10(folder.parent, tmp_path / "c3"))
    _check_canonical(load_cifar10(folder, tmp_path / "c4"))


def _tree(root: Path, classes=("cat", "dog"), per_class=3, size=8) -> Path:
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for cls in classes:
            (root / split / cls).mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(
                    root / split / cls / f"{i}.png"
                )
    return root


def test_image_tree_folder_and_archive_load_identically(tmp_path):
    tree = _tree(tmp_path / "tree")
    archive = tmp_path / "tree.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname=".")
    a = load_cifar10(tree, tmp_path / "ca")
    b = load_cifar10(archive, tmp_path / "cb")
    assert a.classes == b.classes == ["cat", "dog"]
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.test.y, b.test.y)
    pixels = np.array(Image.open(tree / "train" / "dog" / "1.png"))
    assert torch.equal(a.train.x[4], torch.from_numpy(pixels).permute(2, 0, 1))
    assert a.train.y.tolist() == [0, 0, 0, 1, 1, 1]


def test_bundled_subset_is_balanced_cifar10(tmp_path):
    data = load_cifar10(None, tmp_path)
    assert data.shape == (3, 32, 32) and data.classes == CIFAR10_CLASSES
    assert torch.bincount(data.train.y).tolist() == [500] * 10
    assert torch.bincount(data.test.y).tolist() == [100] * 10


def test_second_load_comes_from_the_cache(tmp_path, monkeypatch):
    tree = _tree(tmp_path / "tree")
    first = load_cifar10(tree, tmp_path / "cache")
    monkeypatch.setattr(datasets, "_decode", lambda *a: pytest.fail("decoded twice"))
    again = load_cifar10(tree, tmp_path / "cache")
    assert torch.equal(first.train.x, again.train.x)
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(tree / "train" / "cat" / "extra.png")
    with pytest.raises(pytest.fail.Exception):  # a changed source is decoded anew
        load_cifar10(tree, tmp_path / "cache")


def test_balanced_subset_of_class_ordered_labels():
    y = torch.arange(10).repeat_interleave(100)  # ordered by class, like the shared archive
    idx = balanced_subset(y, 95, seed=0)
    counts = torch.bincount(y[idx], minlength=10)
    assert len(idx) == 95 and counts.max() - counts.min() <= 1
    assert len(set(idx.tolist())) == 95
    assert not torch.equal(torch.sort(idx).values, torch.arange(95)), "must not be the first N"
    assert torch.equal(idx, balanced_subset(y, 95, seed=0))
    assert not torch.equal(idx, balanced_subset(y, 95, seed=1))
    assert sorted(balanced_subset(y, 5000, seed=0).tolist()) == list(range(1000))


def test_balanced_subset_fills_from_other_classes_when_one_runs_out():
    y = torch.tensor([0] * 3 + [1] * 50 + [2] * 50)
    counts = torch.bincount(y[balanced_subset(y, 60, seed=0)])
    assert counts.tolist() == [3, 29, 28] or counts.tolist() == [3, 28, 29]


def test_stratified_split():
    y = torch.arange(4).repeat_interleave(50)
    train, val = stratified_split(y, 0.2, seed=0)
    assert set(train.tolist()).isdisjoint(val.tolist()) and len(train) + len(val) == 200
    assert torch.bincount(y[val]).tolist() == [10] * 4


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda t: t / "missing", "does not exist"),
        (lambda t: (t / "empty").mkdir() or t / "empty", "is empty"),
        (lambda t: ((t / "junk").mkdir(), (t / "junk" / "a.txt").write_text("x"))[0] or t / "junk", "neither CIFAR-10"),
    ],
)
def test_bad_data_dirs(tmp_path, make, message):
    with pytest.raises(UsageError, match=message):
        load_cifar10(make(tmp_path), tmp_path / "cache")


def test_truncated_archive(tmp_path):
    (tmp_path / "good").mkdir()
    good = _canonical_archive(tmp_path / "good" / "cifar-10-python.tar.gz")
    bad = tmp_path / "bad" / "cifar-10-python.tar.gz"
    bad.parent.mkdir()
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(UsageError, match="corrupt or truncated"):
        load_cifar10(bad, tmp_path / "cache")


def test_garbage_pickle(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in _canonical_files():
        (folder / name).write_bytes(b"not a pickle at all")
    with pytest.raises(UsageError, match="corrupt"):
        load_cifar10(folder, tmp_path / "cache")


def test_train_and_test_classes_must_match(tmp_path):
    tree = _tree(tmp_path / "tree")
    (tree / "test" / "dog").rename(tree / "test" / "wolf")
    with pytest.raises(UsageError, match="different classes"):
        load_cifar10(tree, tmp_path / "cache")


def test_download_verifies_the_checksum(tmp_path):
    archive = _canonical_archive(tmp_path / "served.tar.gz")
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    dest = tmp_path / "data"
    got = download_cifar10(dest, url=archive.as_uri(), md5=md5)
    assert got == dest / "cifar-10-python.tar.gz" and got.read_bytes() == archive.read_bytes()
    _check_canonical(load_cifar10(dest, tmp_path / "cache"))
    archive.unlink()  # a good file in place is not fetched again
    assert download_cifar10(dest, url=archive.as_uri(), md5=md5) == got

    other = tmp_path / "other"
    served = _canonical_archive(tmp_path / "served2.tar.gz")
    with pytest.raises(UsageError, match="md5"):
        download_cifar10(other, url=served.as_uri(), md5="0" * 32)
    assert list(other.iterdir()) == []


@pytest.mark.parametrize("factory", ["vector_pairs", "one_vector_dataset"])
def test_a_factory_of_vectors_or_one_dataset_trains_on_two_workers(tmp_path, factory):
    """A dataset factory may return vectors (not C,H,W images), and one Dataset that paratrain
    splits; the model factory gets in_features from the samples' shape."""
    import json
    import subprocess
    import sys

    tests = Path(__file__).parent
    run = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "paratrain",
            "train",
            "--workers",
            "2",
            "--model",
            "user_factories:mlp",
            "--dataset",
            f"user_factories:{factory}",
            "--num-classes",
            "2",
            "--epochs",
            "1",
            "--batch-size",
            "16",
            "--run-dir",
            str(run),
            "--quiet",
        ],
        cwd=tests,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = next(e["epoch_samples"] for e in events if e["event"] == "epoch")
    tested = next(e["samples"] for e in events if e["event"] == "eval" and e["split"] == "test")
    # the pair is 128 + 32; the one Dataset of 200 gives 20 % (40) to the test split
    assert (trained, tested) == ((128, 32) if factory == "vector_pairs" else (160, 40))


def test_the_classes_of_a_dataset_that_keeps_targets_are_read_without_loading_its_samples():
    """#57: a factory's dataset without --num-classes had every sample loaded (decoded, for images) to find its
    largest label, in every rank. torchvision's datasets keep them in `targets`: read there, split or not."""
    from user_factories import DecodedImages

    from paratrain.config import TrainConfig
    from paratrain.workloads import load_data

    DecodedImages.loads = 0
    data = load_data(TrainConfig(model="user_factories:mlp", dataset="user_factories:decoded_images"))
    assert data.num_classes == 7
    assert DecodedImages.loads == 1, "only the first sample, for the shape"
