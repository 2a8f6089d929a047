"""Train a small CNN on the 8x8 digits, export it to ONNX, and check ONNX Runtime agrees.

The model (two 3x3 convolutions with batch norm, max and average pooling, dropout, a linear
classifier) trains for a few epochs on scikit-learn's bundled digits, so its batch-norm running
statistics are real ones. It is exported with ``input_shape=(1, 8, 8, 1)`` and then run through
ONNX Runtime on the whole held-out set at once (a batch size the export never saw). The script
prints what this run measured: the test accuracy, the largest absolute difference between
EveryO's logits and ONNX Runtime's, and whether every prediction matches.

Run:  python examples/onnx_export.py [--quick] [--epochs N] [--out model.onnx]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

import everyo as eo


def load_digits(seed: int = 0):
    """Digits as NHWC float32 in [0, 1], split 80/20 into train and test."""
    from sklearn.datasets import load_digits as sklearn_digits

    data = sklearn_digits()
    x = (data.images / 16.0).astype(np.float32)[..., None]
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    split = int(0.8 * len(x))
    return (x[order[:split]], y[order[:split]]), (x[order[split:]], y[order[split:]])


def digits_cnn() -> eo.Sequential:
    return eo.Sequential(
        eo.Conv2D(1, 16, 3, padding="same", seed=0), eo.BatchNorm2D(16), eo.ReLU(),
        eo.MaxPool2D(2),                                          # 8x8 -> 4x4
        eo.Conv2D(16, 32, 3, padding="same", seed=1), eo.BatchNorm2D(32), eo.ReLU(),
        eo.AvgPool2D(2),                                          # 4x4 -> 2x2
        eo.Flatten(), eo.Dropout(0.2, seed=0), eo.Linear(128, 10, seed=2),
    )


def train(model, x, y, epochs: int, batch_size: int = 64, seed: int = 0) -> float:
    """Adam on cross-entropy; returns the last mini-batch loss."""
    optimizer = eo.Adam(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(seed)
    model.train()
    loss = None
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), batch_size):
            index = order[start:start + batch_size]
            loss = eo.cross_entropy(model(eo.tensor(x[index])), y[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return float(loss.data)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two epochs (for CI)")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--out", default=None, help="where to write the .onnx file")
    args = parser.parse_args(argv)
    epochs = args.epochs if args.epochs is not None else (2 if args.quick else 8)

    (x_train, y_train), (x_test, y_test) = load_digits()
    model = digits_cnn()
    loss = train(model, x_train, y_train, epochs)
    model.eval()
    with eo.no_grad():
        logits = np.asarray(model(eo.tensor(x_test)).data)
    accuracy = float((logits.argmax(axis=1) == y_test).mean())
    print(f"trained {epochs} epoch(s): last loss {loss:.4f}, test accuracy {accuracy:.3f} "
          f"on {len(x_test)} images")

    if args.out:
        export_and_compare(model, args.out, x_test, logits)
    else:
        with tempfile.TemporaryDirectory() as directory:
            export_and_compare(model, os.path.join(directory, "digits_cnn.onnx"), x_test, logits)


def export_and_compare(model, path: str, x_test, logits) -> None:
    """Export (verified), re-run on the test set through ONNX Runtime, print the agreement."""
    eo.export_onnx(model, path, input_shape=(1, 8, 8, 1), output_name="logits", verify=True)
    print(f"exported to {path} ({os.path.getsize(path)} bytes)")
    onnx_logits = eo.run_onnx(path, x_test)  # one batch of len(x_test), not the exported 1
    difference = float(np.abs(onnx_logits - logits).max())
    same = bool((onnx_logits.argmax(axis=1) == logits.argmax(axis=1)).all())
    print(f"ONNX Runtime vs EveryO on {len(x_test)} test images: "
          f"max abs difference {difference:.2e}")
    print(f"every prediction matches: {same}")


if __name__ == "__main__":
    main()
