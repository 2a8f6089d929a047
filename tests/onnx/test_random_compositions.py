"""Property test: random compositions of core ops and convertible layers inside custom forwards
export by tracing and agree with both ONNX consumers at batch 1, 3 and 17."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import everyo as eo
from support.random_pieces import FEATURES, PIECES, Composition, assert_as_accurate_as_the_model

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(sorted(PIECES)), min_size=1, max_size=6))
def test_random_compositions_match_both_consumers(kinds, tmp_path_factory):
    # NOTE: "transpose_matmul" mixes samples across the batch, so its output depends on the
    # batch as a whole; it is still the same graph for every batch size.
    model = Composition(kinds)
    path = tmp_path_factory.mktemp("random") / "m.onnx"
    eo.export_onnx(model, path, input_shape=(2, FEATURES))
    assert_as_accurate_as_the_model(model, path)
