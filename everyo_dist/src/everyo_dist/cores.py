"""``available_workers``: how many CPU cores this process may really use."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _affinity_count() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _own_cgroup_paths(proc_cgroup: Path) -> dict[str, str]:
    """Controller -> path of this process's cgroup ("" is the v2 unified hierarchy)."""
    paths: dict[str, str] = {}
    for line in (_read(proc_cgroup) or "").splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _candidates(root: Path, relative: str) -> list[Path]:
    """Our cgroup directory and its ancestors (a quota anywhere above us applies too); inside a
    container the cgroup is usually mounted at the root, so the root itself is included."""
    found = []
    directory = root / relative.lstrip("/")
    while True:
        found.append(directory)
        if directory == root or root not in directory.parents:
            break
        directory = directory.parent
    if root not in found:
        found.append(root)
    return found


def cgroup_cpu_limit(root: Path = CGROUP_ROOT,
                     proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPU quota (in cores) of this process's cgroup, v2 or v1; None when unlimited."""
    paths = _own_cgroup_paths(proc_cgroup)
    limits = []
    if "" in paths:  # v2: "<quota> <period>" or "max <period>" in cpu.max
        for directory in _candidates(root, paths[""]):
            fields = (_read(directory / "cpu.max") or "").split()
            if len(fields) == 2 and fields[0] != "max" and int(fields[1]) > 0:
                limits.append(int(fields[0]) / int(fields[1]))
    if "cpu" in paths:  # v1: cpu.cfs_quota_us is -1 when unlimited
        for base in (root / "cpu", root / "cpu,cpuacct"):
            for directory in _candidates(base, paths["cpu"]):
                quota = _read(directory / "cpu.cfs_quota_us")
                period = _read(directory / "cpu.cfs_period_us")
                if quota and period and int(quota) > 0 and int(period) > 0:
                    limits.append(int(quota) / int(period))
    return min(limits) if limits else None


def available_workers() -> int:
    """The number of cores this process can use: its CPU affinity, capped by a cgroup CPU quota
    (v1 or v2, as Docker's ``--cpus`` and Kubernetes limits set) rounded up. At least 1.

    Returns:
        A positive integer, a sensible upper bound for ``spawn``'s ``world_size``.

    Example:
        >>> n = available_workers()
        >>> 1 <= n <= (os.cpu_count() or 1)
        True
    """
    count = _affinity_count()
    quota = cgroup_cpu_limit()
    if quota is not None:
        count = min(count, math.ceil(quota))
    return max(1, count)
