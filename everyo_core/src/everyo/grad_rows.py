"""Gradients handed over in row blocks: the block plan, and the engine's side of the hand-over.

A large weight gradient takes tens of milliseconds to compute; data-parallel training can send
its first rows while the rest is still being computed. An op (``matmul``) computes such a
gradient in contiguous blocks of rows (slices along the first axis) of one array, in the
order of :func:`row_block_stops`, and its ``backward_parts`` yields ``(operand index,
gradient, stop)`` after each block: rows ``[previous stop, stop)`` are now computed, the last
block has ``stop == len(gradient)``. When the engine finalises that operand (a leaf) inside
the op, :class:`RowBlocks` adds each block into the leaf's ``.grad`` and calls its
rows-ready hooks; otherwise it waits for the last block and takes the gradient whole.

The plan depends on the gradient's shape and dtype only, never on timing, so a consumer
(``DistributedDataParallel``) cuts its buffers at the same rows on every rank.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from everyo import hooks
from everyo.errors import EveryOError
from everyo.versioning import op_name

#: A gradient of at least this many bytes is computed and handed over in row blocks. Below it
#: the whole product takes a few milliseconds at most, less than one block's wire time over
#: 1 Gbit/s, so there is nothing to win and a collective per block to pay.
ROW_BLOCKS_MIN_BYTES = 4 * 1024 * 1024
#: Bytes per block (whole rows, at least one), once the blocks have grown to it: the first
#: block is an eighth of it and each next one twice the previous. The link waits only for the
#: first block (mlp_large's 16 MiB weight gradient: 0.5 ms of a 23 ms product, where a first
#: 2 MiB block took 3 ms), and each block is computed before the link has sent the one before
#: (a block's product takes ~1/6 of its wire time at 1 Gbit/s). The blocked product costs
#: ~1 ms more than one GEMM (the other operand is packed again per block); 512 KiB blocks
#: throughout cost ~6 ms more.
ROW_BLOCK_BYTES = 2 * 1024 * 1024


def row_block_stops(shape: tuple, itemsize: int) -> tuple:
    """Where the row blocks of a gradient of ``shape`` end: ``(rows,)`` for one block.

    Args:
        shape: the gradient's shape (rows are slices along the first axis).
        itemsize: bytes per element.
    Returns:
        Increasing row counts, the last one ``shape[0]``.

    Example:
        >>> row_block_stops((2048, 2048), 4)  # blocks of 32, 64, 128, then 256 rows
        (32, 96, 224, 480, 736, 992, 1248, 1504, 1760, 2016, 2048)
        >>> row_block_stops((100, 10), 4)
        (100,)
    """
    rows = shape[0] if len(shape) else 1
    nbytes = math.prod(shape) * itemsize
    if nbytes < ROW_BLOCKS_MIN_BYTES or rows < 2:
        return (rows,)
    largest = max(1, ROW_BLOCK_BYTES // (nbytes // rows))
    block, stop, stops = max(1, largest // 8), 0, []
    while stop < rows:
        stop = min(stop + block, rows)
        stops.append(stop)
        block = min(2 * block, largest)
    return tuple(stops)


class RowBlocks:
    """The engine's view of one op's row-block parts: checks that the op keeps the protocol
    (one array per operand, blocks in order, finished before the next operand) and, for a leaf
    it finalises early, makes each block final in ``.grad`` and announces it."""

    __slots__ = ("op", "index", "array", "done", "leaf", "fresh")
    index: int | None
    array: np.ndarray | None
    leaf: Any

    def __init__(self, op) -> None:
        self.op, self.index, self.array, self.done = op, None, None, 0
        self.leaf, self.fresh = None, False

    def starts(self, index: int) -> bool:
        """True when this part begins operand ``index``'s blocks (the caller then calls
        :meth:`begin`)."""
        return index != self.index

    def begin(self, index: int, gradient: np.ndarray, leaf) -> None:
        """Operand ``index``'s gradient arrives in blocks of ``gradient``; ``leaf``: the tensor
        to finalise block by block, or None to take the gradient whole at its last block."""
        self.finished()
        self.index, self.array, self.done, self.leaf, self.fresh = index, gradient, 0, leaf, False

    def take(self, gradient: np.ndarray, stop) -> bool:
        """Rows up to ``stop`` of the operand's gradient are computed. Returns True when the
        caller must now handle the whole gradient as an ordinary part (its last block, not
        announced); False when there is nothing more to do for this part."""
        assert self.array is not None  # (begin() came first)
        rows = len(self.array)
        if gradient is not self.array or type(stop) is not int or not self.done < stop <= rows:
            raise EveryOError(
                f"op {op_name(self.op)!r}: backward_parts handed over rows up to {stop!r} of "
                f"operand {self.index}'s gradient after rows up to {self.done} (of {rows}): "
                f"row blocks must come in order, in one array (see docs/autograd.md)")
        start, self.done = self.done, stop
        if self.leaf is None:
            return stop == rows
        leaf = self.leaf
        if leaf.grad is None:  # (the op's own array becomes .grad: no copy)
            leaf.grad, self.fresh = self.array, True
        elif self.fresh and leaf.grad is not self.array:
            # NOTE: a hook rebound .grad (not an in-place write, so allowed) while it was the
            # op's own array: the rows still to come exist only in that array, and the new
            # .grad would keep whatever it copied of the uncomputed ones: removed, as after a
            # hook that raises
            leaf.grad = None
            raise EveryOError(
                f"op {op_name(self.op)!r}: a rows-ready or post-accumulate hook replaced "
                f"param.grad (shape {self.array.shape}) after rows up to {start} of {rows} "
                f"were announced, while the later rows were still being computed into the "
                f"array it replaced; replace .grad only once backward() has returned")
        elif not self.fresh:
            # NOTE: element-wise, so blocks add exactly the bits `grad += gradient` would
            leaf.grad[start:stop] += self.array[start:stop]
        for fn in list(hooks.rows_ready_hooks.get(id(leaf), ())):
            fn(leaf, start, stop)
        if stop == rows:
            hooks.run_post_accumulate_hooks(leaf)
        return False

    def finished(self) -> None:
        """Raise if the current operand's gradient was left without its last rows."""
        if self.array is not None and self.done < len(self.array):
            raise EveryOError(
                f"op {op_name(self.op)!r}: backward_parts handed over rows up to {self.done} "
                f"of operand {self.index}'s gradient, of {len(self.array)}, and then stopped: "
                f"the last block must reach the last row (see docs/autograd.md)")

    def abandon(self) -> None:
        """After an exception: a ``.grad`` this hand-over created with rows still missing is
        removed again (never left half computed). A ``.grad`` that existed keeps the blocks
        already added."""
        leaf = self.leaf
        if self.fresh and leaf is not None and leaf.grad is self.array \
                and self.done < len(self.array):
            leaf.grad = None
