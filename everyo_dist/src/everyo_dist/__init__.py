"""everyo-dist: an EveryO plugin distribution (see docs/architecture.md)."""
