"""Module methods a PyTorch user calls in the first hour: ``Sequential(OrderedDict)``,
``add_module``, ``parameters(recurse=False)``, ``requires_grad_``, ``cpu()``/``cuda()``; the
names and counts compared with ``torch.nn`` where it has the same thing."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError


def _ours():
    return eo.Sequential(OrderedDict([("fc", eo.Linear(2, 3)), ("act", eo.ReLU()),
                                      ("out", eo.Linear(3, 1))]))


def test_sequential_of_an_ordered_dict_keeps_pytorchs_names(torch):
    theirs = torch.nn.Sequential(OrderedDict([("fc", torch.nn.Linear(2, 3)),
                                              ("act", torch.nn.ReLU()),
                                              ("out", torch.nn.Linear(3, 1))]))
    ours = _ours()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]
    assert ours(np.ones((4, 2), np.float32)).shape == (4, 1)
    ours.load_state_dict(eo.convert_state_dict(ours, theirs.state_dict()))
    x = np.random.default_rng(0).standard_normal((4, 2)).astype(np.float32)
    np.testing.assert_allclose(ours(x).data, theirs(torch.tensor(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-6)


def test_add_module_appends_to_a_sequential(torch):
    ours, theirs = eo.Sequential(eo.Linear(2, 2)), torch.nn.Sequential(torch.nn.Linear(2, 2))
    ours.add_module("head", eo.Linear(2, 1))
    theirs.add_module("head", torch.nn.Linear(2, 1))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert ours(np.ones((1, 2), np.float32)).shape == (1, 1)
    with pytest.raises(EveryOError, match="add_module.*without '.'"):
        ours.add_module("a.b", eo.ReLU())
    with pytest.raises(EveryOError, match=r"add_module\('x'\): expected an eo.Module"):
        ours.add_module("x", 3)
    with pytest.raises(EveryOError, match="Sequential takes Modules, got int under 'x'"):
        eo.Sequential(OrderedDict([("x", 1)]))


def test_parameters_without_recursion(torch):
    ours = eo.Sequential(eo.Linear(2, 2))
    ours.scale = eo.Parameter(np.ones(1))
    theirs = torch.nn.Sequential(torch.nn.Linear(2, 2))
    theirs.scale = torch.nn.Parameter(torch.ones(1))
    for recurse in (True, False):
        assert [n for n, _ in ours.named_parameters(recurse=recurse)] == \
            [n for n, _ in theirs.named_parameters(recurse=recurse)]
        assert len(list(ours.parameters(recurse=recurse))) == \
            len(list(theirs.parameters(recurse=recurse)))


def test_requires_grad_freezes_and_unfreezes():
    model = _ours()
    assert model.requires_grad_(False) is model
    assert not any(p.requires_grad for p in model.parameters())
    assert not model(np.ones((1, 2), np.float32)).requires_grad
    model.requires_grad_()
    model(np.ones((1, 2), np.float32)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(EveryOError, match="requires_grad_: expected True or False"):
        model.requires_grad_("no")


def test_cpu_is_the_module_and_cuda_is_refused_by_name():
    model = _ours()
    assert model.cpu() is model
    for call in (lambda: model.cuda(), lambda: model.cuda(0), lambda: model.cuda("cuda:1")):
        with pytest.raises(EveryOError, match=r"Sequential.cuda: EveryO computes on the CPU"):
            call()
