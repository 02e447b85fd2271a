"""Comet-style sweep config defaults, pinned exactly (issue #25): the budget (maxCombo), the
sampler, the grid, the priors' bounds and the LR rule a sweep derives."""
import math

import pytest

from paratrain.sweep.space import parse_space

P = {"lr": {"type": "float", "min": 0.001, "max": 0.1}, "bs": {"type": "integer", "min": 8, "max": 64},
     "opt": {"type": "categorical", "values": ["sgd", "adam"]}}


def test_defaults_of_a_bare_config():
    space = parse_space({"algorithm": "random", "parameters": P})
    # Comet's budget for random and bayes: 10 x the parameters
    assert space.max_combo == 30 and space.combinations() == 30
    assert (space.metrics, space.directions) == (("loss",), ("minimize",))
    assert (space.repeats, space.seed, space.grid_size, space.retry_limit, space.randomize) == (1, 0, 10, 0, False)
    assert (space.sampler, space.name, space.lr_scaling) == ("random", "sweep", None)


@pytest.mark.parametrize("metric,sampler", [("loss", "tpe"), (["loss", "val_accuracy"], "nsga2")])
def test_bayes_samples_with_tpe_or_with_nsga2_for_several_metrics(metric, sampler):
    space = parse_space({"algorithm": "bayes", "parameters": P, "spec": {"metric": metric}})
    assert space.sampler == sampler and space.max_combo == 30
    assert space.directions == ("minimize",) * len(space.metrics)


def test_an_explicit_max_combo_is_the_budget():
    assert parse_space({"algorithm": "bayes", "parameters": P, "spec": {"maxCombo": 7}}).combinations() == 7
    # trials (repeats of each combination) sit at the top level
    assert parse_space({"algorithm": "random", "parameters": P, "trials": 3}).repeats == 3
    # seed, gridSize and retryLimit in spec
    space = parse_space({"algorithm": "random", "parameters": P, "spec": {"seed": 5, "gridSize": 3, "retryLimit": 2}})
    assert (space.seed, space.grid_size, space.retry_limit) == (5, 3, 2)


def test_a_grid_tries_every_combination_unless_max_combo_caps_it():
    grid = {"a": {"type": "discrete", "values": [1, 2, 3]}, "b": {"type": "categorical", "values": ["x", "y"]}}
    space = parse_space({"algorithm": "grid", "parameters": grid})
    assert space.max_combo == 0 and space.combinations() == 6
    assert space.grid()[:3] == [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "x"}]
    assert parse_space({"algorithm": "grid", "parameters": grid, "spec": {"maxCombo": 4}}).combinations() == 4
    assert parse_space({"algorithm": "grid", "parameters": grid, "spec": {"maxCombo": 40}}).combinations() == 6


def test_grid_values_of_ranges():
    space = parse_space({"algorithm": "grid", "spec": {"gridSize": 5}, "parameters": {
        "x": {"type": "float", "min": 0, "max": 1},
        "n": {"type": "integer", "min": 1, "max": 3},
        "lr": {"type": "float", "min": 0.001, "max": 10, "scalingType": "loguniform"}}})
    x, n, lr = (p.grid(space.grid_size) for p in space.parameters)
    assert x == pytest.approx([0, 0.25, 0.5, 0.75, 1])
    assert n == [1, 2, 3]                  # 1, 1.5, 2, 2.5, 3 rounded (half to even), each once
    assert lr == pytest.approx([0.001, 0.01, 0.1, 1, 10], rel=1e-9)
    assert space.combinations() == 5 * 3 * 5


def test_normal_priors_span_mu_plus_minus_4_sigma():
    space = parse_space({"algorithm": "random", "parameters": {
        "a": {"type": "float", "scalingType": "normal", "mu": 1, "sigma": 0.5},
        "b": {"type": "float", "scalingType": "lognormal", "mu": 0, "sigma": 1},
        "c": {"type": "integer", "scalingType": "lognormal", "mu": 0, "sigma": 0.1}}})
    a, b, c = space.parameters
    assert a.bounds() == (-1, 3)
    assert b.bounds() == pytest.approx((math.exp(-4), math.exp(4)))
    # an integer log range starts at 1 at least: floor(e^-0.4) = 0 -> 1, ceil(e^0.4) = 2
    assert c.bounds() == (1, 2)
    # the grid of a normal prior sits at its quantiles (i + 0.5) / size: the median for one point
    assert a.grid(1) == [1.0]


def test_lr_scaling_derives_the_lr_from_the_batch():
    space = parse_space({"algorithm": "grid", "parameters": {"batch_size": {"type": "discrete", "values": [64, 256]}},
                         "lr_scaling": {"rule": "linear", "base_batch_size": 64, "base_lr": 0.1}})
    assert space.derived({"batch_size": 256}) == {"lr": pytest.approx(0.4)}
    sqrt = parse_space({"algorithm": "grid", "parameters": {"batch_size": {"type": "discrete", "values": [64, 256]}},
                        "lr_scaling": {"rule": "sqrt", "base_batch_size": 64, "base_lr": 0.1}})
    assert sqrt.derived({"batch_size": 256}) == {"lr": pytest.approx(0.2)}
