"""What a rank holds and saves (engine/memory.py), the figures of summary.json's `memory` block,
against hand-counted bytes on small models in this process."""

from __future__ import annotations

import resource

import pytest
import torch
from torch import nn

from paratrain.engine.memory import (
    MEMORY_FIELDS,
    MemoryMeter,
    SavedTensorPeak,
    held_bytes,
    is_out_of_memory,
    per_rank,
    storage_bytes,
)


def trained_linear(optimizer: type[torch.optim.Optimizer], **options) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(10, 5)  # 50 weights + 5 biases: 55 floats, 220 bytes
    opt = optimizer(model.parameters(), **options)
    model(torch.randn(3, 10)).sum().backward()
    opt.step()
    return model, opt


def test_held_bytes_count_parameters_gradients_and_each_optimizers_state():
    # Adam: two moments of 220 bytes, and a float32 step count per parameter tensor (2 x 4 bytes).
    model, adam = trained_linear(torch.optim.Adam)
    assert held_bytes(model, adam) == {"parameters_bytes": 220, "gradients_bytes": 220, "optimizer_bytes": 448}
    # SGD with momentum: one buffer; without: no state at all.
    model, sgd = trained_linear(torch.optim.SGD, lr=0.1, momentum=0.9)
    assert held_bytes(model, sgd)["optimizer_bytes"] == 220
    model, plain = trained_linear(torch.optim.SGD, lr=0.1)
    assert held_bytes(model, plain)["optimizer_bytes"] == 0
    # Gradients set to None after the step are not held.
    model.zero_grad(set_to_none=True)
    assert held_bytes(model, plain)["gradients_bytes"] == 0


def test_storage_bytes_counts_each_storage_once_and_skips_the_meta_device():
    whole = torch.zeros(100)  # 400 bytes
    other = torch.zeros(25, dtype=torch.float64)  # 200 bytes
    assert storage_bytes([whole, whole[:10], whole.view(10, 10), other]) == 600
    assert storage_bytes([whole[50:]]) == 400  # a view holds its whole storage
    assert storage_bytes([torch.zeros(1000, device="meta"), other]) == 200
    assert storage_bytes([]) == 0


def test_the_saved_tensor_peak_counts_activations_once_and_not_parameters():
    # sin saves its input x, exp its output: 2 x 1000 floats = 8000 bytes live at the end of forward;
    # backward frees both.
    x = torch.randn(1000, requires_grad=True)
    meter = SavedTensorPeak()
    with meter.watch():
        loss = torch.exp(torch.sin(x)).sum()
    assert (meter.peak, meter.live) == (8000, 8000)
    loss.backward()
    del loss
    assert (meter.peak, meter.live) == (8000, 0)
    # x * x saves x twice: one storage. A Linear saves its input, not its weight (a parameter).
    meter = SavedTensorPeak()
    with meter.watch():
        squares = x * x
    assert meter.peak == 4000
    del squares
    meter = SavedTensorPeak()
    with meter.watch():
        nn.Linear(100, 10)(torch.randn(8, 100))
    assert meter.peak == 8 * 100 * 4
    # Outside watch() nothing is counted.
    torch.sin(x).sum()
    assert meter.peak == 3200


def test_the_saved_tensor_peak_leaves_backward_unchanged_and_skips_parameters():
    torch.manual_seed(0)
    layer, inputs = nn.Linear(20, 4), torch.randn(6, 20, requires_grad=True)
    layer(inputs).square().sum().backward()
    expected = (inputs.grad.clone(), layer.weight.grad.clone())
    inputs.grad = layer.weight.grad = layer.bias.grad = None
    meter = SavedTensorPeak()
    with meter.watch():  # the weight is saved for the inputs' gradient: given back as it is
        layer(inputs).square().sum().backward()
    torch.testing.assert_close((inputs.grad, layer.weight.grad), expected)
    only_parameters = SavedTensorPeak()
    with only_parameters.watch():
        torch.sin(layer.weight)
    assert only_parameters.peak == 0


def test_a_storage_saved_by_two_nodes_stays_live_until_both_are_freed():
    # x * x saves x twice (one node), sin(x) once more (another): backward through the product alone
    # frees two of the three holders, and x's 4000 bytes stay live for sin's.
    x = torch.randn(1000, requires_grad=True)
    meter = SavedTensorPeak()
    with meter.watch():
        product, sine = x * x, torch.sin(x)
    product.sum().backward()
    del product
    assert meter.live == 4000
    del sine
    assert meter.live == 0


def test_the_optimizer_state_of_zero_is_its_local_optimizers(tmp_path):
    """ZeroRedundancyOptimizer keeps this rank's partition in `.optim`: on a 1-rank gloo group, all of it."""
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = nn.Linear(10, 5)
        zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam)
        model(torch.randn(3, 10)).sum().backward()
        zero.step()
        assert held_bytes(model, zero)["optimizer_bytes"] == 448
    finally:
        dist.destroy_process_group()


def test_the_meter_measures_the_second_optimizer_step_or_the_only_one():
    assert MemoryMeter(first_step=0, last_step=10).step == 1
    assert MemoryMeter(first_step=5, last_step=7).step == 6  # a resumed run: its own second step
    assert MemoryMeter(first_step=5, last_step=6).step == 5  # one step: that one
    # #57: 2 steps an epoch whose second is partial (5,000 samples at batch 4,096: 4,096 then 904): never
    # the partial one while a full one follows (find-batch's activations fell from 361 to 159 MiB as the batch doubled)
    assert MemoryMeter(first_step=0, last_step=10, steps_per_epoch=2, epochs_end_full=False).step == 2
    assert MemoryMeter(first_step=0, last_step=10, steps_per_epoch=2, epochs_end_full=True).step == 1
    assert MemoryMeter(first_step=0, last_step=10, steps_per_epoch=5, epochs_end_full=False).step == 1
    assert MemoryMeter(first_step=0, last_step=2, steps_per_epoch=2, epochs_end_full=False).step == 0  # no full one
    meter = MemoryMeter(first_step=0, last_step=10)
    assert meter.figures()["parameters_bytes"] is None and meter.figures()["activations_peak_bytes"] is None
    model = nn.Linear(100, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        with meter.watch(step):
            model(torch.randn(8 * (step + 1), 100)).sum().backward()  # 3200, 6400, 9600 bytes of input
        opt.step()
        if step == 2:
            opt.zero_grad(set_to_none=True)  # a count at this step would see no gradients
        meter.count(step, model, opt)
        opt.zero_grad()
    figures = meter.figures()
    assert list(figures) == list(MEMORY_FIELDS)
    assert figures["activations_peak_bytes"] == 6400  # step 1's forward only
    assert figures["parameters_bytes"] == figures["gradients_bytes"] == figures["optimizer_bytes"] == 4040
    assert figures["rss_peak_bytes"] > 50 * 2**20


def test_per_rank_lists_each_figure_in_rank_order():
    ranks = [dict.fromkeys(MEMORY_FIELDS, 1), {**dict.fromkeys(MEMORY_FIELDS, 2), "optimizer_bytes": None}]
    assert per_rank(ranks) == {
        "parameters_bytes": [1, 2],
        "gradients_bytes": [1, 2],
        "optimizer_bytes": [1, None],
        "activations_peak_bytes": [1, 2],
        "rss_peak_bytes": [1, 2],
    }


@pytest.mark.parametrize(
    "error, out_of_memory",
    [
        (MemoryError(), True),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4 GB"), True),
        (RuntimeError("shape mismatch"), False),
        (ValueError("can't allocate memory"), False),
    ],
)
def test_an_allocation_that_failed_is_told_from_other_errors(error, out_of_memory):
    assert is_out_of_memory(error) is out_of_memory


def test_what_checkpointing_by_operator_keeps_is_counted_until_the_watch_ends():
    """--checkpoint-activations-ops keeps op outputs outside autograd's graph, where saved-tensor hooks do not see
    them: the meter counts what the policy keeps. Three blocks of Linear, attention, Linear (no biases) on 4 x 8
    floats: each keeps its first product (128 bytes) and the fused attention's output and log-sum-exp (128 + 16
    bytes), a pair, and recomputes its second product; so the peak is 3 x 272 bytes above whole-block
    checkpointing's, and nothing stays counted after the watch."""
    from paratrain.workloads.models import SELECTIVE_OBSERVERS, checkpoint_blocks

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q = self.first(x).view(1, 1, 4, 8)
            return self.second(nn.functional.scaled_dot_product_attention(q, q, q).view(4, 8))

    def peak(by_operator: bool) -> tuple[int, int]:
        torch.manual_seed(0)
        model = nn.Sequential(Block(), Block(), Block())
        checkpoint_blocks(model, by_operator=by_operator)
        meter = SavedTensorPeak()
        with meter.watch():
            model(torch.randn(4, 8)).sum().backward()
        return meter.peak, meter.live

    (whole, whole_left), (by_operator, left) = peak(False), peak(True)
    assert by_operator - whole == 3 * (4 * 8 * 4 + 4 * 8 * 4 + 4 * 4)
    assert whole_left == left == 0 and SELECTIVE_OBSERVERS == []


def test_the_cpu_peak_counts_what_the_process_allocates_and_not_the_files_it_maps(tmp_path):
    """A rank's peak on the CPU leaves out the pages it maps from files (the libraries' code, which the page cache
    decides): mapping and reading 96 MiB of a file moves it by little; filling a 64 MiB tensor moves it by 64."""
    import mmap

    from paratrain.engine.memory import peak_memory_bytes, reset_peak_memory

    cpu = torch.device("cpu")
    data = tmp_path / "weights.bin"
    data.write_bytes(b"\1" * (96 * 2**20))
    reset_peak_memory(cpu)
    before = peak_memory_bytes(cpu)
    with data.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert sum(mapped[i] for i in range(0, len(mapped), 4096)) == len(mapped) // 4096  # every page resident
        mapped_file = peak_memory_bytes(cpu)
        filled = torch.ones(16 * 2**20)  # 64 MiB
        allocated = peak_memory_bytes(cpu)
        del filled
    assert mapped_file - before < 8 * 2**20
    assert allocated - mapped_file == pytest.approx(64 * 2**20, rel=0.1)
    assert allocated % 1024 == 0  # /proc reports KiB
    # a new run starts its peak from what is resident now: the freed 64 MiB no longer count
    reset_peak_memory(cpu)
    assert peak_memory_bytes(cpu) < allocated - 32 * 2**20


def test_a_gpu_rank_reads_and_resets_its_own_devices_allocator_and_the_host_peak_too(monkeypatch, tmp_path):
    """On a GPU the peak is torch.cuda's counter of that device (stand-ins for the CUDA calls, which
    cannot run here); the host's peak is reset as well, since summary.json reports it on GPU ranks."""
    from paratrain.engine import memory

    calls: list[tuple] = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *d: calls.append(("reset", *d)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *d: calls.append(("peak", *d)) or 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *d: calls.append(("empty", *d)))
    clear_refs = tmp_path / "clear_refs"
    monkeypatch.setattr(memory, "_CLEAR_REFS", clear_refs)
    gpu = torch.device("cuda", 1)
    memory.reset_peak_memory(gpu)
    assert clear_refs.read_text() == "5"
    assert memory.peak_memory_bytes(gpu) == 3 * 2**30
    memory.release_cached_memory(gpu)
    assert calls == [("reset", gpu), ("peak", gpu), ("empty",)]
    # a CPU rank touches none of them
    calls.clear()
    cpu = torch.device("cpu")
    memory.reset_peak_memory(cpu)
    memory.peak_memory_bytes(cpu)
    memory.release_cached_memory(cpu)
    assert calls == []


def test_the_host_peak_is_vmhwm_less_the_file_pages_and_ru_maxrss_where_there_is_no_proc(monkeypatch, tmp_path):
    """Exact figures from a written /proc/self/status; without RssFile the whole VmHWM; without /proc
    (not Linux) getrusage's peak, which Linux reports in KiB; a /proc that refuses the reset is no error."""
    from paratrain.engine import memory

    status = tmp_path / "status"
    monkeypatch.setattr(memory, "_STATUS", status)
    status.write_text("Name:\tpython\nVmHWM:\t  900000 kB\nVmRSS:\t  700000 kB\nRssFile:\t   81000 kB\n")
    assert memory.peak_rss_bytes() == (900000 - 81000) * 1024
    status.write_text("Name:\tpython\nVmHWM:\t  900000 kB\nVmRSS:\t  700000 kB\n")
    assert memory.peak_rss_bytes() == 900000 * 1024
    status.unlink()
    assert memory.peak_rss_bytes() == resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert memory.peak_memory_bytes(torch.device("cpu")) == memory.peak_rss_bytes()
    monkeypatch.setattr(memory, "_CLEAR_REFS", tmp_path / "no-such-dir" / "clear_refs")
    memory.reset_peak_memory(torch.device("cpu"))  # no /proc to reset: the peak covers the process's life


def test_a_tensor_a_subclass_wraps_is_counted_by_the_storage_it_wraps():
    """Functional collectives hand back an AsyncCollectiveTensor (a DTensor's shard can be one, as tensor
    parallelism's input to a pipeline stage is): its own storage cannot be read, the tensor it wraps is counted,
    once however many times it is saved."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    inner = torch.ones(4, 8)  # 128 bytes
    wrapped = AsyncCollectiveTensor(inner)
    with pytest.raises(RuntimeError):
        wrapped.untyped_storage().data_ptr()
    assert storage_bytes([wrapped, inner]) == 128
    meter = SavedTensorPeak()
    kept = [meter._pack(wrapped), meter._pack(inner)]
    assert meter.live == meter.peak == 128
    del kept
    assert meter.live == 0 and meter.peak == 128
