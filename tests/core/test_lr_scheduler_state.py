"""LR schedulers' load_state_dict: a state names its class, is checked by the constructor's
own rules and against the optimizer's group count before anything changes
(docs/checkpoints.md)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import everyo as eo


def optimizer(groups=1):
    return eo.SGD([{"params": [eo.Parameter([1.0])]} for _ in range(groups)], lr=1.0,
                  momentum=0.9)


MAKERS = {
    "StepLR": lambda o: eo.StepLR(o, step_size=2, gamma=0.5),
    "MultiStepLR": lambda o: eo.MultiStepLR(o, milestones=[2, 4], gamma=0.5),
    "LinearLR": lambda o: eo.LinearLR(o, start_factor=0.5, total_iters=4),
    "ExponentialLR": lambda o: eo.ExponentialLR(o, gamma=0.9),
    "CosineAnnealingLR": lambda o: eo.CosineAnnealingLR(o, T_max=5),
    "CosineAnnealingWarmRestarts": lambda o: eo.CosineAnnealingWarmRestarts(o, T_0=3),
    "LambdaLR": lambda o: eo.LambdaLR(o, lambda e: 0.9 ** e),
    "OneCycleLR": lambda o: eo.OneCycleLR(o, max_lr=1.0, total_steps=20),
    "SequentialLR": lambda o: eo.SequentialLR(o, [eo.LinearLR(o, 0.5, total_iters=2),
                                                  eo.ExponentialLR(o, gamma=0.9)], [2]),
    "ReduceLROnPlateau": lambda o: eo.ReduceLROnPlateau(o, factor=0.5, patience=1),
}


def stepped(name, groups=1):
    opt = optimizer(groups)
    sched = MAKERS[name](opt)
    for _ in range(3):
        sched.step(1.0) if name == "ReduceLROnPlateau" else sched.step()
    return opt, sched


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_a_state_names_its_class_and_round_trips(name, tmp_path):
    _, sched = stepped(name)
    state = sched.state_dict()
    assert state["type"] == name
    eo.save(state, tmp_path / "s.npz")
    _, other = stepped(name)
    other.load_state_dict(eo.load(tmp_path / "s.npz"))


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_another_scheduler_class_state_is_refused(name):
    _, sched = stepped(name)
    other_name = "ExponentialLR" if name != "ExponentialLR" else "StepLR"
    _, other = stepped(other_name)
    before = copy.deepcopy(sched.state_dict())
    with pytest.raises(eo.EveryOError, match=f"'{other_name}'"):
        sched.load_state_dict(other.state_dict())
    untyped = {k: v for k, v in other.state_dict().items() if k != "type"}
    with pytest.raises(eo.EveryOError, match=f"not a {name} state"):
        sched.load_state_dict(untyped)
    assert sched.state_dict() == before


@pytest.mark.parametrize("name", sorted(set(MAKERS) - {"SequentialLR"}))
def test_a_state_of_another_group_count_is_refused(name):
    _, two = stepped(name, groups=2)
    _, sched = stepped(name)
    before = copy.deepcopy(sched.state_dict())
    with pytest.raises(eo.EveryOError, match="one per parameter group"):
        sched.load_state_dict(two.state_dict())
    assert sched.state_dict() == before


@pytest.mark.parametrize("name, key, value, words", [
    ("StepLR", "step_size", 0, "StepLR: step_size must be a positive int"),
    ("StepLR", "gamma", float("nan"), "StepLR: gamma must be a non-negative number"),
    ("StepLR", "last_epoch", "3", "last_epoch must be an int"),
    ("StepLR", "base_lrs", [float("inf")], "base_lrs"),
    ("LinearLR", "start_factor", 0.0, r"LinearLR: start_factor must be a number in \(0, 1\]"),
    ("OneCycleLR", "anneal_strategy", "cubic", "anneal_strategy"),
    ("OneCycleLR", "total_steps", 2.5, "OneCycleLR: total_steps must be a positive int"),
    ("ReduceLROnPlateau", "factor", 1.5, "ReduceLROnPlateau: factor"),
    ("ReduceLROnPlateau", "mode", "sideways", "mode"),
    ("ReduceLROnPlateau", "best", "low", "best"),
    ("CosineAnnealingWarmRestarts", "T_cur", float("nan"), "T_cur"),
    # accepted before: inf/-inf gave a NaN learning rate or a raw "math domain error", a
    # zero period a raw ZeroDivisionError at the next step
    ("CosineAnnealingWarmRestarts", "T_cur", float("inf"), "T_cur"),
    ("CosineAnnealingWarmRestarts", "T_cur", -float("inf"), "T_cur"),
    ("CosineAnnealingWarmRestarts", "T_i", 0, "T_i must be a positive int"),
    ("CosineAnnealingWarmRestarts", "T_i", -float("inf"), "T_i"),
])
def test_a_loaded_value_is_checked_by_the_constructor_rules(name, key, value, words):
    _, sched = stepped(name)
    before = copy.deepcopy(sched.state_dict())
    state = dict(before, **{key: value})
    with pytest.raises(eo.EveryOError, match=words):
        sched.load_state_dict(state)
    assert sched.state_dict() == before


def test_a_nested_scheduler_state_is_checked_before_anything_changes():
    _, sched = stepped("SequentialLR")
    before = copy.deepcopy(sched.state_dict())
    state = copy.deepcopy(before)
    state["last_epoch"] = 7
    state["_schedulers"][1]["gamma"] = -1.0
    with pytest.raises(eo.EveryOError, match="ExponentialLR: gamma"):
        sched.load_state_dict(state)
    assert sched.state_dict() == before


def _phase(index, position, value):
    def corrupt(state):
        phases = [list(p) for p in state["phases"]]
        phases[index][position] = value
        return {**state, "phases": phases}
    return corrupt


@pytest.mark.parametrize("name, corrupt, words", [
    # derived state the loader kept unchecked: a NaN lr, or a raw KeyError at the next step
    ("OneCycleLR", _phase(0, 0, -float("inf")), "phases"),
    ("OneCycleLR", _phase(1, 1, "x"), "phases"),
    ("OneCycleLR", _phase(0, 1, np.array(["a", "b"])), "phases"),
    ("OneCycleLR", _phase(1, 4, "initial_lr"), "phases"),
    ("OneCycleLR", lambda s: {**s, "phases": s["phases"][:1]}, "phases"),
    ("OneCycleLR", lambda s: {**s, "phases": [s["phases"][1], s["phases"][0]]}, "phases"),
    ("OneCycleLR", lambda s: {**s, "use_beta1": True}, "use_beta1"),
    ("OneCycleLR", lambda s: {**s, "cycle_momentum": "yes"}, "cycle_momentum"),
    ("SequentialLR", lambda s: {**s, "_milestones": [1, 2, 3]}, "milestones"),
    ("SequentialLR", lambda s: {**s, "_milestones": [0.5]}, "milestones"),
])
def test_a_derived_entry_is_checked_against_the_scheduler(name, corrupt, words):
    _, sched = stepped(name)
    before = copy.deepcopy(sched.state_dict())
    with pytest.raises(eo.EveryOError, match=words):
        sched.load_state_dict(corrupt(copy.deepcopy(before)))
    assert sched.state_dict() == before
    sched.step()
