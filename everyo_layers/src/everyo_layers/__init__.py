"""everyo-layers: an EveryO plugin distribution (see docs/architecture.md)."""
