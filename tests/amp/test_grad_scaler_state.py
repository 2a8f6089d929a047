"""GradScaler.load_state_dict checks a state by the constructor's own rules, before anything
changes, and refuses another class's state (docs/checkpoints.md)."""

from __future__ import annotations

import pytest

import everyo as eo


def stepped_scaler():
    scaler = eo.GradScaler(init_scale=1024.0, growth_interval=3)
    w = eo.Parameter([1.0])
    opt = eo.SGD([w], lr=0.1)
    scaler.backward((w * w).sum())
    scaler.step(opt)
    scaler.update()
    return scaler


@pytest.mark.parametrize("key", ["scale", "growth_factor", "backoff_factor"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, "2.0"])
def test_a_loaded_scale_or_factor_is_checked_as_the_constructor_checks_it(key, value):
    scaler = stepped_scaler()
    before = scaler.state_dict()
    state = dict(before, **{key: value})
    with pytest.raises(eo.EveryOError, match=f"GradScaler.load_state_dict: {key} must be"):
        scaler.load_state_dict(state)
    assert scaler.state_dict() == before


@pytest.mark.parametrize("name", ["init_scale", "growth_factor", "backoff_factor"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_the_constructor_refuses_non_finite_scales_and_factors(name, value):
    with pytest.raises(eo.EveryOError, match=f"GradScaler: {name} must be"):
        eo.GradScaler(**{name: value})


@pytest.mark.parametrize("key, value", [("growth_interval", 0), ("growth_interval", 2.5),
                                        ("_growth_tracker", -1), ("_growth_tracker", 7)])
def test_loaded_counters_are_checked(key, value):
    scaler = stepped_scaler()
    before = scaler.state_dict()
    with pytest.raises(eo.EveryOError, match=key):
        scaler.load_state_dict(dict(before, **{key: value}))
    assert scaler.state_dict() == before


def test_another_class_state_is_refused():
    scaler = stepped_scaler()
    with pytest.raises(eo.EveryOError, match="'SGD'"):
        scaler.load_state_dict(dict(scaler.state_dict(), type="SGD"))
    with pytest.raises(eo.EveryOError, match="not a GradScaler state"):
        scaler.load_state_dict({"step_count": 1, "state": {}, "param_groups": []})


def test_a_state_round_trips():
    scaler = stepped_scaler()
    other = eo.GradScaler()
    other.load_state_dict(scaler.state_dict())
    assert other.state_dict() == scaler.state_dict()
