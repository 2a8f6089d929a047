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
from everyo.validation import expect_state

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
    return {"type": "RNGState", "default": copy.deepcopy(_default.bit_generator.state),
            "modules": modules}


def set_rng_state(state: dict, module=None) -> None:
    """Restore what :func:`get_rng_state` returned (pass the same ``module``).

    Every generator state is checked (by a scratch generator of the same kind) before any
    generator changes.
    """
    owner = "set_rng_state"
    state = expect_state(owner, state, "RNGState", ("default",), ("modules",))
    saved = state.get("modules", {})
    if not isinstance(saved, dict):
        raise EveryOError(f"{owner}: 'modules' must be a dict of generator states")
    owned = {} if module is None else owned_generators(module)
    if module is not None and set(saved) != set(owned):
        raise EveryOError(f"{owner}: the state holds generators for {sorted(map(str, saved))}, "
                          f"the model has {sorted(owned)}")
    if module is None and saved:
        raise EveryOError(f"{owner}: the state holds the generators of a model "
                          f"({sorted(map(str, saved))}); pass that model as module=")
    checked = {path: checked_generator_state(owner, f"modules[{path!r}]", saved[path], g)
               for path, g in owned.items()}
    default = checked_generator_state(owner, "default", state["default"], _default)
    for path, generator in owned.items():
        generator.bit_generator.state = checked[path]
    _default.bit_generator.state = default


def checked_generator_state(owner: str, name: str, state, like: np.random.Generator) -> dict:
    """``state`` (read back from a checkpoint) as a state ``like``'s bit generator takes,
    checked on a scratch generator of the same kind so that ``like`` is left as it is."""
    plain = plain_generator_state(state)
    scratch = type(like.bit_generator)()
    try:
        scratch.state = plain
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as exc:
        raise EveryOError(f"{owner}: {name} is not a {type(like.bit_generator).__name__} "
                          f"generator state ({type(exc).__name__}: {exc})") from None
    return dict(scratch.state)


def plain_generator_state(state):
    """A generator state read back from a checkpoint: dicts, not OrderedDicts or arrays."""
    if isinstance(state, dict):
        return {k: plain_generator_state(v) for k, v in state.items()}
    if isinstance(state, np.ndarray) and state.ndim == 0:
        return state.item()
    return state
