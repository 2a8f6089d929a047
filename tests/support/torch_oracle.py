"""Run the same computation in EveryO and PyTorch (copied weights) and compare the output, the
input's gradient and every parameter's gradient."""

from __future__ import annotations

import numpy as np

import everyo as eo

TOLERANCE = {"float64": 1e-10, "float32": 2e-5}


def compare_with_torch(torch, ours, reference, inputs, params=(), dtype="float64", tol=None):
    """Check ``ours(*inputs)`` against ``reference(*torch_inputs)`` in ``dtype``.

    Args:
        ours: callable on EveryO tensors (a layer already converted to ``dtype``).
        reference: callable on torch tensors with the same layout as ``inputs``.
        inputs: NumPy arrays; floating ones get gradients compared.
        params: ``(everyo_parameter, torch_tensor_leaf)`` pairs of the same layout.
    """
    tol = TOLERANCE[dtype] if tol is None else tol
    eo_in = [eo.tensor(np.asarray(a, dtype) if np.asarray(a).dtype.kind == "f" else a,
                       requires_grad=np.asarray(a).dtype.kind == "f") for a in inputs]
    t_in = [torch.tensor(np.asarray(a, dtype) if np.asarray(a).dtype.kind == "f" else a,
                         requires_grad=np.asarray(a).dtype.kind == "f") for a in inputs]
    out = ours(*eo_in)
    ref = reference(*t_in)
    scale = max(1.0, float(np.abs(ref.detach().numpy()).max()))
    np.testing.assert_allclose(out.data, ref.detach().numpy(), rtol=tol, atol=tol * scale)
    g = np.random.default_rng(1).standard_normal(out.shape).astype(dtype)
    out.backward(g if out.ndim else np.asarray(g))
    ref.backward(torch.tensor(g))
    for ours_t, ref_t in zip(eo_in, t_in):
        if ref_t.requires_grad:
            expected = ref_t.grad.numpy()
            np.testing.assert_allclose(ours_t.grad, expected, rtol=tol,
                                       atol=tol * max(1.0, float(np.abs(expected).max())))
    for ours_p, ref_p in params:
        expected = ref_p.grad.numpy()
        np.testing.assert_allclose(ours_p.grad, expected, rtol=tol,
                                   atol=tol * max(1.0, float(np.abs(expected).max())))
    return out


def leaf(torch, array, dtype):
    """A torch leaf tensor holding ``array`` in ``dtype``."""
    return torch.tensor(np.ascontiguousarray(array, dtype=dtype), requires_grad=True)


def assert_composite_matches(out, tol=1e-12):
    """The op that produced ``out``, re-expressed by its ``composite``, gives the same values."""
    op = out._ctx
    with eo.no_grad():
        again = op.composite(*op.parents)
    np.testing.assert_allclose(again.data, out.data, rtol=tol, atol=tol)
