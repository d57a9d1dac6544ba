"""Two hosts on one machine (scripts/netns_hosts.sh: network namespaces on a private bridge), integration tier.

A rollout server on host h2, the trainer on host h1 reaching it by name (http://h2:8000) with the
shared token on: the run equals the in-process run, also when the server is SIGKILLed mid-run and
restarted. Teardown must leave no namespace, link, file or process behind (checked). Needs root and ``ip netns``
(skipped otherwise; CI runs as root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.rundir import read_metrics
from tests.runtime.test_service import comparable, stop

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ROOT / "scripts" / "netns_hosts.sh"
RUN = ["trainer.prompts_per_step=8", "trainer.eval_every=3", "runtime.threads=1", "seed=1", "rollout.sample_seeds=true"]
TOKEN = "two-hosts-token"
PORT = 8000


def _can_make_hosts() -> str:
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "needs iproute2 (ip) and util-linux (unshare)"
    probe = subprocess.run(["ip", "netns", "add", "harness-probe"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"ip netns add failed: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", "harness-probe"], check=False)
    return ""


REASON = _can_make_hosts()
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
    server = on_host(2, sys.executable, "-m", "harness.cli", "serve", "--host", "h2", "--port", str(PORT), "runtime.threads=1",
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
        run = on_host(1, sys.executable, "-m", "harness.cli", "run", *RUN, "trainer.steps=6", f"rollout.server.url=http://h2:{PORT}",
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
    from harness.cli import main

    main(["run", *RUN, "trainer.steps=6", f"run_dir={tmp_path / 'local'}"])
    remote = metrics(run_dir)
    assert [r["step"] for r in remote] == list(range(7))
    assert comparable(remote) == comparable(metrics(tmp_path / "local"))
