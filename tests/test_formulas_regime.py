"""Where more devices stop paying at a fixed global batch (plan/regime.py, issue #59), on hand-made rows."""

from paratrain.plan.regime import stops_paying


def row(devices, samples_per_s, strategy="fsdp", exposed=0.0, step=0.1, bubble=None, tp=1, global_batch=64):
    return {
        "devices": devices,
        "samples_per_s": samples_per_s,
        "strategy": strategy,
        "step_time_s": step,
        "time": {"exposed_comm_s": exposed, "compute_s": step - exposed},
        "bubble_fraction": bubble,
        "tp": tp,
        "global_batch": global_batch,
        "data_parallel": devices // tp,
    }


def test_the_first_doubling_that_gains_under_ten_percent_is_named_with_the_gathers_share():
    best = [row(1, 100), row(2, 190), row(4, 350), row(8, 370, exposed=0.05), row(16, 380, exposed=0.07)]
    flat = stops_paying(best)
    assert (flat["devices"], flat["doubled"]) == (4, 8)
    assert abs(flat["gain"] - 370 / 350) < 1e-12 and flat["exposed_share"] == 0.5
    assert flat["sentence"].startswith("beyond 4 devices at this batch more devices stop paying: 8 run 1.06x as fast")
    assert "50% of the step is gathers and reduce-scatters that the compute does not hide" in flat["sentence"]
    assert any("--tp" in r for r in flat["remedies"]) and any("--dp-replicate" in r for r in flat["remedies"])
    assert any("--reshard-after-forward false" in r for r in flat["remedies"])


def test_every_doubling_that_pays_says_nothing_and_counts_between_doublings_are_skipped():
    assert stops_paying([row(1, 100), row(2, 190), row(4, 350), row(8, 700)]) is None
    # 384 -> 512 is no doubling; 384 -> 768 is, and gains 5 %
    best = [row(256, 1000), row(384, 1400), row(512, 1450), row(768, 1470, exposed=0.03)]
    flat = stops_paying(best)
    assert (flat["devices"], flat["doubled"]) == (384, 768)


def test_a_split_layout_is_offered_hsdp_and_resharding_but_not_more_tensor_parallelism():
    best = [row(8, 100, "fsdp+tp", tp=8), row(16, 105, "fsdp+tp", exposed=0.04, tp=8)]
    remedies = stops_paying(best)["remedies"]
    assert not any("--tp" in r for r in remedies) and any("--dp-replicate" in r for r in remedies)


def test_data_parallel_communication_and_a_pipelines_bubble_and_small_batches_are_told_apart():
    ddp = stops_paying([row(2, 100, "ddp"), row(4, 105, "ddp", exposed=0.03)])
    assert "30% of the step is communication that the compute does not hide" in ddp["sentence"]
    assert not any("--tp" in r or "--dp-replicate" in r for r in ddp["remedies"])
    piped = stops_paying([row(2, 100, "pipeline"), row(4, 105, "pipeline", exposed=0.01, bubble=0.5)])
    # the bubble's half of the compute (0.09 s) of a 0.1 s step
    assert "45% of the step is the pipeline's bubble" in piped["sentence"]
    assert any("--microbatches" in r for r in piped["remedies"])
    small = stops_paying([row(2, 100, "ddp"), row(4, 105, "ddp", exposed=0.01)])
    assert "16 samples a replica leave the devices little work" in small["sentence"]
