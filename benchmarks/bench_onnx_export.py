"""Trace-time cost of ``eo.export_onnx``: a 50-layer model (25 residual blocks of LayerNorm,
Linear and a skip add written in a custom forward), exported by tracing.

The exporter traces the forward four times (two sizes, then twice again with symbolic sizes)
and checks the graph with onnx.checker and strict shape inference. The reference measured in
the same run is one forward pass of the same model in EveryO (eval mode, no gradients), so the
ratio is the price of exporting in forward passes. Target: the export under 2 s.

    python benchmarks/bench_onnx_export.py [--quick]
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "tests"))

from _timing import best_of

from support.onnx_models import DeepResidual  # the model the test exports too


def main() -> int:
    import numpy as np

    import everyo as eo

    quick = "--quick" in sys.argv
    model = DeepResidual().eval()
    path = os.path.join(tempfile.mkdtemp(), "deep.onnx")
    export = best_of(lambda: eo.export_onnx(model, path, input_shape=(1, 64)),
                     repeats=3 if quick else 7, warmup=1)
    x = eo.tensor(np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32))

    def forward():
        with eo.no_grad():
            model(x)

    reference = best_of(forward, repeats=7 if quick else 21)
    print("single thread; machine shared with other jobs, so compare ratios, not seconds")
    print(f"{'export_onnx, 50 layers':<28} {export * 1e3:10.1f} ms  forward {reference * 1e3:8.2f}"
          f" ms  {export / reference:7.1f}x a forward pass  (target: export < 2000 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
