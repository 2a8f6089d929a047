"""The first-party distributions: which module holds each one's hooks, and how to install it.

Like pytest's list of default plugins, the core names each first-party distribution's plugin
*module* and nothing of its contents. This table is data; what is derived from it lives with
its user:

- load order: first-party plugins load right after the core, in this table's order, before
  any third-party plugin (``everyo.plugins.ordered_entry_points``);
- install hints: which distribution to install or load when ``eo.<name>`` is missing
  (``everyo.install_hints``).
"""

from __future__ import annotations

from typing import NamedTuple


class FirstParty(NamedTuple):
    """A first-party distribution: the module holding its hooks, and how to install it."""

    plugin: str
    install: str


#: Distribution -> its plugin module and install command, in loading order.
FIRST_PARTY: dict[str, FirstParty] = {
    "everyo-layers": FirstParty("everyo_layers.plugin", "pip install everyo-layers"),
    "everyo-amp": FirstParty("everyo_amp.plugin", "pip install everyo-amp"),
    # NOTE: exporting needs only onnx; running a model (run_onnx, verify=True) needs onnxruntime,
    # which the [runtime] extra adds.
    "everyo-onnx": FirstParty("everyo_onnx.plugin", "pip install everyo-onnx; to run models "
                              "too: pip install 'everyo-onnx[runtime]'"),
    "everyo-dist": FirstParty("everyo_dist.plugin", "pip install everyo-dist"),
}
