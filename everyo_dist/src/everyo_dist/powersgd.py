"""PowerSGD gradient compression (Vogels, Karimireddy & Jaggi, 2019), as PyTorch's
``powerSGD_hook``: a communication hook for ``DistributedDataParallel.register_comm_hook``.

Each gradient of two or more dimensions is viewed as a matrix ``M`` (``shape[0]`` rows) and
replaced by a rank-``r`` approximation found with one step of power iteration, with error
feedback:

1. ``M += error`` (what earlier steps' approximations left out, this rank's own);
2. ``P = M Q`` on each rank, then ``P`` is summed over the ranks and orthogonalised;
3. ``Q = Mᵀ P`` on each rank, then averaged over the ranks;
4. the result is ``P Qᵀ`` (the same on every rank), and ``error = M - P Qᵀ``.

``Q`` starts from a normal draw seeded by ``random_seed`` and the bucket's index (the same on
every rank) and is reused by the next step (``warm_start``). Only ``P`` and ``Q`` travel:
``(n + m) r`` numbers instead of ``n m``. One-dimensional gradients (biases, norms), and
matrices that would not shrink by ``min_compression_rate``, are averaged exactly in one
all-reduce and take no error feedback. Until ``start_powerSGD_iter`` steps have run, every
bucket is averaged exactly (PyTorch's warm-up).

Bits: everything computed after a reduction (the orthogonalisation and ``P Qᵀ``) uses
element-wise NumPy arithmetic and NumPy's fixed-order sums only, never BLAS, so every rank —
whatever its CPU or BLAS — returns the same bits, and a rerun returns them again.
"""

from __future__ import annotations

import numpy as np

from everyo_dist.errors import DistributedError


def _check_number(name: str, value, minimum, integer: bool):
    kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value >= minimum \
            or not np.isfinite(value):
        kind = "an integer" if integer else "a finite number"
        raise DistributedError(f"PowerSGDState: {name} must be {kind} >= {minimum}, got "
                               f"{value!r}")
    return value


class PowerSGDState:
    """The state of :func:`powerSGD_hook`: options, the step count, and per bucket the error
    and the last ``Q`` (PyTorch's names, meaning and defaults).

    Args:
        group: the process group (``process_group`` in PyTorch, here required).
        matrix_approximation_rank: ``r``; higher is more accurate and sends more.
        start_powerSGD_iter: steps of exact averaging before compression starts.
        min_compression_rate: a matrix is compressed only if ``n m`` exceeds ``(n + m) r``
            times this.
        use_error_feedback: carry what the approximation left out into the next step.
        warm_start: start each step's power iteration from the previous step's ``Q``.
        orthogonalization_epsilon: added to each column norm when orthogonalising (a zero
            column is left zero either way).
        random_seed: seeds the first ``Q`` (the same on every rank).

    Example:
        >>> import everyo as eo
        >>> from everyo.distributed import init
        >>> with init(backend="shm", rank=0, world_size=1) as group:
        ...     PowerSGDState(group, matrix_approximation_rank=2).matrix_approximation_rank
        2
    """

    def __init__(self, group, matrix_approximation_rank: int = 1,
                 start_powerSGD_iter: int = 1_000, min_compression_rate: float = 2,
                 use_error_feedback: bool = True, warm_start: bool = True,
                 orthogonalization_epsilon: float = 0.0, random_seed: int = 0):
        if not callable(getattr(group, "all_reduce_sum", None)):
            raise DistributedError(f"PowerSGDState needs a process group, got "
                                   f"{type(group).__name__}")
        self.process_group = group
        self.matrix_approximation_rank = int(_check_number(
            "matrix_approximation_rank", matrix_approximation_rank, 1, True))
        self.start_powerSGD_iter = int(_check_number(
            "start_powerSGD_iter", start_powerSGD_iter, 0, True))
        self.min_compression_rate = float(_check_number(
            "min_compression_rate", min_compression_rate, 1, False))
        self.orthogonalization_epsilon = float(_check_number(
            "orthogonalization_epsilon", orthogonalization_epsilon, 0, False))
        self.random_seed = int(_check_number("random_seed", random_seed, 0, True))
        self.use_error_feedback, self.warm_start = bool(use_error_feedback), bool(warm_start)
        self.iter = 0
        self.error_dict: dict[int, np.ndarray] = {}
        self.q_memory_dict: dict[int, list] = {}
        self.total_numel_before_compression = 0
        self.total_numel_after_compression = 0

    def maybe_increase_iter(self, bucket) -> None:
        """Count a step once its last bucket is through."""
        if bucket.is_last():
            self.iter += 1

    def compression_stats(self) -> tuple[float, int, int]:
        """``(rate, numbers before, numbers after)`` over the compressed steps so far."""
        after = self.total_numel_after_compression
        before = self.total_numel_before_compression
        return (before / after if after else 0.0, before, after)


def _compute_dtype(dtype: np.dtype, index: int) -> np.dtype:
    if dtype.kind != "f" and dtype.name != "bfloat16":
        raise DistributedError(f"powerSGD_hook: bucket {index} holds {dtype} gradients, which "
                               f"it cannot factor (floating gradients only)")
    return np.dtype(np.float64 if dtype == np.float64 else np.float32)


def _split(state: PowerSGDState, bucket) -> tuple[list, list]:
    """(matrices to compress, as (view, n, m, r)), (gradients averaged exactly, as (view,
    offset in the buffer))."""
    matrices, exact = [], []
    for grad, start in zip(bucket.gradients(), bucket.offsets()):
        if grad.ndim >= 2 and grad.size:
            n = grad.shape[0]
            m = grad.size // n
            r = min(n, m, state.matrix_approximation_rank)
            if n * m > (n + m) * r * state.min_compression_rate:
                matrices.append((grad.reshape(n, m), n, m, r))
                continue
        exact.append((grad, start))
    return matrices, exact


def orthogonalize(columns: np.ndarray, epsilon: float) -> np.ndarray:
    """Gram-Schmidt on the rows of ``columns`` (``r`` x ``n``: the columns of P, transposed),
    in place, with element-wise arithmetic and NumPy's fixed-order sums only."""
    for i in range(columns.shape[0]):
        column = columns[i]
        norm = np.sqrt(np.add.reduce(column * column))
        if norm + epsilon > 0:
            column /= norm + epsilon
        for j in range(i + 1, columns.shape[0]):
            columns[j] -= np.add.reduce(column * columns[j]) * column
    return columns


def _initial_q(state: PowerSGDState, index: int, matrices: list, dtype) -> list:
    rng = np.random.default_rng([state.random_seed, index, state.iter])
    return [orthogonalize(rng.standard_normal((r, m)), 0.0).astype(dtype)
            for _, _, m, r in matrices]


def _flat(parts: list, dtype) -> np.ndarray:
    return np.concatenate([np.ravel(p) for p in parts]).astype(dtype, copy=False) if parts \
        else np.zeros(0, dtype)


def _unflatten(flat: np.ndarray, shapes: list) -> list:
    out, offset = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        out.append(flat[offset:offset + size].reshape(shape))
        offset += size
    return out


def _approximate(state: PowerSGDState, index: int, matrices: list, dtype) -> list:
    """The rank-r approximations of the ranks' mean of ``matrices`` (two all-reduces)."""
    group = state.process_group
    qs = state.q_memory_dict.get(index) if state.warm_start else None
    if qs is None or [q.shape for q in qs] != [(r, m) for _, _, m, r in matrices]:
        qs = _initial_q(state, index, matrices, dtype)
    ms = [matrix.astype(dtype, copy=False) for matrix, _, _, _ in matrices]
    ps = [m @ q.T for m, q in zip(ms, qs)]  # (n, r) each
    flat_p = group.all_reduce_sum(_flat(ps, dtype))
    pts = [orthogonalize(p.T.copy(), state.orthogonalization_epsilon)
           for p in _unflatten(flat_p, [p.shape for p in ps])]  # (r, n) each
    new_qs = [(m.T @ pt.T).T.copy() for m, pt in zip(ms, pts)]  # (r, m) each
    flat_q = group.all_reduce_mean(_flat(new_qs, dtype))
    qs = _unflatten(flat_q, [q.shape for q in new_qs])
    state.q_memory_dict[index] = [q.copy() for q in qs]
    state.total_numel_after_compression += flat_p.size + flat_q.size
    results = []
    for pt, q in zip(pts, qs):
        product = np.multiply.outer(pt[0], q[0])
        for k in range(1, pt.shape[0]):
            product += np.multiply.outer(pt[k], q[k])
        results.append(product)
    return results


def powerSGD_hook(state: PowerSGDState, bucket) -> np.ndarray:
    """PyTorch's ``powerSGD_hook``: the bucket's mean over the ranks, with each large enough
    matrix replaced by a rank-``state.matrix_approximation_rank`` approximation (see the
    module's docstring). Register it with ``ddp.register_comm_hook(state, powerSGD_hook)``."""
    if not isinstance(state, PowerSGDState):
        raise DistributedError(f"powerSGD_hook: its state must be a PowerSGDState, got "
                               f"{type(state).__name__}")
    group, buffer, index = state.process_group, bucket.buffer(), bucket.index()
    dtype = _compute_dtype(buffer.dtype, index)
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return group.all_reduce_mean(buffer)
    error = state.error_dict.get(index)
    if state.use_error_feedback and error is not None and error.shape == buffer.shape:
        buffer += error
    matrices, exact = _split(state, bucket)
    state.total_numel_before_compression += buffer.size
    state.total_numel_after_compression += sum(g.size for g, _ in exact)
    if exact:
        grads = [g for g, _ in exact]
        averaged = group.all_reduce_mean(_flat(grads, buffer.dtype))
        for grad, values in zip(grads, _unflatten(averaged, [g.shape for g in grads])):
            grad[...] = values
    if matrices:
        wanted = buffer.copy() if state.use_error_feedback else None
        for (matrix, _, _, _), result in zip(matrices, _approximate(state, index, matrices,
                                                                    dtype)):
            matrix[...] = result
        if wanted is not None:
            # NOTE: what the approximation left out; the exactly averaged gradients keep none
            error = wanted - buffer
            for grad, start in exact:
                error[start:start + grad.size] = 0
            state.error_dict[index] = error
    state.maybe_increase_iter(bucket)
    return buffer
