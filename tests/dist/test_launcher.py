"""``everyo-run``: one-machine and two-"node" jobs to completion with rank-prefixed output,
and a failing rank tearing the whole job down with a non-zero exit naming it."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from dist_workers import make_data, train_single_process
from tcp_harness import TRAIN_SCRIPT, launcher_environment, make_test_certificates

HERE = Path(__file__).resolve().parent
EVERYO_RUN = shutil.which("everyo-run", path=str(Path(sys.executable).parent)) or "everyo-run"

FAILING_SCRIPT = """
import os, sys, time
import numpy as np
import pytest
import everyo.distributed as dist

group = dist.init()
group.barrier()
if group.rank == int(sys.argv[1]):
    print("failing now", flush=True)
    sys.exit(7)
if sys.argv[2] == "collective":
    group.all_reduce_mean(np.ones(8, np.float32))
time.sleep(120)
"""


def _run(args, timeout=90, env=None):
    started = time.monotonic()
    done = subprocess.run([EVERYO_RUN, *map(str, args)], env=env or launcher_environment(),
                          capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - started


def _check_training(outdir, world_size):
    reference = train_single_process(*make_data())
    results = [np.load(Path(outdir) / f"rank{rank}.npz") for rank in range(world_size)]
    for index, expected in enumerate(reference):
        for result in results:
            np.testing.assert_allclose(result[f"arr_{index}"], expected, atol=1e-5, rtol=0)
            assert result[f"arr_{index}"].tobytes() == results[0][f"arr_{index}"].tobytes()


def test_two_ranks_train_to_completion_with_prefixed_output(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    done, _ = _run(["--nproc-per-node", 2, script, tmp_path, "--extra", "x"])
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert all(re.match(r"\[rank [01]\] ", line) for line in lines), lines
    for rank in (0, 1):
        assert f"[rank {rank}] threads 1 backend tcp world 2 args ['{tmp_path}', '--extra', " \
               f"'x']" in lines
        assert f"[rank {rank}] done" in lines
    _check_training(tmp_path, 2)


def test_tls_from_the_environment_covers_the_launchers_server_too(tmp_path):
    files = make_test_certificates(tmp_path)
    env = dict(launcher_environment(), EVERYO_TLS_CERT=files["node.pem"],
               EVERYO_TLS_KEY=files["node.key"], EVERYO_TLS_CA=files["ca.pem"])
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    done, _ = _run(["--nproc-per-node", 2, script, tmp_path], env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    _check_training(tmp_path, 2)


def two_node_options(tmp_path, nproc_per_node: int) -> list:
    """``everyo-run`` options of a two-node job on loopback: a token file in ``tmp_path`` and
    a free port for the master (add ``--node-rank``, the script and its arguments)."""
    token_file = tmp_path / "job.token"
    token_file.write_text("0123456789abcdef0123456789abcdef\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return ["--nnodes", 2, "--master", f"127.0.0.1:{port}", "--token-file", token_file,
            "--nproc-per-node", nproc_per_node]


def test_two_nodes_on_loopback_with_a_token_file(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    common = two_node_options(tmp_path, nproc_per_node=1)
    nodes = [subprocess.Popen([EVERYO_RUN, *map(str, common), "--node-rank", str(k), script,
                               tmp_path], env=launcher_environment(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in (1, 0)]
    outputs = [node.communicate(timeout=90) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert "[rank 1] done" in outputs[0][0] and "[rank 0] done" in outputs[1][0]
    _check_training(tmp_path, 2)


def test_a_failing_rank_stops_the_job_and_is_named(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(FAILING_SCRIPT)
    for waiting_in in ("collective", "sleep"):  # the survivor is blocked either way
        done, elapsed = _run(["--nproc-per-node", 2, script, 1, waiting_in], timeout=60)
        assert done.returncode == 7, done.stdout + done.stderr
        assert "rank 1 exited with code 7" in done.stderr
        assert "[rank 1] failing now" in done.stdout
        assert elapsed < 30


def test_several_nodes_require_a_master_and_a_token_file(tmp_path):
    done, _ = _run(["--nnodes", 2, "--node-rank", 0, tmp_path / "x.py"], timeout=30)
    assert done.returncode == 2
    assert "--master" in done.stderr and "--token-file" in done.stderr


def test_a_master_port_outside_1_to_65535_is_refused(tmp_path):
    # (the resolver would take 99999 as 34463)
    done, _ = _run(["--master", "127.0.0.1:99999", tmp_path / "x.py"], timeout=30)
    assert done.returncode == 2 and "port in 1..65535" in done.stderr, done.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "1e9"])
def test_a_timeout_that_is_not_a_positive_number_of_seconds_is_refused_before_any_rank(
        tmp_path, value):
    """Not started, failed and restarted by --max-restarts: refused once, naming --timeout."""
    script = tmp_path / "started.py"
    marker = tmp_path / "started"
    script.write_text(f"open({str(marker)!r}, 'a').write('x')\n")
    done, _ = _run(["--timeout", value, "--max-restarts", 2, script], timeout=30)
    assert done.returncode == 2, done.stderr
    assert "--timeout" in done.stderr and "positive number of seconds" in done.stderr
    assert "Traceback" not in done.stderr and not marker.exists()


def test_a_master_port_in_use_is_one_line_naming_it_not_a_traceback(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        done, _ = _run(["--master", f"127.0.0.1:{port}", tmp_path / "x.py"], timeout=30)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, \
        done.stderr
    assert done.stderr.startswith(f"everyo-run: cannot listen on 127.0.0.1:{port}:"), done.stderr


def test_terminating_the_launcher_stops_every_rank(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import os, sys, time\nimport everyo.distributed as dist\n"
                      "group = dist.init()\n"
                      "tmp = os.path.join(sys.argv[1], f'{group.rank}.tmp')\n"
                      "open(tmp, 'w').write(str(os.getpid()))\n"
                      # NOTE: renamed into place, so the test never reads a half-written file
                      "os.replace(tmp, os.path.join(sys.argv[1], f'{group.rank}.pid'))\n"
                      "time.sleep(120)\n")
    launcher = subprocess.Popen([EVERYO_RUN, "--nproc-per-node", "2", str(script),
                                 str(tmp_path)], env=launcher_environment(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [int(path.read_text()) for path in tmp_path.glob("*.pid")]
    assert len(pids) == 2
    launcher.terminate()
    _, stderr = launcher.communicate(timeout=20)
    assert launcher.returncode == 130 and "stopping every rank" in stderr
    for pid in pids:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"rank process {pid} outlived the launcher")
