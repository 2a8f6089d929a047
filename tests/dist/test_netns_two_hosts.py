"""Two "hosts" as network namespaces joined by a veth pair (10.77.0.1 <-> 10.77.0.2): one
``everyo-run`` node in each trains the documented MLP over the tcp backend, token
required. Needs root and iproute2 (``ip netns``); skips with the reason otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dist_workers import make_data, train_single_process
from tcp_harness import TRAIN_SCRIPT, launcher_environment

EVERYO_RUN = shutil.which("everyo-run", path=str(Path(sys.executable).parent)) or "everyo-run"
IP = shutil.which("ip")
ADDRESSES = ("10.77.0.1", "10.77.0.2")


def _ip(*args):
    return subprocess.run([IP, *args], capture_output=True, text=True, timeout=20)


@pytest.fixture
def two_hosts():
    if IP is None:
        pytest.skip("the `ip` command (iproute2) is not installed")
    if os.geteuid() != 0:
        pytest.skip("creating network namespaces needs root")
    tag = f"eo{os.getpid() % 100000}"
    names = (f"{tag}a", f"{tag}b")
    created = []
    try:
        for name in names:
            done = _ip("netns", "add", name)
            if done.returncode != 0:
                pytest.skip(f"cannot create a network namespace: {done.stderr.strip()}")
            created.append(name)
        steps = [("link", "add", f"{tag}va", "netns", names[0], "type", "veth", "peer", "name",
                  f"{tag}vb", "netns", names[1])]
        for name, address, device in zip(names, ADDRESSES, (f"{tag}va", f"{tag}vb")):
            steps += [("-n", name, "addr", "add", f"{address}/24", "dev", device),
                      ("-n", name, "link", "set", device, "up"),
                      ("-n", name, "link", "set", "lo", "up")]
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                pytest.skip(f"cannot set up the veth pair (`ip {' '.join(step)}`): "
                            f"{done.stderr.strip()}")
        yield names
    finally:
        for name in created:
            _ip("netns", "del", name)
        leftover = _ip("netns", "list").stdout
        assert not any(name in leftover for name in created), "namespaces left behind"


def test_one_rank_per_host_trains_the_spec_mlp(two_hosts, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    token_file = tmp_path / "job.token"
    token_file.write_text(os.urandom(24).hex())
    master = f"{ADDRESSES[0]}:29517"
    nodes = []
    for node_rank, namespace in ((1, two_hosts[1]), (0, two_hosts[0])):
        command = [IP, "netns", "exec", namespace, EVERYO_RUN, "--nnodes", "2", "--node-rank",
                   str(node_rank), "--master", master, "--token-file", str(token_file),
                   "--nproc-per-node", "1", "--timeout", "60", str(script), str(tmp_path)]
        nodes.append(subprocess.Popen(command, env=launcher_environment(), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    try:
        outputs = [node.communicate(timeout=90) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert [node.returncode for node in nodes] == [0, 0], outputs
    reference = train_single_process(*make_data())
    results = [np.load(tmp_path / f"rank{rank}.npz") for rank in range(2)]
    for index, expected in enumerate(reference):
        for result in results:
            np.testing.assert_allclose(result[f"arr_{index}"], expected, atol=1e-5, rtol=0)
        assert results[0][f"arr_{index}"].tobytes() == results[1][f"arr_{index}"].tobytes()


SERVER_CODE = """
import sys, time
from everyo.distributed_tcp import TCPRendezvousServer
try:
    TCPRendezvousServer("10.77.0.1", 29518, world_size=2)
except Exception as exc:
    print("tokenless:", type(exc).__name__, exc, flush=True)
with TCPRendezvousServer("10.77.0.1", 29518, world_size=2, token="the-real-token") as server:
    print("serving", flush=True)
    deadline = time.monotonic() + 30
    while not server.refusals and time.monotonic() < deadline:
        time.sleep(0.05)
    print("refusals:", server.refusals, flush=True)
"""

CLIENT_CODE = """
from everyo.distributed_tcp import init_tcp_process_group
try:
    init_tcp_process_group("10.77.0.1", 29518, rank=0, world_size=2, token="a-guess",
                           timeout=20)
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def test_across_hosts_a_token_is_required_and_a_wrong_one_refused(two_hosts):
    server = subprocess.Popen([IP, "netns", "exec", two_hosts[0], sys.executable, "-c",
                               SERVER_CODE], stdout=subprocess.PIPE, text=True)
    try:
        assert "without a token" in server.stdout.readline()
        assert server.stdout.readline().strip() == "serving"
        client = subprocess.run([IP, "netns", "exec", two_hosts[1], sys.executable, "-c",
                                 CLIENT_CODE], capture_output=True, text=True, timeout=60)
        assert client.stdout.startswith("AuthenticationError"), client.stdout + client.stderr
        assert "refused this process's token" in client.stdout
        refusals = server.communicate(timeout=40)[0]
        assert "10.77.0.2" in refusals and "AuthenticationError" in refusals
    finally:
        server.kill()
        server.wait()
