"""everyo-layers: an EveryO plugin distribution (see docs/architecture.md)."""

# NOTE: load the core (and through it every plugin, this one included) before any submodule:
# importing e.g. ``everyo_layers.linear`` first would otherwise start the core's plugin loading
# while that submodule is half-initialised, and its layers would silently not be registered.
import everyo
