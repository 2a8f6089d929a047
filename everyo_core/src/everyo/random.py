"""EveryO's global random generator, and saving/restoring every generator a run depends on.

Like PyTorch, EveryO has one default generator: ``eo.manual_seed(seed)`` seeds it, and what
draws random numbers without a generator of its own uses it (``eo.init`` functions, ``Dropout``
layers created without ``seed=``). ``eo.get_rng_state(model)`` returns its state together with
the state of every generator a module of ``model`` owns (layers created with ``seed=``), keyed
by the module's path; ``eo.set_rng_state(state, model)`` puts them back. With ``DataLoader``'s
own ``state_dict()``, this is what an exactly resumable checkpoint needs.
"""

from __future__ import annotations

import copy

import numpy as np

from everyo.errors import EveryOError

# NOTE: seeded from the OS's entropy, as NumPy's default_rng(): runs differ unless seeded.
_default = np.random.default_rng()


def default_generator() -> np.random.Generator:
    """The global NumPy ``Generator`` that :func:`manual_seed` seeds.

    Example:
        >>> import everyo as eo
        >>> _ = eo.manual_seed(0)
        >>> a = eo.default_generator().random()
        >>> _ = eo.manual_seed(0)
        >>> a == eo.default_generator().random()
        True
    """
    return _default


def manual_seed(seed: int) -> np.random.Generator:
    """Seed the global generator (in place: code holding it sees the new seed).

    Args:
        seed: a non-negative integer.

    Returns:
        The global generator.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise EveryOError(f"manual_seed: the seed must be a non-negative integer, got {seed!r}")
    _default.bit_generator.state = np.random.default_rng(int(seed)).bit_generator.state
    return _default


def resolve_generator(generator) -> np.random.Generator:
    """``generator`` if given (a NumPy ``Generator``), else the global one."""
    if generator is None:
        return _default
    if not isinstance(generator, np.random.Generator):
        raise EveryOError(f"generator must be a numpy.random.Generator (e.g. "
                          f"np.random.default_rng(0)), got {type(generator).__name__}")
    return generator


def owned_generators(module) -> dict:
    """``{path: Generator}`` for every generator held as an attribute by a module of
    ``module`` (e.g. ``Dropout(seed=...)``); a path ends with the attribute's name."""
    found = {}
    for path, sub in module.named_modules():
        for name, value in vars(sub).items():
            if isinstance(value, np.random.Generator) and value is not _default:
                found[f"{path}.{name}" if path else name] = value
    return found


def get_rng_state(module=None) -> dict:
    """The state of the global generator and of the generators ``module``'s layers own.

    Args:
        module: a model whose own generators (layers created with ``seed=``) to include.

    Returns:
        A dict of plain values that :func:`everyo.save` can store.

    Example:
        >>> import everyo as eo
        >>> state = eo.get_rng_state()
        >>> a = eo.default_generator().random()
        >>> eo.set_rng_state(state)
        >>> a == eo.default_generator().random()
        True
    """
    modules = {} if module is None else {
        path: copy.deepcopy(g.bit_generator.state) for path, g in owned_generators(module).items()}
    return {"default": copy.deepcopy(_default.bit_generator.state), "modules": modules}


def set_rng_state(state: dict, module=None) -> None:
    """Restore what :func:`get_rng_state` returned (pass the same ``module``)."""
    if not isinstance(state, dict) or "default" not in state:
        raise EveryOError("set_rng_state: expected the dict eo.get_rng_state() returns")
    saved = dict(state.get("modules", {}))
    if module is not None:
        owned = owned_generators(module)
        if set(saved) != set(owned):
            raise EveryOError(f"set_rng_state: the state holds generators for "
                              f"{sorted(saved)}, the model has {sorted(owned)}")
        for path, generator in owned.items():
            generator.bit_generator.state = plain_generator_state(saved[path])
    elif saved:
        raise EveryOError(f"set_rng_state: the state holds the generators of a model "
                          f"({sorted(saved)}); pass that model as module=")
    _default.bit_generator.state = plain_generator_state(state["default"])


def plain_generator_state(state):
    """A generator state read back from a checkpoint: dicts, not OrderedDicts or arrays."""
    if isinstance(state, dict):
        return {k: plain_generator_state(v) for k, v in state.items()}
    if isinstance(state, np.ndarray) and state.ndim == 0:
        return state.item()
    return state
