"""The doctor's checks of work the model need not do (doctor/wasted_compute.py) on hand-made records: each
prediction worked out by hand in the comment above it, so a changed term or threshold fails it. Fast: scripts/
mutate.py runs it for every mutant of that module."""

import pytest
from test_formulas_causes import LOADER, findings, step
from test_formulas_doctor import probed_run

WARNING = {"category": "UserWarning", "message": "CUDA is not available ... Disabling autocast.", "where": "t.py:61"}


def test_a_disabled_autocast_is_priced_at_the_layers_measured_ratio_or_is_advice(tmp_path):
    # forward 30 + backward 50 ms of a 100 ms step, the layers 1.6x as fast under bfloat16: 80 x (1 - 1/1.6) = 30 ms
    phases = {"forward": 0.03, "backward": 0.05, "optimizer": 0.01, "other": 0.01}
    rank = step(phases, warnings=[WARNING], autocast_penalty=1.6)
    found = findings(probed_run(tmp_path / "fast", [rank] * 2))["autocast_disabled"]
    assert found["saving"] == pytest.approx(0.30)
    assert found["where"] == "t.py:61" and "torch.autocast(device_type=x.device.type" in found["remedy"]
    # bfloat16 no faster here (a CPU without its instructions): named, no gain
    slow = findings(probed_run(tmp_path / "slow", [step(phases, warnings=[WARNING], autocast_penalty=0.9)] * 2))
    assert slow["autocast_disabled"]["saving"] is None and slow["autocast_disabled"]["severity"] == "advice"
    other = {**WARNING, "message": "some other warning"}
    assert "autocast_disabled" not in findings(probed_run(tmp_path / "none", [step(phases, warnings=[other])] * 2))


def test_compile_unused_only_when_no_rank_compiled_anything(tmp_path):
    phases = {"forward": 0.03, "backward": 0.05, "optimizer": 0.01, "other": 0.01}
    calls = ["train.py:85 (main): torch.compile(model)"]
    found = findings(probed_run(tmp_path / "eager", [step(phases, compile_calls=calls)] * 2))["compile_unused"]
    assert found["saving"] is None and found["severity"] == "medium" and found["where"] == "train.py:85 (main)"
    assert "model = torch.compile(model)" in found["remedy"]
    compiled = [step(phases, compile_calls=calls, compiled=True, compiled_frames=3)] * 2
    assert "compile_unused" not in findings(probed_run(tmp_path / "compiled", compiled))


def test_padding_saves_forward_and_backward_in_proportion_to_the_positions_beyond_the_longest(tmp_path):
    # forward 30 + backward 50 ms of 100; 1,000 positions carried, 250 up to each batch's longest: 75 % padding,
    # 80 x 0.75 = 60 ms saved
    phases = {"forward": 0.03, "backward": 0.05, "optimizer": 0.01, "other": 0.01}
    padded = {**LOADER, "padded_positions": 1000, "longest_positions": 250, "collate_fn": "train.py:53 (Collate)"}
    found = findings(probed_run(tmp_path / "padded", [step(phases, loaders=[padded])] * 2))["padding"]
    assert found["saving"] == pytest.approx(0.60)
    assert found["where"] == "train.py:53 (Collate)" and 'padding="longest"' in found["remedy"]
    # 15 % padding: under the 20 % line, nothing said
    little = {**padded, "longest_positions": 850}
    assert "padding" not in findings(probed_run(tmp_path / "little", [step(phases, loaders=[little])] * 2))


def test_the_lines_each_check_draws(tmp_path):
    phases = {"forward": 0.03, "backward": 0.05, "optimizer": 0.01, "other": 0.01}
    # autocast: 80 ms at 1.0667x saves 80 x (1 - 1/1.0667) = 5.0 ms, 5 % of the step: priced; at 1.06x, 4.5 %: advice
    at_line = findings(probed_run(tmp_path / "a", [step(phases, warnings=[WARNING], autocast_penalty=16 / 15)] * 2))
    assert at_line["autocast_disabled"]["saving"] == pytest.approx(0.05)
    under = findings(probed_run(tmp_path / "b", [step(phases, warnings=[WARNING], autocast_penalty=1.06)] * 2))
    assert under["autocast_disabled"]["saving"] is None
    assert "1.06x as fast" in under["autocast_disabled"]["evidence"]
    # not timed (the layers could not run under autocast): named, not priced
    untimed = findings(probed_run(tmp_path / "c", [step(phases, warnings=[WARNING])] * 2))["autocast_disabled"]
    assert untimed["saving"] is None and "not priced" in untimed["predicted_gain"]
    # the penalty is the ranks' median: 1.2, 2.0 and 4.0 give 2.0, so 80 x 1/2 = 40 ms
    three = [step(phases, warnings=[WARNING], autocast_penalty=x) for x in (1.2, 4.0, 2.0)]
    assert findings(probed_run(tmp_path / "d", three))["autocast_disabled"]["saving"] == pytest.approx(0.40)
    # compile: one rank that compiled, or fewer than 2 steps, is no finding
    calls = ["train.py:85 (main): torch.compile(model)"]
    mixed = [step(phases, compile_calls=calls), step(phases, compile_calls=calls, compiled=True)]
    assert "compile_unused" not in findings(probed_run(tmp_path / "e", mixed))
    early = [step(phases, compile_calls=calls, steps=1)] * 2
    assert "compile_unused" not in findings(probed_run(tmp_path / "f", early))
    two = findings(probed_run(tmp_path / "g", [step(phases, compile_calls=calls, steps=2)] * 2))["compile_unused"]
    assert "nothing was compiled in 2 steps" in two["finding"] and "train.py:85 (main)" in two["evidence"]
    # padding: 21 % of the positions is named (80 x 0.21 = 16.8 ms); a step mostly elsewhere saves under 5 %
    line = {**LOADER, "padded_positions": 1000, "longest_positions": 790}
    assert findings(probed_run(tmp_path / "h", [step(phases, loaders=[line])] * 2))["padding"]["saving"] == (
        pytest.approx(0.168)
    )
    # forward 2 + backward 2 ms of a 100 ms step at 75 % padding: 3 ms, under 5 %
    elsewhere = {"forward": 0.002, "backward": 0.002, "other": 0.096}
    padded = {**LOADER, "padded_positions": 1000, "longest_positions": 250}
    assert "padding" not in findings(probed_run(tmp_path / "i", [step(elsewhere, loaders=[padded])] * 2))
    # the positions are summed over the ranks: 1,000 and 3,000 carried, 500 and 500 needed: 1 - 1,000 / 4,000 = 75 %
    # padding, of forward and backward's 80 % of the step
    ranks = [
        step(phases, loaders=[{**LOADER, "padded_positions": 1000, "longest_positions": 500}]),
        step(phases, loaders=[{**LOADER, "padded_positions": 3000, "longest_positions": 500}]),
    ]
    assert findings(probed_run(tmp_path / "j", ranks))["padding"]["saving"] == pytest.approx(0.8 * 0.75)


def test_what_each_finding_accounts_for(tmp_path):
    # autocast at 1.6x: forward 30 ms x (1 - 1/1.6) = 11.25 ms and backward 50 x 0.375 = 18.75 ms accounted for;
    # its share of the step is forward and backward's, 80 %
    phases = {"forward": 0.03, "backward": 0.05, "optimizer": 0.01, "other": 0.01}
    found = findings(probed_run(tmp_path / "a", [step(phases, warnings=[WARNING], autocast_penalty=1.6)] * 2))
    assert found["autocast_disabled"]["explains"] == {
        "forward": pytest.approx(0.01125),
        "backward": pytest.approx(0.01875),
    }
    assert found["autocast_disabled"]["share"] == pytest.approx(0.8)
    # padding at 75 %: forward 22.5 and backward 37.5 ms accounted for, 60 % of the step its share
    padded = {**LOADER, "padded_positions": 1000, "longest_positions": 250}
    found = findings(probed_run(tmp_path / "b", [step(phases, loaders=[padded])] * 2))["padding"]
    assert found["explains"] == {"forward": pytest.approx(0.0225), "backward": pytest.approx(0.0375)}
    assert found["share"] == pytest.approx(0.6)
    # the recompute is the model's work too: forward 20 + backward 30 + recompute 30 ms at 75 % padding = 60 ms
    recomputed = {"forward": 0.02, "backward": 0.03, "recompute": 0.03, "optimizer": 0.01, "other": 0.01}
    found = findings(probed_run(tmp_path / "c", [step(recomputed, loaders=[padded])] * 2))["padding"]
    assert found["saving"] == pytest.approx(0.6)
    # compile: its share is forward, backward and recompute's, 80 %
    calls = ["train.py:85 (main): torch.compile(model)"]
    found = findings(probed_run(tmp_path / "d", [step(recomputed, compile_calls=calls)] * 2))["compile_unused"]
    assert found["share"] == pytest.approx(0.8)


def traced(phases, **trace):
    """A rank's profiled steps: each phase's seconds, as launch/trace_summary.py records them."""
    return {"phases": {p: {"s": s, "what": [], "where": []} for p, s in phases.items()}, "link": [], **trace}


def test_a_parametrization_read_at_every_time_step_saves_all_its_calls_but_one_a_forward(tmp_path):
    # the profiled step 200 ms, of which the parametrization (forward and its backward) 160: 80 %; 32 calls a step
    # of 1 tensor in 1 forward: cached, 1 call of 32, so 80 % x 31/32 = 77.5 % saved
    phases = {"forward": 0.04, "backward": 0.15, "optimizer": 0.01}
    found = {"tensors": 1, "calls": 32.0, "s": 0.16, "module": "RNN_0/ParametrizedLinear_0/ParametrizationList_0"}
    trace = traced({"forward": 0.05, "backward": 0.14, "optimizer": 0.01}, parametrizations=found)
    trace["phases"]["forward"]["where"] = [["rnn.py(51): forward", 0.05]]
    result = findings(probed_run(tmp_path / "loop", [step(phases, trace=trace)] * 2))["parametrization_recomputed"]
    assert result["saving"] == pytest.approx(0.8 * 31 / 32)
    assert result["where"] == "rnn.py(51): forward" and "parametrize.cached()" in result["remedy"]
    # it accounts for its whole share, 160 ms of the 200 ms step, in forward's and backward's shares (40 and 150
    # of the 190 ms of model work): 33.7 and 126.3 ms
    assert result["explains"] == {
        "forward": pytest.approx(0.04 * 0.16 / 0.19),
        "backward": pytest.approx(0.15 * 0.16 / 0.19),
        "recompute": 0.0,
    }
    # 2 tensors, 2 micro-steps a step: 4 calls are needed; 8 calls are 2 a forward, at the line: 80 % x 1/2
    twice = {**found, "tensors": 2, "calls": 8.0}
    two = [step(phases, micro_per_step=2.0, trace={**trace, "parametrizations": twice})] * 2
    assert findings(probed_run(tmp_path / "two", two))["parametrization_recomputed"]["saving"] == pytest.approx(0.4)
    # 7 calls for 4 needed: under 2 a forward, nothing said
    once = [step(phases, micro_per_step=2.0, trace={**trace, "parametrizations": {**twice, "calls": 7.0}})] * 2
    assert "parametrization_recomputed" not in findings(probed_run(tmp_path / "once", once))


def test_distributed_debug_detail_is_priced_as_the_collectives_beyond_what_their_bytes_need(tmp_path):
    # comm 60 ms of a 100 ms step; 10 calls a step moving 2 MB; the link: 8-byte messages at best 0.1 ms, 2 MB in
    # 20.1 ms at best and 4 MB in 40.1 ms (100 MB/s): the bytes need 20 ms + 10 calls x 0.1 ms = 21 ms; saved
    # 60 - 21 = 39 ms, 39 % of the step
    phases = {"forward": 0.02, "backward": 0.02, "comm": 0.06}
    link = [[8.0, 0.0001], [2e6, 0.0201], [4e6, 0.0401], [2e6, 0.05]]
    script = tmp_path / "train.py"
    script.write_text(
        '"""Set TORCH_DISTRIBUTED_DEBUG to find hangs."""\nimport os\n\n'
        'os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"\n'
    )
    rank = step(
        phases,
        debug_environment={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
        inner_calls_per_step=10.0,
        inner_bytes_per_step=2e6,
        trace=traced(phases, link=link),
    )
    found = findings(probed_run(tmp_path / "detail", [rank] * 2, config={"script": str(script)}))
    assert found["debug_environment"]["saving"] == pytest.approx(0.39, abs=1e-3) and found["debug_environment"]["bound"]
    assert found["debug_environment"]["predicted_gain"].startswith("up to 1.64x")
    assert found["debug_environment"]["where"] == f"{script}:4"  # the code's line, not the docstring's
    assert found["debug_environment"]["explains"] == {"comm": pytest.approx(0.039, abs=1e-4)}
    # INFO adds no checks: nothing said; CUDA_LAUNCH_BLOCKING on CPU ranks does nothing: nothing said
    quiet = {**rank, "debug_environment": {"TORCH_DISTRIBUTED_DEBUG": "INFO", "CUDA_LAUNCH_BLOCKING": "1"}}
    assert "debug_environment" not in findings(probed_run(tmp_path / "info", [quiet] * 2))


def test_the_switches_a_gpu_run_cannot_time_are_advice(tmp_path):
    phases = {"forward": 0.02, "backward": 0.02, "comm": 0.01}
    rank = step(phases, debug_environment={"CUDA_LAUNCH_BLOCKING": "1"})
    found = findings(probed_run(tmp_path / "gpu", [rank] * 2, config={"resolved": {"device": "cuda"}}))
    assert found["debug_environment"]["saving"] is None and found["debug_environment"]["severity"] == "high"
    assert "unset CUDA_LAUNCH_BLOCKING" in found["debug_environment"]["remedy"]


def test_unfused_attention_saves_the_operators_on_the_scores_but_their_products(tmp_path):
    # the profiled step 200 ms: forward 60 + backward 100; a softmax over 2x4x512x512 scores takes 24 ms of those
    # 160 (15 %, the line); every operator on the scores but the products 50 ms: 25 % of the step saved
    phases = {"forward": 0.06, "backward": 0.10, "optimizer": 0.04}

    def run(name, softmax, module, ops=0.05):
        scores = {"s": softmax, "ops_s": ops, "products_s": 0.03, "shape": [2, 4, 512, 512], "module": module}
        trace = traced(phases, scores=scores)
        return findings(probed_run(tmp_path / name, [step(phases, trace=trace)] * 2))

    found = run("mha", 0.024, "Net_0/MultiheadAttention_0")["unfused_attention"]
    assert found["saving"] == pytest.approx(0.25) and found["where"] == "Net_0/MultiheadAttention_0"
    assert "need_weights=False" in found["remedy"] and "2x4x512x512" in found["finding"]
    # accounted for: those 50 ms and the products' 30 (attention's own work, which stays), 80 ms of forward and
    # backward's 160, in their shares: 30 and 50 ms
    assert found["explains"]["forward"] == pytest.approx(0.03)
    assert found["explains"]["backward"] == pytest.approx(0.05)
    own = run("own", 0.024, "GPT2Model_0/GPT2Attention_0")["unfused_attention"]
    assert 'attn_implementation="sdpa"' in own["remedy"] and "scaled_dot_product_attention" in own["remedy"]
    assert "unfused_attention" not in run("under", 0.0239, "Net_0/MultiheadAttention_0")  # softmax under 15 %
    assert "unfused_attention" not in run("cheap", 0.024, "Net_0/MultiheadAttention_0", ops=0.0099)  # under 5 %


def test_a_backward_per_loss_of_one_forward_keeps_one_backward_and_its_collectives(tmp_path):
    # 3 backward passes a step for 1 forward: backward 45 ms and collectives 30 ms of a 100 ms step, of which
    # 2/3 go: (45 + 30) x 2/3 = 50 ms, a bound
    phases = {"forward": 0.015, "backward": 0.045, "comm": 0.03, "optimizer": 0.01}
    rank = step(phases, backwards_per_step=3.0, micro_per_step=1.0)
    found = findings(probed_run(tmp_path / "three", [rank] * 2))["repeated_backward"]
    assert found["saving"] == pytest.approx(0.5) and found["bound"] and "up to" in found["predicted_gain"]
    assert found["explains"] == {"backward": pytest.approx(0.03), "comm": pytest.approx(0.02)}
    assert ".backward()" in found["remedy"] and "3 times per forward" in found["finding"]
    # 2 micro-steps of accumulation, 2 backward passes: one each, nothing said; 2 for 1 forward: 1/2 goes
    accumulated = step(phases, backwards_per_step=2.0, micro_per_step=2.0)
    assert "repeated_backward" not in findings(probed_run(tmp_path / "accumulated", [accumulated] * 2))
    twice = findings(probed_run(tmp_path / "twice", [step(phases, backwards_per_step=2.0)] * 2))
    assert twice["repeated_backward"]["saving"] == pytest.approx(0.375)
    # 1.4 backward passes a forward: under 1.5; a run without the count (an older probe): nothing
    assert "repeated_backward" not in findings(probed_run(tmp_path / "few", [step(phases, backwards_per_step=1.4)] * 2))
    assert "repeated_backward" not in findings(probed_run(tmp_path / "old", [step(phases)] * 2))
    # 8 ms of backward and collectives a step, half of it repeated: 4 ms, under 5 %
    small = step({"forward": 0.092, "backward": 0.004, "comm": 0.004}, backwards_per_step=2.0)
    assert "repeated_backward" not in findings(probed_run(tmp_path / "small", [small] * 2))
