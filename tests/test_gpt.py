"""The `gpt` workloads: the transformer, byte-level text, workload-owned losses, tokens/s, FLOPs and MFU."""

import json
import math
import os

import pytest
import torch

import paratrain
from paratrain.cli import main
from paratrain.engine import flops
from paratrain.runs import RunDir
from paratrain.workloads import gpt, text
from paratrain.workloads.models import residual_blocks
from paratrain.workloads.objective import Objective, _unpack


def tiny(tmp_path, **overrides):
    """gpt-tiny on short windows of the default corpus (Python's own sources): quick on one core."""
    cfg = dict(
        workload="gpt-tiny",
        seq_len=64,
        samples_per_epoch=256,
        eval_samples=64,
        batch_size=16,
        epochs=1,
        threads_per_worker=1,
        quiet=True,
        run_dir=tmp_path / "run",
        log_every=4,
    )
    cfg.update(overrides)
    return cfg


def _unigram_bits(tokens: torch.Tensor) -> float:
    p = torch.bincount(tokens.long(), minlength=256).double()
    p = p[p > 0] / p.sum()
    return float(-(p * p.log2()).sum())


@pytest.fixture
def known_cpu_peak():
    """A known CPU peak (1e11 FLOP/s for one fp32 thread) where the ranks look for the measured one,
    removed afterwards so no other test sees it."""
    path = text.default_cache_dir() / flops.CPU_PEAK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    key = f"{flops.cpu_model()}|threads=1|32|torch {torch.__version__}"
    path.write_text(json.dumps({key: {"value": 1.0e11, "source": "seeded by the test"}}))
    yield 1.0e11
    path.unlink(missing_ok=True)


def test_gpt_tiny_learns_and_reports_tokens_bits_flops_and_mfu(tmp_path, known_cpu_peak):
    """After 200 AdamW steps gpt-tiny predicts held-out Python source far better than its byte
    frequencies do: its bits per byte lie well below the held-out text's unigram entropy (4.42 bits
    for CPython 3.11). The MFU is the run's own FLOPs x samples/s over a peak seeded with a known value."""
    summary = paratrain.train(tiny(tmp_path, samples_per_epoch=3200, optimizer="adamw", lr=1e-3))
    _, held_out, _, info = text.load_corpus(None)
    entropy = _unigram_bits(held_out)
    assert summary["val_bits_per_byte"] == pytest.approx(summary["val_loss"] / math.log(2))
    assert summary["val_bits_per_byte"] < entropy - 0.5, (summary["val_bits_per_byte"], entropy)
    assert 0.2 < summary["val_accuracy"] < 1, "next-byte accuracy"

    assert summary["seq_len"] == 64
    assert summary["tokens_per_s"] == pytest.approx(summary["samples_per_s"] * 64)
    model = gpt.GPT(gpt.PRESETS["gpt-tiny"])
    assert summary["flops_per_sample"] == pytest.approx(model.flops_per_token(64) * 64, rel=0.1)
    peak = known_cpu_peak
    assert summary["mfu_peak"] == {
        "flops_per_s": peak,
        "per_device": peak,
        "devices": 1,
        "source": "seeded by the test",
    }
    assert summary["mfu"] == pytest.approx(summary["flops_per_sample"] * summary["samples_per_s"] / peak)

    data = RunDir(tmp_path / "run").read_config()["resolved"]["data"]
    assert data["python"] == info["python"] and data["sha256"] == info["sha256"] and "PSF" in data["licence"]


def _params(run_dir):
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]


def test_data_parallel_gpt_equals_one_process_with_the_global_batch(tmp_path):
    """2 ranks x 8 windows == 1 process x 16 windows, step for step (the windows are dealt to the
    ranks like DistributedSampler's samples). Tolerance as the CNN's: float32 summation order only."""
    common = dict(
        seq_len=32,
        samples_per_epoch=64,
        optimizer="sgd",
        lr=0.1,
        lr_scaling="linear",
        base_batch_size=16,
        checkpoint_every=1,
    )
    one = paratrain.train(tiny(tmp_path, run_dir=tmp_path / "one", workers=1, batch_size=16, **common))
    two = paratrain.train(tiny(tmp_path, run_dir=tmp_path / "two", workers=2, batch_size=8, **common))
    assert one["steps"] == two["steps"] == 4
    a, b = _params(tmp_path / "one"), _params(tmp_path / "two")
    torch.manual_seed(0)
    init = gpt.GPT(gpt.PRESETS["gpt-tiny"]).state_dict()
    assert max((a[k] - init[k]).abs().max().item() for k in a) > 1e-3, "training did not move the parameters"
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-6)
    assert two["mfu_peak"]["devices"] == 2 and two["tokens_per_s"] == pytest.approx(two["samples_per_s"] * 32)


@pytest.mark.parametrize("preset, seq_len", [("gpt-tiny", 256), ("gpt-small", 256), ("gpt-medium", 1024)])
def test_flop_counter_agrees_with_the_analytic_estimate(preset, seq_len):
    """FlopCounterMode over forward + loss + backward of one sample vs nanoGPT's / PaLM's
    6N + 12·L·H·Q·T per token (N: parameters without the position embeddings)."""
    with torch.device("meta"):  # shapes only: counting gpt-medium costs nothing
        model = gpt.GPT(gpt.PRESETS[preset])
    x = torch.zeros(1, seq_len, dtype=torch.long)
    counted = flops.count_flops_per_sample(model, Objective(), x, x)
    analytic = model.flops_per_token(seq_len) * seq_len
    assert counted == pytest.approx(analytic, rel=0.1), counted / analytic


def test_mfu_arithmetic_and_device_peaks(tmp_path, monkeypatch):
    assert flops.mfu(1e9, 100.0, 1e12, 2) == pytest.approx(0.05)
    assert flops.mfu(None, 100.0, 1e12, 2) is None and flops.mfu(1e9, 100.0, None, 2) is None
    peak, source = flops.gpu_peak("NVIDIA A100-SXM4-80GB", "bf16")
    assert peak == 312e12 and "A100" in source
    assert flops.gpu_peak("NVIDIA H100 PCIe", "32")[0] == 51e12
    assert flops.gpu_peak("NVIDIA H100 80GB HBM3", "bf16")[0] == pytest.approx(989.4e12)
    assert flops.gpu_peak("Tesla V100-SXM2-16GB", "fp16")[0] == 125e12
    assert flops.gpu_peak("Tesla V100-SXM2-16GB", "bf16") is None, "Volta has no bf16 units"
    assert flops.gpu_peak("NVIDIA A10G", "bf16") is None and flops.gpu_peak("NVIDIA A10", "bf16")[0] == 125e12
    assert flops.gpu_peak("NVIDIA GeForce RTX 4090", "bf16")[0] == pytest.approx(165.2e12)
    assert flops.gpu_peak("Some Future GPU", "bf16") is None

    measured, how = flops.cpu_peak("32", tmp_path, size=128, seconds=0.05)
    assert measured > 1e8 and "measured" in how and "128x128" in how
    for module, name in ((flops.torch, "mm"), (flops.F, "linear")):
        monkeypatch.setattr(module, name, lambda *a: pytest.fail("the cached peak must be reused, not re-measured"))
    assert flops.cpu_peak("32", tmp_path, size=128) == (measured, how)


def test_user_model_that_returns_its_own_loss_trains(tmp_path):
    summary = paratrain.train(
        tiny(tmp_path, model="user_factories:bigram_lm", samples_per_epoch=2048, optimizer="adamw", lr=0.1)
    )
    _, held_out, _, _ = text.load_corpus(None)
    assert summary["status"] == "completed"
    assert summary["val_loss"] < _unigram_bits(held_out) * math.log(2), "byte pairs predict better than byte counts"
    assert summary["val_accuracy"] > 0.1, "accuracy comes from the logits the model returned"
    assert "val_bits_per_byte" not in summary, "a user's own loss is not assumed to be in nats"


def test_loss_function_from_the_command_line_is_the_loss_trained_on(tmp_path):
    common = dict(samples_per_epoch=16, log_every=1, optimizer="sgd", lr=0.01)
    paratrain.train(tiny(tmp_path, run_dir=tmp_path / "builtin", **common))
    paratrain.train(tiny(tmp_path, run_dir=tmp_path / "doubled", loss="user_factories:doubled_cross_entropy", **common))
    first = [
        next(e["loss"] for e in RunDir(tmp_path / name).read_metrics() if e["event"] == "step")
        for name in ("builtin", "doubled")
    ]
    assert first[1] == pytest.approx(2 * first[0], rel=1e-5)


def test_blocks_are_exposed_for_sharding_pipelining_and_checkpointing():
    from paratrain.workloads.models import checkpoint_blocks

    torch.manual_seed(0)
    model = gpt.GPT(gpt.resolve("gpt-tiny", n_layer=3, n_embd=64))
    assert isinstance(model.blocks, torch.nn.ModuleList) and len(model.blocks) == 3
    assert residual_blocks(model) == list(model.blocks)
    assert model.head.lm_head.weight is model.embed.wte.weight, "input and output embeddings are tied"
    x = torch.randint(0, 256, (2, 16))
    # the three parts compose to the whole model: what a pipeline split relies on
    h = model.embed(x)
    for block in model.blocks:
        h = block(h)
    torch.testing.assert_close(model.head(h), model(x))

    reference = _grads(model, x)
    checkpoint_blocks(model)
    assert sum(type(m).__name__ == "CheckpointWrapper" for m in model.modules()) == 3, "one wrapper per block"
    for a, b in zip(reference, _grads(model, x)):
        torch.testing.assert_close(a, b)


def _grads(model, x):
    model.zero_grad()
    Objective()(model, x, x)[0].backward()
    return [p.grad.clone() for p in model.parameters()]


def test_model_outputs_carrying_the_loss_are_understood():
    logits, loss = torch.randn(2, 3), torch.tensor(1.5)
    assert _unpack(loss) == (loss, None)
    assert _unpack((logits, loss)) == (loss, logits)
    assert _unpack({"loss": loss, "logits": logits}) == (loss, logits)


def test_text_is_split_by_whole_documents(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(20):
        (folder / f"doc{i:02d}.txt").write_text(f"document number {i} " * 50)
    (folder / "image.bin").write_bytes(bytes(range(256)))  # not text: skipped
    train, held_out, lengths, info = text.load_corpus(folder, tmp_path / "cache")
    assert info["documents"] == 20 and len(lengths) == 18
    held = held_out.numpy().tobytes().decode()
    held_ids = {int(part.split()[0]) for part in held.split("document number ")[1:]}
    assert len(held_ids) == 2
    train_text = train.numpy().tobytes().decode()
    assert all(f"number {i} " not in train_text for i in held_ids), "a held-out document leaked into training"
    again = text.load_corpus(folder, tmp_path / "cache")
    assert torch.equal(again[1], held_out), "the split is fixed, not drawn per run"


@pytest.fixture
def corpora(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "binary").mkdir()
    (tmp_path / "binary" / "blob.bin").write_bytes(os.urandom(4096) + b"\0")
    (tmp_path / "short.txt").write_text("print('hi')\n")
    return tmp_path


BAD = {
    "seq-len above the context": (["--seq-len", "512"], "exceeds gpt-tiny's context of 256"),
    "width not divisible by heads": (
        ["--n-embd", "100", "--n-head", "3"],
        "--n-embd 100 is not divisible by --n-head 3",
    ),
    "empty text file": (["--data-dir", "{tmp}/empty.txt"], "is empty"),
    "folder without text": (["--data-dir", "{tmp}/binary"], "holds no UTF-8 text"),
    "text shorter than a window": (["--data-dir", "{tmp}/short.txt"], "--seq-len"),
    "loss not importable": (["--loss", "no_such_pkg.losses:ce"], "--loss"),
    "loss not a scalar": (["--loss", "user_factories:per_token_cross_entropy"], "not a scalar"),
    "gpt flags on a CNN": (["--workload", "cifar10-cnn", "--n-layer", "2"], "--n-layer"),
    "seq-len on images": (["--workload", "synthetic-cnn", "--seq-len", "64"], "--seq-len"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_text_and_loss_input_is_one_line_exit_2_and_writes_nothing(corpora, capsys, case):
    args, expected = BAD[case]
    run_dir = corpora / "run"
    try:
        code = main(
            [
                "train",
                "--workload",
                "gpt-tiny",
                "--run-dir",
                str(run_dir),
                "--quiet",
                *[a.format(tmp=corpora) for a in args],
            ]
        )
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert expected in err and "Traceback" not in err
    assert not run_dir.exists()
