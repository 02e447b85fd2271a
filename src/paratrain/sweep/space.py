"""The search space: Comet's optimizer config (Vizier-inspired), read leniently, mapped to Optuna.

    {"algorithm": "grid" | "random" | "bayes",
     "parameters": {NAME: {"type": "integer" | "float" | "double" | "discrete" | "categorical",
                           "min", "max", "values", "scalingType", "mu", "sigma"}},
     "spec": {"metric", "objective", "maxCombo", "seed", "gridSize", "retryLimit", ...},
     "trials": repeats of each combination, "name": ...,
     "lr_scaling": {"rule", "base_batch_size", "base_lr"}}          <- paratrain's extension

Files copied from articles carry `#` comments and trailing commas; they are accepted. Every
problem is one UsageError naming the file, the place and what was expected.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from paratrain.errors import UsageError

ALGORITHMS = ("grid", "random", "bayes")
TYPES = ("integer", "float", "double", "discrete", "categorical")
SCALINGS = ("linear", "uniform", "loguniform", "normal", "lognormal")
SAMPLERS = ("tpe", "gp", "nsga2")
LR_RULES = ("none", "linear", "sqrt")
# Comet spec keys: the ones paratrain acts on, and the ones of Comet's server that mean nothing
# here but appear in copied configs (accepted, ignored, documented in docs/sweeps.md).
SPEC_KEYS = {"metric", "objective", "maxCombo", "seed", "gridSize", "retryLimit", "randomize", "sampler"}
SPEC_IGNORED = {"minSampleSize", "retryAssignLimit"}
TOP_KEYS = {"algorithm", "parameters", "spec", "trials", "name", "lr_scaling"}


# -- reading the file -------------------------------------------------------------------------


def read_config_file(path: Path) -> dict[str, Any]:
    """JSON, YAML, or JSON with `#` comments and trailing commas, as a dict."""
    if not path.is_file():
        raise UsageError(f"sweep config {path} does not exist; pass a JSON or YAML search-space file")
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise UsageError(f"sweep config {path}{where}: {getattr(exc, 'problem', None) or exc}") from None
    else:
        try:
            data = json.loads(strip_json_extras(text))
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"sweep config {path} line {exc.lineno}, column {exc.colno}: {_expected(exc.msg)}"
            ) from None
    if not isinstance(data, dict):
        raise UsageError(f'sweep config {path} must hold an object with "algorithm", "parameters" and "spec"')
    return data


def _expected(message: str) -> str:
    return message.replace("Expecting", "expected")


def strip_json_extras(text: str) -> str:
    """Blank out `#` comments and drop trailing commas outside strings, keeping line numbers."""
    out: list[str] = []
    in_string = escaped = in_comment = False
    pending_comma: int | None = None  # index in `out` of a comma that may be trailing
    for char in text:
        if in_comment:
            if char == "\n":
                in_comment = False
                out.append(char)
            continue
        if in_string:
            out.append(char)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if char == "#":
            in_comment = True
            continue
        if char in "}]" and pending_comma is not None:
            out[pending_comma] = " "
        if not char.isspace():
            pending_comma = None
        if char == ",":
            pending_comma = len(out)
        elif char == '"':
            in_string = True
        out.append(char)
    return "".join(out)


# -- parameters -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Parameter:
    name: str
    type: str  # integer | float | discrete | categorical ("double" is read as float)
    scaling: str = "uniform"  # uniform | loguniform | normal | lognormal ("linear" is uniform)
    low: float | None = None
    high: float | None = None
    values: tuple | None = None
    mu: float | None = None
    sigma: float | None = None

    @property
    def is_choice(self) -> bool:
        return self.values is not None

    def distribution(self):
        """The Optuna distribution this parameter is sampled from (and its values must lie in)."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.is_choice:
            return CategoricalDistribution(self.values)
        log = self.scaling in ("loguniform", "lognormal")
        low, high = self.bounds()
        if self.type == "integer":
            return IntDistribution(int(low), int(high), log=log)
        return FloatDistribution(low, high, log=log)

    @property
    def extensible(self) -> bool:
        """A list of integers only, or of floats only: in a grid it is recorded as a range (see
        SearchSpace.distributions), which Optuna lets a study widen; a categorical's choices are fixed."""
        kinds = {type(v) for v in self.values or ()}
        return kinds == {int} or kinds == {float}

    def bounds(self) -> tuple[float, float]:
        """min/max, or for a normal prior without them mu ± 4 sigma (in log space for lognormal)."""
        if self.low is not None and self.high is not None:
            return self.low, self.high
        assert self.mu is not None and self.sigma is not None
        low, high = self.mu - 4 * self.sigma, self.mu + 4 * self.sigma
        if self.scaling == "lognormal":
            low, high = math.exp(low), math.exp(high)
        if self.type == "integer":
            # Whole numbers covering the range; a log-scaled integer range must start at 1 or more.
            low, high = math.floor(low), math.ceil(high)
            if self.scaling == "lognormal":
                low = max(low, 1)
        return low, high

    def grid(self, size: int) -> list[Any]:
        """`size` values spread over the range: evenly, evenly in log space, or at the prior's quantiles."""
        if self.is_choice:
            return list(self.values)
        low, high = self.bounds()
        if self.scaling in ("normal", "lognormal"):
            prior = statistics.NormalDist(self.mu, self.sigma)
            points = [prior.inv_cdf((i + 0.5) / size) for i in range(size)]
            if self.scaling == "lognormal":
                points = [math.exp(p) for p in points]
            points = [min(max(p, low), high) for p in points]
        elif self.scaling == "loguniform":
            points = list(np.geomspace(low, high, size))
        else:
            points = list(np.linspace(low, high, size))
        return self._typed(points)

    def draw(self, rng: np.random.Generator) -> Any:
        """One random value from the prior (uniform, log-uniform, normal, log-normal, or a choice)."""
        if self.is_choice:
            return self.values[int(rng.integers(len(self.values)))]
        low, high = self.bounds()
        if self.scaling == "loguniform":
            value = math.exp(rng.uniform(math.log(low), math.log(high)))
        elif self.scaling == "normal":
            value = rng.normal(self.mu, self.sigma)
        elif self.scaling == "lognormal":
            value = math.exp(rng.normal(self.mu, self.sigma))
        else:
            value = rng.uniform(low, high + (1 if self.type == "integer" else 0))
            value = math.floor(value) if self.type == "integer" else value
        return self._typed([min(max(value, low), high)])[0]

    def _typed(self, points: Sequence[float]) -> list[Any]:
        if self.type == "integer":
            # int(): points from np.geomspace are NumPy floats, whose round() is a float before NumPy 2.
            return list(dict.fromkeys(int(round(p)) for p in points))  # noqa: RUF046
        return [float(p) for p in points]


def parse_parameter(name: str, spec: Any, where: str) -> Parameter:
    if not isinstance(spec, dict):
        raise UsageError(
            f'{where}: parameter {name!r} must be an object like {{"type": "integer", "min": 1, "max": 5}}'
        )
    known = {"type", "min", "max", "values", "scalingType", "mu", "sigma"}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise UsageError(
            f"{where}: parameter {name!r} has unknown key {unknown[0]!r}; expected one of {', '.join(sorted(known))}"
        )
    kind = spec.get("type")
    if kind not in TYPES:
        raise UsageError(f"{where}: parameter {name!r} has type {kind!r}; expected one of {', '.join(TYPES)}")
    kind = "float" if kind == "double" else kind
    scaling = spec.get("scalingType", "uniform")
    if scaling not in SCALINGS:
        raise UsageError(
            f"{where}: parameter {name!r} has scalingType {scaling!r}; expected one of {', '.join(SCALINGS)}"
        )
    scaling = "uniform" if scaling == "linear" else scaling
    if kind in ("discrete", "categorical"):
        values = spec.get("values")
        if not isinstance(values, list) or not values:
            raise UsageError(f'{where}: parameter {name!r} ({kind}) needs a non-empty "values" list')
        if kind == "discrete" and not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise UsageError(
                f'{where}: parameter {name!r} is discrete, so its values must be numbers; use "categorical" for strings'
            )
        if len(set(map(json.dumps, values))) != len(values):
            raise UsageError(f"{where}: parameter {name!r} lists a value twice")
        return Parameter(name, kind, values=tuple(values))
    low, high, mu, sigma = (spec.get(k) for k in ("min", "max", "mu", "sigma"))
    for key, value in (("min", low), ("max", high), ("mu", mu), ("sigma", sigma)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise UsageError(f"{where}: parameter {name!r}: {key} must be a number (got {value!r})")
    if scaling in ("normal", "lognormal"):
        if mu is None or sigma is None:
            raise UsageError(f'{where}: parameter {name!r} with scalingType {scaling} needs "mu" and "sigma"')
        if sigma <= 0:
            raise UsageError(f"{where}: parameter {name!r}: sigma must be positive (got {sigma})")
        if (low is None) != (high is None):
            raise UsageError(f"{where}: parameter {name!r}: give both min and max, or neither")
    elif low is None or high is None:
        raise UsageError(f'{where}: parameter {name!r} ({kind}) needs "min" and "max"')
    if low is not None and high is not None and low > high:
        raise UsageError(f"{where}: parameter {name!r} has min {low} > max {high}; swap them")
    if scaling == "loguniform" and low is not None and low <= 0:
        raise UsageError(f"{where}: parameter {name!r} is loguniform, so min must be > 0 (got {low})")
    return Parameter(name, kind, scaling, low, high, mu=mu, sigma=sigma)


# -- the whole config -------------------------------------------------------------------------


@dataclass(frozen=True)
class LRScaling:
    """lr = base_lr x (batch / base_batch_size) (linear) or its square root (sqrt): Goyal et al. 2017."""

    rule: str
    base_batch_size: int
    base_lr: float
    batch_param: str = "batch_size"
    lr_param: str = "lr"

    def lr_for(self, batch_size: float) -> float:
        ratio = batch_size / self.base_batch_size
        return self.base_lr * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[self.rule]


@dataclass(frozen=True)
class SearchSpace:
    algorithm: str
    parameters: tuple[Parameter, ...]
    metrics: tuple[str, ...]
    directions: tuple[str, ...]  # "minimize" | "maximize", one per metric
    max_combo: int  # combinations to try (grid: 0 = all of it)
    repeats: int  # trials of each combination ("trials")
    seed: int
    grid_size: int
    retry_limit: int
    randomize: bool
    sampler: str  # what picks the values: grid | random, or bayes's tpe | gp | nsga2
    name: str
    lr_scaling: LRScaling | None

    @property
    def multi_objective(self) -> bool:
        return len(self.metrics) > 1

    def distributions(self) -> dict[str, Any]:
        """What each trial's values are recorded as in the study. A grid fixes every value itself,
        so a list of numbers is recorded as the range it spans: adding a value to it later extends
        the study (Optuna refuses a categorical whose choices change)."""
        from optuna.distributions import FloatDistribution, IntDistribution

        if self.algorithm != "grid":
            return {p.name: p.distribution() for p in self.parameters}
        out = {}
        for p in self.parameters:
            if p.is_choice and p.extensible:
                kind = IntDistribution if isinstance(p.values[0], int) else FloatDistribution
                out[p.name] = kind(min(p.values), max(p.values))
            else:
                out[p.name] = p.distribution()
        return out

    def grid(self) -> list[dict[str, Any]]:
        """Every combination of the parameters' grid values, each exactly once."""
        axes = [p.grid(self.grid_size) for p in self.parameters]
        combos = [dict(zip((p.name for p in self.parameters), values)) for values in itertools.product(*axes)]
        if self.randomize:
            order = np.random.default_rng(self.seed).permutation(len(combos))
            combos = [combos[i] for i in order]
        return combos

    def draw(self, combo: int) -> dict[str, Any]:
        """Random search: combination `combo` is a pure function of (seed, combo), so any worker
        on any machine draws the same values for it and a resumed sweep continues the same sequence."""
        rng = np.random.default_rng([self.seed, combo])
        return {p.name: p.draw(rng) for p in self.parameters}

    def combinations(self) -> int:
        if self.algorithm == "grid":
            size = len(self.grid())
            return min(size, self.max_combo) if self.max_combo else size
        return self.max_combo

    def derived(self, params: dict[str, Any]) -> dict[str, Any]:
        """Parameters that follow others: the learning rate from the batch size."""
        rule = self.lr_scaling
        if rule is None:
            return {}
        return {rule.lr_param: rule.lr_for(params[rule.batch_param])}

    def to_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "metrics": list(self.metrics),
            "directions": list(self.directions),
            "max_combo": self.max_combo,
            "repeats": self.repeats,
            "seed": self.seed,
            "grid_size": self.grid_size,
            "retry_limit": self.retry_limit,
            "randomize": self.randomize,
            "sampler": self.sampler,
            "name": self.name,
            "parameters": {
                p.name: {k: v for k, v in vars(p).items() if k != "name" and v is not None} for p in self.parameters
            },
            "lr_scaling": vars(self.lr_scaling) if self.lr_scaling else None,
        }


def parse_space(data: dict[str, Any], where: str = "sweep config") -> SearchSpace:
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r}; expected {', '.join(sorted(TOP_KEYS))}")
    algorithm = data.get("algorithm")
    if algorithm not in ALGORITHMS:
        raise UsageError(f"{where}: algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    params = data.get("parameters")
    if not isinstance(params, dict) or not params:
        raise UsageError(f'{where}: "parameters" must be a non-empty object of parameter specs')
    parameters = tuple(parse_parameter(name, spec, where) for name, spec in params.items())

    spec = data.get("spec", {})
    if not isinstance(spec, dict):
        raise UsageError(f'{where}: "spec" must be an object with "metric" and "objective"')
    unknown = sorted(set(spec) - SPEC_KEYS - SPEC_IGNORED)
    if unknown:
        raise UsageError(
            f"{where}: unknown spec key {unknown[0]!r}; expected {', '.join(sorted(SPEC_KEYS | SPEC_IGNORED))}"
        )
    metric = spec.get("metric", "loss")
    metrics = tuple(metric) if isinstance(metric, list) else (metric,)
    if not metrics or not all(isinstance(m, str) and m for m in metrics):
        raise UsageError(f"{where}: spec.metric must be a metric name or a list of names (got {metric!r})")
    objective = spec.get("objective", "minimize")
    directions = tuple(objective) if isinstance(objective, list) else (objective,) * len(metrics)
    if len(directions) != len(metrics):
        raise UsageError(
            f"{where}: spec.objective lists {len(directions)} objective(s) for {len(metrics)} metric(s); give one per "
            "metric"
        )
    for direction in directions:
        if direction not in ("minimize", "maximize"):
            raise UsageError(f'{where}: spec.objective {direction!r} must be "minimize" or "maximize"')

    def count(key: str, default: int, least: int) -> int:
        value = spec.get(key, default) if key in spec else data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise UsageError(f"{where}: {key} must be an integer >= {least} (got {value!r})")
        return value

    max_combo = count("maxCombo", 0, 0)
    if algorithm != "grid" and max_combo == 0:
        max_combo = 10 * len(parameters)  # Comet's default budget for random and bayes
    if "sampler" in spec and algorithm != "bayes":
        raise UsageError(
            f'{where}: spec.sampler chooses the sampler of algorithm "bayes"; {algorithm} search has '
            "its own plan, so drop spec.sampler"
        )
    # Grid and random plans are computed here, not sampled by Optuna: they are named for what they are.
    sampler = spec.get("sampler", "nsga2" if len(metrics) > 1 else "tpe") if algorithm == "bayes" else algorithm
    if algorithm == "bayes" and sampler not in SAMPLERS:
        raise UsageError(f"{where}: spec.sampler {sampler!r} is not one of {', '.join(SAMPLERS)}")
    name = data.get("name", "sweep")
    if not isinstance(name, str) or not name:
        raise UsageError(f"{where}: name must be a non-empty string")
    space = SearchSpace(
        algorithm=algorithm,
        parameters=parameters,
        metrics=metrics,
        directions=directions,
        max_combo=max_combo,
        repeats=count("trials", 1, 1),
        seed=count("seed", 0, 0),
        grid_size=count("gridSize", 10, 1),
        retry_limit=count("retryLimit", 0, 0),
        randomize=bool(spec.get("randomize", False)),
        sampler=sampler,
        name=name,
        lr_scaling=_parse_lr_scaling(data.get("lr_scaling"), parameters, where),
    )
    return space


def _parse_lr_scaling(spec: Any, parameters: Sequence[Parameter], where: str) -> LRScaling | None:
    if spec is None:
        return None
    keys = {"rule", "base_batch_size", "base_lr", "batch_param", "lr_param"}
    if not isinstance(spec, dict) or set(spec) - keys:
        raise UsageError(f"{where}: lr_scaling must be an object with keys {', '.join(sorted(keys))}")
    rule = LRScaling(
        rule=spec.get("rule", "linear"),
        base_batch_size=spec.get("base_batch_size", 0),
        base_lr=spec.get("base_lr", 0),
        batch_param=spec.get("batch_param", "batch_size"),
        lr_param=spec.get("lr_param", "lr"),
    )
    if rule.rule not in LR_RULES:
        raise UsageError(f"{where}: lr_scaling.rule {rule.rule!r} is not one of {', '.join(LR_RULES)}")
    if not isinstance(rule.base_batch_size, int) or rule.base_batch_size <= 0:
        raise UsageError(
            f"{where}: lr_scaling.base_batch_size must be a positive integer, the batch base_lr was tuned for"
        )
    if not isinstance(rule.base_lr, (int, float)) or rule.base_lr <= 0:
        raise UsageError(f"{where}: lr_scaling.base_lr must be a positive number")
    names = [p.name for p in parameters]
    if rule.batch_param not in names:
        raise UsageError(f"{where}: lr_scaling follows parameter {rule.batch_param!r}, which the sweep does not vary")
    if rule.lr_param in names:
        raise UsageError(f"{where}: lr_scaling derives {rule.lr_param!r}, so it cannot also be a swept parameter")
    return rule


def load_space(path: Path) -> tuple[dict[str, Any], SearchSpace]:
    """A sweep config file's contents, as stored with the study (a rerun is checked against them), and
    the search space they describe; refusals name the file."""
    raw = read_config_file(path)
    return raw, parse_space(raw, f"sweep config {path}")
