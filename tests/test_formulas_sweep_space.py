"""Comet-style sweep config defaults, pinned exactly (issue #25): the budget (maxCombo), the
sampler, the grid, the priors' bounds and the LR rule a sweep derives."""

import math

import pytest

from paratrain.sweep.space import parse_space

P = {
    "lr": {"type": "float", "min": 0.001, "max": 0.1},
    "bs": {"type": "integer", "min": 8, "max": 64},
    "opt": {"type": "categorical", "values": ["sgd", "adam"]},
}


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
    space = parse_space(
        {
            "algorithm": "grid",
            "spec": {"gridSize": 5},
            "parameters": {
                "x": {"type": "float", "min": 0, "max": 1},
                "n": {"type": "integer", "min": 1, "max": 3},
                "lr": {"type": "float", "min": 0.001, "max": 10, "scalingType": "loguniform"},
            },
        }
    )
    x, n, lr = (p.grid(space.grid_size) for p in space.parameters)
    assert x == pytest.approx([0, 0.25, 0.5, 0.75, 1])
    assert n == [1, 2, 3]  # 1, 1.5, 2, 2.5, 3 rounded (half to even), each once
    assert lr == pytest.approx([0.001, 0.01, 0.1, 1, 10], rel=1e-9)
    assert space.combinations() == 5 * 3 * 5


def test_normal_priors_span_mu_plus_minus_4_sigma():
    space = parse_space(
        {
            "algorithm": "random",
            "parameters": {
                "a": {"type": "float", "scalingType": "normal", "mu": 1, "sigma": 0.5},
                "b": {"type": "float", "scalingType": "lognormal", "mu": 0, "sigma": 1},
                "c": {"type": "integer", "scalingType": "lognormal", "mu": 0, "sigma": 0.1},
            },
        }
    )
    a, b, c = space.parameters
    assert a.bounds() == (-1, 3)
    assert b.bounds() == pytest.approx((math.exp(-4), math.exp(4)))
    # an integer log range starts at 1 at least: floor(e^-0.4) = 0 -> 1, ceil(e^0.4) = 2
    assert c.bounds() == (1, 2)
    # the grid of a normal prior sits at its quantiles (i + 0.5) / size: the median for one point
    assert a.grid(1) == [1.0]


def test_lr_scaling_derives_the_lr_from_the_batch():
    space = parse_space(
        {
            "algorithm": "grid",
            "parameters": {"batch_size": {"type": "discrete", "values": [64, 256]}},
            "lr_scaling": {"rule": "linear", "base_batch_size": 64, "base_lr": 0.1},
        }
    )
    assert space.derived({"batch_size": 256}) == {"lr": pytest.approx(0.4)}
    sqrt = parse_space(
        {
            "algorithm": "grid",
            "parameters": {"batch_size": {"type": "discrete", "values": [64, 256]}},
            "lr_scaling": {"rule": "sqrt", "base_batch_size": 64, "base_lr": 0.1},
        }
    )
    assert sqrt.derived({"batch_size": 256}) == {"lr": pytest.approx(0.2)}


# -- what the file and the config may say, and what each refusal names (mutation-tested) ----------

import json  # noqa: E402

import numpy as np  # noqa: E402
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution  # noqa: E402

from paratrain.errors import UsageError  # noqa: E402
from paratrain.sweep.space import load_space, read_config_file, strip_json_extras  # noqa: E402

X = {"x": {"type": "integer", "min": 1, "max": 2}}


def refused(raw: dict, message: str, where: str = "sweep config") -> None:
    """parse_space refuses `raw` with one UsageError that starts with `where: ` and says `message`."""
    with pytest.raises(UsageError) as caught:
        parse_space(raw) if where == "sweep config" else parse_space(raw, where)
    assert str(caught.value).startswith(f"{where}: "), str(caught.value)
    assert message in str(caught.value)


def test_yml_is_yaml_too_and_a_yaml_error_names_line_and_column(tmp_path):
    path = tmp_path / "space.yml"
    path.write_text("algorithm: grid\nparameters: {x: {type: integer, min: 1, max: 2}}\n")
    assert parse_space(read_config_file(path)).algorithm == "grid"
    # the flow mapping opened on line 2 is never closed: YAML stops at line 3, column 1 (1-based)
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm: grid\nparameters: {x: 1\n")
    with pytest.raises(UsageError) as caught:
        read_config_file(bad)
    assert str(caught.value).startswith(f"sweep config {bad} line 3, column 1: ")


def test_a_yaml_error_without_a_place_still_names_the_file(tmp_path):
    # a control character is refused by YAML's reader, whose error has no line and column
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm: grid\x07\n")
    with pytest.raises(UsageError) as caught:
        read_config_file(bad)
    assert str(caught.value).startswith(f"sweep config {bad}: unacceptable character #x0007")


def test_a_comma_is_trailing_only_before_a_closing_bracket():
    assert strip_json_extras("[1, 2, ]") == "[1, 2  ]"  # whitespace between the comma and ] too
    assert strip_json_extras("[1,2]") == "[1,2]"
    assert strip_json_extras("[1, X]") == "[1, X]"  # not before anything else, even invalid JSON
    assert strip_json_extras("]") == "]"  # a bracket with no comma before it


def test_escaped_quotes_and_backslashes_inside_strings():
    # an escaped quote does not end the string: the # after it is text
    text = '{"a": "say \\"hi\\" # not a comment, ]"}'
    assert strip_json_extras(text) == text
    # a string ending in an escaped quote: the closing quote after it ends the string, the comment goes
    assert json.loads(strip_json_extras('{"a": "x\\"", # gone\n "b": 1}')) == {"a": 'x"', "b": 1}
    # an escaped backslash escapes nothing after it: the quote ends the string, the comment goes
    assert json.loads(strip_json_extras('{"a": "\\\\", # gone\n "b": 1,}')) == {"a": "\\", "b": 1}


def test_types_and_scalings_are_read_as_their_canonical_names():
    space = parse_space(
        {
            "algorithm": "random",
            "parameters": {
                "d": {"type": "double", "min": 0, "max": 1, "scalingType": "linear"},
                "n": {"type": "discrete", "values": [1, 2]},
                "c": {"type": "categorical", "values": ["a"]},
            },
        }
    )
    d, n, c = space.parameters
    assert (d.type, d.scaling) == ("float", "uniform")
    assert (n.type, n.values, c.type, c.values) == ("discrete", (1, 2), "categorical", ("a",))


@pytest.mark.parametrize(
    "spec,message",
    [
        ({"type": "integer", "min": 1, "max": 2, "step": 1}, "parameter 'x' has unknown key 'step'"),
        ({"type": "discrete", "values": [1, "b"]}, "parameter 'x' is discrete, so its values must be numbers"),
        ({"type": "discrete", "values": [1, True]}, "parameter 'x' is discrete, so its values must be numbers"),
        ({"type": "categorical", "values": "ab"}, "parameter 'x' (categorical) needs a non-empty \"values\" list"),
        ({"type": "categorical", "values": ["a", "a"]}, "parameter 'x' lists a value twice"),
        ({"type": "float", "min": "1", "max": 2}, "parameter 'x': min must be a number (got '1')"),
        ({"type": "float", "min": 1, "max": True}, "parameter 'x': max must be a number (got True)"),
        (
            {"type": "float", "scalingType": "normal", "mu": "0", "sigma": 1},
            "parameter 'x': mu must be a number (got '0')",
        ),
        (
            {"type": "float", "scalingType": "normal", "mu": 0, "sigma": [1]},
            "parameter 'x': sigma must be a number (got [1])",
        ),
        ({"type": "float", "scalingType": "normal", "mu": 0}, 'with scalingType normal needs "mu" and "sigma"'),
        (
            {"type": "float", "scalingType": "lognormal", "sigma": 1},
            'with scalingType lognormal needs "mu" and "sigma"',
        ),
        (
            {"type": "float", "scalingType": "normal", "mu": 0, "sigma": 0},
            "parameter 'x': sigma must be positive (got 0)",
        ),
        (
            {"type": "float", "scalingType": "normal", "mu": 0, "sigma": 1, "min": -1},
            "give both min and max, or neither",
        ),
        ({"type": "float", "min": 1}, 'parameter \'x\' (float) needs "min" and "max"'),
        ({"type": "integer", "max": 1}, 'parameter \'x\' (integer) needs "min" and "max"'),
        (
            {"type": "float", "min": 0, "max": 1, "scalingType": "loguniform"},
            "is loguniform, so min must be > 0 (got 0)",
        ),
        ("float", "parameter 'x' must be an object like"),
    ],
)
def test_bad_parameters_say_what_is_wrong(spec, message):
    refused({"algorithm": "random", "parameters": {"x": spec}}, message)


def test_a_one_value_range_and_a_positive_log_range_are_accepted():
    space = parse_space(
        {
            "algorithm": "grid",
            "parameters": {
                "x": {"type": "integer", "min": 3, "max": 3},
                "lr": {"type": "float", "min": 1e-3, "max": 1, "scalingType": "loguniform"},
            },
        }
    )
    assert space.parameters[0].bounds() == (3, 3) and space.grid()[0] == {"x": 3, "lr": pytest.approx(1e-3)}


@pytest.mark.parametrize(
    "raw,message",
    [
        ({"algorithm": "grid", "parameters": {}}, '"parameters" must be a non-empty object'),
        ({"algorithm": "grid", "parameters": ["x"]}, '"parameters" must be a non-empty object'),
        ({"algorithm": "grid", "parameters": X, "spec": []}, '"spec" must be an object'),
        (
            {"algorithm": "grid", "parameters": X, "spec": {"metric": []}},
            "spec.metric must be a metric name or a list of names (got [])",
        ),
        (
            {"algorithm": "grid", "parameters": X, "spec": {"metric": 5}},
            "spec.metric must be a metric name or a list of names (got 5)",
        ),
        ({"algorithm": "grid", "parameters": X, "spec": {"metric": ["a", ""]}}, "spec.metric must be a metric name"),
        (
            {"algorithm": "grid", "parameters": X, "spec": {"metric": ["a", "b"], "objective": ["minimize"]}},
            "spec.objective lists 1 objective(s) for 2 metric(s)",
        ),
        ({"algorithm": "grid", "parameters": X, "trials": 0}, "trials must be an integer >= 1 (got 0)"),
        ({"algorithm": "grid", "parameters": X, "spec": {"seed": -1}}, "seed must be an integer >= 0 (got -1)"),
        ({"algorithm": "grid", "parameters": X, "spec": {"seed": True}}, "seed must be an integer >= 0 (got True)"),
        (
            {"algorithm": "grid", "parameters": X, "spec": {"gridSize": 2.5}},
            "gridSize must be an integer >= 1 (got 2.5)",
        ),
        (
            {"algorithm": "grid", "parameters": X, "spec": {"maxCombo": "3"}},
            "maxCombo must be an integer >= 0 (got '3')",
        ),
        (
            {"algorithm": "random", "parameters": X, "spec": {"sampler": "tpe"}},
            'spec.sampler chooses the sampler of algorithm "bayes"',
        ),
        (
            {"algorithm": "bayes", "parameters": X, "spec": {"sampler": "cmaes"}},
            "spec.sampler 'cmaes' is not one of tpe, gp, nsga2",
        ),
        ({"algorithm": "grid", "parameters": X, "name": ""}, "name must be a non-empty string"),
    ],
)
def test_bad_specs_say_what_is_wrong(raw, message):
    refused(raw, message)


def test_a_refusal_names_where_the_config_came_from(tmp_path):
    refused(
        {"algorithm": "grid", "parameters": {"x": {"type": "cubic"}}},
        "parameter 'x' has type 'cubic'",
        where="cfg.json",
    )
    path = tmp_path / "space.json"
    path.write_text('{"algorithm": "grid", "parameters": {"x": {"type": "integer", "min": 1, "max": 2}},}')
    raw, space = load_space(path)
    assert [p.name for p in space.parameters] == ["x"] and raw["algorithm"] == "grid"
    path.write_text('{"algorithm": "hyperband", "parameters": {}}')
    with pytest.raises(UsageError, match=f"^sweep config {path}: algorithm 'hyperband'"):
        load_space(path)


def test_bayes_takes_the_sampler_it_is_given_and_the_seed_orders_a_randomized_grid():
    assert parse_space({"algorithm": "bayes", "parameters": X, "spec": {"sampler": "gp"}}).sampler == "gp"
    raw = {
        "algorithm": "grid",
        "parameters": {"x": {"type": "discrete", "values": list(range(8))}},
        "spec": {"randomize": True, "seed": 4},
    }
    # the same seed, the same order on any machine (a resumed grid continues where it was)
    assert parse_space(raw).grid() == parse_space(raw).grid() != [{"x": v} for v in range(8)]


@pytest.mark.parametrize(
    "lr_scaling,message",
    [
        (
            {"rule": "linear", "base_batch_size": 64, "base_lr": 0.1, "warmup": 5},
            "lr_scaling must be an object with keys",
        ),
        ("linear", "lr_scaling must be an object with keys"),
        (
            {"rule": "cubic", "base_batch_size": 64, "base_lr": 0.1},
            "lr_scaling.rule 'cubic' is not one of none, linear, sqrt",
        ),
        ({"rule": "linear", "base_lr": 0.1}, "lr_scaling.base_batch_size must be a positive integer"),
        (
            {"rule": "linear", "base_batch_size": 0, "base_lr": 0.1},
            "lr_scaling.base_batch_size must be a positive integer",
        ),
        (
            {"rule": "linear", "base_batch_size": 32.5, "base_lr": 0.1},
            "lr_scaling.base_batch_size must be a positive integer",
        ),
        ({"rule": "linear", "base_batch_size": 64}, "lr_scaling.base_lr must be a positive number"),
        ({"rule": "linear", "base_batch_size": 64, "base_lr": -0.1}, "lr_scaling.base_lr must be a positive number"),
        ({"rule": "linear", "base_batch_size": 64, "base_lr": "0.1"}, "lr_scaling.base_lr must be a positive number"),
        (
            {"rule": "linear", "base_batch_size": 64, "base_lr": 0.1, "batch_param": "bs"},
            "lr_scaling follows parameter 'bs'",
        ),
        (
            {"rule": "linear", "base_batch_size": 64, "base_lr": 0.1, "lr_param": "batch_size"},
            "lr_scaling derives 'batch_size', so it cannot also be a swept parameter",
        ),
    ],
)
def test_bad_lr_scaling_says_what_is_wrong(lr_scaling, message):
    refused(
        {
            "algorithm": "grid",
            "parameters": {"batch_size": {"type": "discrete", "values": [64]}},
            "lr_scaling": lr_scaling,
        },
        message,
    )


def test_lr_scaling_defaults_its_rule_and_may_name_its_parameters():
    # no rule: linear; a base batch of 1 is a batch
    space = parse_space(
        {
            "algorithm": "grid",
            "parameters": {"batch_size": {"type": "discrete", "values": [4]}},
            "lr_scaling": {"base_batch_size": 1, "base_lr": 0.01},
        }
    )
    assert space.lr_scaling.rule == "linear" and space.derived({"batch_size": 4}) == {"lr": pytest.approx(0.04)}
    space = parse_space(
        {
            "algorithm": "grid",
            "parameters": {"bs": {"type": "discrete", "values": [32, 128]}},
            "lr_scaling": {
                "rule": "none",
                "base_batch_size": 32,
                "base_lr": 0.05,
                "batch_param": "bs",
                "lr_param": "learning_rate",
            },
        }
    )
    # rule none: base_lr at every batch, under the name given
    assert space.derived({"bs": 128}) == {"learning_rate": 0.05}


def test_grid_of_normal_and_lognormal_priors_sits_at_their_quartiles():
    space = parse_space(
        {
            "algorithm": "grid",
            "parameters": {
                "a": {"type": "float", "scalingType": "normal", "mu": 1, "sigma": 0.5},
                "b": {"type": "float", "scalingType": "lognormal", "mu": 0, "sigma": 1},
            },
        }
    )
    a, b = space.parameters
    z = 0.6744897501960817  # the standard normal's 75th percentile
    # two points: the quantiles 0.25 and 0.75
    assert a.grid(2) == pytest.approx([1 - 0.5 * z, 1 + 0.5 * z], rel=1e-12)
    assert b.grid(2) == pytest.approx([math.exp(-z), math.exp(z)], rel=1e-12)


def test_random_draws_of_choices_lognormal_and_integers_follow_their_prior():
    space = parse_space(
        {
            "algorithm": "random",
            "spec": {"seed": 11},
            "parameters": {
                "c": {"type": "categorical", "values": ["a", "b", "c"]},
                "ln": {"type": "float", "scalingType": "lognormal", "mu": 1.0, "sigma": 0.5},
                "i": {"type": "integer", "min": 1, "max": 3},
            },
        }
    )
    draws = [space.draw(k) for k in range(3000)]
    for key, values in (("c", "abc"), ("i", (1, 2, 3))):
        # each choice, and each integer of the range (the top one too, not twice as often), about a third
        shares = [sum(d[key] == v for d in draws) / len(draws) for v in values]
        assert shares == pytest.approx([1 / 3] * 3, abs=0.04), (key, shares)
    logs = [math.log(d["ln"]) for d in draws]
    assert np.median(logs) == pytest.approx(1.0, abs=0.05) and np.std(logs) == pytest.approx(0.5, rel=0.08)


def test_a_grid_records_lists_of_numbers_as_ranges_and_other_algorithms_as_given():
    params = {
        "n": {"type": "discrete", "values": [8, 32, 128]},
        "f": {"type": "discrete", "values": [0.1, 0.01]},
        "c": {"type": "categorical", "values": ["sgd", "adam"]},
        "r": {"type": "float", "min": 0.5, "max": 2},
    }
    grid = parse_space({"algorithm": "grid", "parameters": params}).distributions()
    assert grid == {
        "n": IntDistribution(8, 128),
        "f": FloatDistribution(0.01, 0.1),
        "c": CategoricalDistribution(("sgd", "adam")),
        "r": FloatDistribution(0.5, 2),
    }
    rand = parse_space({"algorithm": "random", "parameters": params}).distributions()
    assert rand["n"] == CategoricalDistribution((8, 32, 128)) and rand["f"] == CategoricalDistribution((0.1, 0.01))


def test_to_dict_is_what_the_sweep_records():
    space = parse_space(
        {
            "algorithm": "bayes",
            "name": "s",
            "trials": 2,
            "parameters": {
                "bs": {"type": "discrete", "values": [8, 16]},
                "lr": {"type": "float", "min": 0.1, "max": 1},
            },
            "spec": {"metric": ["loss", "acc"], "objective": ["minimize", "maximize"], "seed": 3},
            "lr_scaling": None,
        }
    )
    assert space.to_dict() == {
        "algorithm": "bayes",
        "metrics": ["loss", "acc"],
        "directions": ["minimize", "maximize"],
        "max_combo": 20,
        "repeats": 2,
        "seed": 3,
        "grid_size": 10,
        "retry_limit": 0,
        "randomize": False,
        "sampler": "nsga2",
        "name": "s",
        "parameters": {
            "bs": {"type": "discrete", "scaling": "uniform", "values": (8, 16)},
            "lr": {"type": "float", "scaling": "uniform", "low": 0.1, "high": 1},
        },
        "lr_scaling": None,
    }
    scaled = parse_space(
        {
            "algorithm": "grid",
            "parameters": {"batch_size": {"type": "discrete", "values": [8]}},
            "lr_scaling": {"rule": "sqrt", "base_batch_size": 8, "base_lr": 0.1},
        }
    )
    assert scaled.to_dict()["lr_scaling"] == {
        "rule": "sqrt",
        "base_batch_size": 8,
        "base_lr": 0.1,
        "batch_param": "batch_size",
        "lr_param": "lr",
    }
