"""``TensorDataset`` and ``DataLoader``: mini-batches from arrays.

They live in the core, not in everyo-layers, because every training loop needs them whatever
layers it uses (and everyo-dist's examples shard plain arrays with them).
"""

from __future__ import annotations

import copy

import numpy as np

from everyo.dtypes import is_floating
from everyo.errors import EveryOError
from everyo.random import checked_generator_state, default_generator
from everyo.tensor import Tensor
from everyo.validation import checked_argument, expect_state


class TensorDataset:
    """Rows of one or more equally long arrays; ``dataset[i]`` is a tuple of rows.

    Example:
        >>> import everyo as eo, numpy as np
        >>> ds = eo.TensorDataset(np.zeros((4, 2)), np.arange(4))
        >>> len(ds), int(ds[1][1])
        (4, 1)
    """

    def __init__(self, *arrays):
        if not arrays:
            raise EveryOError("TensorDataset needs at least one array")
        for i, a in enumerate(arrays):
            _refuse_a_dataset_object(a, i)
        self.arrays = tuple(np.asarray(a.data if isinstance(a, Tensor) else a) for a in arrays)
        for i, a in enumerate(self.arrays):
            if a.ndim == 0 or not (a.dtype.kind in "biu" or is_floating(a.dtype)):
                raise EveryOError(f"TensorDataset: array {i} must be an array of numbers with "
                                  f"one row per example, got {type(arrays[i]).__name__} "
                                  f"(dtype {a.dtype}, shape {a.shape})")
        lengths = {len(a) for a in self.arrays}
        if len(lengths) != 1:
            raise EveryOError(f"TensorDataset: arrays have different lengths "
                              f"{[len(a) for a in self.arrays]}")

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, index):
        return tuple(a[index] for a in self.arrays)


def _check_pytorch_loader_options(**options) -> None:
    """PyTorch's ``DataLoader`` options: those about workers checked and accepted (batches
    are slices taken in this process), those that change the batches accepted as None only."""
    checked_argument("DataLoader", "num_workers", options["num_workers"], "non-negative int",
                     EveryOError)
    for name in ("pin_memory", "persistent_workers"):
        checked_argument("DataLoader", name, options[name], "bool", EveryOError)
    if options["prefetch_factor"] is not None:
        checked_argument("DataLoader", "prefetch_factor", options["prefetch_factor"],
                         "positive int", EveryOError)
    checked_argument("DataLoader", "timeout", options["timeout"], "non-negative float",
                     EveryOError)
    if options["worker_init_fn"] is not None and not callable(options["worker_init_fn"]):
        raise EveryOError("DataLoader: worker_init_fn must be a function or None")
    for name in ("sampler", "batch_sampler", "collate_fn", "generator"):
        if options[name] is not None:
            raise EveryOError(f"DataLoader: {name}= is not supported (only None): batches are rows "
                              f"of the dataset's arrays, in order or shuffled with "
                              f"shuffle=True and seed=")


def _refuse_a_dataset_object(value, index: int) -> None:
    """Refuse a map-style dataset (an object with ``__getitem__``, PyTorch's ``Dataset``) where
    an array is expected: NumPy's conversion would read its items until an IndexError, which
    such a dataset need never raise (memory filled without end)."""
    if isinstance(value, (np.ndarray, Tensor, list, tuple, range)) or not hasattr(
            value, "__getitem__") or any(hasattr(value, name) for name in (
                "__array__", "__array_interface__", "__array_struct__")):
        return
    raise EveryOError(f"TensorDataset: array {index} is a {type(value).__name__}, a dataset "
                      f"object, not an array; EveryO's DataLoader batches arrays: gather its "
                      f"items into arrays and pass them (or a TensorDataset of them)")


class DataLoader:
    """Iterate over mini-batches of Tensors.

    Args:
        dataset: a ``TensorDataset``, an array, or a tuple of arrays of equal length.
        batch_size: rows per batch.
        shuffle: reshuffle every epoch: with its own generator seeded by ``seed``, or with
            the global one (``eo.manual_seed``) when ``seed`` is None.
        drop_last: drop the final short batch.
        num_workers, pin_memory, persistent_workers, prefetch_factor, timeout,
            worker_init_fn: PyTorch's, accepted so that its loaders port unchanged: batches
            are sliced from arrays in this process (no workers, nothing to pin), so they
            change nothing. ``sampler``, ``batch_sampler``, ``collate_fn`` and ``generator``
            are accepted as None only (refused by name otherwise: shuffle with
            ``shuffle=``/``seed=``).

    ``state_dict()`` holds the current epoch's order, how many of its batches were taken and
    the loader's own generator, so a run resumed from a checkpoint gets the same batches.

    Example:
        >>> import everyo as eo, numpy as np
        >>> loader = eo.DataLoader((np.arange(10.0), np.arange(10)), batch_size=4)
        >>> [x.shape for x, y in loader]
        [(4,), (4,), (2,)]
    """

    def __init__(self, dataset, batch_size: int = 1, shuffle: bool = False, seed=None,
                 drop_last: bool = False, *, num_workers: int = 0, pin_memory: bool = False,
                 persistent_workers: bool = False, prefetch_factor=None, timeout: float = 0,
                 worker_init_fn=None, sampler=None, batch_sampler=None, collate_fn=None,
                 generator=None):
        _check_pytorch_loader_options(num_workers=num_workers, pin_memory=pin_memory,
                                      persistent_workers=persistent_workers,
                                      prefetch_factor=prefetch_factor, timeout=timeout,
                                      worker_init_fn=worker_init_fn, sampler=sampler,
                                      batch_sampler=batch_sampler, collate_fn=collate_fn,
                                      generator=generator)
        if isinstance(dataset, (tuple, list)):
            dataset = TensorDataset(*dataset)
        elif not isinstance(dataset, TensorDataset):
            dataset = TensorDataset(dataset)
        self.dataset = dataset
        self.batch_size = checked_argument("DataLoader", "batch_size", batch_size,
                                           "positive int", EveryOError)
        self.shuffle = checked_argument("DataLoader", "shuffle", shuffle, "bool", EveryOError)
        self.drop_last = checked_argument("DataLoader", "drop_last", drop_last, "bool",
                                          EveryOError)
        self._rng = None if seed is None else np.random.default_rng(seed)
        self._order: np.ndarray | None = None  # the order of the epoch in progress
        self._position = 0      # batches of it handed out
        self._resume = False    # the next iter() continues a loaded epoch

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        if self._resume and self._order is not None:
            order, start = self._order, self._position
        else:
            n = len(self.dataset)
            rng = self._rng if self._rng is not None else default_generator()
            order, start = (rng.permutation(n) if self.shuffle else np.arange(n)), 0
        self._resume = False
        self._order = order
        for batch in range(start, len(self)):
            self._position = batch + 1
            rows = order[batch * self.batch_size:(batch + 1) * self.batch_size]
            parts = tuple(Tensor(a[rows]) for a in self.dataset.arrays)
            yield parts if len(parts) > 1 else parts[0]

    def state_dict(self) -> dict:
        """Where iteration stands: the epoch in progress and the loader's own generator,
        with the batch size and dataset length the position counts in."""
        in_progress = self._order is not None and self._position < len(self)
        return {"type": "DataLoader", "batch_size": self.batch_size,
                "dataset_length": len(self.dataset),
                "order": np.array(self._order) if in_progress else None,
                "position": self._position if in_progress else 0,
                "generator": None if self._rng is None else copy.deepcopy(
                    self._rng.bit_generator.state)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`: the next ``iter()`` finishes the saved epoch.

        Everything is checked before anything changes: the state must be a DataLoader's,
        saved with this batch size over a dataset of this length, its order a permutation
        of the rows and its generator state one this loader's generator takes.
        """
        owner = "DataLoader.load_state_dict"
        state = expect_state(owner, state, "DataLoader",
                             ("order", "position", "generator", "batch_size", "dataset_length"))
        batch_size = checked_argument(owner, "batch_size", state["batch_size"], "positive int",
                                      EveryOError)
        if batch_size != self.batch_size:
            raise EveryOError(f"{owner}: the state was saved with batch_size {batch_size}, this "
                              f"loader has {self.batch_size}; resuming would repeat or skip rows")
        n = checked_argument(owner, "dataset_length", state["dataset_length"],
                             "non-negative int", EveryOError)
        if n != len(self.dataset):
            raise EveryOError(f"{owner}: the state's dataset has {n} rows, this one "
                              f"{len(self.dataset)}")
        order = self._checked_order(owner, state["order"])
        position = checked_argument(owner, "position", state["position"], "non-negative int",
                                    EveryOError)
        if position > len(self):
            raise EveryOError(f"{owner}: position {position} is past the epoch's {len(self)} "
                              f"batches")
        if (state["generator"] is None) != (self._rng is None):
            raise EveryOError(f"{owner}: the state was saved by a loader "
                              + ("without" if state["generator"] is None else "with")
                              + " its own seed; create this one the same way")
        if self._rng is not None:
            generator = checked_generator_state(owner, "generator", state["generator"],
                                                self._rng)
            self._rng.bit_generator.state = generator
        self._order, self._position, self._resume = order, position, order is not None

    def _checked_order(self, owner: str, order):
        if order is None:
            return None
        order = np.asarray(order)
        n = len(self.dataset)
        if (order.shape != (n,) or order.dtype.kind not in "iu"
                or not np.array_equal(np.sort(order), np.arange(n))):
            raise EveryOError(f"{owner}: order must be a permutation of the dataset's {n} row "
                              f"indices, got an array of dtype {order.dtype} and shape "
                              f"{order.shape}")
        return order
