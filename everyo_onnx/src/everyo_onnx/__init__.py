"""everyo-onnx: an EveryO plugin distribution (see docs/architecture.md)."""
