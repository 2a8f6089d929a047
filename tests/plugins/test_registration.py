"""Registering plugins explicitly: validation, duplicates, overrides."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import everyo as eo

_names = (f"test-plugin-{i}" for i in itertools.count())


class Cube(eo.Op):
    __slots__ = ()

    def forward(self, x):
        self.saved = x
        return x ** 3

    def backward(self, g):
        return (3 * self.saved ** 2 * g,)


def plugin_with(hook: str, *pairs, **register_kwargs):
    class Plugin:
        pass

    def impl(register):
        for key, thing in pairs:
            register(key, thing, **register_kwargs)

    impl.__name__ = hook
    setattr(Plugin, hook, staticmethod(eo.hookimpl(impl)))
    return Plugin()


def test_an_op_registered_by_a_plugin_is_dispatchable_and_differentiable():
    eo.register_plugin(plugin_with("everyo_register_ops", ("cube_test", Cube)), next(_names))
    assert eo.gradcheck(lambda x: eo.cube_test(x), np.array([0.5, -1.5]))
    assert eo.registry("ops").items["cube_test"].name == "cube_test"


def test_duplicate_names_are_refused_naming_both_plugins_and_nothing_is_kept():
    first = next(_names)
    eo.register_plugin(plugin_with("everyo_register_layers", ("Twin", lambda: "first")), first)
    second = next(_names)
    with pytest.raises(eo.PluginError, match=f"by plugin '{first}' and again by plugin '{second}'"):
        eo.register_plugin(plugin_with("everyo_register_layers", ("Twin", lambda: "second"),
                                       ("Lonely", lambda: "x")), second)
    assert eo.Twin() == "first"
    assert "Lonely" not in eo.registry("layers")


def test_override_replaces_on_purpose():
    eo.register_plugin(plugin_with("everyo_register_api", ("answer_test", lambda: 1)), next(_names))
    eo.register_plugin(plugin_with("everyo_register_api", ("answer_test", lambda: 2),
                                   override=True), next(_names))
    assert eo.answer_test() == 2


@pytest.mark.parametrize("hook,key,thing,message", [
    ("everyo_register_ops", "not_an_op", lambda x: x, "subclass of everyo.Op"),
    ("everyo_register_ops", "bad name", Cube, "identifier"),
    ("everyo_register_layers", "NotCallable", 42, "callable"),
    ("everyo_register_autocast_policies", "nopolicy", object(), ".ops and .dtype"),
    ("everyo_register_onnx_converters", "Linear", lambda *a: None, "layer_class"),
])
def test_invalid_registrations_are_refused(hook, key, thing, message):
    with pytest.raises(eo.PluginError, match=message):
        eo.register_plugin(plugin_with(hook, (key, thing)), next(_names))


def test_an_override_wins_whichever_plugin_loads_first():
    overrider = next(_names)
    eo.register_plugin(plugin_with("everyo_register_api", ("early_test", lambda: "override"),
                                   override=True), overrider)
    owner = next(_names)
    eo.register_plugin(plugin_with("everyo_register_api", ("early_test", lambda: "original"),
                                   ("other_test", lambda: "kept")), owner)
    assert eo.early_test() == "override"
    assert eo.registry("api").owners["early_test"] == overrider
    assert eo.other_test() == "kept"
