"""The sweep's search space (Comet format -> Optuna), the stdout protocol and the device plan."""

import itertools
import math

import numpy as np
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from paratrain.errors import UsageError
from paratrain.sweep.space import parse_space, read_config_file, strip_json_extras
from paratrain.sweep.trial import param_arguments, parse_stdout_metrics, plan_slots

# Verbatim from the issue (and the articles users copy it from): comments and trailing commas.
COMMENTED = (
    '{ # We pick the Bayes algorithm:\n "algorithm": "random", "parameters": {"batch_size": {"type": "discrete", '
    '"values": [8, 32, 128, 512]},}, "spec": {"metric": "val_loss", "objective": "minimize",},}'
)


def test_the_commented_config_parses(tmp_path):
    path = tmp_path / "optim.config"
    path.write_text(COMMENTED)
    space = parse_space(read_config_file(path))
    assert space.algorithm == "random"
    assert space.metrics == ("val_loss",) and space.directions == ("minimize",)
    assert space.parameters[0].distribution() == CategoricalDistribution((8, 32, 128, 512))
    assert space.max_combo == 10  # Comet's default budget: 10 x the number of parameters


def test_comments_and_commas_inside_strings_are_kept():
    text = '{"a": "x # not a comment, ]", # a comment, with a comma\n "b": [1, 2,],}'
    assert strip_json_extras(text).count("\n") == 1
    import json

    assert json.loads(strip_json_extras(text)) == {"a": "x # not a comment, ]", "b": [1, 2]}


def test_yaml_config(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(
        "algorithm: grid\nparameters:\n  lr: {type: float, min: 0.001, max: 0.1, scalingType: loguniform}\n"
        "spec: {metric: val_accuracy, objective: maximize, gridSize: 3}\n"
    )
    space = parse_space(read_config_file(path))
    assert [round(v, 6) for v in space.grid()[0].values()] == [0.001]
    assert [round(c["lr"], 6) for c in space.grid()] == [0.001, 0.01, 0.1]


@pytest.mark.parametrize(
    "spec, expected",
    [
        ({"type": "integer", "min": 1, "max": 5}, IntDistribution(1, 5)),
        ({"type": "integer", "min": 1, "max": 1024, "scalingType": "loguniform"}, IntDistribution(1, 1024, log=True)),
        ({"type": "float", "min": 0.0, "max": 1.0}, FloatDistribution(0.0, 1.0)),
        ({"type": "double", "min": 0.0, "max": 1.0, "scalingType": "linear"}, FloatDistribution(0.0, 1.0)),
        (
            {"type": "float", "min": 1e-4, "max": 1e-1, "scalingType": "loguniform"},
            FloatDistribution(1e-4, 1e-1, log=True),
        ),
        ({"type": "float", "mu": 0.5, "sigma": 0.1, "scalingType": "normal"}, FloatDistribution(0.1, 0.9)),
        (
            {"type": "float", "mu": 0.5, "sigma": 0.1, "min": 0.3, "max": 0.6, "scalingType": "normal"},
            FloatDistribution(0.3, 0.6),
        ),
        (
            {"type": "float", "mu": 0.0, "sigma": 1.0, "scalingType": "lognormal"},
            FloatDistribution(math.exp(-4), math.exp(4), log=True),
        ),
        ({"type": "discrete", "values": [8, 32, 128]}, CategoricalDistribution((8, 32, 128))),
        ({"type": "categorical", "values": ["sgd", "adam"]}, CategoricalDistribution(("sgd", "adam"))),
    ],
)
def test_each_type_and_scaling_maps_to_its_optuna_distribution(spec, expected):
    space = parse_space({"algorithm": "bayes", "parameters": {"p": spec}, "spec": {"metric": "loss"}})
    got = space.parameters[0].distribution()
    assert type(got) is type(expected)
    if isinstance(expected, CategoricalDistribution):
        assert got.choices == expected.choices
    else:
        assert (got.low, got.high, got.log) == pytest.approx((expected.low, expected.high, expected.log))


def test_random_draws_follow_their_prior_and_stay_in_range():
    space = parse_space(
        {
            "algorithm": "random",
            "spec": {"metric": "loss", "seed": 3},
            "parameters": {
                "u": {"type": "float", "min": 2.0, "max": 4.0},
                "lu": {"type": "float", "min": 1e-4, "max": 1.0, "scalingType": "loguniform"},
                "n": {"type": "float", "mu": 10.0, "sigma": 2.0, "scalingType": "normal"},
                "i": {"type": "integer", "min": 1, "max": 3},
            },
        }
    )
    draws = [space.draw(k) for k in range(4000)]
    assert space.draw(7) == draws[7]  # a pure function of (seed, combination)
    assert np.mean([d["u"] for d in draws]) == pytest.approx(3.0, abs=0.05)
    assert np.median([math.log10(d["lu"]) for d in draws]) == pytest.approx(-2.0, abs=0.15)
    assert np.std([d["n"] for d in draws]) == pytest.approx(2.0, rel=0.08)
    assert {d["i"] for d in draws} == {1, 2, 3}
    for d in draws:
        assert space.parameters[0].distribution()._contains(d["u"])


def test_grid_is_the_product_exactly_once_and_max_combo_cuts_it():
    raw = {
        "algorithm": "grid",
        "spec": {"metric": "loss", "gridSize": 3},
        "parameters": {
            "batch_size": {"type": "discrete", "values": [8, 32]},
            "opt": {"type": "categorical", "values": ["sgd", "adam"]},
            "lr": {"type": "float", "min": 0.1, "max": 0.3},
        },
    }
    combos = parse_space(raw).grid()
    keys = [tuple(c.values()) for c in combos]
    assert len(keys) == len(set(keys)) == 12
    assert set(keys) == set(itertools.product([8, 32], ["sgd", "adam"], [0.1, 0.2, 0.3]))
    raw["spec"]["maxCombo"] = 5
    assert parse_space(raw).combinations() == 5
    raw["spec"]["randomize"] = True
    assert sorted(map(str, parse_space(raw).grid())) == sorted(map(str, combos))


def test_lr_scaling_derives_the_learning_rate():
    space = parse_space(
        {
            "algorithm": "grid",
            "spec": {"metric": "loss"},
            "parameters": {"batch_size": {"type": "discrete", "values": [8, 32, 128, 512]}},
            "lr_scaling": {"rule": "linear", "base_batch_size": 8, "base_lr": 0.001},
        }
    )
    assert [space.derived(c)["lr"] for c in space.grid()] == pytest.approx([0.001, 0.004, 0.016, 0.064])
    sqrt = parse_space(
        {
            "algorithm": "grid",
            "spec": {"metric": "loss"},
            "parameters": {"batch_size": {"type": "discrete", "values": [32]}},
            "lr_scaling": {"rule": "sqrt", "base_batch_size": 8, "base_lr": 0.001},
        }
    )
    assert sqrt.derived({"batch_size": 32})["lr"] == pytest.approx(0.002)


def test_multi_objective_spec():
    space = parse_space(
        {
            "algorithm": "bayes",
            "parameters": {"x": {"type": "integer", "min": 1, "max": 3}},
            "spec": {"metric": ["val_accuracy", "time_s"], "objective": ["maximize", "minimize"]},
        }
    )
    assert space.multi_objective and space.sampler == "nsga2"


@pytest.mark.parametrize(
    "raw, message",
    [
        (
            {"algorithm": "hyperband", "parameters": {"x": {"type": "integer", "min": 1, "max": 2}}},
            "algorithm 'hyperband'",
        ),
        ({"algorithm": "grid", "parameters": {"x": {"type": "complex", "min": 1, "max": 2}}}, "type 'complex'"),
        (
            {"algorithm": "grid", "parameters": {"x": {"type": "float", "min": 1, "max": 2, "scalingType": "cubic"}}},
            "scalingType 'cubic'",
        ),
        ({"algorithm": "grid", "parameters": {"x": {"type": "float", "min": 3, "max": 2}}}, "min 3 > max 2"),
        ({"algorithm": "grid", "parameters": {"x": {"type": "discrete", "values": []}}}, 'non-empty "values"'),
        (
            {
                "algorithm": "grid",
                "parameters": {"x": {"type": "integer", "min": 1, "max": 2}},
                "spec": {"objective": "minimise"},
            },
            '"minimize" or "maximize"',
        ),
        (
            {"algorithm": "grid", "parameters": {"x": {"type": "integer", "min": 1, "max": 2}}, "spec": {"metrc": "x"}},
            "unknown spec key 'metrc'",
        ),
        (
            {"algorithm": "grid", "parameters": {"x": {"type": "integer", "min": 1, "max": 2}}, "budget": 3},
            "unknown key 'budget'",
        ),
        (
            {
                "algorithm": "grid",
                "parameters": {
                    "x": {"type": "float", "mu": 1},
                },
            },
            'needs "min" and "max"',
        ),
    ],
)
def test_bad_spaces_say_what_is_wrong(raw, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_space(raw)


def test_malformed_file_names_line_and_what_was_expected(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "algorithm": "grid"\n  "parameters": {}\n}')
    with pytest.raises(UsageError, match=r"line 3, column 3: expected ',' delimiter"):
        read_config_file(path)


def test_stdout_protocol_forms():
    assert parse_stdout_metrics(["val_loss=0.5"]) == {"val_loss": 0.5}
    assert parse_stdout_metrics(["epoch 3", "val_loss: 0.25 accuracy=0.9"]) == {"val_loss": 0.25, "accuracy": 0.9}
    assert parse_stdout_metrics(['{"val_loss": 0.125, "note": "ok"}']) == {"val_loss": 0.125}
    assert parse_stdout_metrics(["val_loss=0.5", "val_loss=0.4"]) == {"val_loss": 0.4}  # the last line wins
    assert math.isnan(parse_stdout_metrics(["val_loss=nan"])["val_loss"])


def test_param_styles():
    params = {"batch_size": 32, "optimizer": "adam", "lr": 0.5}
    assert param_arguments(params, "space") == ["--batch_size", "32", "--optimizer", "adam", "--lr", "0.5"]
    assert param_arguments(params, "equals") == ["--batch_size=32", "--optimizer=adam", "--lr=0.5"]
    assert param_arguments(params, "plain") == ["batch_size=32", "optimizer=adam", "lr=0.5"]
    assert param_arguments(params, "none") == []


def test_slots_give_each_trial_its_own_cores_and_refuse_oversubscription():
    assert [s.cores for s in plan_slots(2, 1, False, cores=[0, 1])] == [(0,), (1,)]
    assert [s.cores for s in plan_slots(2, 2, False, cores=[0, 1, 2, 3])] == [(0, 1), (2, 3)]
    assert [s.gpus for s in plan_slots(2, 2, False, cores=[0, 1], gpus=4)] == [(0, 1), (2, 3)]
    with pytest.raises(UsageError, match="-j 2 x --workers-per-trial 2 needs 4 cores"):
        plan_slots(2, 2, False, cores=[0, 1])
    with pytest.raises(UsageError, match="needs 4 GPUs"):
        plan_slots(4, 1, False, cores=[0, 1], gpus=2)
    assert len(plan_slots(4, 1, True, cores=[0, 1])) == 4
