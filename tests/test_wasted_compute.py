"""Work the model need not do (doctor/wasted_compute.py): an autocast that disabled itself, a torch.compile whose
result nobody calls, batches padded beyond their longest sample. What the probe records of each, in one process
with its hooks installed (as tests/test_probe_hooks.py); the doctor's predictions from such records are pinned in
tests/test_formulas_wasted_compute.py."""

import json
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from paratrain.launch import probe as probe_module
from paratrain.launch.probe import hooks
from paratrain.launch.probe.facts import padding


def state(probe):
    """The probe's last state, as probe_summary reads it."""
    probe.flush()
    out = {}
    with open(probe.path) as records:
        for r in map(json.loads, records):
            if r["kind"] == "state":
                out.update(r)
    return out


class Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(50, 16), nn.Linear(16, 3)

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


def test_padding_is_the_trailing_columns_every_row_holds_one_value_in():
    ids = torch.zeros(4, 64, dtype=torch.long)
    ids[0, :10], ids[1, :25], ids[2, :3] = 7, 8, 9  # the longest sample: 25 positions
    assert padding(torch, (ids, ids != 0, torch.tensor([0, 1, 2, 0]))) == (4, 64, 25)
    labels = torch.full((4, 64), -100)  # labels padded with the ignore index, in a dict as Hugging Face batches come
    labels[3, :30] = 1
    assert padding(torch, {"input_ids": ids, "labels": labels}) == (4, 64, 30)  # the same shape: the longer need
    full = ids.clone()
    full[2, :] = 5  # a row reaching the end: no padding beyond the longest sample
    assert padding(torch, (full,)) == (4, 64, 64)
    assert padding(torch, (torch.randn(4, 64), torch.zeros(4, 8, dtype=torch.long))) is None  # floats, too narrow


def test_the_probe_counts_each_batchs_positions_against_its_longest_sample(probe):
    lengths = [3, 19, 5, 22, 4, 6, 17, 2]
    samples = [(torch.randint(1, 50, (n,)), i % 3) for i, n in enumerate(lengths)]

    def to_width(width):
        def collate(batch):
            ids = torch.zeros(len(batch), width or max(len(t) for t, _ in batch), dtype=torch.long)
            for row, (tokens, _) in enumerate(batch):
                ids[row, : len(tokens)] = tokens
            return ids, torch.tensor([label for _, label in batch])

        return collate

    model = Tokens()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for width in (64, None):  # padded to a fixed 64, then each batch to its own longest
        for ids, labels in DataLoader(samples, batch_size=4, collate_fn=to_width(width)):
            nn.functional.cross_entropy(model(ids), labels).backward()
            optimizer.step()
    fixed, own = sorted(state(probe)["loaders"], key=lambda loader: -loader["padded_positions"])
    # fixed: 2 batches of 4 rows x 64 = 512 positions; their longest samples 22 and 17: 4 x 22 + 4 x 17 = 156
    assert (fixed["padded_positions"], fixed["longest_positions"]) == (512, 156)
    assert own["padded_positions"] == own["longest_positions"] == 156
    assert fixed["collate_fn"].startswith("tests/test_wasted_compute.py:") and "collate" in fixed["collate_fn"]


def test_a_torch_compile_call_is_noted_with_its_line_and_compiles_nothing_until_called(probe, monkeypatch):
    import torch._dynamo.utils

    # dynamo's records are the process's: other tests' compilations must not count as this model's
    monkeypatch.setattr(torch._dynamo.utils, "compilation_time_metrics", {})
    model = Tokens()
    torch.compile(model)  # the result discarded: the loop trains `model`, eagerly
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(probe_module.CALIBRATION_STEP + 1):
        nn.functional.cross_entropy(model(torch.randint(0, 50, (4, 8))), torch.tensor([0, 1, 2, 0])).backward()
        optimizer.step()
    seen = state(probe)
    [call] = seen["compile_calls"]
    assert call.startswith("tests/test_wasted_compute.py:") and "torch.compile(model)" in call
    assert not seen.get("compiled")


def test_an_autocast_that_disables_itself_is_noted_and_priced_under_bfloat16(probe):
    if torch.cuda.is_available():
        pytest.skip("autocast('cuda') is enabled where CUDA is")
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # pytest's own filters would otherwise decide what is shown
        hooks.script_warnings(probe, torch)  # pytest puts showwarning back around each test phase: hooked here
        for _ in range(probe_module.CALIBRATION_STEP + 1):
            with torch.autocast("cuda", dtype=torch.bfloat16):  # a GPU script's line, on a CPU rank
                out = model(torch.randn(32, 64))
            nn.functional.cross_entropy(out, torch.randint(0, 10, (32,))).backward()
            optimizer.step()
    seen = state(probe)
    assert any(
        "Disabling autocast" in w["message"] and w["where"].startswith("tests/test_wasted_compute.py:")
        for w in seen["warnings"]
    ), seen.get("warnings")
    assert seen["autocast_penalty"] > 0  # the layers timed in float32 and under autocast to bfloat16


def test_debugging_switches_left_in_the_environment_are_noted_with_torchs_own_debug_level(
    probe, fake_world, monkeypatch
):
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")  # read by torch when the process group is made
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
    fake_world(0, 2)
    try:
        model = nn.Linear(8, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
        seen = state(probe)
    finally:
        torch.distributed.set_debug_level(torch.distributed.DebugLevel.OFF)  # torch keeps the level process-wide
    assert seen["debug_environment"] == {"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "NCCL_DEBUG": "INFO"}


@pytest.fixture
def gloo_alone(tmp_path):
    """This process as the one rank of a real gloo group."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_model_compiled_in_place_under_ddp_is_the_models_forward_not_ddps(probe, gloo_alone):
    # model.compile() then DDP(model): the compiled call runs none of the wrapped module's hooks, so the probe
    # cannot tell DDP's own forward work from the model's and must not charge the forward to DDP
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1))
    model.compile()
    ddp = nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for _ in range(probe_module.CALIBRATION_STEP + 3):
        ddp(torch.randn(256, 64)).sum().backward()
        optimizer.step()
    probe.flush()
    with open(probe.path) as records:
        steps = [r for r in map(json.loads, records) if r["kind"] == "step"][2:]
    forward = sum(s["forward"] for s in steps)
    assert forward > 0 and sum(s["ddp_overhead"] for s in steps) < 0.1 * forward, steps
