"""eo.autocast and eo.GradScaler exist because the everyo-amp plugin registers them."""

from __future__ import annotations

import os
import subprocess
import sys

import everyo as eo
import everyo_amp


def run_without_autoload(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with plugin autoloading switched off.

    A kernel provider named in ``EVERYO_KERNELS`` is a plugin too, so it is not loaded there:
    the child runs the reference kernels, which is all these tests are about."""
    env = {**os.environ, "EVERYO_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("EVERYO_KERNELS", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=60)


def test_public_names_are_the_plugins():
    assert eo.autocast is everyo_amp.autocast
    assert eo.GradScaler is everyo_amp.GradScaler
    assert "autocast" in dir(eo) and "GradScaler" in dir(eo)


def test_without_the_plugin_the_error_says_what_to_do():
    code = (
        "import everyo as eo\n"
        "try:\n"
        "    eo.autocast\n"
        "except AttributeError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
        "print(hasattr(eo, 'GradScaler'))\n"
    )
    result = run_without_autoload(code)
    assert result.returncode == 0, result.stderr
    assert "MissingDistributionError" in result.stdout
    assert "everyo-amp" in result.stdout
    assert result.stdout.strip().endswith("False")


def test_registering_the_plugin_explicitly_provides_the_names():
    code = (
        "import everyo as eo, everyo_amp.plugin\n"
        "eo.register_plugin(everyo_amp.plugin, name='everyo_amp')\n"
        "with eo.autocast():\n"
        "    print((eo.ones(1, 2) @ eo.ones(2, 1)).dtype)\n"
    )
    result = run_without_autoload(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "float16"


def test_the_declared_policy_sees_an_op_registered_while_it_reads_the_registry(monkeypatch):
    """A registration between reading the declarations and caching them (another thread) must
    not leave the policy's cache marked up to date without that op."""
    from everyo_amp import DeclaredPolicy

    class LowerOp(eo.Op):
        __slots__ = ()
        precision = "lower"

        def forward(self, x):
            return x

    class Plugin:
        @eo.hookimpl
        def everyo_register_ops(self, register):
            register("lower_test_op", LowerOp)

    ops = eo.registry("ops")
    read = ops.declared

    def read_then_register(attribute):
        found = read(attribute)
        monkeypatch.setattr(ops, "declared", read)
        eo.register_plugin(Plugin(), name="amp-policy-race-test")
        return found

    policy = DeclaredPolicy()
    monkeypatch.setattr(ops, "declared", read_then_register)
    try:
        assert "lower_test_op" not in policy.ops  # read before the registration landed
        assert "lower_test_op" in policy.ops
    finally:
        eo.unregister_plugin("amp-policy-race-test")
