"""Random corruptions of every state dict, and random damage to checkpoint files: a load either
succeeds or raises a named EveryOError and changes nothing — never a raw exception, never a
half-loaded object. Bounded and derandomized in CI; EVERYO_FUZZ_EXAMPLES=N for more."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import everyo as eo

EXAMPLES = int(os.environ.get("EVERYO_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def _trained_parameters():
    w, b = eo.Parameter(np.ones((2, 3))), eo.Parameter(np.zeros(3))
    return w, b


def _adam():
    w, b = _trained_parameters()
    opt = eo.Adam([{"params": [w]}, {"params": [b], "lr": 0.01}], lr=0.1, amsgrad=True)
    ((w * w).sum() + b.sum()).backward()
    opt.step()
    return opt


def _sgd():
    w, b = _trained_parameters()
    opt = eo.SGD([w, b], lr=0.1, momentum=0.9)
    ((w * w).sum() + b.sum()).backward()
    opt.step()
    return opt


def _optimizer(make):
    def build():
        w, b = _trained_parameters()
        opt = make([w, b])
        loss = lambda: (w * w).sum() + b.sum()  # noqa: E731 - (LBFGS's closure)
        loss().backward()
        opt.step(loss) if isinstance(opt, eo.LBFGS) else opt.step()
        return opt
    return build


def _module():
    return eo.Sequential(eo.Linear(3, 2, seed=0), eo.BatchNorm1D(2))


def _scheduler(make):
    def build():
        opt = eo.SGD([eo.Parameter([1.0])], lr=1.0, momentum=0.9)
        sched = make(opt)
        for _ in range(2):
            sched.step()
        return sched
    return build


def _scaler():
    scaler = eo.GradScaler(init_scale=256.0, growth_interval=4)
    w = eo.Parameter([1.0])
    scaler.backward((w * w).sum())
    scaler.step(eo.SGD([w], lr=0.1))
    scaler.update()
    return scaler


def _loader():
    loader = eo.DataLoader(np.arange(10.0), batch_size=3, shuffle=True, seed=1)
    next(iter(loader))
    return loader


class _Rng:
    """get_rng_state / set_rng_state seen as a stateful object."""

    def __init__(self):
        self.model = eo.Sequential(eo.Dropout(0.5, seed=3))

    def state_dict(self):
        return eo.get_rng_state(self.model)

    def load_state_dict(self, state):
        eo.set_rng_state(state, self.model)


OBJECTS = {
    "Module": _module, "Adam": _adam, "SGD": _sgd, "GradScaler": _scaler,
    "DataLoader": _loader, "RNG": _Rng,
    "StepLR": _scheduler(lambda o: eo.StepLR(o, step_size=2, gamma=0.5)),
    "OneCycleLR": _scheduler(lambda o: eo.OneCycleLR(o, max_lr=1.0, total_steps=10)),
    "SequentialLR": _scheduler(lambda o: eo.SequentialLR(
        o, [eo.LinearLR(o, 0.5, total_iters=2), eo.ExponentialLR(o, gamma=0.9)], [2])),
    "ReduceLROnPlateau": lambda: eo.ReduceLROnPlateau(eo.SGD([eo.Parameter([1.0])], lr=1.0)),
    "AdamW": _optimizer(lambda p: eo.AdamW(p, lr=0.1)),
    "RMSprop": _optimizer(lambda p: eo.RMSprop(p, lr=0.1, momentum=0.5, centered=True)),
    "Adagrad": _optimizer(lambda p: eo.Adagrad(p, lr=0.1)),
    "Adadelta": _optimizer(lambda p: eo.Adadelta(p)),
    "LBFGS": _optimizer(lambda p: eo.LBFGS(p, lr=0.5, max_iter=3)),
    "CosineAnnealingLR": _scheduler(lambda o: eo.CosineAnnealingLR(o, T_max=5)),
    "CosineAnnealingWarmRestarts": _scheduler(lambda o: eo.CosineAnnealingWarmRestarts(o, T_0=3)),
    "ExponentialLR": _scheduler(lambda o: eo.ExponentialLR(o, gamma=0.9)),
    "LambdaLR": _scheduler(lambda o: eo.LambdaLR(o, lambda epoch: 0.5 ** epoch)),
    "MultiplicativeLR": _scheduler(lambda o: eo.MultiplicativeLR(o, lambda epoch: 0.9)),
    "LinearLR": _scheduler(lambda o: eo.LinearLR(o, 0.5, total_iters=4)),
    "MultiStepLR": _scheduler(lambda o: eo.MultiStepLR(o, milestones=[1, 3], gamma=0.5)),
}


def leaf_paths(tree, prefix=()):
    """Every path into ``tree`` (dict keys, list indices), leaves and containers alike."""
    yield prefix
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from leaf_paths(value, (*prefix, key))
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from leaf_paths(value, (*prefix, i))


def replaced(tree, path, value):
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(tree, dict):
        return {**tree, head: replaced(tree[head], rest, value)}
    items = list(tree)
    items[head] = replaced(items[head], rest, value)
    return type(tree)(items) if isinstance(tree, tuple) else items


def removed(tree, path):
    if len(path) == 1:
        if isinstance(tree, dict):
            return {k: v for k, v in tree.items() if k != path[0]}
        return [v for i, v in enumerate(tree) if i != path[0]]
    head = path[0]
    if isinstance(tree, dict):
        return {**tree, head: removed(tree[head], path[1:])}
    items = list(tree)
    items[head] = removed(items[head], path[1:])
    return items


JUNK = st.sampled_from([
    float("nan"), float("inf"), -float("inf"), -1, 0, 2.5, 10 ** 30, True, "x", None, [], {},
    [1.0, 2.0, 3.0], (0.9,), np.array(["a", "b"]), np.ones(3) * 1j, np.ones((4, 4)),
    np.array(np.nan), np.array([1, 1, 2]), {"type": "Adam"}, "Adam",
])


def comparable(state):
    """``state`` with arrays as lists, so that two states compare with ==."""
    if isinstance(state, dict):
        return {str(k): comparable(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return [comparable(v) for v in state]
    if isinstance(state, np.ndarray):
        return ("array", str(state.dtype), state.tolist())
    return state


@pytest.mark.parametrize("name", sorted(OBJECTS))
@FUZZ
@given(data=st.data())
def test_a_corrupted_state_is_loaded_whole_or_refused_by_name(name, data):
    target = OBJECTS[name]()
    source = OBJECTS[name]()
    state = copy.deepcopy(source.state_dict())
    paths = list(leaf_paths(state))
    path = data.draw(st.sampled_from(paths), label="path")
    if path and data.draw(st.booleans(), label="remove"):
        corrupted = removed(state, path)
    else:
        corrupted = replaced(state, path, data.draw(JUNK, label="junk"))
    before = comparable(copy.deepcopy(target.state_dict()))
    try:
        target.load_state_dict(corrupted)
    except eo.EveryOError:
        assert comparable(target.state_dict()) == before
    else:
        target.state_dict()  # a state that loaded is a state the object can report


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
@FUZZ
@given(data=st.data())
def test_a_damaged_checkpoint_file_loads_or_is_a_serialization_error(tmp_path, suffix, data):
    if suffix == ".safetensors":
        pytest.importorskip("safetensors")
    path = tmp_path / f"c{suffix}"
    eo.save({"model": _module(), "optimizer": _adam(), "step": 3, "name": "run",
             "nested": [{"a": (1, 2.5)}, None]} if suffix == ".npz" else _module(), path)
    raw = bytearray(path.read_bytes())
    for _ in range(data.draw(st.integers(1, 8), label="flips")):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans(), label="truncate"):
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    path.write_bytes(bytes(raw))
    try:
        eo.load(path)
    except eo.EveryOSerializationError:
        pass
