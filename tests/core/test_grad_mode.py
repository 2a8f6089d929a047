"""``no_grad`` / ``enable_grad`` as context managers and decorators, as PyTorch's behave: with
or without parentheses, on functions and on generator functions (whose body runs in the mode
at every resumption, while the caller between two items keeps its own)."""

from __future__ import annotations

import pytest

import everyo as eo


def _records() -> bool:
    return (eo.ones(1, requires_grad=True) * 2.0).requires_grad


@pytest.mark.parametrize("mode, inside", [(eo.no_grad, False), (eo.enable_grad, True)])
def test_a_generator_function_runs_its_body_in_the_mode(mode, inside):
    @mode()
    def steps(n):
        for _ in range(n):
            yield _records(), eo.is_grad_enabled()

    outside = not inside
    with eo.enable_grad() if outside else eo.no_grad():  # the caller's mode: the other one
        seen = []
        for item in steps(3):
            seen.append(item)
            seen.append((_records(), eo.is_grad_enabled()))  # the caller, between items
    assert seen == [(inside, inside), (outside, outside)] * 3


def test_a_generator_gets_what_is_sent_and_thrown_and_returns_its_value():
    @eo.no_grad()
    def echo():
        received = yield eo.is_grad_enabled()
        try:
            yield (received, eo.is_grad_enabled())
        except KeyError:
            yield ("thrown", eo.is_grad_enabled())
        return "done"

    gen = echo()
    assert next(gen) is False
    assert gen.send(7) == (7, False)
    assert gen.throw(KeyError("k")) == ("thrown", False)
    with pytest.raises(StopIteration) as stop:
        next(gen)
    assert stop.value.value == "done" and eo.is_grad_enabled()


def test_closing_a_generator_runs_its_cleanup_in_the_mode():
    seen = []

    @eo.no_grad()
    def stream():
        try:
            yield 1
        finally:
            seen.append(eo.is_grad_enabled())

    gen = stream()
    next(gen)
    gen.close()
    assert seen == [False] and eo.is_grad_enabled()


@pytest.mark.parametrize("mode, inside", [(eo.no_grad, False), (eo.enable_grad, True)])
def test_the_bare_decorator_works_as_with_parentheses(mode, inside):
    @mode
    def f(x):
        return x * 2.0, eo.is_grad_enabled()

    with eo.no_grad() if inside else eo.enable_grad():  # the caller's mode: the other one
        y, enabled = f(eo.ones(2, requires_grad=True))
    assert enabled is inside and y.requires_grad is inside
    assert f.__name__ == "f"


def test_no_grad_given_something_else_is_named():
    with pytest.raises(eo.EveryOError, match="no_grad"):
        eo.no_grad(3)


def test_decorating_keeps_the_function_reusable_and_nested():
    @eo.no_grad()
    def inner():
        return eo.is_grad_enabled()

    @eo.enable_grad()
    def outer():
        return eo.is_grad_enabled(), inner(), eo.is_grad_enabled()

    assert outer() == (True, False, True)
    with eo.no_grad():
        assert outer() == (True, False, True)
        assert not eo.is_grad_enabled()


def test_a_shared_instance_nests_in_itself():
    mode = eo.no_grad()
    with mode:
        with mode:
            assert not eo.is_grad_enabled()
        assert not eo.is_grad_enabled()
    assert eo.is_grad_enabled()
