"""LARS and LAMB against their papers' update rules, computed by hand in plain tensor arithmetic."""

import copy

import pytest
import torch
from torch import nn

from paratrain.engine.optim import LAMB, LARS, build_optimizer
from paratrain.errors import UsageError


def _param(values, grad):
    p = nn.Parameter(torch.tensor(values, dtype=torch.float64))
    p.grad = torch.tensor(grad, dtype=torch.float64)
    return p


def test_lars_two_steps_match_algorithm_1():
    w0, g = [3.0, 4.0], [0.6, 0.8]  # ||w|| = 5, ||g|| = 1
    lr, m, beta, eta = 0.1, 0.9, 0.01, 0.001
    p = _param(w0, g)
    opt = LARS([p], lr=lr, momentum=m, weight_decay=beta, trust_coefficient=eta, eps=0.0)
    # step 1 by hand: local_lr = eta*||w|| / (||g|| + beta*||w||) = 0.005 / 1.05
    w = torch.tensor(w0, dtype=torch.float64)
    gt = torch.tensor(g, dtype=torch.float64)
    local = eta * 5.0 / (1.0 + beta * 5.0)
    v = lr * local * (gt + beta * w)
    w1 = w - v
    opt.step()
    torch.testing.assert_close(p.data, w1)
    # step 2 with the same gradient: norms recomputed on the new weights
    local2 = eta * w1.norm().item() / (1.0 + beta * w1.norm().item())
    v2 = m * v + lr * local2 * (gt + beta * w1)
    opt.step()
    torch.testing.assert_close(p.data, w1 - v2)


def test_lars_zero_gradient_or_zero_weights_use_ratio_one():
    p = _param([0.0, 0.0], [1.0, 2.0])
    LARS([p], lr=0.5, momentum=0.0, eps=0.0).step()
    torch.testing.assert_close(p.data, torch.tensor([-0.5, -1.0], dtype=torch.float64))


def test_lamb_two_steps_match_algorithm_2():
    w0, g = [1.0, -2.0, 2.0], [0.5, 0.5, -1.0]
    lr, b1, b2, eps, wd = 0.01, 0.9, 0.999, 1e-6, 0.1
    p = _param(w0, g)
    opt = LAMB([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    w = torch.tensor(w0, dtype=torch.float64)
    gt = torch.tensor(g, dtype=torch.float64)
    m = torch.zeros(3, dtype=torch.float64)
    v = torch.zeros(3, dtype=torch.float64)
    for t in (1, 2):
        m = b1 * m + (1 - b1) * gt
        v = b2 * v + (1 - b2) * gt * gt
        r = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
        u = r + wd * w
        w = w - lr * (w.norm() / u.norm()) * u
        opt.step()
        torch.testing.assert_close(p.data, w)


def test_state_dict_round_trip_continues_identically():
    torch.manual_seed(0)
    for cls in (LARS, LAMB):
        a = nn.Linear(4, 3).double()
        b = nn.Linear(4, 3).double()
        b.load_state_dict(a.state_dict())
        opt_a = cls(a.parameters(), lr=0.1)
        x = torch.randn(8, 4, dtype=torch.float64)
        for _ in range(2):
            opt_a.zero_grad()
            a(x).pow(2).sum().backward()
            opt_a.step()
        b.load_state_dict(a.state_dict())
        opt_b = cls(b.parameters(), lr=0.1)
        opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))  # as a checkpoint round trip gives
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
        torch.testing.assert_close(a.weight, b.weight, rtol=0, atol=0)


def test_biases_and_norms_get_no_decay_and_no_adaptation():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    opt = build_optimizer("lars", model, lr=0.1, weight_decay=1e-4)
    weights, rest = opt.param_groups
    assert [p.ndim for p in weights["params"]] == [2]
    assert weights["weight_decay"] == 1e-4 and weights["adapt"] is True
    assert len(rest["params"]) == 3 and rest["weight_decay"] == 0.0 and rest["adapt"] is False
    sgd = build_optimizer("sgd", model, lr=0.1, weight_decay=1e-4)
    assert isinstance(sgd, torch.optim.SGD) and "adapt" not in sgd.param_groups[1]


def test_excluded_group_takes_a_plain_momentum_step():
    p = _param([1.0, 1.0], [0.3, 0.4])
    opt = LARS([{"params": [p], "adapt": False, "weight_decay": 0.0}], lr=0.1, momentum=0.9)
    opt.step()
    torch.testing.assert_close(p.data, torch.tensor([0.97, 0.96], dtype=torch.float64))


def test_unknown_optimizer_is_a_usage_error():
    with pytest.raises(UsageError, match="choose from"):
        build_optimizer("rmsprop", nn.Linear(2, 2), lr=0.1)
