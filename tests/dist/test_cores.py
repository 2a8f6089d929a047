"""``available_workers``: CPU affinity and cgroup quotas (v1 and v2, read from fake trees)."""

from __future__ import annotations

import os

import pytest

from everyo.distributed import available_workers
from everyo_dist import cores


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota_of_our_cgroup_or_an_ancestor(tmp_path):
    _write(tmp_path / "proc_cgroup", "0::/job/step\n")
    _write(tmp_path / "fs" / "job" / "step" / "cpu.max", "max 100000\n")
    _write(tmp_path / "fs" / "job" / "cpu.max", "150000 100000\n")
    assert cores.cgroup_cpu_limit(tmp_path / "fs", tmp_path / "proc_cgroup") == 1.5


def test_cgroup_v2_unlimited(tmp_path):
    _write(tmp_path / "proc_cgroup", "0::/\n")
    _write(tmp_path / "fs" / "cpu.max", "max 100000\n")
    assert cores.cgroup_cpu_limit(tmp_path / "fs", tmp_path / "proc_cgroup") is None


def test_cgroup_v1_quota(tmp_path):
    _write(tmp_path / "proc_cgroup", "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n")
    _write(tmp_path / "fs" / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "250000\n")
    _write(tmp_path / "fs" / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_period_us", "100000\n")
    assert cores.cgroup_cpu_limit(tmp_path / "fs", tmp_path / "proc_cgroup") == 2.5


def test_cgroup_v1_unlimited_container_view(tmp_path):
    """Inside a container the cgroup is mounted at the root while /proc names the host path."""
    _write(tmp_path / "proc_cgroup", "1:cpu:/docker/abc\n")
    _write(tmp_path / "fs" / "cpu" / "cpu.cfs_quota_us", "-1\n")
    _write(tmp_path / "fs" / "cpu" / "cpu.cfs_period_us", "100000\n")
    assert cores.cgroup_cpu_limit(tmp_path / "fs", tmp_path / "proc_cgroup") is None


def test_quota_caps_affinity_rounding_up(monkeypatch):
    monkeypatch.setattr(cores, "_affinity_count", lambda: 8)
    monkeypatch.setattr(cores, "cgroup_cpu_limit", lambda: 2.5)
    assert available_workers() == 3
    monkeypatch.setattr(cores, "cgroup_cpu_limit", lambda: None)
    assert available_workers() == 8
    monkeypatch.setattr(cores, "cgroup_cpu_limit", lambda: 0.2)
    assert available_workers() == 1


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity API")
def test_this_machine_respects_affinity():
    assert len(os.sched_getaffinity(0)) >= available_workers() >= 1
