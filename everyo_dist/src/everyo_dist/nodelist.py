"""Slurm's compressed host lists (``SLURM_JOB_NODELIST``): ``node[01-04,07]``, ``a1,b[2-3]``,
``gpu-[001-004]``, ``rack[1-2]-node[01-08]``.

A list is hosts separated by top-level commas; a host pattern may hold several bracket groups,
each a comma-separated set of numbers and ``low-high`` ranges whose zero padding is kept
(``[08-10]`` is ``08, 09, 10``). The hosts of a pattern with several groups are every
combination, the last group varying fastest, as Slurm's ``scontrol show hostnames`` lists them.
"""

from __future__ import annotations

import re

from everyo_dist.errors import DistributedError

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
MAX_RANGE = 100_000  # hosts one bracket range may name (Slurm's own clusters stay far below)


def _split_top_level(text: str, where: str) -> list[str]:
    """``text`` cut at the commas outside brackets; unbalanced brackets are refused."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise DistributedError(f"{where}: nested '[' at position {index}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise DistributedError(f"{where}: ']' without '[' at position {index}")
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    if depth:
        raise DistributedError(f"{where}: '[' without ']'")
    parts.append(text[start:])
    if any(not part for part in parts):
        raise DistributedError(f"{where}: an empty host name")
    return parts


def _patterns(nodelist: str, where: str) -> list[str]:
    if not nodelist or nodelist.strip() != nodelist:
        raise DistributedError(f"{where} is not a host list")
    return _split_top_level(nodelist, where)


def _group_values(group: str, where: str) -> list[str]:
    """The numbers of one bracket group's body (``01-03,07`` -> ``01 02 03 07``)."""
    values = []
    for item in group.split(","):
        match = _RANGE.fullmatch(item)
        if match is None:
            raise DistributedError(f"{where}: [{group}] holds {item!r}, which is neither a "
                                   f"number nor a range low-high")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise DistributedError(f"{where}: the range {item!r} in [{group}] runs backwards")
        if int(high) - int(low) >= MAX_RANGE:
            raise DistributedError(f"{where}: the range {item!r} names more than {MAX_RANGE} "
                                   f"hosts")
        width = len(low)
        values.extend(str(number).zfill(width) for number in range(int(low), int(high) + 1))
    return values


def _pattern_pieces(pattern: str, where: str) -> list[list[str]]:
    """A host pattern as its literal pieces and bracket groups, each a list of choices."""
    pieces = []
    for index, piece in enumerate(re.split(r"\[([^\]]*)\]", pattern)):
        pieces.append(_group_values(piece, where) if index % 2 else [piece])
    return pieces


def expand_nodelist(nodelist: str, variable: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Every host of a compressed Slurm host list, in Slurm's order.

    Example:
        >>> expand_nodelist("node[01-03,07],login1")
        ['node01', 'node02', 'node03', 'node07', 'login1']
    """
    where = f"{variable}={nodelist!r}"
    hosts: list[str] = []
    for pattern in _patterns(nodelist, where):
        names = [""]
        for choices in _pattern_pieces(pattern, where):
            names = [name + choice for name in names for choice in choices]
        hosts.extend(names)
    return hosts


def first_host(nodelist: str, variable: str = "SLURM_JOB_NODELIST") -> str:
    """The first host of a compressed Slurm host list (the whole list is checked).

    Example:
        >>> first_host("gpu-[001-004]"), first_host("a1,b[2-3]")
        ('gpu-001', 'a1')
    """
    where = f"{variable}={nodelist!r}"
    patterns = _patterns(nodelist, where)
    for pattern in patterns[1:]:  # checked without expanding: a list may name thousands
        _pattern_pieces(pattern, where)
    return "".join(choices[0] for choices in _pattern_pieces(patterns[0], where))
