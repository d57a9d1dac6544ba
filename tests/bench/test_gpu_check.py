"""bench/gpu_check.py runs its checks on CPU (a dry run: tiny shape, hf rollout) and fails on a broken sync;
scripts/gpu_check.sh installs a wheelhouse offline and stops in one line without a CUDA device."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRY = ["--cpu", "--shape", "tiny", "--rollout", "hf", "--steps", "2", "--prompts", "4", "--n", "4", "--max-new", "8",
       "runtime.threads=1"]  # fmt: skip


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.integration
def test_the_dry_run_passes_every_check(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), *DRY, "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checks = json.loads((tmp_path / "gpu_check.json").read_text())["checks"]
    assert {c["check"].split(" ")[0] for c in checks} >= {"steps", "min", "fraction", "max", "planted"}
    assert all(c["ok"] for c in checks)
    # the sync stage's negative control: the push that left out one matrix was caught, once per step
    assert [c["measured"] for c in checks if c["stage"] == "sync"] == [[1.0]]
    # the workers stage: 2 gloo ranks trained, synced exactly, and wrote one shard file each
    workers = {c["check"]: c["measured"] for c in checks if c["stage"] == "workers"}
    assert workers["shard files of the policy in step_0000002"] == ["__0_0.distcp", "__1_0.distcp"], workers


@pytest.mark.integration
def test_a_sync_that_loses_the_weights_fails_the_check(tmp_path, monkeypatch):
    """An engine that ignores the pushed weights (a crash-free, broken sync) fails the sync check."""
    from harness.runtime.rollout.hf import HFRollout

    monkeypatch.setattr(HFRollout, "load_weights", lambda self, state_dict: None)
    failed = _load().main([*DRY, "--skip", "workers", "--out", str(tmp_path)])
    checks = json.loads((tmp_path / "gpu_check.json").read_text())["checks"]
    assert failed >= 1
    assert [c["ok"] for c in checks if "rollout/sync" in c["check"]] == [False, False]


def _no_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the check would run for real")


def test_without_cuda_it_stops_in_one_line_naming_the_first_stage(capsys, tmp_path):
    _no_cuda()
    assert _load().main(["--rollout", "hf", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("no CUDA device: stopping before stage learning"), err


def test_rollout_auto_without_vllm_falls_back_to_hf_and_says_what_it_skips(capsys, tmp_path, monkeypatch):
    _no_cuda()
    module = _load()
    monkeypatch.setattr(module, "vllm_importable", lambda: False)
    assert module.main(["--out", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "vllm absent: rollout=hf; stages skipped: memory" in out
    args = module.parse_args(["--rollout", "hf"])
    assert module.plan_stages(args, True, 1) == (["learning", "sync"], ["contract (needs vLLM)", "memory (needs vLLM)",
                                                                        "workers (needs 2 CUDA devices)"])  # fmt: skip
    args = module.parse_args(["--rollout", "vllm", "--skip", "workers"])
    assert module.plan_stages(args, True, 2) == (["learning", "sync", "contract", "memory"], ["workers (--skip)"])
    assert module.plan_stages(module.parse_args(["--rollout", "hf"]), False, 0)[0] == ["learning", "sync", "workers"]


def _wheel(directory: Path, name: str) -> Path:
    """A pure-Python wheel holding one module, ``name``, written by hand (no build backend, no network)."""
    dist = f"{name}-0.1.dist-info"
    files = {f"{name}.py": b"VALUE = 42\n", f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}  # fmt: skip
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for path, data in files.items()) + f"{dist}/RECORD,,\n"  # fmt: skip
    path = directory / f"{name}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, data in {**files, f"{dist}/RECORD": record.encode()}.items():
            z.writestr(p, data)
    return path


def test_gpu_check_sh_installs_the_wheelhouse_offline(tmp_path):
    """WHEELHOUSE's wheels land in HARNESS_SITE with --no-index; then, without CUDA, the one-line stop."""
    _no_cuda()
    house = tmp_path / "whl"
    house.mkdir()
    _wheel(house, "gpu_check_probe")
    env = {**os.environ, "PYTHON": sys.executable, "WHEELHOUSE": str(house), "HARNESS_SITE": str(tmp_path / "site"),
           "PIP_NO_INDEX": "1"}  # fmt: skip
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--rollout", "hf", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "1 wheels installed offline" in proc.stdout
    assert (tmp_path / "site" / "gpu_check_probe.py").read_text() == "VALUE = 42\n"
    assert proc.stderr.strip().splitlines()[-1].startswith("no CUDA device: stopping before stage learning")
