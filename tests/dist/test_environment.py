"""``detect_environment`` on the variables real launchers set, Slurm's compressed host lists,
refusals naming the variables, and ``init()`` with no arguments under a real ``mpiexec``."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from everyo.distributed import detect_environment
from everyo_dist.environment import ClusterEnvironment
from everyo_dist.errors import DistributedError
from everyo_dist.initialize import init, resolve_options
from everyo_dist.nodelist import expand_nodelist, first_host

MPIEXEC = Path(sys.executable).parent / "mpiexec"

# What each launcher sets, copied from real runs (values of a rank in the middle of a job).
TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1", "ROLE_RANK": "3", "MASTER_ADDR": "10.1.0.7",
            "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none",
            "TORCHELASTIC_USE_AGENT_STORE": "False"}
SLURM = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
         "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[01-04,07]",
         "SLURM_STEP_NODELIST": "node[01-04,07]", "SLURM_TASKS_PER_NODE": "2(x4)"}
OPENMPI = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
           "OMPI_COMM_WORLD_NODE_RANK": "1"}
MPICH = {"PMI_RANK": "1", "PMI_SIZE": "2", "PMI_FD": "9", "PMI_HOSTNAME": "vm",
         "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
EVERYO_RUN = {"EVERYO_RANK": "1", "EVERYO_WORLD_SIZE": "2", "EVERYO_LOCAL_RANK": "1",
              "EVERYO_LOCAL_WORLD_SIZE": "2", "EVERYO_MASTER_ADDR": "127.0.0.1",
              "EVERYO_MASTER_PORT": "41234", "EVERYO_BACKEND": "tcp"}


@pytest.mark.parametrize("environ, expected", [
    (EVERYO_RUN, ClusterEnvironment(1, 2, 1, "127.0.0.1", 41234, "everyo-run")),
    (TORCHRUN, ClusterEnvironment(3, 4, 1, "10.1.0.7", 29500, "torchrun")),
    (SLURM, ClusterEnvironment(5, 8, 1, "node01", 29500 + 4242 % 1000, "slurm")),
    (OPENMPI, ClusterEnvironment(2, 4, 0, None, None, "openmpi")),
    (MPICH, ClusterEnvironment(1, 2, 1, None, None, "pmi")),
    ({**OPENMPI, "MASTER_ADDR": "head", "MASTER_PORT": "1234"},
     ClusterEnvironment(2, 4, 0, "head", 1234, "openmpi")),
    ({**SLURM, "MASTER_ADDR": "login2", "MASTER_PORT": "4000"},
     ClusterEnvironment(5, 8, 1, "login2", 4000, "slurm")),
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"},
     ClusterEnvironment(0, 1, None, "localhost", 29500, "torchrun")),
])
def test_each_launcher_is_read_from_its_own_variables(environ, expected):
    assert detect_environment(environ) == expected


@pytest.mark.parametrize("environ, launcher", [
    ({**SLURM, **TORCHRUN}, "torchrun"),  # torchrun inside an srun step
    ({**SLURM, **MPICH}, "pmi"),  # mpiexec inside a Slurm allocation
    ({**SLURM, **TORCHRUN, **EVERYO_RUN}, "everyo-run"),
])
def test_the_innermost_launcher_wins(environ, launcher):
    assert detect_environment(environ).launcher == launcher


def test_under_torchrun_the_port_after_its_agent_store_is_ours():
    environ = {**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert detect_environment(environ).master_port == 29501


def test_no_launcher_is_none():
    assert detect_environment({"HOME": "/root", "PATH": "/bin"}) is None


def test_reads_os_environ_by_default(monkeypatch):
    for variable in list(os.environ):
        if variable.startswith(("EVERYO_", "SLURM_", "OMPI_", "PMI_")) or variable in TORCHRUN:
            monkeypatch.delenv(variable)
    for variable, value in OPENMPI.items():
        monkeypatch.setenv(variable, value)
    assert detect_environment().launcher == "openmpi"


@pytest.mark.parametrize("nodelist, first, hosts", [
    ("node[01-04,07]", "node01", ["node01", "node02", "node03", "node04", "node07"]),
    ("a1,b[2-3]", "a1", ["a1", "b2", "b3"]),
    ("gpu-[001-004]", "gpu-001", ["gpu-001", "gpu-002", "gpu-003", "gpu-004"]),
    ("rack[1-2]-node[08-10]", "rack1-node08",
     ["rack1-node08", "rack1-node09", "rack1-node10", "rack2-node08", "rack2-node09",
      "rack2-node10"]),
    ("login", "login", ["login"]),
    ("cn[7],cn[09-10]", "cn7", ["cn7", "cn09", "cn10"]),
    ("n[0998-1001]", "n0998", ["n0998", "n0999", "n1000", "n1001"]),
])
def test_slurm_node_lists_in_compressed_form(nodelist, first, hosts):
    assert first_host(nodelist) == first
    assert expand_nodelist(nodelist) == hosts
    assert detect_environment({**SLURM, "SLURM_JOB_NODELIST": nodelist}).master_addr == first


@pytest.mark.parametrize("nodelist, message", [
    ("node[01-04", "'\\[' without '\\]'"),
    ("node01]", "'\\]' without '\\['"),
    ("node[[1]]", "nested"),
    ("node[04-01]", "runs backwards"),
    ("node[a-b]", "neither a number nor a range"),
    ("node[]", "neither a number nor a range"),
    ("a,,b", "empty host name"),
    ("a,b[1-3", "without"),  # a broken later host is refused too
    (" node1", "not a host list"),
    ("", "neither SLURM_JOB_NODELIST nor MASTER_ADDR"),
])
def test_malformed_node_lists_are_refused_naming_the_variable(nodelist, message):
    with pytest.raises(DistributedError, match=message) as caught:
        detect_environment({**SLURM, "SLURM_JOB_NODELIST": nodelist})
    assert "SLURM_JOB_NODELIST" in str(caught.value)


@pytest.mark.parametrize("environ, named", [
    ({"RANK": "0"}, ["RANK", "WORLD_SIZE"]),  # partial
    ({"LOCAL_RANK": "0"}, ["LOCAL_RANK", "RANK and WORLD_SIZE"]),
    ({"RANK": "0", "WORLD_SIZE": "2"}, ["MASTER_ADDR and MASTER_PORT"]),
    ({**TORCHRUN, "MASTER_PORT": ""}, ["MASTER_PORT", "MASTER_ADDR"]),
    ({**TORCHRUN, "RANK": "4"}, ["RANK=4", "WORLD_SIZE=4"]),  # inconsistent
    ({**TORCHRUN, "LOCAL_RANK": "2"}, ["LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"]),
    ({**TORCHRUN, "WORLD_SIZE": "four"}, ["WORLD_SIZE='four'"]),
    ({**TORCHRUN, "MASTER_PORT": "70000"}, ["MASTER_PORT='70000'", "0..65535"]),
    ({**TORCHRUN, "RANK": "-1"}, ["RANK='-1'"]),
    # what int() would read but no launcher writes: not silently another rank
    ({**SLURM, "SLURM_PROCID": "1_0"}, ["SLURM_PROCID='1_0'", "not a valid int"]),
    ({**SLURM, "SLURM_NTASKS": "\u0668"}, ["SLURM_NTASKS='\u0668'", "not a valid int"]),
    ({**OPENMPI, "OMPI_COMM_WORLD_RANK": "+2"}, ["OMPI_COMM_WORLD_RANK='+2'"]),
    ({**SLURM, "SLURM_PROCID": "-3"}, ["SLURM_PROCID='-3'", "at least 0"]),
    ({**SLURM, "SLURM_PROCID": "9"}, ["SLURM_PROCID=9", "SLURM_NTASKS=8"]),
    ({**SLURM, "SLURM_JOB_ID": "12x"}, ["SLURM_JOB_ID='12x'"]),
    ({**TORCHRUN, "MASTER_PORT": "0"}, ["MASTER_PORT='0'", "at least 1"]),  # no peer can dial
    ({**OPENMPI, "MASTER_ADDR": "head", "MASTER_PORT": "0"}, ["MASTER_PORT='0'"]),
    ({"SLURM_PROCID": "0"}, ["SLURM_PROCID", "SLURM_NTASKS"]),
    ({**SLURM, "SLURM_PROCID": "8"}, ["SLURM_PROCID=8", "SLURM_NTASKS=8"]),
    ({**SLURM, "SLURM_LOCALID": "6"}, ["SLURM_LOCALID=6", "SLURM_PROCID=5"]),
    ({k: v for k, v in SLURM.items() if "NODELIST" not in k}, ["SLURM_JOB_NODELIST"]),
    ({**SLURM, "MASTER_ADDR": "login2"}, ["MASTER_PORT"]),
    ({"OMPI_COMM_WORLD_RANK": "0"}, ["OMPI_COMM_WORLD_SIZE"]),
    ({**OPENMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "5"}, ["OMPI_COMM_WORLD_LOCAL_SIZE=5"]),
    ({"PMI_SIZE": "2"}, ["PMI_RANK"]),
    ({**MPICH, "PMI_RANK": "2"}, ["PMI_RANK=2", "PMI_SIZE=2"]),
    ({**MPICH, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"},
     ["OMPI_COMM_WORLD_RANK=0", "PMI_RANK=1"]),
    ({"EVERYO_RANK": "0", "EVERYO_WORLD_SIZE": "2", "EVERYO_MASTER_ADDR": "h"},
     ["EVERYO_MASTER_PORT"]),
])
def test_partial_or_inconsistent_environments_are_refused_by_name(environ, named):
    with pytest.raises(DistributedError) as caught:
        detect_environment(environ)
    for text in named:
        assert text in str(caught.value)


def test_init_fills_membership_from_any_launcher_and_tells_rank_0_to_host():
    def tcp_like(rank, world_size, master_addr=None, master_port=None, serve_rendezvous=False):
        pass

    assert resolve_options(tcp_like, {}, {**SLURM, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}) == {
        "rank": 0, "world_size": 8, "master_addr": "node01", "master_port": 29742,
        "serve_rendezvous": True}
    assert resolve_options(tcp_like, {}, SLURM) == {
        "rank": 5, "world_size": 8, "master_addr": "node01", "master_port": 29742}
    # everyo-run hosts the rendezvous itself
    assert "serve_rendezvous" not in resolve_options(tcp_like, {}, {
        **EVERYO_RUN, "EVERYO_RANK": "0", "EVERYO_LOCAL_RANK": "0"})
    # explicit arguments win, and a factory that declares nothing reads nothing
    assert resolve_options(tcp_like, {"rank": 1, "world_size": 2, "master_addr": "a",
                                      "master_port": 1}, {"RANK": "0"})["rank"] == 1
    assert resolve_options(lambda timeout=None: None, {}, {"RANK": "0"}) == {}
    # an explicit option completes an EVERYO_* environment, as each variable did alone
    assert resolve_options(tcp_like, {"rank": 1}, {"EVERYO_WORLD_SIZE": "2"}) == {
        "rank": 1, "world_size": 2}


def test_init_without_a_launcher_says_what_it_looked_for(monkeypatch):
    for variable in list(os.environ):
        if variable.startswith(("EVERYO_", "SLURM_", "OMPI_", "PMI_")) or variable in TORCHRUN:
            monkeypatch.delenv(variable)
    with pytest.raises(DistributedError, match="needs a backend"):
        init()


# -- the whole path under a real mpiexec -------------------------------------------------------
INIT_SCRIPT = """
import sys
import numpy as np, everyo as eo
env = eo.distributed.detect_environment()
with eo.distributed.init(timeout=60) as group:
    total = group.all_reduce_sum(np.float64([group.rank + 1.0]))
    fields = (env.launcher, env.rank, env.world_size, env.local_rank, group.backend, group.rank,
              group.world_size, total[0])
    sys.stdout.write(" ".join(map(str, fields)) + "\\n")  # one write: ranks share the pipe
    sys.stdout.flush()
"""


def _mpiexec(tmp_path, ranks: int, *env_pairs: str) -> list[list[str]]:
    if not MPIEXEC.exists() or shutil.which("hydra_pmi_proxy", path=str(MPIEXEC.parent)) is None:
        pytest.skip("MPICH's mpiexec is not installed in this venv (everyo-dist[mpich])")
    script = tmp_path / "init_script.py"
    script.write_text(INIT_SCRIPT)
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("EVERYO_", "PMI_", "OMPI_", "SLURM_"))}
    command = [str(MPIEXEC), "-n", str(ranks)]
    for pair in env_pairs:
        command += ["-env", *pair.split("=", 1)]
    done = subprocess.run([*command, sys.executable, str(script)], capture_output=True,
                          text=True, timeout=120, env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    return sorted(line.split() for line in done.stdout.splitlines() if line.strip())


def test_init_with_no_arguments_under_mpiexec_uses_the_mpi_backend(tmp_path):
    pytest.importorskip("mpi4py")
    lines = _mpiexec(tmp_path, 3)
    assert lines == [["pmi", str(r), "3", str(r), "mpi", str(r), "3", "6.0"] for r in range(3)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_init_under_mpiexec_with_the_tcp_backend_hosts_the_rendezvous_on_rank_0(tmp_path):
    """No everyo-run: rank 0 hosts the rendezvous at MASTER_ADDR:MASTER_PORT itself."""
    lines = _mpiexec(tmp_path, 2, "EVERYO_BACKEND=tcp", "MASTER_ADDR=127.0.0.1",
                     f"MASTER_PORT={_free_port()}")
    assert lines == [["pmi", str(r), "2", str(r), "tcp", str(r), "2", "3.0"] for r in range(2)]


def test_torchrun_style_processes_meet_through_init(tmp_path):
    """Processes started as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*)."""
    script = tmp_path / "init_script.py"
    script.write_text(INIT_SCRIPT)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("EVERYO_", "PMI_", "OMPI_", "SLURM_"))}
    base.update(WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(_free_port()))
    ranks = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=dict(base, RANK=str(r), LOCAL_RANK=str(r)))
             for r in (1, 0)]  # rank 1 first: it retries until rank 0 hosts the rendezvous
    outputs = [process.communicate(timeout=120) for process in ranks]
    assert all(process.returncode == 0 for process in ranks), [err for _, err in outputs]
    assert sorted(out.split() for out, _ in outputs) == [
        ["torchrun", str(r), "2", str(r), "tcp", str(r), "2", "3.0"] for r in range(2)]


def test_init_under_torch_own_torchrun(tmp_path):
    """torch's torchrun (an optional oracle): its agent holds MASTER_PORT."""
    pytest.importorskip("torch")
    torchrun = Path(sys.executable).parent / "torchrun"
    script = tmp_path / "init_script.py"
    script.write_text(INIT_SCRIPT)
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("EVERYO_", "PMI_", "OMPI_", "SLURM_"))}
    done = subprocess.run([str(torchrun), "--nproc-per-node", "2", str(script)],
                          capture_output=True, text=True, timeout=180, env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = sorted(line.split() for line in done.stdout.splitlines() if line.strip())
    assert lines == [["torchrun", str(r), "2", str(r), "tcp", str(r), "2", "3.0"]
                     for r in range(2)]
