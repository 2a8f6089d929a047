"""Registering plugins explicitly: validation, duplicates, overrides."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import everyo as eo
from everyo.plugins import host

_names = (f"test-plugin-{i}" for i in itertools.count())


@pytest.fixture(autouse=True)
def _unregister_what_the_test_registered():
    before = {info.name for info in host.plugins}
    yield
    for info in list(host.plugins):
        if info.name not in before:
            eo.unregister_plugin(info.name)


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


def test_an_op_kept_under_an_earlier_override_comes_back_with_its_name():
    class Square(eo.Op):
        __slots__ = ()

        def forward(self, x):
            return x * x

    overrider, owner = next(_names), next(_names)
    eo.register_plugin(plugin_with("everyo_register_ops", ("power_test", Cube), override=True),
                       overrider)
    eo.register_plugin(plugin_with("everyo_register_ops", ("power_test", Square)), owner)
    eo.unregister_plugin(overrider)
    assert eo.registry("ops")["power_test"] is Square
    assert Square.name == "power_test"  # what errors about the op name it by
    assert eo.power_test(eo.tensor([3.0])).item() == 9.0


def test_unregistering_gives_back_what_an_override_replaced():
    owner, overrider = next(_names), next(_names)
    eo.register_plugin(plugin_with("everyo_register_api", ("swap_test", lambda: "mine")), owner)
    eo.register_plugin(plugin_with("everyo_register_api", ("swap_test", lambda: "theirs"),
                                   override=True), overrider)
    assert eo.swap_test() == "theirs"
    eo.unregister_plugin(overrider)
    assert eo.swap_test() == "mine" and eo.registry("api").owners["swap_test"] == owner
    eo.unregister_plugin(owner)
    assert "swap_test" not in eo.registry("api")
    with pytest.raises(eo.PluginError, match="no plugin named"):
        eo.unregister_plugin(owner)


def test_a_declared_value_outside_the_documented_ones_is_refused_at_registration():
    class Misdeclared(Cube):
        precision = "float16"  # the precision classes are "lower" and "float32"
        __slots__ = ()

    with pytest.raises(eo.PluginError, match="declares precision = 'float16'.*'lower', 'float32'"):
        eo.register_plugin(plugin_with("everyo_register_ops", ("misdeclared_test", Misdeclared)),
                           next(_names))
    assert "misdeclared_test" not in eo.registry("ops")


def test_declarations_are_read_back_from_the_registry():
    class Kept(Cube):
        precision = "float32"
        __slots__ = ()

    class Refused(eo.Module):
        onnx_export = "refused"

    eo.register_plugin(plugin_with("everyo_register_ops", ("kept_test", Kept)), next(_names))
    eo.register_plugin(plugin_with("everyo_register_layers", ("RefusedTest", Refused)),
                       next(_names))
    assert eo.registry("ops").declared("precision")["kept_test"] == "float32"
    assert "cube_test" not in eo.registry("ops").declared("precision")
    assert eo.registry("layers").declared("onnx_export")["RefusedTest"] == "refused"


class TwoKinds:
    """A plugin registering one name as both an op and its functional form."""

    @eo.hookimpl
    def everyo_register_ops(self, register):
        register("cube_pair_test", Cube)

    @eo.hookimpl
    def everyo_register_layers(self, register):
        register("cube_pair_test", lambda x: "the function")


def test_one_plugin_may_register_an_op_and_its_functional_form_under_one_name():
    eo.register_plugin(TwoKinds(), next(_names))
    assert eo.cube_pair_test(2.0) == "the function"  # eo.<name> is the function
    assert eo.dispatch("cube_pair_test", eo.tensor([2.0])).data.tolist() == [8.0]


@pytest.mark.parametrize("first, second, message", [
    # a layer name that is another plugin's op
    (("everyo_register_ops", ("clash_op_test", Cube)),
     ("everyo_register_layers", ("clash_op_test", lambda: 0)), "already the op of plugin"),
    # an op name that is another plugin's layer function
    (("everyo_register_layers", ("clash_fn_test", lambda: 0)),
     ("everyo_register_ops", ("clash_fn_test", Cube)), "already the layer of plugin"),
    # one eo.<name> as a layer and as an API name
    (("everyo_register_api", ("clash_api_test", lambda: 0)),
     ("everyo_register_layers", ("clash_api_test", lambda: 0)), "already the name of plugin"),
])
def test_a_name_in_two_registries_from_two_plugins_is_refused(first, second, message):
    owner = next(_names)
    eo.register_plugin(plugin_with(*first), owner)
    with pytest.raises(eo.PluginError, match=f"{message} '{owner}'"):
        eo.register_plugin(plugin_with(*second), next(_names))


def test_a_layer_may_not_hide_behind_a_core_name():
    with pytest.raises(eo.PluginError, match="a name the core already defines"):
        eo.register_plugin(plugin_with("everyo_register_layers", ("tensor", lambda: 0)),
                           next(_names))


def test_overriding_an_op_keeps_its_functional_form():
    class LoudCrossEntropy(eo.registry("ops")["cross_entropy"]):
        __slots__ = ()

    eo.register_plugin(plugin_with("everyo_register_ops", ("cross_entropy", LoudCrossEntropy),
                                   override=True), next(_names))
    assert eo.registry("ops")["cross_entropy"] is LoudCrossEntropy
    assert eo.cross_entropy is eo.registry("layers")["cross_entropy"]


def test_a_misspelled_hook_is_refused_naming_the_right_one():
    class Misspelled:
        @eo.hookimpl
        def everyo_register_layer(self, register):
            register("Never", lambda: 0)

    with pytest.raises(eo.PluginError, match="did you mean 'everyo_register_layers'"):
        eo.register_plugin(Misspelled(), next(_names))
    assert "Never" not in eo.registry("layers")


def test_registering_one_plugin_twice_under_two_names_is_a_plugin_error():
    plugin = plugin_with("everyo_register_api", ("twice_test", lambda: 1))
    first = next(_names)
    eo.register_plugin(plugin, first)
    with pytest.raises(eo.PluginError, match=f"already registered, as '{first}'"):
        eo.register_plugin(plugin, next(_names))
    assert eo.twice_test() == 1


def test_the_core_plugin_cannot_be_unregistered():
    core_ops = eo.registry("ops").owned_by("everyo")
    assert "add" in core_ops
    with pytest.raises(eo.PluginError, match="core plugin 'everyo' cannot be unregistered"):
        eo.unregister_plugin("everyo")
    assert eo.registry("ops").owned_by("everyo") == core_ops
    assert eo.plugins.host.info("everyo") is not None
    assert eo.add(eo.tensor([1.0]), eo.tensor([2.0])).item() == 3.0
