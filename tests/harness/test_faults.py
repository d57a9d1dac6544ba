"""Faults and bad input, each reproduced as a user would meet it: nothing written is lost, no
pickled code runs, every failure is one line naming the fix."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import harness.rundir.writer
from harness.commands.cli import main
from harness.core.errors import CheckpointError
from harness.rundir.writer import RunDir
from harness.runtime.train.checkpoint_files import read_engine_state


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_second_writer_is_refused_with_the_holders_pid(tmp_path, fast_run, compose_cfg):
    run_dir = tmp_path / "run"
    cfg = compose_cfg([*fast_run, f"run_dir={run_dir}"])
    with RunDir(run_dir, cfg):  # a live run holds the directory
        with pytest.raises(SystemExit, match=rf"in use by pid {os.getpid()} on .*choose another run_dir"):
            main(["run", *fast_run, f"run_dir={run_dir}"])
        assert not (run_dir / "metrics.jsonl").exists()  # nothing written by the refused one
    main(["run", *fast_run, f"run_dir={run_dir}"])  # released: the run goes ahead
    assert [r["step"] for r in metrics(run_dir)] == [0, 1, 2, 3]


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path, fast_run, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".lock").write_text("pid 999999 on gone-host (since 2026-01-01T00:00:00+0000)")  # no flock held
    main(["run", *fast_run, f"run_dir={run_dir}"])  # (Hydra's log handler writes to stdout)
    assert "taking over the lock last held by pid 999999" in capsys.readouterr().out
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"


def test_truncated_latest_checkpoint_falls_back_to_the_previous(tmp_path, fast_run, capsys):
    run_dir = tmp_path / "run"
    args = ["run", *fast_run, "trainer.checkpoint_every=1", f"run_dir={run_dir}"]
    main(args)
    newest = run_dir / "checkpoints" / "step_0000003" / "state.pt"
    newest.write_bytes(newest.read_bytes()[:1024])  # cut to 1 kB, as a full disk or a kill might
    capsys.readouterr()
    main([*args, "trainer.steps=4"])
    out = capsys.readouterr().out
    assert "step_0000003 cannot be loaded" in out and "falling back" in out
    assert [r["step"] for r in metrics(run_dir)] == [0, 1, 2, 3, 4]  # steps after step 2 redone
    assert json.loads((run_dir / "run.json").read_text())["steps_done"] == 4


class _Payload:
    """What a hostile state.pt could carry: unpickling it would run ``os.system``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_checkpoints_load_without_running_pickled_code(tmp_path, fast_run, compose_cfg):
    cfg = compose_cfg([*fast_run, f"run_dir={tmp_path}"])
    good, evil = tmp_path / "checkpoints" / "step_0000001", tmp_path / "checkpoints" / "step_0000002"
    good.mkdir(parents=True)
    evil.mkdir()
    # An older harness wrote plain dicts of tensors and numbers: they still load.
    torch.save({"step": 1, "engine": {"policy": {"model": {"w": torch.ones(2)}}}, "wall_s": 1.5}, good / "state.pt")
    marker = tmp_path / "pwned"
    torch.save({"step": 2, "engine": _Payload(marker)}, evil / "state.pt")
    with RunDir(tmp_path, cfg) as run:
        with pytest.raises(Exception, match="(?i)weights.only|unsupported global"):
            run.load_checkpoint(evil)
        path, state = run.load_latest_checkpoint()  # the hostile one is skipped
    assert not marker.exists()
    assert path == good and state["step"] == 1 and torch.equal(state["engine"]["policy"]["model"]["w"], torch.ones(2))


def test_no_loadable_checkpoint_is_a_clear_error(tmp_path, fast_run, compose_cfg):
    cfg = compose_cfg([*fast_run, f"run_dir={tmp_path}"])
    (tmp_path / "checkpoints" / "step_0000001").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_0000001" / "state.pt").write_bytes(b"not a checkpoint")
    with RunDir(tmp_path, cfg) as run, pytest.raises(CheckpointError, match="none of the checkpoints.*move them away"):
        run.load_latest_checkpoint()


def test_full_disk_while_checkpointing_keeps_the_previous_one(tmp_path, fast_run, monkeypatch):
    run_dir = tmp_path / "run"
    real_save, calls = torch.save, []

    def save(obj, path, *a, **kw):
        if not isinstance(path, (str, os.PathLike)):  # the engine's shard writer pickles small objects to memory
            return real_save(obj, path, *a, **kw)
        calls.append(path)
        if len(calls) == 2:  # the second checkpoint: the disk is full
            Path(path).write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *a, **kw)

    monkeypatch.setattr(harness.rundir.writer.torch, "save", save)
    with pytest.raises(SystemExit, match="step 2 failed.*No space left.*step_0000001, is intact.*free disk space"):
        main(["run", *fast_run, "trainer.checkpoint_every=1", f"run_dir={run_dir}"])
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == ["step_0000001"]  # no half-written folder left behind
    monkeypatch.setattr(harness.rundir.writer.torch, "save", real_save)
    main(["run", *fast_run, "trainer.checkpoint_every=1", f"run_dir={run_dir}"])  # space freed: resumes
    assert [r["step"] for r in metrics(run_dir)] == [0, 1, 2, 3]


def test_diverging_run_skips_non_finite_updates_then_stops(tmp_path, fast_run, monkeypatch):
    """After the first update every loss is nan, so its gradients are too: each update is skipped and
    the run stops after trainer.max_skipped_steps of them. The nan is injected into the loss: a real
    divergence (trainer.lr=1e6) depends on the CPU's float kernels; on a Xeon the wrecked policy
    scored 0 everywhere, so its gradients were 0, not nan."""
    import algorithms.base
    from harness.runtime.train import fsdp

    real_loss, real_step, updates = algorithms.base.Algorithm.loss, fsdp.TrainEngine.optimizer_step, []

    def diverging_loss(self, logp, entropy, mb):
        loss, stats = real_loss(self, logp, entropy, mb)
        return (loss * float("nan") if updates else loss), stats

    def counted_step(self):
        updates.append(1)
        return real_step(self)

    monkeypatch.setattr(algorithms.base.Algorithm, "loss", diverging_loss)
    monkeypatch.setattr(fsdp.TrainEngine, "optimizer_step", counted_step)
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit, match=r"skipped 3 steps in a row for non-finite values.*Lower trainer.lr"):
        main(["run", *fast_run, "trainer.steps=10", "trainer.checkpoint_every=1", f"run_dir={run_dir}"])
    rows = metrics(run_dir)
    skipped = [r["train/skipped_steps"] for r in rows[1:]]
    assert skipped[-3:] == [1, 1, 1] and skipped[0] == 0
    last = rows[-1]["step"]
    assert not (run_dir / "checkpoints" / f"step_{last:07d}").exists()  # the stopping step wrote none
    weights = read_engine_state(sorted((run_dir / "checkpoints").iterdir())[-1])["policy"]["model"]
    assert all(torch.isfinite(w).all() for w in weights.values())  # skipped updates never reached the weights


def test_non_finite_rewards_skip_the_update(tmp_path, fast_run, monkeypatch):
    import rewards
    from rewards.registry import Verdict

    real_get = rewards.get

    class NanChecker:
        def __init__(self, inner):
            self.inner, self.tag = inner, inner.tag

        def score_batch(self, responses, truths):
            return [Verdict(float("nan"), False, None, "user_fn") for _ in responses]

    monkeypatch.setattr(rewards, "get", lambda name: NanChecker(real_get(name)))
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit, match="non-finite rewards 16"):
        main(["run", *fast_run, "trainer.max_skipped_steps=2", "trainer.steps=5", f"run_dir={run_dir}"])
    rows = metrics(run_dir)
    assert [r.get("train/nonfinite_rewards") for r in rows[1:]] == [16, 16]


def test_missing_or_broken_model_directory_is_one_line(tmp_path, fast_run):
    with pytest.raises(SystemExit, match=r"model.path=/no/such/model: no such directory"):
        main(["run", *fast_run, "model.path=/no/such/model", f"run_dir={tmp_path / 'a'}"])
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    with pytest.raises(SystemExit, match=r"is not a Hugging Face model directory \(no config.json\)"):
        main(["run", *fast_run, f"model.path={not_a_model}", f"run_dir={tmp_path / 'b'}"])
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(SystemExit, match=rf"model.path={broken}: cannot load its tokenizer"):
        main(["run", *fast_run, f"model.path={broken}", f"run_dir={tmp_path / 'c'}"])


def test_prompts_all_over_the_limit_and_empty_tasks_are_refused(tmp_path, fast_run):
    with pytest.raises(SystemExit, match=r"every prompt of task arith is longer than task.max_prompt_tokens=2"):
        main(["run", *fast_run, "task.max_prompt_tokens=2", f"run_dir={tmp_path / 'a'}"])
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(SystemExit, match=r"empty.jsonl: no usable rows \(expected gsm8k"):
        main(["run", *fast_run, "task=gsm8k", f"task.source={tmp_path / 'empty.jsonl'}", f"run_dir={tmp_path / 'b'}"])
    with pytest.raises(SystemExit, match=r"(?i)train_size|0 train"):
        main(["run", *fast_run, "task.train_size=0", f"run_dir={tmp_path / 'c'}"])


@pytest.mark.integration
def test_sigterm_checkpoints_at_the_step_boundary_and_exits_0(tmp_path, fast_run):
    args = [a for a in fast_run if not a.startswith("trainer.steps")]
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "harness.commands.cli", "run", *args, "trainer.steps=200", "trainer.checkpoint_every=0",
           f"run_dir={run_dir}"]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while not (run_dir / "metrics.jsonl").exists() or len(metrics(run_dir)) < 3:  # a couple of steps in
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "interrupted" and "rerun the same command to resume" in " ".join(out.split())
    done = info["steps_done"]
    assert (run_dir / "checkpoints" / f"step_{done:07d}" / "state.pt").exists() and done < 200
    main(["run", *args, f"trainer.steps={done + 1}", "trainer.checkpoint_every=0", f"run_dir={run_dir}"])  # resumes
    assert [r["step"] for r in metrics(run_dir)] == list(range(done + 2))


def test_emulated_bf16_on_cpu_is_warned(tmp_path, fast_run, monkeypatch, capsys):
    import harness.models

    monkeypatch.setattr(harness.models, "cpu_flags", lambda: "avx avx2 fma sse4_1 sse4_2")
    monkeypatch.setattr(harness.models.platform, "machine", lambda: "x86_64")
    assert harness.models.bf16_is_emulated()
    main(["run", *fast_run, "trainer.steps=1", "trainer.precision=bf16", f"run_dir={tmp_path / 'a'}"])
    assert "on a CPU without bf16 instructions" in " ".join(capsys.readouterr().out.split())
    monkeypatch.setattr(harness.models, "cpu_flags", lambda: "avx2 avx512_bf16 avx512f")
    assert not harness.models.bf16_is_emulated()
