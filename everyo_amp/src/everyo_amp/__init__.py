"""everyo-amp: an EveryO plugin distribution (see docs/architecture.md)."""
