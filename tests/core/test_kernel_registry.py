"""The kernel registry: kernels and providers registered through ``everyo_register_kernels``,
selection (environment, ``use``, default by priority), per-call fallback to the reference."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import everyo as eo
import everyo.kernels as K
from everyo.plugins import host

_names = (f"kernel-test-plugin-{i}" for i in itertools.count())


@pytest.fixture(autouse=True)
def _unregister_what_the_test_registered():
    before = {info.name for info in host.plugins}
    yield
    for info in list(host.plugins):
        if info.name not in before:
            eo.unregister_plugin(info.name)


def kernels_plugin(*pairs):
    class Plugin:
        @eo.hookimpl
        def everyo_register_kernels(self, register):
            for key, thing in pairs:
                register(key, thing)

    name = next(_names)
    eo.register_plugin(Plugin(), name)
    return name


def doubled(x):
    return x * 2


def doubled_fast(x):
    if x.dtype != np.float32:
        return NotImplemented
    return np.multiply(x, 2, dtype=np.float32) + np.float32(0.5)  # (recognisable on purpose)


def test_a_registered_kernel_runs_its_reference_when_no_provider_implements_it():
    kernels_plugin(("doubled_t", K.Kernel(doubled, "x -> 2x, new array")))
    assert K.kernel.doubled_t(np.float32([1.5])).tolist() == [3.0]
    assert K.coverage()["doubled_t"] == "numpy"


def test_a_provider_is_used_where_it_implements_a_kernel_and_falls_back_per_call():
    kernels_plugin(("doubled_t", K.Kernel(doubled, "x -> 2x, new array")),
                   ("fast_t", K.KernelProvider({"doubled_t": doubled_fast}, priority=10**6)))
    with K.use("fast_t"):
        assert K.provider_name() == "fast_t"
        assert K.kernel.doubled_t(np.float32([1.0])).tolist() == [2.5]  # the provider ran
        assert K.kernel.doubled_t(np.float64([1.0])).tolist() == [2.0]  # NotImplemented: reference
        assert K.coverage()["doubled_t"] == "fast_t"
    with K.use("numpy"):
        assert K.kernel.doubled_t(np.float32([1.0])).tolist() == [2.0]
        assert K.fingerprint() == "numpy"


def test_the_default_is_the_installed_provider_of_highest_priority():
    kernels_plugin(("doubled_t", K.Kernel(doubled, "x -> 2x, new array")),
                   ("fast_t", K.KernelProvider({"doubled_t": doubled_fast}, priority=10**6,
                                               version="1.2")))
    if os.environ.get(K.KERNELS_ENV, "").strip().lower() not in ("", "auto"):
        pytest.skip(f"{K.KERNELS_ENV} chooses the provider in this run")
    assert K.provider_name() == "fast_t" and K.fingerprint() == "fast_t 1.2"
    assert K.kernel.doubled_t(np.float32([1.0])).tolist() == [2.5]


def test_a_provider_leaving_takes_its_implementations_with_it():
    kernels_plugin(("doubled_t", K.Kernel(doubled, "x -> 2x, new array")))
    provider = kernels_plugin(("fast_t", K.KernelProvider({"doubled_t": doubled_fast})))
    with K.use("fast_t"):
        assert K.kernel.doubled_t(np.float32([1.0])).tolist() == [2.5]
    eo.unregister_plugin(provider)
    with pytest.raises(eo.EveryOError, match="'fast_t'.*not installed.*numpy"):
        with K.use("fast_t"):
            pass


def test_implementations_given_as_paths_are_imported_on_first_call():
    kernels_plugin(("negated_t", K.Kernel(np.negative, "x -> -x")),
                   ("lazy_t", K.KernelProvider({"negated_t": "numpy:positive"})))
    provider = eo.registry("kernels")["lazy_t"]
    assert provider._resolved == {}
    with K.use("lazy_t"):
        assert K.kernel.negated_t(np.float32([1.0])).tolist() == [1.0]
    assert provider._resolved["negated_t"] is np.positive


@pytest.mark.parametrize("thing, message", [
    (doubled, "must be an everyo.kernels.Kernel"),
    (K.KernelProvider({}), None),
])
def test_what_is_registered_is_checked(thing, message):
    if message is None:
        kernels_plugin(("empty_provider_t", thing))  # a provider of nothing is allowed
        return
    with pytest.raises(eo.PluginError, match=message):
        kernels_plugin(("bad_t", thing))


def test_the_references_name_cannot_be_taken():
    with pytest.raises(eo.PluginError, match="'numpy' names the reference kernels"):
        kernels_plugin(("numpy", K.KernelProvider({})))


@pytest.mark.parametrize("build, message", [
    (lambda: K.Kernel(doubled, ""), "needs a contract"),
    (lambda: K.Kernel("doubled", "x -> 2x"), "reference must be callable"),
    (lambda: K.KernelProvider({"x": 3}), "must be callable or a 'module:attribute' path"),
    (lambda: K.KernelProvider({}, priority="high"), "priority is an int"),
])
def test_kernels_and_providers_refuse_malformed_fields(build, message):
    with pytest.raises(eo.EveryOError, match=message):
        build()


def test_an_unknown_kernel_name_is_an_error_naming_it():
    with pytest.raises(eo.EveryOError, match="unknown kernel 'no_such_kernel_t'"):
        K.kernel.no_such_kernel_t


def test_use_restores_the_previous_selection_after_an_error():
    before = K.provider_name()
    with pytest.raises(ZeroDivisionError):
        with K.use("numpy"):
            1 / 0
    assert K.provider_name() == before


def test_kernels_cannot_be_assigned_around_the_registry():
    with pytest.raises(AttributeError, match="selected with everyo.kernels.use"):
        K.kernel.max_pool2d_forward = doubled


def _run(code: str, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=environment, timeout=120)


def test_the_environment_variable_selects_the_references():
    result = _run("import everyo.kernels as K, everyo; print(K.provider_name())",
                  EVERYO_KERNELS="numpy")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "numpy"


def test_an_environment_naming_no_installed_provider_fails_at_the_first_kernel_call():
    result = _run("""
        import everyo as eo, numpy as np
        try:
            eo.kernels.provider_name()
        except eo.EveryOError as error:
            print(error)
    """, EVERYO_KERNELS="numbaa")
    assert result.returncode == 0, result.stderr
    assert "'numbaa'" in result.stdout and "numpy" in result.stdout


def test_everyo_plugins_shows_the_provider_and_what_it_runs():
    listing = subprocess.run([sys.executable, "-m", "everyo", "plugins"], capture_output=True,
                             text=True, timeout=120, env={**os.environ, "EVERYO_KERNELS": "numpy"})
    assert "kernel provider: numpy" in listing.stdout, listing.stdout
    providers = sorted(eo.registry("kernels").providers())
    if not providers:
        return
    chosen = providers[-1]
    listing = subprocess.run([sys.executable, "-m", "everyo", "plugins"], capture_output=True,
                             text=True, timeout=120, env={**os.environ, "EVERYO_KERNELS": chosen})
    covered = [k for k, p in _coverage_under(chosen).items() if p == chosen]
    assert f"kernel provider: {chosen}" in listing.stdout, listing.stdout
    assert f"runs {len(covered)} of " in listing.stdout and covered[0] in listing.stdout


def _coverage_under(provider: str) -> dict:
    with K.use(provider):
        return K.coverage()


def test_import_everyo_imports_no_provider_module_and_a_kernel_call_only_its_own():
    # NOTE: cold start: a provider registers "module:function" paths, so `import everyo` (and
    # listing the kernels) imports neither the provider's modules nor what they need (Numba);
    # the first call of a kernel imports that kernel's module only.
    providers = eo.registry("kernels").providers()
    if "numba" not in providers:
        pytest.skip("everyo-numba is not installed")
    result = _run("""
        import sys
        import everyo as eo, everyo.kernels as K, numpy as np
        loaded = lambda: " ".join(sorted(m for m in sys.modules
                                         if m.split(".")[0] in ("numba", "everyo_numba")))
        K.coverage(), K.fingerprint()
        print(loaded())
        K.kernel.relu_forward(np.float32([-1.0, 2.0]))
        print(loaded())
    """, EVERYO_KERNELS="numba")
    assert result.returncode == 0, result.stderr
    at_import, after_call = result.stdout.splitlines()
    assert at_import == "everyo_numba everyo_numba.plugin", at_import
    modules = set(after_call.split())
    assert "numba" in modules and "everyo_numba.activation" in modules
    assert not {"everyo_numba.norm", "everyo_numba.pool", "everyo_numba.optim"} & modules
