"""Calls a careless user makes on optimizers, schedulers, modules, data loaders and the op
functions: each works as in PyTorch (``optimizer.step(closure)``) or is an ``EveryOError``
naming what was wrong, never a raw ``TypeError`` or a learning rate of NaN."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError

NAMES = ("SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Adadelta")


@pytest.mark.parametrize("name", NAMES)
def test_step_with_a_closure_is_pytorchs(name, torch):
    start = np.array([0.5, -1.0, 2.0])
    ours_w, theirs_w = eo.Parameter(start.copy()), torch.tensor(start.copy(), requires_grad=True)
    ours, theirs = getattr(eo, name)([ours_w], lr=0.1), getattr(torch.optim, name)([theirs_w],
                                                                                  lr=0.1)
    for _ in range(3):
        def closure(w=ours_w, opt=ours):
            opt.zero_grad()
            loss = (w * w * w).sum()
            loss.backward()
            return loss

        def torch_closure(w=theirs_w, opt=theirs):
            opt.zero_grad()
            loss = (w * w * w).sum()
            loss.backward()
            return loss

        loss = ours.step(closure)
        expected = theirs.step(torch_closure)
        assert float(loss.data) == pytest.approx(float(expected.detach()), rel=1e-12)
    np.testing.assert_allclose(ours_w.data, theirs_w.detach().numpy(), rtol=1e-12)
    assert ours.step() is None


@pytest.mark.parametrize("name", NAMES + ("LBFGS",))
@pytest.mark.parametrize("params", [None, 3, "abc"])
def test_parameters_that_are_not_an_iterable_of_tensors(name, params):
    with pytest.raises(EveryOError, match=name):
        getattr(eo, name)(params)


@pytest.mark.parametrize("name", NAMES + ("LBFGS",))
def test_a_closure_that_is_not_callable(name):
    w = eo.Parameter([1.0])
    (w * w).sum().backward()
    with pytest.raises(EveryOError, match="closure"):
        getattr(eo, name)([w]).step("abc")
    np.testing.assert_array_equal(w.data, [1.0])


@pytest.mark.parametrize("value", [float("nan"), "0.1", None, float("inf"), np.array([1.0, 2.0])])
def test_a_scheduler_never_sets_a_learning_rate_that_is_not_a_number(value):
    w = eo.Parameter([1.0])
    optimizer = eo.SGD([w], lr=0.1)
    scheduler = eo.LambdaLR(optimizer, lambda epoch: value if epoch else 1.0)
    with pytest.raises(EveryOError, match="lr"):
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.1


@pytest.mark.parametrize("mode", ["no", None, 0, 1.0])
def test_module_train_takes_a_bool(mode):
    model = eo.Sequential(eo.Linear(2, 2), eo.Dropout(0.5))
    with pytest.raises(EveryOError, match="mode"):
        model.train(mode)
    assert model.training and model[1].training


@pytest.mark.parametrize("value", ["abc", {"a": 1}, [None], np.array([object()])])
def test_register_buffer_takes_an_array(value):
    layer = eo.Linear(2, 2)
    with pytest.raises(EveryOError, match="buffer"):
        layer.register_buffer("extra", value)
    assert "extra" not in layer.state_dict()


@pytest.mark.parametrize("dataset", [None, "abc", 3, {"x": 1}])
def test_data_loader_refuses_what_is_not_a_dataset(dataset):
    with pytest.raises(EveryOError):
        list(eo.DataLoader(dataset, batch_size=2))


# (eo.relu, eo.matmul, ... are Python functions: called with the wrong number of arguments they
# raise Python's TypeError, as any function does; these are the ops reached through dispatch)
@pytest.mark.parametrize("call", [
    lambda x: eo.dispatch("dropout", x, 0.5), lambda x: eo.dispatch("softmax", x, x),
    lambda x: eo.dispatch("add", x, x, x), lambda x: eo.dispatch("add", x, x, nonsense=1),
    lambda x: eo.dispatch("relu", x, x), lambda x: eo.dispatch("matmul", x),
], ids=["dropout p positional", "softmax axis as operand", "add three operands",
        "add unknown attribute", "relu two operands", "matmul one operand"])
def test_an_op_called_with_the_wrong_arguments_is_named(call):
    with pytest.raises(EveryOError, match="takes|axis"):
        call(eo.ones(2, 3, requires_grad=True))


@pytest.mark.parametrize("loss", ["cross_entropy", "nll_loss"])
@pytest.mark.parametrize("ignore_index", ["a", 1.5, None, True])
def test_ignore_index_must_be_an_int(loss, ignore_index):
    scores = eo.tensor(np.random.default_rng(0).standard_normal((2, 3)), requires_grad=True)
    with pytest.raises(EveryOError, match="ignore_index"):
        getattr(eo, loss)(scores, np.array([0, 1]), ignore_index=ignore_index)
