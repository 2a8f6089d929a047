"""Entry point of the everyo-onnx plugin: its hookimpls register what it provides."""
