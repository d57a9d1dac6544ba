"""The rollout server as an attacker would try it, in process (FastAPI's TestClient around the real
app and a real hf engine on the shipped tiny model): every malformed request gets a 4xx with a
one-line reason and no traceback, a push without the token is refused, no path leaves the weights
dir, a bad push leaves the served weights as they were. The same probes against a `harness serve`
process, the fuzz and 8 concurrent clients: tests/runtime/test_service.py (integration tier)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from harness.commands.serve import ServeLimits, ServeOptions, build_server
from harness.runtime.rollout.remote import generation_from_bytes, state_to_bytes

TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
VALID = {"prompts": [[3, 4, 5]], "n": 2, "max_tokens": 4, "temperature": 1.0, "seeds": [7]}
OCTET = {"content-type": "application/octet-stream"}

# The probes of the issue that found the server's open doors, and what each must now get.
PROBES = [
    ("/generate", {**VALID, "n": "abc"}, 422, "n: Input should be a valid integer"),
    ("/generate", {**VALID, "prompts": "12+3="}, 422, "prompts"),  # a string, not a list of prompts
    ("/generate", {**VALID, "prompts": [[10**12]]}, 422, "token ids must lie in [0, 14)"),
    ("/generate", {**VALID, "n": 10**9}, 422, "n: 1000000000 is over this server's cap of 64"),
    ("/generate", {**VALID, "max_tokens": 10**9}, 422, "max_tokens: 1000000000 is over this server's cap"),
    ("/generate", {**VALID, "temperature": -1}, 422, "temperature: Input should be greater than or equal to 0"),
    ("/generate", {**VALID, "top_p": 0}, 422, "top_p"),
    ("/generate", {**VALID, "temperature": 1e-87}, 422, "0 (greedy) or at least 0.001"),
    ("/generate", {**VALID, "prompts": [[3]] * 1000, "n": 64, "seeds": None}, 422, "prompts x n: 64000 is over"),
    ("/generate", {**VALID, "seeds": [1, 2]}, 422, "one per prompt"),
    ("/generate", {k: v for k, v in VALID.items() if k != "n"}, 422, "n: Field required"),
    ("/generate", {**VALID, "prompts": [[1] * 2046]}, 422, "exceed the model's context of 2048"),
    ("/weights", {"path": "/etc/passwd"}, 403, "only .safetensors files under the server's --weights-dir"),
    ("/weights", {"nonsense": 1}, 422, "Extra inputs are not permitted"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app (token on, a weights dir) and the served model's starting state dict."""
    from fastapi.testclient import TestClient

    from harness.config import compose_config
    from harness.runtime.loading import load_causal_lm

    weights_dir = tmp_path_factory.mktemp("weights")
    options = ServeOptions(TOKEN, weights_dir, ServeLimits(n=64, max_tokens=4096))
    app, backend, model_path = build_server(compose_config(["runtime.threads=1"]), options)
    client = TestClient(app, raise_server_exceptions=False)
    client.weights_dir = weights_dir
    client.base = load_causal_lm(model_path, "float32").state_dict()
    yield client
    client.close()


def generate(client, body=VALID):
    response = client.post("/generate", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    return generation_from_bytes(response.content)


def same(a, b) -> bool:
    return torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)


@pytest.mark.parametrize("path,body,status,reason", PROBES, ids=[f"{p}-{r[:24]}" for p, _, _, r in PROBES])
def test_each_probe_gets_a_4xx_with_a_one_line_reason_and_no_traceback(server, caplog, path, body, status, reason):
    with caplog.at_level(logging.WARNING):
        response = server.post(path, json=body, headers=AUTH)
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    assert reason in detail and "\n" not in detail
    assert not any(r.exc_info for r in caplog.records) and "Traceback" not in caplog.text


def test_junk_and_oversized_weight_bodies_are_refused(server):
    junk = server.post("/weights?id=x", content=b"junk" * 100, headers={**AUTH, **OCTET})
    assert junk.status_code == 422 and "not a readable safetensors file" in junk.json()["detail"]
    huge = server.post("/weights?id=x", content=bytes(200 << 20), headers={**AUTH, **OCTET})  # 200 MB
    assert huge.status_code == 413
    big_json = server.post("/generate", content=b"[" * (80 << 20), headers={**AUTH, "content-type": "application/json"})
    assert big_json.status_code == 413

    def chunks():  # no Content-Length: the cap is counted while the body streams in
        for _ in range(300):
            yield bytes(1 << 20)

    streamed = server.post("/weights?id=x", content=chunks(), headers={**AUTH, **OCTET})
    assert streamed.status_code == 413 and "over" in streamed.json()["detail"]
    nan = server.post("/generate", content=b'{"prompts": [[3]], "n": 1, "max_tokens": 2, "temperature": NaN}',
                      headers={**AUTH, "content-type": "application/json"})  # fmt: skip
    assert nan.status_code == 422
    assert server.get("/health", headers=AUTH).json()["weights"] == "base"


def test_no_token_or_a_wrong_one_gets_401_and_changes_nothing(server, caplog):
    before = generate(server)
    evil = {k: torch.zeros_like(v) for k, v in server.base.items()}
    with caplog.at_level(logging.WARNING):
        for headers in ({}, {"Authorization": "Bearer not-the-token-x7"}, {"Authorization": TOKEN}):
            push = server.post("/weights?id=evil", content=state_to_bytes(evil), headers={**headers, **OCTET})
            assert push.status_code == 401 and push.headers["www-authenticate"] == "Bearer"
            assert server.post("/generate", json=VALID, headers=headers).status_code == 401
            assert server.get("/health", headers=headers).status_code == 401
    assert TOKEN not in caplog.text and "not-the-token-x7" not in caplog.text  # no secret logged, not even a wrong one
    health = server.get("/health", headers=AUTH).json()
    assert health["weights"] == "base" and same(generate(server), before)


def test_a_push_that_does_not_fit_the_model_leaves_the_served_weights_unchanged(server):
    before = generate(server)
    name = "model.embed_tokens.weight"
    bad = [
        ({**server.base, name: torch.zeros(3, 3)}, "has shape [3, 3]"),
        ({**server.base, "extra.weight": torch.zeros(2)}, "unknown ['extra.weight']"),
        ({k: v for k, v in server.base.items() if k != name}, f"missing ['{name}']"),
        ({**server.base, name: server.base[name].to(torch.int32)}, "pushes are float32, bfloat16 or float16"),
        ({**server.base, name: server.base[name].to(torch.float64)}, "pushes are float32, bfloat16 or float16"),
    ]
    for state, reason in bad:
        response = server.post("/weights?id=bad", content=state_to_bytes(state), headers={**AUTH, **OCTET})
        assert response.status_code == 422 and reason in response.json()["detail"], response.text
    assert server.get("/health", headers=AUTH).json()["weights"] == "base" and same(generate(server), before)
    # the model's own weights, pushed: accepted, and the same samples
    ok = server.post("/weights?id=again", content=state_to_bytes(server.base), headers={**AUTH, **OCTET})
    assert ok.status_code == 200 and same(generate(server, {**VALID}), before)
    assert server.post("/weights", json={"reset": True}, headers=AUTH).json()["weights"] == "base"


def test_weights_by_path_only_from_inside_the_weights_dir(server, tmp_path):
    from safetensors.torch import save_file

    outside = tmp_path / "outside.safetensors"
    save_file({k: v.contiguous().clone() for k, v in server.base.items()}, str(outside))
    (server.weights_dir / "link.safetensors").symlink_to(outside)
    (server.weights_dir / "notes.txt").write_text("x")
    up = f"../{tmp_path.name}/{outside.name}"  # weights dir and tmp_path are siblings under pytest's base
    assert (server.weights_dir / up).resolve() == outside.resolve()  # the traversal reaches a real file
    for path in (str(outside), up, f"sub/../../{tmp_path.name}/{outside.name}", "link.safetensors",
                 "notes.txt", "/etc/passwd"):  # fmt: skip
        response = server.post("/weights?id=p", json={"path": path}, headers=AUTH)
        assert response.status_code == 403, (path, response.text)
    assert server.post("/weights?id=p", json={"path": "absent.safetensors"}, headers=AUTH).status_code == 404
    save_file({k: v.contiguous().clone() for k, v in server.base.items()}, str(server.weights_dir / "w.safetensors"))
    inside = server.post("/weights?id=inside", json={"path": "w.safetensors"}, headers=AUTH)
    assert inside.status_code == 200 and inside.json()["weights"] == "inside"
    assert server.post("/weights", json={"reset": True}, headers=AUTH).status_code == 200


def test_a_server_error_is_a_500_with_an_id_that_the_log_names_once(server, caplog, monkeypatch):
    from harness.runtime.rollout import hf

    def broken(*args, **kwargs):
        raise RuntimeError("engine fell over")

    monkeypatch.setattr(hf.HFRollout, "generate", broken)
    with caplog.at_level(logging.ERROR):
        response = server.post("/generate", json=VALID, headers=AUTH)
    assert response.status_code == 500
    error_id = response.json()["id"]
    assert error_id in response.json()["detail"] and "engine fell over" not in response.text
    assert len([r for r in caplog.records if error_id in r.getMessage()]) == 1


def test_serve_on_a_public_address_without_a_token_refuses_to_start_in_one_line():
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_SERVE_TOKEN"}
    out = subprocess.run([sys.executable, "-m", "harness.commands.cli", "serve", "--host", "0.0.0.0"], capture_output=True,
                         text=True, env=env, timeout=120)  # fmt: skip
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: harness serve --host 0.0.0.0 without a token"), out.stderr
    assert "HARNESS_SERVE_TOKEN" in lines[0] and "--insecure" in lines[0]


def test_limits_are_reported_by_info(server):
    info = server.get("/info", headers=AUTH).json()
    assert info["limits"]["n"] == 64 and info["vocab"] == 14 and json.dumps(info)
