"""Several hosts on one machine (scripts/netns_hosts.sh: network namespaces on a private bridge), integration tier.

- A rollout server on host h2, the trainer on host h1 reaching it by name (http://h2:8000) with the
  shared token on: the run equals the in-process run, also when the server is SIGKILLed mid-run and
  restarted.
- Ray across hosts: head on h1, a worker node on h2, one actor on each (Ray's state API), the run
  equal to the in-process one.
- SLURM with a slurmd per host (scripts/local_slurm.sh start --nodes 2): srun on both nodes,
  scripts/ray_slurm.sbatch over 2 nodes equal to the in-process run, a submitit sweep spread over both.

Teardown must leave no namespace, link, file, daemon or process behind (checked). The hosts are
global, so the tests run one at a time (one xdist group). Needs root and ``ip netns`` (skipped
otherwise; CI runs as root).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness.rundir.schema import read_metrics
from tests.runtime.test_ray_slurm import ray_processes
from tests.runtime.test_service import comparable, stop
from tests.runtime.test_workers import EQUIV_RUN, assert_same_trajectory

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("netns")]  # one test at a time: the hosts are global

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ROOT / "scripts" / "netns_hosts.sh"
LOCAL_SLURM = ROOT / "scripts" / "local_slurm.sh"
BIN = str(Path(sys.executable).parent)  # this environment's harness, ray, python
RUN = ["trainer.prompts_per_step=8", "trainer.eval_every=3", "runtime.threads=1", "seed=1", "rollout.sample_seeds=true"]
TOKEN = "two-hosts-token"
PORT = 8000


def _can_make_hosts() -> str:
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "needs iproute2 (ip) and util-linux (unshare)"
    name = f"harness-probe-{os.getpid()}"  # each test process collects this module: one name each
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"ip netns add failed: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], check=False)
    return ""


REASON = _can_make_hosts()
if REASON and os.environ.get("HARNESS_TEST_HOSTS") == "1":  # CI: these must run
    raise RuntimeError(f"HARNESS_TEST_HOSTS=1 but no hosts can be made here: {REASON}")
if REASON:
    pytest.skip(REASON, allow_module_level=True)


def hosts(*args: str) -> str:
    return subprocess.run([str(HOSTS), *args], check=True, capture_output=True, text=True).stdout


def on_host(k: int, *cmd: str, **popen) -> subprocess.Popen:
    """``cmd`` on host h``k`` (its namespace and hostname), this process's environment passed on."""
    return subprocess.Popen([str(HOSTS), "exec", str(k), *cmd], cwd=ROOT, start_new_session=True, **popen)


def leftovers() -> list[str]:
    """Anything of the hosts' that still exists: namespaces, links, /etc/netns files."""
    found = [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
             if n.startswith("harness-h")]  # fmt: skip
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [line.split(": ")[1].split("@")[0] for line in links.splitlines() if ": hns-" in line]
    found += [str(p) for p in Path("/etc/netns").glob("harness-h*")] if Path("/etc/netns").exists() else []
    return found


def serve_on_h2(log: Path) -> subprocess.Popen:
    """`harness serve` on h2's address, token on; returns once h1 gets an answer from /health."""
    server = on_host(2, sys.executable, "-m", "harness.commands.cli", "serve", "--host", "h2", "--port", str(PORT), "runtime.threads=1",
                     stdout=open(log, "ab"), stderr=subprocess.STDOUT, env={**os.environ, "HARNESS_SERVE_TOKEN": TOKEN})  # fmt: skip
    probe = (f"import urllib.request as u; r = u.Request('http://h2:{PORT}/health', "
             f"headers={{'Authorization': 'Bearer {TOKEN}'}}); print(u.urlopen(r, timeout=2).status)")  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert server.poll() is None, log.read_text()[-3000:]
        answer = subprocess.run([str(HOSTS), "exec", "1", sys.executable, "-c", probe], capture_output=True, text=True)
        if answer.stdout.strip() == "200":
            return server
        time.sleep(1)
    raise AssertionError(f"harness serve on h2 did not answer /health from h1 in 300 s: {log.read_text()[-3000:]}")


def metrics(run_dir: Path) -> list[dict]:
    return read_metrics(run_dir / "metrics.jsonl")  # [] before the run wrote any; a line being written is skipped


def test_a_rollout_server_on_another_host_serves_a_run_that_survives_its_restart(tmp_path):
    """Hosts h1, h2 (and h3, idle). The run on h1 (rollout.server.url=http://h2:8000, token from a file), its
    server SIGKILLed after step 2 of 6 and started again 3 s later: every step once, every metric equal to the
    in-process run. Then `down` with a process still running on h3 (as after a failed test): nothing of
    the hosts is left. One test, so that no other test process changes the hosts meanwhile."""
    hosts("up", "3")
    try:
        sleeper = on_host(3, "sleep", "600")
        (tmp_path / "token").write_text(TOKEN + "\n")
        server = serve_on_h2(tmp_path / "serve.log")
        run_dir = tmp_path / "remote"
        run = on_host(1, sys.executable, "-m", "harness.commands.cli", "run", *RUN, "trainer.steps=6", f"rollout.server.url=http://h2:{PORT}",
                      f"rollout.server.token_file={tmp_path / 'token'}", f"run_dir={run_dir}",
                      stdout=open(tmp_path / "run.log", "wb"), stderr=subprocess.STDOUT)  # fmt: skip
        try:
            while len(metrics(run_dir)) < 3:  # steps 0, 1, 2 logged
                assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
                time.sleep(0.05)
            stop(server)  # SIGKILL: no goodbye
            killed_after = len(metrics(run_dir)) - 1
            time.sleep(3)  # the run is now retrying
            server = serve_on_h2(tmp_path / "serve.log")
            assert run.wait(timeout=600) == 0, (tmp_path / "run.log").read_text()[-3000:]
        finally:
            stop(run)
            stop(server)
        assert "h3" in hosts("status") and sleeper.poll() is None
    finally:
        hosts("down")
    assert sleeper.wait(timeout=10) != 0  # killed with its host
    assert leftovers() == []
    assert killed_after < 6
    log = (tmp_path / "run.log").read_text()
    # the run saw h2 go and come back (after it, a generate call gets 409 and the weights are pushed again, or
    # the run's own next push comes first: which one depends on where the kill fell)
    assert "unreachable" in log and "answers again" in log, log[-3000:]
    from harness.commands.cli import main

    main(["run", *RUN, "trainer.steps=6", f"run_dir={tmp_path / 'local'}"])
    remote = metrics(run_dir)
    assert [r["step"] for r in remote] == list(range(7))
    assert comparable(remote) == comparable(metrics(tmp_path / "local"))


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> list[dict]:
    """EQUIV_RUN (tests/runtime/test_workers.py) with one in-process worker: what every multi-host run must equal."""
    from harness.commands.cli import main

    run_dir = tmp_path_factory.mktemp("local") / "run"
    main(["run", *EQUIV_RUN, f"run_dir={run_dir}"])
    return metrics(run_dir)


def host_env(**extra: str) -> dict[str, str]:
    """This process's environment with the venv first on PATH (as an activated venv) and the checkout importable."""
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", "HARNESS_SLURM_DIR", "RAY_ADDRESS")}
    return {**env, "PATH": f"{BIN}:{env.get('PATH', '')}", "PYTHONPATH": str(ROOT), **extra}


def on(k: int, *cmd: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """``cmd`` on host h``k``, waited for; its output in the failure message."""
    out = subprocess.run([str(HOSTS), "exec", str(k), *cmd], cwd=ROOT, env=env or host_env(), capture_output=True,
                         text=True, timeout=timeout)  # fmt: skip
    assert out.returncode == 0, f"{' '.join(cmd)} on h{k} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def test_ray_across_two_hosts_places_one_actor_on_each_and_equals_the_local_run(tmp_path, local_run):
    """`ray start --head` on h1, `ray start --address` on h2 (one CPU each, so the placement group must use
    both), `harness run runtime=ray runtime.ray_address=h1:PORT runtime.workers=2` on h1: Ray's state API
    shows the two worker actors on the two nodes, run.json names both hosts, and the run equals the
    in-process one."""
    pytest.importorskip("ray")
    temp = Path(tempfile.mkdtemp(prefix="ray-mh-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    port = 6390
    # Token authentication on, with this cluster's own token in every process's environment (as
    # scripts/ray_slurm.sbatch does): nothing depends on ~/.ray/auth_token, which a local `ray.init()`
    # of another test may write meanwhile.
    env = host_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    try:
        hosts("up", "2")
        on(1, "ray", "start", "--head", "--node-ip-address=10.213.0.1", f"--port={port}", "--num-cpus=1",
           "--include-dashboard=true", f"--temp-dir={temp}/h1", "--disable-usage-stats", env=env)  # fmt: skip
        on(2, "ray", "start", f"--address=10.213.0.1:{port}", "--num-cpus=1", f"--temp-dir={temp}/h2",
           "--disable-usage-stats", env=env)  # fmt: skip
        run_dir = tmp_path / "ray"
        on(1, "harness", "run", *EQUIV_RUN, "runtime=ray", f"runtime.ray_address=h1:{port}", "runtime.workers=2",
           f"run_dir={run_dir}", env=env)  # fmt: skip
        # this cluster's address, named: another test's Ray may run on the machine meanwhile
        placed = on(1, "python", "-c", (
            "import json, sys; from ray.util.state import list_actors, list_nodes\n"
            "ips = {n.node_id: n.node_ip for n in list_nodes(address=sys.argv[1])}\n"
            "actors = list_actors(address=sys.argv[1], filters=[('class_name', '=', 'RayWorker')])\n"
            "print(json.dumps(sorted(ips[a.node_id] for a in actors)))"), f"10.213.0.1:{port}", env=env)  # fmt: skip
    finally:
        hosts("down")
        shutil.rmtree(temp, ignore_errors=True)
    assert leftovers() == []
    assert json.loads(placed.stdout.strip().splitlines()[-1]) == ["10.213.0.1", "10.213.0.2"]
    assert sorted(json.loads((run_dir / "run.json").read_text())["worker_hosts"]) == ["h1", "h2"]
    assert_same_trajectory(metrics(run_dir), local_run)


def slurm_daemons() -> list[str]:
    """Daemons of the 2-node cluster still running (by the command lines local_slurm.sh started them with)."""
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
    return [p for p in ps if "harness-slurm-nodes" in p and p.split()[0].rsplit("/", 1)[-1] in ("slurmctld", "slurmd", "munged")]


def test_two_node_slurm_runs_ray_slurm_sbatch_and_a_sweep_across_both_nodes(tmp_path, local_run, fast_run):
    """`scripts/local_slurm.sh start --nodes 2`: sinfo shows h1 and h2, `srun --nodes=2 hostname` prints both,
    `sbatch --nodes=2 scripts/ray_slurm.sbatch harness run ... runtime.workers=2` puts one Ray worker on each
    node and equals the in-process run, and a submitit sweep's 2 jobs land one per node. Then `stop --nodes 2`
    leaves no daemon, namespace or link."""
    if shutil.which("slurmctld") is None and os.environ.get("HARNESS_TEST_SLURM") != "1":
        pytest.skip("SLURM is not installed (scripts/local_slurm.sh start installs it; CI does)")
    pytest.importorskip("ray")
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    env = host_env(SLURM_CONF="/tmp/harness-slurm-nodes/etc/slurm.conf", RAY_WAIT_S="120")

    def node_states() -> list[str]:
        return sorted(filter(None, on(1, "sinfo", "-h", "-N", "-o", "%N %T", env=env).stdout.split("\n")))

    try:
        start = subprocess.run([str(LOCAL_SLURM), "start", "--nodes", "2"], env=host_env(), capture_output=True,
                               text=True, timeout=600)  # fmt: skip
        assert start.returncode == 0, start.stdout[-3000:] + start.stderr[-3000:]
        assert node_states() == ["h1 idle", "h2 idle"]
        assert sorted(on(1, "srun", "--nodes=2", "hostname", env=env).stdout.split()) == ["h1", "h2"]

        run_dir = tmp_path / "sbatch"
        job = on(1, "sbatch", "--parsable", "--wait", "--nodes=2", "--cpus-per-task=1", "--time=15",
                 f"--output={tmp_path}/job.out", str(ROOT / "scripts" / "ray_slurm.sbatch"),
                 "harness", "run", *EQUIV_RUN, "runtime.workers=2", f"run_dir={run_dir}", env=env, timeout=900)  # fmt: skip
        log = (tmp_path / "job.out").read_text()
        assert "[ray_slurm] cluster up: 2 node(s)" in log, log[-3000:]
        assert sorted(json.loads((run_dir / "run.json").read_text())["worker_hosts"]) == ["h1", "h2"]
        assert_same_trajectory(metrics(run_dir), local_run)
        job_id = job.stdout.strip()  # the job's Ray processes on both nodes ended with it
        deadline = time.monotonic() + 30
        while (ray_left := ray_processes(job_id)) and time.monotonic() < deadline:
            time.sleep(1)
        assert ray_left == "", f"Ray processes of job {job_id} outlived it: {ray_left}"

        deadline = time.monotonic() + 30
        while node_states() != ["h1 idle", "h2 idle"] and time.monotonic() < deadline:
            time.sleep(1)  # both nodes free again, so that the sweep's jobs start together
        sweep = tmp_path / "sweep"  # each job asks for a whole node's CPUs: the two jobs run at once, one per node
        node_cpus = on(1, "sinfo", "-h", "-N", "-o", "%c", env=env).stdout.split()[0]
        on(1, "harness", "sweep", "hydra/launcher=submitit_slurm", "hydra.launcher.partition=debug",
           "hydra.launcher.timeout_min=15", f"hydra.launcher.cpus_per_task={node_cpus}", f"hydra.sweep.dir={sweep}",
           "algo=grpo", "seed=0,1", "runtime.threads=1", *fast_run, env=env, timeout=900)  # fmt: skip
        infos = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/run.json"))]
        assert [i["status"] for i in infos] == ["finished", "finished"]
        assert sorted(i["host"] for i in infos) == ["h1", "h2"]
    finally:
        stop_out = subprocess.run([str(LOCAL_SLURM), "stop", "--nodes", "2"], env=host_env(), capture_output=True, text=True)
    assert stop_out.returncode == 0, stop_out.stderr
    assert slurm_daemons() == [] and leftovers() == []
