"""The ``tcp_hierarchical`` backend: every all-reduce equals the canonical reduction (float64,
rank order: what shm and the reference compute) bit for bit, for sums and means, float32 and
float64, odd lengths and uneven machines; a killed rank fails the job quickly and leaves no
shared memory; ``everyo-run`` drives it across two "nodes" on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import numpy as np
import pytest
from hier_harness import CASES, TOKEN, rank_data, start_ranks
from tcp_harness import launcher_environment, make_test_certificates
from test_launcher import EVERYO_RUN, two_node_options

from everyo_dist.backends.hierarchical.layout import (
    flat_ring_bytes,
    hierarchical_bytes,
    hierarchy_pays,
    machines_of,
)
from everyo_dist.errors import DistributedError
from everyo_dist.reduction import reduce_rows_f64


def _run(mode, local_ranks, outdir, hierarchy="always", timeout=90, flat=False):
    """Run the workers; with ``flat`` they also run every case on a plain tcp ring."""
    from everyo.distributed_tcp import TCPRendezvousServer

    world = len(local_ranks)
    with TCPRendezvousServer(world_size=world, token=TOKEN) as server, \
            TCPRendezvousServer(world_size=world, token=TOKEN) as flat_server:
        procs = start_ranks(mode, local_ranks, server.port, flat_server.port if flat else 0,
                            outdir, hierarchy)
        started = time.monotonic()
        outputs = [proc.communicate(timeout=timeout)[0] for proc in procs]
    return procs, outputs, time.monotonic() - started


# M=2 k=2; one machine of 3 (shared memory only); uneven machines; a machine of one rank
@pytest.mark.parametrize("local_ranks,hierarchy", [
    ([0, 1, 0, 1], "always"), ([0, 1, 2], "auto"), ([0, 1, 2, 0, 1], "always"),
    ([0, 1, 0, 0], "always")])
def test_all_reduce_is_the_canonical_reduction_bit_for_bit(tmp_path, clean_shm, local_ranks,
                                                           hierarchy):
    procs, outputs, _ = _run("reduce", local_ranks, tmp_path, hierarchy, flat=True)
    assert [proc.returncode for proc in procs] == [0] * len(procs), outputs
    world = len(local_ranks)
    results = [np.load(tmp_path / f"rank{rank}.npz") for rank in range(world)]
    for dtype, length, mean in CASES:
        case = f"{dtype}_{length}_{'mean' if mean else 'sum'}"
        expected = reduce_rows_f64([rank_data(r, dtype, length) for r in range(world)], mean,
                                   dtype)
        for rank, result in enumerate(results):
            # the hierarchy, and the flat tcp ring of the same ranks: both the canonical bits
            for key in (f"hier_{case}", f"flat_{case}"):
                assert result[key].dtype == expected.dtype
                assert result[key].tobytes() == expected.tobytes(), (key, rank)


def test_a_killed_rank_fails_every_rank_quickly_and_leaves_no_shared_memory(tmp_path,
                                                                           clean_shm):
    procs, outputs, seconds = _run("kill", [0, 1, 0, 1], tmp_path, timeout=60)
    assert procs[3].returncode == -signal.SIGKILL
    assert [proc.returncode for proc in procs[:3]] == [1, 1, 1], outputs
    assert seconds < 20, f"the survivors took {seconds:.1f}s to fail (timeout is 60s)"
    errors = [(tmp_path / f"rank{rank}.err").read_text() for rank in range(3)]
    assert "rank 3 was lost" in errors[2], errors[2]  # its machine's leader names it
    assert all("PeerLostError" in error for error in errors), errors


def test_a_broken_link_on_the_leaders_ring_names_group_ranks_not_ring_positions(tmp_path,
                                                                              clean_shm):
    # machines {0, 1}, {2}, {3}: ring positions 0, 1, 2 are ranks 0, 2, 3. Rank 3 dies; rank 0
    # said "the link between rank 0 and rank 2 broke. Most likely rank 2's process died"
    # (positions), blaming a rank that was alive
    procs, outputs, _ = _run("kill", [0, 1, 0, 0], tmp_path, timeout=60)
    assert procs[3].returncode == -signal.SIGKILL, outputs
    error = (tmp_path / "rank0.err").read_text().strip().splitlines()[-1]
    assert "rank 3 was lost" in error, error
    assert "between rank 0 (127.0.0.1) and rank 3 (127.0.0.1)" in error, error
    assert "Most likely rank 3's process died" in error and "rank 2" not in error, error


def test_a_leader_dying_before_it_creates_its_machines_segment_fails_the_job_quickly(
        tmp_path, clean_shm):
    procs, outputs, seconds = _run("die_before_segment", [0, 1, 0, 1], tmp_path, timeout=60)
    assert procs[2].returncode == -signal.SIGKILL
    assert [proc.returncode for proc in (procs[0], procs[1], procs[3])] == [1, 1, 1], outputs
    assert seconds < 20, f"the survivors took {seconds:.1f}s to fail (timeout is 60s)"
    waiting = (tmp_path / "rank3.err").read_text()  # rank 3 waited for rank 2's segment
    assert "PeerLostError" in waiting and "rank 2 was lost" in waiting, waiting
    assert "exited before creating it" in waiting, waiting


def test_ranks_passing_different_hierarchy_choices_fail_at_start_up_naming_them(tmp_path):
    procs, outputs, seconds = _run("reduce", [0, 1, 0, 1], tmp_path,
                                   hierarchy="auto,auto,auto,never", timeout=60)
    assert [proc.returncode for proc in procs] == [1, 1, 1, 1], outputs
    assert seconds < 20, f"the ranks took {seconds:.1f}s to fail (timeout is 60s)"
    for rank in range(4):
        error = (tmp_path / f"rank{rank}.err").read_text()
        assert "every rank must pass the same hierarchy=" in error, error
        assert "rank 2: 'auto', rank 3: 'never'" in error, error


@pytest.mark.parametrize("tls", [False, True])
def test_two_nodes_of_two_ranks_under_everyo_run(tmp_path, clean_shm, tls):
    env = launcher_environment()
    if tls:  # the leaders' ring is wrapped like every other connection
        files = make_test_certificates(tmp_path)
        env.update(EVERYO_TLS_CERT=files["node.pem"], EVERYO_TLS_KEY=files["node.key"],
                   EVERYO_TLS_CA=files["ca.pem"])
    script = tmp_path / "reduce.py"
    script.write_text(
        "import sys, numpy as np, everyo.distributed as dist\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "from hier_harness import rank_data\n"
        "group = dist.init()\n"
        "assert group.backend == 'tcp_hierarchical' and group.ranks_on_this_machine == 2\n"
        "import os, ssl\n"
        "leaders = group.transport._leaders  # the leaders' ring, on local rank 0\n"
        "if leaders is not None:\n"
        "    assert isinstance(leaders.to_next, ssl.SSLSocket) == bool(\n"
        "        os.environ.get('EVERYO_TLS_CERT'))\n"
        "out = group.all_reduce_mean(rank_data(group.rank, 'float32', 100003))\n"
        "np.save(f'{sys.argv[1]}/rank{group.rank}.npy', out)\n")
    common = [*two_node_options(tmp_path, nproc_per_node=2), "--backend", "tcp_hierarchical"]
    here = os.path.dirname(__file__)
    nodes = [subprocess.Popen([EVERYO_RUN, *map(str, common), "--node-rank", str(k), script,
                               tmp_path, here], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in (1, 0)]
    outputs = [node.communicate(timeout=90) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    expected = reduce_rows_f64([rank_data(r, "float32", 100003) for r in range(4)], True,
                               "float32")
    for rank in range(4):
        assert np.load(tmp_path / f"rank{rank}.npy").tobytes() == expected.tobytes()


def test_machines_must_be_contiguous_blocks_of_local_ranks():
    assert machines_of([0, 1, 2, 0, 1]) == [range(0, 3), range(3, 5)]
    with pytest.raises(DistributedError, match="contiguous.*rank 3 has local rank 1 but rank 2 has 2"):
        machines_of([0, 1, 2, 1])
    with pytest.raises(DistributedError, match="rank 0 has local rank 1"):
        machines_of([1, 0])


def test_the_hierarchy_is_chosen_only_where_it_sends_fewer_bytes():
    count = 10 ** 7
    # two machines of two float32 ranks: 6 bytes per element on the busiest link against the
    # flat ring's 9 (its rank-order ring: raw rows until a chunk passes rank 0)
    assert hierarchical_bytes(count, [2, 2], 4) == 6 * count
    assert flat_ring_bytes(count, 4, 4) == 9 * count
    assert flat_ring_bytes(count, 8, 4) == 12 * count  # the chain: 8 + 4 bytes per element
    assert hierarchy_pays(count, [2, 2], 4) and hierarchy_pays(count, [3], 8)
    assert hierarchy_pays(count, [4, 4], 4)  # 10 against the chain's 12
    assert hierarchy_pays(count, [2, 2], 8)  # 12 against the chain's 16
    assert not hierarchy_pays(count, [2, 1, 1], 4)  # rows travel several hops: 9.3 against 9
    assert not hierarchy_pays(count, [3, 3], 8)  # float64 rows: 16 against 16


def test_an_unknown_hierarchy_choice_is_refused():
    import everyo.distributed as dist

    with pytest.raises(DistributedError, match="hierarchy must be one of"):
        dist.init(backend="tcp_hierarchical", rank=0, world_size=1, master_addr="127.0.0.1",
                  master_port=1, hierarchy="sometimes")


def test_wire_compression_is_refused_rather_than_ignored():
    import everyo.distributed as dist

    with pytest.raises(DistributedError, match="no wire compression"):
        dist.init(backend="tcp_hierarchical", rank=0, world_size=1, master_addr="127.0.0.1",
                  master_port=1, wire_dtype="float16")


def test_a_leaders_address_from_the_start_up_exchange_is_checked():
    from everyo_dist.backends.hierarchical.group import _leader_address

    def padded(host: bytes):
        return np.frombuffer(host.ljust(64, b"\0"), np.uint8)

    assert _leader_address(2, np.int64([0, 4242, 7, 99]), padded(b"10.0.0.2")) == \
        ("10.0.0.2", 4242)
    for record, host in [([0, 70000, 7, 99], b"10.0.0.2"), ([0, 0, 7, 99], b"10.0.0.2"),
                         ([0, 4242, 7, 99], b"\xff\xfe"), ([0, 4242, 7, 99], b"")]:
        with pytest.raises(DistributedError, match="leader rank 2 sent an invalid address"):
            _leader_address(2, np.int64(record), padded(host))
