"""The shape/dtype/layout table every kernel provider is tested on against the references.

``CASES`` is a list of ``(kernel name, build)`` where ``build(rng)`` returns the kernel's
arguments. Layouts: ``contiguous``, ``strided`` (a non-contiguous view), ``reversed`` (a
negative stride), ``readonly`` (an input not writeable), ``broadcast`` (zero strides), ``empty``
(a zero-length batch), ``swapped`` (non-native byte order). Values include
ties and, where the kernel must carry them, NaN and -inf.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from everyo_layers.norm_kernels import batch_norm_forward, group_norm_forward, layer_norm_forward
from everyo_layers.padding import output_size
from everyo_layers.pool_kernels import max_pool2d_forward
from everyo_layers.recurrent_kernels import lstm_forward_steps

DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16),
          np.dtype(ml_dtypes.bfloat16))
LAYOUTS = ("contiguous", "strided", "reversed", "readonly", "broadcast", "empty")

#: Kernels whose implementations must give the reference's bits.
EXACT = frozenset({"max_pool2d_forward", "max_pool2d_backward", "relu_forward", "sgd_step",
                   "adam_step", "unscale_all_finite", "depthwise_conv2d_forward",
                   "float16_to_float32", "float32_to_float16", "conv2d_columns",
                   "conv2d_transpose_interleave", "conv2d_transpose_phase_rows",
                   "conv_bias_grad", "round_to_float16_values", "round_to_bfloat16_values",
                   "float32_to_bfloat16", "lstm_forward_steps", "lstm_backward_steps"})
#: Kernels that call BLAS (whose bits may depend on the thread count).
USES_BLAS = frozenset({"conv2d_input_grad", "lstm_forward_steps", "lstm_backward_steps"})
#: Arguments that are scratch (contents left open by the contract), by position.
SCRATCH = {"lstm_backward_steps": (7,)}
#: Normwise bound of the others, in units of the output dtype's epsilon (see the test module).
ULPS = {"conv2d_input_grad": 16, "layer_norm_forward": 16, "layer_norm_backward": 16,
        "batch_norm_forward": 16, "batch_norm_backward": 16, "group_norm_forward": 16,
        "group_norm_backward": 16, "depthwise_conv2d_backward": 16}


def layout(array: np.ndarray, how: str) -> np.ndarray:
    """``array`` (batch first) in layout ``how``, with the same values where it has any."""
    if how == "strided":  # every other element of a twice-as-wide array
        wide = np.empty(array.shape[:-1] + (2 * array.shape[-1],), array.dtype)
        wide[..., ::2] = array
        return wide[..., ::2]
    if how == "reversed":  # a negative stride: the last axis read backwards
        return np.ascontiguousarray(array[..., ::-1])[..., ::-1]
    if how == "readonly":  # contiguous, not writeable (np.frombuffer of bytes, a memory map)
        frozen = np.array(array)
        frozen.flags.writeable = False
        return frozen
    if how == "broadcast":  # every sample the same: the batch axis has stride 0
        return np.broadcast_to(array[:1], array.shape)
    if how == "empty":
        return array[:0]
    return np.ascontiguousarray(array)


def values(rng, shape, dtype, specials: bool = False) -> np.ndarray:
    """Values with ties (rounded to tenths) and, with ``specials``, a NaN and a -inf."""
    data = np.round(rng.standard_normal(shape), 1)
    if specials and data.size >= 8:
        flat = data.reshape(-1)
        flat[3], flat[7] = np.nan, -np.inf
    return data.astype(dtype)


POOLS = [((2, 2), (2, 2), ((0, 0), (0, 0))),  # tiled
         ((3, 3), (2, 2), ((1, 1), (1, 1))),
         ((3, 3), (1, 1), ((1, 1), (1, 1))),
         ((2, 3), (1, 2), ((0, 1), (1, 0)))]


def _pool_geometry(shape, pool, stride, pads):
    out_hw = (output_size(shape[1], pool[0], stride[0], 1, pads[0]),
              output_size(shape[2], pool[1], stride[1], 1, pads[1]))
    tiled = (pads == ((0, 0), (0, 0)) and stride == pool
             and shape[1] == out_hw[0] * pool[0] and shape[2] == out_hw[1] * pool[1])
    return out_hw, tiled


def _special_values(rng, shape, dtype):
    return values(rng, shape, dtype, specials=True)


def _plain_values(rng, shape, dtype):
    return values(rng, shape, dtype)


def _pool_forward(pool, stride, pads, dtype, how, make=_special_values):
    """Max pooling's forward on ``make(rng, shape, dtype)`` inputs."""
    def build(rng):
        x = layout(make(rng, (3, 8, 8, 5), dtype), how)
        out_hw, tiled = _pool_geometry(x.shape, pool, stride, pads)
        return x, pool, stride, pads, out_hw, tiled
    return build


def _pool_backward(pool, stride, pads, dtype, how, make=_plain_values):
    """Max pooling's backward, its winners taken on a float32 ``make(rng, shape, float32)``."""
    def build(rng):
        x = make(rng, (3, 8, 8, 5), np.float32)
        out_hw, tiled = _pool_geometry(x.shape, pool, stride, pads)
        _, winner = max_pool2d_forward(x, pool, stride, pads, out_hw, tiled)
        g = layout(values(rng, winner.shape, dtype), how)
        winner = winner[:len(g)]
        return g, winner, (len(g),) + x.shape[1:], pool, stride, pads, out_hw, tiled
    return build


CONVS = [((3, 3), (1, 1), (1, 1), ((1, 1), (1, 1))),
         ((3, 3), (2, 2), (1, 1), ((1, 1), (1, 1))),
         ((2, 2), (1, 1), (2, 2), ((0, 0), (0, 0))),
         ((1, 1), (1, 1), (1, 1), ((0, 0), (0, 0)))]


def _conv_input_grad(kernel, stride, dilation, pads, dtype, how):
    def build(rng):
        n, h, w, cin, cout = 3, 7, 6, 4, 5
        ho = output_size(h, kernel[0], stride[0], dilation[0], pads[0])
        wo = output_size(w, kernel[1], stride[1], dilation[1], pads[1])
        g = layout(values(rng, (n, ho * wo, cout), dtype), how)
        g2 = g.reshape(-1, cout) if how != "strided" else g[:, :, :].reshape(len(g) * ho * wo,
                                                                              cout)
        if how == "strided":  # keep it a view: a column slice of wider rows
            wide = np.zeros((g2.shape[0], 2 * cout), dtype)
            wide[:, ::2] = g2
            g2 = wide[:, ::2]
        w2 = values(rng, (kernel[0] * kernel[1] * cin, cout), dtype)
        return (g2, w2, (len(g), h, w, cin), kernel + (cin, cout), stride, dilation, pads,
                (ho, wo))
    return build


#: (kernel, stride, dilation, outputs per input channel) of the depthwise cases.
DEPTHWISE = [((3, 3), (1, 1), (1, 1), 1), ((3, 3), (2, 2), (1, 1), 1),
             ((2, 3), (1, 2), (2, 1), 1), ((3, 3), (1, 1), (1, 1), 2),
             ((3, 2), (2, 1), (1, 2), 1)]  # (the whole-row loops: a row stride, a dilation)


def _depthwise(kernel, stride, dilation, mult, dtype, how, backward):
    """The padded input in layout ``how``, the weight, and for the backward an output
    gradient. (The op hands the kernels its compute dtype, float32 for 16-bit layers; float16
    operands here check that the provider leaves them to the reference; bfloat16 ones are
    float32, as the op hands them: NumPy's einsum has no bfloat16 loop.)"""
    def build(rng):
        compute, channels = (dtype if dtype.name != "bfloat16" else np.dtype(np.float32)), 4
        xp = layout(values(rng, (3, 9, 8, channels), compute), how)
        w = values(rng, kernel + (1, channels * mult), compute)
        out_hw = tuple(output_size(xp.shape[1 + a], kernel[a], stride[a], dilation[a], (0, 0))
                       for a in (0, 1))
        if not backward:
            return xp, w, stride, dilation, out_hw
        g = layout(values(rng, (len(xp),) + out_hw + (channels * mult,), compute),
                   how if how != "empty" else "contiguous")[:len(xp)]
        return g, xp, w, stride, dilation, out_hw, True, True
    return build


def _norm_input(rng, shape, dtype, how):
    return layout((values(rng, shape, np.float64) * 3 + 10).astype(dtype), how)


def _parameters(rng, shape, affine):
    if not affine:
        return None, None
    return values(rng, shape, np.float32) + 1, values(rng, shape, np.float32)


def _compute(dtype):
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _cast(parameters, dtype):
    return tuple(None if p is None else p.astype(_compute(dtype)) for p in parameters)


def _layer_norm(dtype, how, ndims, affine, backward):
    def build(rng):
        shape = (4, 6, 10)
        x = _norm_input(rng, shape, dtype, how)
        weight, bias = _cast(_parameters(rng, shape[3 - ndims:], affine), dtype)
        if not backward:
            return x, weight, bias, ndims, 1e-5
        _, xhat, inv_std = layer_norm_forward(x, weight, bias, ndims, 1e-5)
        g = layout(values(rng, x.shape, dtype), how if how != "empty" else "contiguous")
        return g, xhat, inv_std, weight, ndims, (True, affine, affine)
    return build


def _batch_norm(dtype, how, affine, backward, training=True):
    def build(rng):
        x = _norm_input(rng, (4, 5, 3, 6), dtype, how)
        weight, bias = _cast(_parameters(rng, (6,), affine), dtype)
        if not backward:
            return x, weight, bias, 1e-5
        _, xhat, inv_std, _, _ = batch_norm_forward(x, weight, bias, 1e-5)
        g = layout(values(rng, x.shape, dtype), how if how != "empty" else "contiguous")
        return g, xhat, inv_std, weight, training, (True, affine, affine)
    return build


def _group_norm(dtype, how, affine, backward):
    def build(rng):
        x = _norm_input(rng, (4, 5, 3, 8), dtype, how)
        weight, bias = _cast(_parameters(rng, (8,), affine), dtype)
        if not backward:
            return x, weight, bias, 4, 1e-5
        _, xhat, inv_std = group_norm_forward(x, weight, bias, 4, 1e-5)
        g = layout(values(rng, x.shape, dtype), how if how != "empty" else "contiguous")
        return g, xhat, inv_std, weight, 4, (True, affine, affine)
    return build


def _lstm_state(rng, dtype, steps=5, batch=3, hidden=4):
    """What LSTMOp hands the time loops: activations to be, the scaled hidden weight, the
    state arrays with the initial states in place."""
    acts = (values(rng, (steps, batch, 4 * hidden), np.float64) * 0.5).astype(dtype)
    w = (values(rng, (hidden, 4 * hidden), np.float64) * 0.3).astype(dtype)
    hs = np.zeros((steps + 2, batch, hidden), dtype)
    cs = np.zeros((steps + 1, batch, hidden), dtype)
    hs[0], cs[0] = values(rng, (batch, hidden), dtype), values(rng, (batch, hidden), dtype)
    return acts, w, hs, cs, np.zeros((steps, batch, hidden), dtype)


def _lstm(dtype, how, backward):
    """``how``: the output gradient's layout (the loops' state arrays are the op's own)."""
    def build(rng):
        acts, w, hs, cs, tanh_c = _lstm_state(rng, dtype, batch=0 if how == "empty" else 3)
        if not backward:
            return acts, w, hs, cs, tanh_c
        lstm_forward_steps(acts, w, hs, cs, tanh_c)
        gt = values(rng, (hs.shape[0] - 1,) + hs.shape[1:], dtype)
        gt = gt if how != "strided" else layout(gt.transpose(1, 0, 2), how).transpose(1, 0, 2)
        if how in ("reversed", "readonly"):
            gt = layout(gt, how)
        if how == "broadcast":
            gt = np.broadcast_to(gt[:1], gt.shape)
        w_t = np.ascontiguousarray(w.T)
        return (gt, acts, cs, tanh_c, w_t, np.array(gt[-1]), np.zeros(acts.shape, dtype),
                np.zeros(tanh_c.shape, dtype))
    return build


def _signed(rng, shape, dtype):
    """Values with ties, +-0.0, NaNs of both signs and both infinities."""
    data = values(rng, shape, np.float64)
    flat = data.reshape(-1)
    if flat.size >= 8:
        flat[:8] = [0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1e-30, -1e-30]
    return data.astype(dtype)


def _relu(dtype, how):
    def build(rng):
        return (layout(_signed(rng, (4, 3, 6), dtype), how),)
    return build


SGD_OPTIONS = [dict(lr=0.1, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0),
               dict(lr=0.05, momentum=0.9, dampening=0.1, nesterov=False, weight_decay=1e-2),
               dict(lr=0.05, momentum=0.9, dampening=0.0, nesterov=True, weight_decay=0.0)]
ADAM_OPTIONS = [dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                     decoupled=False, amsgrad=False),
                dict(lr=3e-3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1,
                     decoupled=True, amsgrad=True),
                dict(lr=3e-3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1,
                     decoupled=False, amsgrad=False)]
_PARAMETER_SHAPES = [(5, 3), (3,), (2, 2, 2), (1,)]


def _group(rng, dtype, how):
    """A parameter group's weights (``how`` "empty": one weight has no elements)."""
    shapes = _PARAMETER_SHAPES + ([(0, 4)] if how == "empty" else [])
    return [values(rng, shape, dtype) for shape in shapes]


def _sgd(dtype, how, options, first):
    def build(rng):
        weights = _group(rng, dtype, how)
        grads = [values(rng, w.shape, dtype) for w in weights]
        if how in ("strided", "reversed", "readonly"):  # one gradient another layout
            grads[0] = layout(grads[0], how)
        buffers = [None if first else values(rng, w.shape, dtype) for w in weights]
        return (weights, grads, buffers, options["lr"], options["momentum"],
                options["dampening"], options["nesterov"], options["weight_decay"])
    return build


def _adam(dtype, how, options, step):
    def build(rng):
        weights = _group(rng, dtype, how)
        grads = [values(rng, w.shape, dtype) for w in weights]
        if how in ("strided", "reversed", "readonly"):
            grads[0] = layout(grads[0], how)
        m = [values(rng, w.shape, dtype) * 0.1 for w in weights]
        v = [np.abs(values(rng, w.shape, dtype)) * 0.1 for w in weights]
        top = [np.abs(values(rng, w.shape, dtype)) * 0.1 for w in weights] \
            if options["amsgrad"] else None
        steps = [step + k for k in range(len(weights))]
        return (weights, grads, m, v, top, steps, options["lr"], options["beta1"],
                options["beta2"], options["eps"], options["weight_decay"],
                options["decoupled"])
    return build


def _unscale(dtype, how, special, inverse):
    """Gradients of a parameter group, one holding ``special`` (None: all finite)."""
    def build(rng):
        grads = [values(rng, w.shape, dtype) * 1e4 for w in _group(rng, dtype, how)]
        if how in ("strided", "reversed"):
            grads[0] = layout(grads[0], how)
        if special is not None:
            grads[1].reshape(-1)[-1] = special
        return grads, inverse
    return build


def _float16_patterns(how, with_nans: bool = True):
    """Every float16 bit pattern (NaNs, infinities, subnormals, both zeros), in a 2-D array;
    without the NaNs (which a provider may leave to the reference), those that are not NaN."""
    def build(rng):
        bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
        if not with_nans:
            bits = bits[~np.isnan(bits.view(np.float16))]
        return (layout(bits.reshape(2, -1), how),)
    return build


def _float16_boundaries():
    """float32 values on and around every float16 rounding boundary: each finite float16
    value, the midpoints between neighbours (ties), one float32 ulp either side of both,
    the overflow threshold (65520) and far beyond, signs both ways."""
    finite = np.arange(1 << 15, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = finite[np.isfinite(finite)].astype(np.float64)
    mids = (finite[:-1] + finite[1:]) / 2
    points = np.concatenate([finite, mids, [65504.0, 65519.99, 65520.0, 65536.0, 1e5, 3e38,
                                            2.0 ** -25, 2.0 ** -26, 1e-45]]).astype(np.float32)
    around = np.concatenate([points, np.nextafter(points, np.float32(np.inf)),
                             np.nextafter(points, np.float32(0))])
    return np.concatenate([around, -around, [np.inf, -np.inf]]).astype(np.float32)


def _float32_to_float16(how, special=None):
    def build(rng):
        x = _float16_boundaries()
        x = x[:x.size // 2 * 2].reshape(2, -1)
        if special is not None:
            x[1, 5] = special
        return (layout(x, how),)
    return build


def _conversion_cases() -> list:
    cases = []
    for how in LAYOUTS:
        cases.append(("float16_to_float32", _float16_patterns(how), f"every-pattern-{how}"))
        cases.append(("float16_to_float32", _float16_patterns(how, with_nans=False),
                      f"every-non-nan-pattern-{how}"))
        cases.append(("float32_to_float16", _float32_to_float16(how),
                      f"boundaries-{how}"))
    for payload in (np.nan, np.float32(np.uint32(0x7F800001).view(np.float32))):
        cases.append(("float32_to_float16", _float32_to_float16("contiguous", payload),
                      f"nan-{np.float32(payload).view(np.uint32):x}"))
    return cases


# -- conv (#25): the window matrix and the transposed convolution's data movements ----------

def _conv_columns(kernel, stride, dilation, pads, channels, dtype, how):
    """An NHWC input in layout ``how`` and a geometry (4 channels: the provider leaves them to
    the reference; 9: its loop runs)."""
    def build(rng):
        x = layout(values(rng, (3, 7, 6, channels), dtype), how)
        out_hw = tuple(output_size(x.shape[1 + a], kernel[a], stride[a], dilation[a], pads[a])
                       for a in (0, 1))
        return x, kernel, stride, dilation, pads, out_hw
    return build


#: (stride, crop, out_hw, phase positions q) of the transposed-convolution cases: "same" 4x4
#: stride 2, "valid" 3x3 stride 2, "same" 3x3 stride 1, and outputs past the phases' reach
#: (PyTorch's output_padding: a zero row and column plus the bias).
TRANSPOSES = [((2, 2), (1, 1), (8, 8), (5, 5)), ((2, 2), (0, 0), (9, 9), (5, 5)),
              ((1, 1), (1, 1), (4, 4), (6, 6)), ((2, 3), (1, 0), (10, 14), (5, 5))]


def _transpose_interleave(stride, crop, out_hw, q, bias, dtype, how):
    """Phases in the op's compute dtype (float32 for the 16-bit formats, whose bias widens into
    them) in layout ``how``, and a bias or None."""
    def build(rng):
        compute = np.dtype(np.float64 if dtype == np.float64 else np.float32)
        phases = layout(values(rng, (3,) + q + (stride[0] * stride[1] * 5,), compute), how)
        return phases, stride, crop, out_hw, values(rng, (5,), dtype) if bias else None
    return build


def _transpose_phase_rows(stride, crop, out_hw, q, dtype, how):
    def build(rng):
        compute = np.dtype(np.float64 if dtype == np.float64 else np.float32)
        return layout(values(rng, (3,) + out_hw + (5,), dtype), how), stride, crop, q, compute
    return build


def _bias_grad(rows, channels, dtype, how):
    """An output gradient's (rows, channels) matrix with ties, NaN, -inf and a -0.0 first row
    entry (which an added 0.0 would turn into +0.0)."""
    def build(rng):
        g2 = values(rng, (rows, channels), dtype, specials=rows * channels >= 8)
        if g2.size:
            g2[0, -1] = -0.0
        return (layout(g2, how),)
    return build


def _conv_movement_cases(dtype, how) -> list:
    cases = [("conv_bias_grad", _bias_grad(rows, channels, dtype, how),
              f"{rows}x{channels}-{dtype.name}-{how}")
             for rows, channels in ((1, 3), (3, 1), (37, 5), (300, 16), (4100, 3))]
    for conv in CONVS:
        for channels in (4, 9):
            cases.append(("conv2d_columns", _conv_columns(*conv, channels, dtype, how),
                          f"k{conv[0]}s{conv[1]}d{conv[2]}c{channels}-{dtype.name}-{how}"))
    for geometry in TRANSPOSES:
        label = f"s{geometry[0]}crop{geometry[1]}out{geometry[2]}-{dtype.name}-{how}"
        for bias in (True, False):
            cases.append(("conv2d_transpose_interleave",
                          _transpose_interleave(*geometry, bias, dtype, how),
                          f"{label}-{'bias' if bias else 'nobias'}"))
        cases.append(("conv2d_transpose_phase_rows", _transpose_phase_rows(*geometry, dtype, how),
                      label))
    return cases


def _rounding_values(name: str):
    """float32 values on and around every rounding boundary of the kernel's 16-bit format."""
    if name == "round_to_float16_values":
        return _float16_boundaries()
    kept = np.arange(1 << 16, dtype=np.uint32) << 16  # every bfloat16 value, as float32 bits
    ties = kept | 0x8000
    bits = np.concatenate([kept, ties, ties + 1, ties - 1, kept + 1, kept - 1])
    finite = bits.view(np.float32)
    return finite[~np.isnan(finite)]


def _rounding(name: str, how: str, special=None):
    """``(x, out)`` of a ``round_to_*_values`` kernel: C-ordered (the contract), read-only,
    empty, or in place (``out`` is ``x``); ``special`` put in one element."""
    def build(rng):
        x = _rounding_values(name)
        x = x[:x.size // 4 * 4].reshape(4, -1)
        # columns shuffled into a fresh C-ordered array (Generator.shuffle(x, axis=1), in place,
        # took 0.1 s a case)
        x = x.take(rng.permutation(x.shape[1]), axis=1)
        if special is not None:
            x[1, 5] = special
        if how == "empty":
            x = x[:0]
        if how == "in-place":
            return x, x
        if how == "readonly":
            x.flags.writeable = False
        return x, np.full(x.shape, np.float32(7.0))
    return build


def _rounding_cases() -> list:
    # (labels without "-contiguous": the contract takes native float32 only, not swapped bytes)
    cases = []
    for name in ("round_to_float16_values", "round_to_bfloat16_values"):
        for how in ("c-order", "readonly", "empty", "in-place"):
            cases.append((name, _rounding(name, how), how))
        for how in ("c-order", "in-place"):
            for payload in (np.nan, np.float32(np.uint32(0xFF800001).view(np.float32)), np.inf):
                cases.append((name, _rounding(name, how, payload),
                              f"{how}-special-{np.float32(payload).view(np.uint32):x}"))
    return cases


def _float32_to_bfloat16(how, special=None):
    def build(rng):
        x = _rounding_values("round_to_bfloat16_values")
        x = x[:x.size // 2 * 2].reshape(2, -1).copy()
        if special is not None:
            x[1, 5] = special
        return (layout(x, how),)
    return build


def _bfloat16_conversion_cases() -> list:
    cases = [("float32_to_bfloat16", _float32_to_bfloat16(how), f"boundaries-{how}")
             for how in LAYOUTS]
    for payload in (np.nan, np.float32(np.uint32(0x7F800001).view(np.float32)),
                    np.float32(np.uint32(0xFFFFFFFF).view(np.float32))):
        cases.append(("float32_to_bfloat16", _float32_to_bfloat16("contiguous", payload),
                      f"nan-{np.float32(payload).view(np.uint32):x}"))
    return cases


def _table() -> list:
    cases = _conversion_cases() + _rounding_cases() + _bfloat16_conversion_cases()
    for dtype in DTYPES:
        for how in LAYOUTS:
            for pool in POOLS:
                cases.append(("max_pool2d_forward", _pool_forward(*pool, dtype, how),
                              f"{pool[0]}s{pool[1]}-{dtype.name}-{how}"))
                cases.append(("max_pool2d_backward", _pool_backward(*pool, dtype, how),
                              f"{pool[0]}s{pool[1]}-{dtype.name}-{how}"))
            for conv in CONVS:
                cases.append(("conv2d_input_grad", _conv_input_grad(*conv, dtype, how),
                              f"k{conv[0]}s{conv[1]}d{conv[2]}-{dtype.name}-{how}"))
            for conv in DEPTHWISE:
                for backward in (False, True):
                    name = f"depthwise_conv2d_{'backward' if backward else 'forward'}"
                    cases.append((name, _depthwise(*conv, dtype, how, backward),
                                  f"k{conv[0]}s{conv[1]}d{conv[2]}m{conv[3]}-{dtype.name}-{how}"))
            for affine in (True, False):
                label = f"{dtype.name}-{how}-{'affine' if affine else 'plain'}"
                for ndims in (1, 2):
                    for backward in (False, True):
                        name = "layer_norm_backward" if backward else "layer_norm_forward"
                        cases.append((name, _layer_norm(dtype, how, ndims, affine, backward),
                                      f"ndims{ndims}-{label}"))
                for backward in (False, True):
                    name = "batch_norm_backward" if backward else "batch_norm_forward"
                    cases.append((name, _batch_norm(dtype, how, affine, backward), label))
                    name = "group_norm_backward" if backward else "group_norm_forward"
                    cases.append((name, _group_norm(dtype, how, affine, backward), label))
                cases.append(("batch_norm_backward",
                              _batch_norm(dtype, how, affine, True, training=False),
                              f"eval-{label}"))
            cases.append(("relu_forward", _relu(dtype, how), f"{dtype.name}-{how}"))
            cases += _conv_movement_cases(dtype, how)
            for k, options in enumerate(SGD_OPTIONS):
                for first in (True, False):
                    cases.append(("sgd_step", _sgd(dtype, how, options, first),
                                  f"{dtype.name}-{how}-options{k}-{'first' if first else 'later'}"))
            for special in (None, np.inf, -np.inf, np.nan, 3e38):
                for inverse in (2.0 ** -16, 1.0):
                    cases.append(("unscale_all_finite", _unscale(dtype, how, special, inverse),
                                  f"{dtype.name}-{how}-{special}-{inverse}"))
            for k, options in enumerate(ADAM_OPTIONS):
                cases.append(("adam_step", _adam(dtype, how, options, step=1 + 5 * k),
                              f"{dtype.name}-{how}-options{k}"))
            for backward in (False, True):
                name = "lstm_backward_steps" if backward else "lstm_forward_steps"
                cases.append((name, _lstm(dtype, how, backward), f"{dtype.name}-{how}"))
    return cases


# -- overhead (#25): log_softmax ---------------------------------------------------------------

ULPS["log_softmax"] = 8
_LOG_SOFTMAX_SHAPES = [(4, 3, 6), (5, 200), (7,), (3, 1)]


def _log_softmax(shape, dtype, how, axis=-1, specials=False):
    def build(rng):
        x = values(rng, shape, np.float64) * 4
        if specials:  # a row with a NaN, a row of -inf, a row with +inf: NaN rows, as 0/0
            rows = x.reshape(-1, shape[-1])
            rows[0, -1], rows[1], rows[2, 0] = np.nan, -np.inf, np.inf
        return layout(x.astype(dtype), how), axis
    return build


def _log_softmax_cases() -> list:
    cases = []
    for dtype in DTYPES[:2]:  # (the ops widen 16-bit input first: the contract's dtypes)
        for how in LAYOUTS:
            for shape in _LOG_SOFTMAX_SHAPES:
                label = f"{'x'.join(map(str, shape))}-{dtype.name}-{how}"
                if how == "empty" and len(shape) == 1:
                    continue  # (an empty reduced axis is outside the contract)
                cases.append(("log_softmax", _log_softmax(shape, dtype, how), label))
                if how != "empty":
                    cases.append(("log_softmax", _log_softmax(shape, dtype, how, axis=0),
                                  f"axis0-{label}"))
            cases.append(("log_softmax", _log_softmax((4, 5), dtype, how, specials=True),
                          f"specials-{dtype.name}-{how}"))
    return cases


def _swap_bytes(arg):
    """``arg`` with every floating array (in lists and tuples too) in non-native byte order:
    the same values, as NumPy loads them from a file written on the other endianness."""
    if isinstance(arg, (list, tuple)):
        return type(arg)(_swap_bytes(a) for a in arg)
    if isinstance(arg, np.ndarray) and arg.dtype.kind == "f":
        return arg.astype(arg.dtype.newbyteorder())
    return arg


def _swapped(build):
    return lambda rng: _swap_bytes(build(rng))


def _with_swapped(cases: list) -> list:
    """Every contiguous case again with its floating arrays in non-native byte order."""
    return cases + [(name, _swapped(build), label.replace("-contiguous", "-swapped"))
                    for name, build, label in cases if "-contiguous" in label]


_ALL = _with_swapped(_table() + _log_softmax_cases())
CASES = [(name, build) for name, build, _ in _ALL]


def case_ids() -> list:
    return [f"{name}-{label}" for name, _, label in _ALL]


# -- dist: the distributed backends' float64 reduction (reduce_rows) ---------------------------
EXACT = EXACT | {"reduce_rows"}  # every backend's results agree bit for bit
_REDUCE_DTYPES = (*DTYPES, np.dtype(np.int32), np.dtype(np.int64))


def _reduce_rows(dtype, how, ranks, divisor, length, in_place=False, out_dtype=None):
    """``ranks`` rows (one in layout ``how``) with ties, signed zeros, NaN, infinities and sums
    past float32's and float16's range, reduced into a fresh ``out`` (or the first row)."""
    def build(rng):
        rows = []
        for rank in range(ranks):
            row = _signed(rng, (length,), np.float64) * (1 + rank)
            if length > 12:
                row[8:12] = [3e38, 6e4, -3e38, 1e308]  # float64 sums still finite (1e308 too)
            rows.append(_integers(rng, length, dtype, row))
        if how == "empty":
            rows = [row[:0] for row in rows]
        else:
            rows[-1] = layout(rows[-1], how)
        out = rows[0] if in_place else np.empty(len(rows[0]), out_dtype or dtype)
        return rows, out, divisor, None
    return build


def _integers(rng, length, dtype, row):
    """``row`` in ``dtype``; for an integer dtype, random integers whose sums may wrap."""
    if dtype.kind not in "iu":
        with np.errstate(over="ignore"):  # (3e38 is inf in float16: on purpose)
            return row.astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min // 2, info.max // 2, length, dtype=dtype, endpoint=True)


def _stacked(rows, out, divisor, scratch):
    return np.stack(rows), out, divisor, scratch


def _reduce_rows_table() -> list:
    cases = []
    for dtype in _REDUCE_DTYPES:
        for how in LAYOUTS:
            for ranks, divisor in ((1, 1), (2, 1), (2, 2), (3, 3), (4, 4), (5, 1)):
                if dtype.kind in "iu" and divisor != 1:
                    continue  # (integers are summed, never averaged: a mean would truncate)
                cases.append(("reduce_rows", _reduce_rows(dtype, how, ranks, divisor, 37),
                              f"{dtype.name}-{how}-ranks{ranks}-divisor{divisor}"))
        for ranks in (2, 3):  # past the compiled loops' blocks; in place, as a backend may do
            divisor = 1 if dtype.kind in "iu" else ranks
            cases.append(("reduce_rows", _reduce_rows(dtype, "contiguous", ranks, divisor, 3001),
                          f"{dtype.name}-contiguous-ranks{ranks}-long"))
            cases.append(("reduce_rows", _reduce_rows(dtype, "contiguous", ranks, divisor, 3001,
                                                      in_place=True),
                          f"{dtype.name}-contiguous-ranks{ranks}-in-place"))
    cases.append(("reduce_rows", _reduce_rows(np.dtype(np.float32), "contiguous", 2, 2, 37,
                                              out_dtype=np.float64),
                  "float32-into-float64-contiguous"))
    for ranks in (2, 3):  # the rows as one 2-D array (the mpi backend receives them so)
        stacked = _reduce_rows(np.dtype(np.float32), "contiguous", ranks, ranks, 37)
        cases.append(("reduce_rows", lambda rng, build=stacked: _stacked(*build(rng)),
                      f"float32-stacked-ranks{ranks}-contiguous"))
    return cases


_ALL += _with_swapped(_reduce_rows_table())
CASES = [(name, build) for name, build, _ in _ALL]


# -- conv3 (#25): the transposed convolution's forward and weight gradient ---------------------
# (one GEMM per group of images in the provider, the sub-pixel phases in the reference: other
# summation orders, so a normwise bound; GEMMs inside, whose bits BLAS decides per thread count)
ULPS["conv2d_transpose_forward"] = 16
ULPS["conv2d_transpose_weight_grad"] = 16
ULPS["conv2d_transpose_input_grad"] = 16
USES_BLAS = USES_BLAS | {"conv2d_transpose_forward", "conv2d_transpose_weight_grad",
                         "conv2d_transpose_input_grad"}

#: (input hw, kernel, stride, crop, out_hw): "same" 4x4 stride 2, "valid" 3x3 stride 2, "same"
#: 3x3 stride 1, an output past the scatter's reach (PyTorch's output_padding), a kernel
#: smaller than the stride (pixels no tap reaches: zeros plus the bias).
TRANSPOSE_CONVS = [((5, 4), (4, 4), (2, 2), (1, 1), (10, 8)),
                   ((4, 5), (3, 3), (2, 2), (0, 0), (9, 11)),
                   ((4, 4), (3, 3), (1, 1), (1, 1), (4, 4)),
                   ((3, 3), (3, 2), (2, 3), (1, 0), (8, 10)),
                   ((3, 4), (1, 1), (2, 2), (0, 0), (6, 8))]


def _transpose_forward(hw, kernel, stride, crop, out_hw, bias, dtype, how):
    """Input and weight in the op's compute dtype (float32 for the 16-bit formats, whose bias
    widens into it), the input in layout ``how``."""
    def build(rng):
        compute = np.dtype(np.float64 if dtype == np.float64 else np.float32)
        x = layout(values(rng, (3,) + hw + (9,), compute), how)
        weight = values(rng, kernel + (5, 9), compute)
        return (x, weight, values(rng, (5,), dtype) if bias else None, stride, crop, out_hw,
                {})
    return build


def _transpose_weight_grad(hw, kernel, stride, crop, out_hw, dtype, how):
    """The forward's input (compute dtype) and an output gradient in ``dtype``, both in layout
    ``how``."""
    def build(rng):
        compute = np.dtype(np.float64 if dtype == np.float64 else np.float32)
        x = layout(values(rng, (3,) + hw + (9,), compute), how)
        g = layout(values(rng, (3,) + out_hw + (5,), dtype), how)
        return x, g, {}, kernel + (5, 9), stride, crop
    return build


def _transpose_input_grad(hw, kernel, stride, crop, out_hw, dtype, how):
    """An output gradient in ``dtype`` and layout ``how``, the weight in the compute dtype."""
    def build(rng):
        compute = np.dtype(np.float64 if dtype == np.float64 else np.float32)
        g = layout(values(rng, (3,) + out_hw + (5,), dtype), how)
        weight = values(rng, kernel + (5, 9), compute)
        return g, weight, {}, (g.shape[0],) + hw + (9,), stride, crop
    return build


def _transpose_cases() -> list:
    cases = []
    for dtype in DTYPES:
        for how in LAYOUTS:
            for geometry in TRANSPOSE_CONVS:
                label = f"k{geometry[1]}s{geometry[2]}out{geometry[4]}-{dtype.name}-{how}"
                for bias in (True, False):
                    cases.append(("conv2d_transpose_forward",
                                  _transpose_forward(*geometry, bias, dtype, how),
                                  f"{label}-{'bias' if bias else 'nobias'}"))
                cases.append(("conv2d_transpose_weight_grad",
                              _transpose_weight_grad(*geometry, dtype, how), label))
                cases.append(("conv2d_transpose_input_grad",
                              _transpose_input_grad(*geometry, dtype, how), label))
    return cases


_ALL += _with_swapped(_transpose_cases())
CASES = [(name, build) for name, build, _ in _ALL]


# -- norm4: max pooling's ties between -0.0 and +0.0 and between NaN payloads ------------------
# (the reference is an np.maximum chain: on a tie it keeps the new value for float32, float64
# and bfloat16 but the running one for float16; of two NaNs it keeps the running one. The
# winner, hence the gradient's routing, is the first strictly greater value either way.)


def _signed_zeros_and_nans(rng, shape, dtype):
    """Mostly +-0.0 (random signs), some negatives, and NaNs of two payloads."""
    choice = rng.integers(0, 6, size=shape)
    data = np.where(choice < 2, 0.0, np.where(choice < 4, -0.0, -1.0)).astype(dtype)
    bits = np.dtype(f"u{data.dtype.itemsize}")
    flat = data.reshape(-1).view(bits)
    quiet = np.array([np.nan], dtype).view(bits)[0]
    flat[5::17], flat[11::23] = quiet, quiet | 1
    return data


def _pool_tie_cases() -> list:
    cases = []
    for dtype in DTYPES:
        for how in ("contiguous", "strided"):
            for pool in POOLS:
                label = f"ties-{pool[0]}s{pool[1]}-{dtype.name}-{how}"
                for name, build in (("max_pool2d_forward", _pool_forward),
                                    ("max_pool2d_backward", _pool_backward)):
                    cases.append((name, build(*pool, dtype, how, _signed_zeros_and_nans), label))
    return cases


_ALL += _pool_tie_cases()
CASES = [(name, build) for name, build, _ in _ALL]
