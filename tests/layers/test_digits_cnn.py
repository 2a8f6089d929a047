"""End to end: a small NHWC CNN learns scikit-learn's bundled 8x8 digits to > 95% accuracy."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


@pytest.mark.slow
def test_digits_cnn_reaches_95_percent_test_accuracy():
    datasets = pytest.importorskip("sklearn.datasets", reason="scikit-learn is a test extra")
    digits = datasets.load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]  # (N, 8, 8, 1): NHWC
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(labels))
    train, test = order[:1400], order[1400:]

    model = eo.Sequential(
        eo.Conv2D(1, 16, 3, padding="same", seed=0), eo.BatchNorm2D(16), eo.ReLU(),
        eo.MaxPool2D(2),
        eo.Conv2D(16, 32, 3, padding="same", seed=1), eo.ReLU(), eo.MaxPool2D(2),
        eo.Flatten(), eo.Dropout(0.2, seed=2), eo.Linear(2 * 2 * 32, 10, seed=3))
    optimizer = eo.Adam(list(model.parameters()), lr=3e-3)
    scheduler = eo.StepLR(optimizer, step_size=6, gamma=0.3)
    criterion = eo.CrossEntropyLoss(label_smoothing=0.05)
    loader = eo.DataLoader((images[train], labels[train]), batch_size=64, shuffle=True, seed=0)

    for _ in range(12):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            eo.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
        scheduler.step()

    model.eval()
    with eo.no_grad():
        predictions = model(eo.tensor(images[test])).data.argmax(axis=1)
    accuracy = float(np.mean(predictions == labels[test]))
    assert accuracy > 0.95, f"test accuracy {accuracy:.3f}"
