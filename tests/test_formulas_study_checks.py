"""The doctor's sweep checks (doctor/study_checks.py) at their edges, by hand: the batch knee's change to the
global batch, which parameters of a space are read, where a range's edge lies (linear or log space, exactly at
the outer tenth, an empty range) and the next value a list of numbers suggests. Each expected text is worked
out from the check's stated rule (issue #58's mutation run: each case pins behaviour a surviving mutant
changed unseen); the spaces are as space.py's SearchSpace.to_dict writes them. Fast: scripts/mutate.py runs
it for every mutant of the module."""

from __future__ import annotations

from typing import Any

from paratrain.doctor import study_checks
from paratrain.runs.records import Trial


def scored(value: float | None, state: str = "COMPLETE", **params: Any) -> Trial:
    return Trial(number=0, state=state, params=params, value=value)


def edge(parameters: dict[str, Any], **best: Any) -> list[str]:
    """best_at_edge's findings for a random search over `parameters` whose best trial had `best`."""
    space = {"algorithm": "random", "parameters": parameters}
    return [f.finding for f in study_checks.best_at_edge(space, [], scored(0.6, **best), "val_accuracy")]


def remedy(values: list[float], best: float) -> str:
    """The remedy of a grid over a list of numbers whose best value is `best` (at one end)."""
    space = {"algorithm": "grid", "parameters": {"p": {"type": "discrete", "values": values}}}
    [found] = study_checks.best_at_edge(space, [], scored(0.6, p=best), "val_accuracy")
    return found.remedy


def test_the_batch_knee_multiplies_the_global_batch_by_the_knee_over_the_chosen_batch():
    # 200 samples/s at best, the knee 32 (196 >= 190): from 16 the global batch doubles, from 8 it grows 4x
    rates = {8: 100.0, 16: 180.0, 32: 196.0, 64: 200.0}
    trials = [
        Trial(number=i, state="COMPLETE", params={"batch_size": b}, metrics={"samples_per_s": rates[b]})
        for i, b in enumerate(rates)
    ]
    found = study_checks.batch_knee(trials, scored(0.6, batch_size=16))
    assert found.global_batch_factor == 2.0 and found.remedy.startswith("train with --batch-size 32")
    assert study_checks.batch_knee(trials, scored(0.6, batch_size=8)).global_batch_factor == 4.0


def test_every_numeric_parameter_of_the_space_is_read_past_those_not_at_an_edge():
    # a categorical first (its best value no number), a dropout in the middle of its range, then two at an edge
    parameters = {
        "optimizer": {"type": "categorical", "values": ["sgd", "adam"]},
        "dropout": {"type": "float", "scaling": "uniform", "low": 0.0, "high": 0.5},
        "batch_size": {"type": "discrete", "values": [8, 16, 32]},
        "lr": {"type": "float", "scaling": "loguniform", "low": 1e-4, "high": 0.1},
    }
    assert edge(parameters, optimizer="adam", dropout=0.25, batch_size=8, lr=0.09) == [
        "the best trial's batch_size, 8, is at the smallest end of the space",
        "the best trial's lr, 0.09, is at the largest end of the space",
    ]


def test_a_range_is_in_log_space_for_log_scalings_only():
    # uniform: the evidence says no log space
    uniform = {"dropout": {"type": "float", "scaling": "uniform", "low": 0.0, "high": 0.5}}
    space = {"algorithm": "random", "parameters": uniform}
    [found] = study_checks.best_at_edge(space, [], scored(0.6, dropout=0.46), "val_accuracy")
    assert found.evidence == "dropout searched from 0 to 0.5; the best trial's 0.46 is within the highest 10% of it"
    # a uniform range above 0 stays linear: 10 in 1 to 100 is 9/99 = 9 % of it (half of it in log space)
    assert edge({"width": {"type": "float", "scaling": "uniform", "low": 1.0, "high": 100.0}}, width=10.0) == [
        "the best trial's width, 10, is at the smallest end of the space"
    ]
    # a lognormal prior bounded by min and max: in log space, as loguniform
    lognormal = {"lr": {"type": "float", "scaling": "lognormal", "mu": -6.0, "sigma": 1.0, "low": 1e-4, "high": 0.1}}
    space = {"algorithm": "random", "parameters": lognormal}
    [found] = study_checks.best_at_edge(space, [], scored(0.6, lr=1.5e-4), "val_accuracy")
    assert found.evidence.startswith("lr searched from 0.0001 to 0.1 in log space; the best trial's 0.00015 is")
    # 0.005 is 5 % of the linear range but log(50)/log(1000) = 57 % of the decades: no edge
    assert edge(lognormal, lr=0.005) == []
    # a lognormal bounded below at 0 has no log of its bottom: its range is read linearly (0.05 of 0 to 1: 5 %)
    from_zero = {"p": {"type": "float", "scaling": "lognormal", "mu": -3.0, "sigma": 1.0, "low": 0.0, "high": 1.0}}
    assert edge(from_zero, p=0.05) == ["the best trial's p, 0.05, is at the smallest end of the space"]


def test_the_outer_tenth_of_a_range_includes_its_bound_and_an_empty_range_has_no_edge():
    unit = {"p": {"type": "float", "scaling": "uniform", "low": 0.0, "high": 1.0}}
    assert edge(unit, p=0.1) == ["the best trial's p, 0.1, is at the smallest end of the space"]
    assert edge(unit, p=0.9) == ["the best trial's p, 0.9, is at the largest end of the space"]
    assert edge(unit, p=0.11) == [] and edge(unit, p=0.89) == []
    # min = max (space.py allows it): one value, no end to be at
    assert edge({"p": {"type": "float", "scaling": "uniform", "low": 0.1, "high": 0.1}}, p=0.1) == []


def test_the_next_value_of_lists_through_zero_geometric_ones_and_positive_ones_reaching_zero():
    # 0, 1, 2 holds no ratio (a step from 0): by its difference, 3 above and -1 below (it is no positive list)
    assert "(e.g. 3)" in remedy([0, 1, 2], 2)
    assert "(e.g. -1)" in remedy([0, 1, 2], 0)
    # 1, 2, 4 doubles: 8 above
    assert "(e.g. 8)" in remedy([1, 2, 4], 4)
    # 1, 2, 3 steps by 1 down to 0: no positive value, none offered
    assert "e.g." not in remedy([1, 2, 3], 1)
    # five decades a step, whose ratios differ in the last bits of a float (1e5 and 99999.99999999999): geometric
    assert "(e.g. 1e-15)" in remedy([1e-10, 1e-5, 1.0], 1e-10)


def test_the_means_by_value_are_of_completed_trials_and_of_the_first_objective():
    # a failed trial and a pruned one (recorded without a value, sweep/driver.py) are no result of their batch
    trials = [scored(3.5, batch_size=8), scored(3.8, batch_size=16), scored(4.1, batch_size=32)]
    trials += [scored(None, "FAIL", batch_size=32), scored(None, "PRUNED", batch_size=16)]
    space = {"algorithm": "grid", "parameters": {"batch_size": {"type": "discrete", "values": [8, 16, 32]}}}
    [found] = study_checks.best_at_edge(space, trials, trials[0], "val_bits_per_byte")
    assert found.evidence.endswith("val_bits_per_byte by batch_size: 8: 3.500, 16: 3.800, 32: 4.100")
    # a sweep of two objectives records a list per trial: the means are of the first, the metric the doctor names
    trials = [scored([3.5, 900.0], batch_size=8), scored([3.8, 1200.0], batch_size=16)]
    [found] = study_checks.best_at_edge(space, trials, trials[0], "val_bits_per_byte")
    assert found.finding == "the best trial's batch_size, 8, is at the smallest end of the space"
    assert found.evidence.startswith("batch_size searched over 8, 16, 32;")
    assert found.evidence.endswith("val_bits_per_byte by batch_size: 8: 3.500, 16: 3.800"), found.evidence
