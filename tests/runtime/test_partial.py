"""Partial rollouts (``rollout.partial``): segments, per-token versions, the producer letting pushes through.

Fast tier: ``generate_in_segments`` on a scripted engine, and the pipeline's hand-over of the rollout
lock mid-batch. The per-token-version check on a real hf engine (recomputed log-probs, 1e-5) is fast
too; vLLM's is in tests/runtime/test_vllm.py; whole runs are in the integration tier.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from harness.config import compose_config, validate
from harness.core.errors import ConfigError
from harness.rundir.schema import read_metrics
from harness.runtime.driver.partial import generate_in_segments, token_staleness
from harness.runtime.driver.pipeline import RolloutPipeline
from harness.runtime.rollout.base import Generation
from tests.helpers import segments_against_versions, untrained_tiny_model

EOS, PAD, TOKEN = 2, 0, 7


class ScriptedEngine:
    """Prompt [L] asks for L tokens, the last one EOS; each token's log-prob is -(version + 1) / 10, so the
    version that sampled it can be read back from it."""

    def __init__(self):
        self.version, self.calls = 0, []

    def generate(self, prompts, n, cap, seeds):
        self.calls.append((len(prompts), n, cap))
        rows = [p for p in prompts for _ in range(n)]
        out = torch.full((len(rows), cap), PAD)
        mask = torch.zeros((len(rows), cap), dtype=torch.bool)
        for i, p in enumerate(rows):
            wanted, done = p[0], len(p) - 1  # tokens generated so far: the context past the one-token prompt
            for j in range(cap):
                out[i, j] = EOS if done + j + 1 == wanted else TOKEN
                mask[i, j] = True
                if out[i, j] == EOS:
                    break
        logp = torch.where(mask, torch.tensor(-(self.version + 1) / 10), torch.tensor(0.0))
        ids = torch.tensor([[p[0]] for p in prompts]).repeat_interleave(n, 0)
        return Generation(ids, torch.ones_like(ids, dtype=torch.bool), out, mask, ~(out == EOS).any(1),
                          torch.arange(len(prompts)).repeat_interleave(n), logp)  # fmt: skip


def run_segments(lengths, push_before: set[int], restart=False, chunk=3, max_tokens=10):
    engine, calls = ScriptedEngine(), []

    def checkpoint():
        calls.append(1)
        if len(calls) in push_before:  # a weight push goes through before this segment
            engine.version += 1
        return engine.version

    gen, counts = generate_in_segments(engine.generate, [[length] for length in lengths], 2, max_tokens, None,
                                       lambda k: None, checkpoint, chunk, [EOS], PAD, restart)  # fmt: skip
    return engine, gen, counts


def test_a_push_between_segments_tags_later_tokens_with_the_new_version():
    # Responses of 3, 6 and 9 tokens (a cap of 10), 3 tokens per segment; pushes before segments 2 and 3.
    engine, gen, counts = run_segments([3, 6, 9], push_before={2, 3})
    assert engine.calls == [(3, 2, 3), (4, 1, 3), (2, 1, 3)]  # segment 2: 4 unfinished rows; segment 3: 2
    lengths = gen.response_mask.sum(1).tolist()
    assert lengths == [3, 3, 6, 6, 9, 9]
    v = gen.token_version
    assert v[0, :3].tolist() == [0, 0, 0] and v[2, :6].tolist() == [0, 0, 0, 1, 1, 1]
    assert v[4, :9].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert (v[~gen.response_mask] == -1).all()
    # each token's log-prob is its own version's
    assert torch.equal(gen.rollout_logp[gen.response_mask], (-(v[gen.response_mask] + 1) / 10).float())
    assert gen.response_ids[4, 8] == EOS and not gen.truncated.any()
    assert (counts.segments, counts.interrupts, counts.resumed, counts.restarted) == (3, 2, 4, 0)


def test_without_a_push_the_segments_are_one_version_and_a_long_chunk_is_one_call():
    engine, gen, counts = run_segments([3, 6, 12], push_before=set())
    assert (gen.token_version[gen.response_mask] == 0).all() and counts.interrupts == 0 and counts.resumed == 0
    assert gen.truncated.tolist() == [False, False, False, False, True, True]  # 12 tokens > max_tokens 10
    engine, gen, counts = run_segments([3, 6], push_before={2}, chunk=10)
    assert len(engine.calls) == 1 and counts.segments == 1 and counts.interrupts == 0


def test_restart_samples_unfinished_sequences_again_under_the_new_weights():
    engine, gen, counts = run_segments([3, 6], push_before={2}, restart=True)
    # rows 2, 3 (6 tokens each) were cut after 3 tokens: dropped and sampled again, all by version 1
    assert gen.token_version[2, :6].tolist() == [1] * 6 and gen.token_version[0, :3].tolist() == [0] * 3
    assert (counts.restarted, counts.discarded_tokens, counts.resumed) == (2, 6, 0)


def test_token_staleness_is_per_token():
    versions = torch.tensor([[3, 3, 4, -1], [4, 4, 4, 4]])
    mask = versions >= 0
    m = token_staleness(versions, mask, trained_version=4)
    assert m == {"rollout/staleness_mean": pytest.approx(2 / 7), "rollout/staleness_max": 1,
                 "rollout/current_version_frac": pytest.approx(5 / 7), "rollout/partial_resumed_frac": 0.5}  # fmt: skip


def test_a_segment_that_gives_a_row_no_token_ends_it():
    """E.g. a continued context that fills the engine's window: the row ends (truncated), the loop does too."""

    def generate(prompts, n, cap, seeds):
        gen = ScriptedEngine().generate(prompts, n, cap, seeds)
        if len(prompts[0]) > 1:  # a continuation: nothing more fits
            gen.response_mask[:] = False
        return gen

    gen, counts = generate_in_segments(generate, [[9]], 1, 10, None, lambda k: None, lambda: 0, 3, [EOS], PAD)
    assert int(gen.response_mask.sum()) == 3 and gen.truncated.tolist() == [True] and counts.segments == 2


def test_the_producer_lets_a_push_and_an_eval_through_mid_batch():
    """Batch 2 is in flight when the trainer pushes after step 1 and then evaluates: with partial rollouts
    both get the engine at the producer's next segment, before batch 2 is done, and batch 2's later
    segments see version 1."""
    seen: dict[int, list[int]] = {}
    box: dict[str, RolloutPipeline] = {}  # the pipeline, once built (its producer starts in the constructor)
    in_batch_2, evaluated = threading.Event(), threading.Event()

    def wait_for_trainer(unless: threading.Event | None = None):  # until the trainer waits for the engine
        deadline = time.monotonic() + 60
        while "pipe" not in box or box["pipe"].lock_waiters == 0:
            if unless is not None and unless.is_set():
                return
            assert time.monotonic() < deadline, "the trainer never asked for the engine"
            time.sleep(0.001)

    def produce(step, checkpoint):
        versions = [checkpoint()]
        if step == 2:
            in_batch_2.set()
            wait_for_trainer()  # its push
            versions.append(checkpoint())
            # its eval: at this checkpoint, or already done (it may take the engine right after the push)
            wait_for_trainer(unless=evaluated)
            versions.append(checkpoint())
        seen[step] = versions
        return step

    pipe = box["pipe"] = RolloutPipeline(produce, lambda: 0.0, "async", 1, first=1, last=3, partial=True)
    try:
        assert pipe.get(1)[0].item == 1
        assert in_batch_2.wait(60)  # the producer holds the engine, generating batch 2
        pipe.synced()  # the push after step 1 goes through mid-batch
        with pipe.exclusive():  # an eval, also mid-batch
            assert 2 not in pipe.ready and pipe.version == 1
        evaluated.set()
        produced, _ = pipe.get(2)
        assert produced.version == 0 and seen[2] == [0, 1, 1]
        pipe.synced()
        assert pipe.get(3)[0].item == 3
    finally:
        pipe.close()


@pytest.mark.parametrize("override, message", [
    (["rollout.partial=continu"], "did you mean 'continue'"),
    (["rollout.partial=continue"], "needs trainer.pipeline=async"),
    (["rollout.partial=continue", "trainer.pipeline=async", "trainer.max_staleness=0"], "max_staleness >= 1"),
    (["rollout.partial=restart", "trainer.pipeline=async", "rollout.partial_chunk_tokens=0"], "partial_chunk_tokens=0"),
])  # fmt: skip
def test_bad_partial_settings_name_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose_config(override))


@pytest.fixture(scope="module")
def untrained_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("untrained")
    return str(path), untrained_tiny_model(path)


def test_hf_tokens_carry_the_version_and_log_prob_that_sampled_them(untrained_model):
    from harness.models import load_causal_lm
    from harness.runtime.rollout.hf import HFRollout

    path, tok = untrained_model
    backend = HFRollout(load_causal_lm(path, "float32"), tok, max_prompt_tokens=64, return_logp=True)
    gaps = segments_against_versions(backend, path, [f"What is {a} + 3? Answer:" for a in range(6)], tol=1e-5)
    assert all(gaps[f"v{v}_tokens"] > 0 for v in range(3))


# ------------------------------------------------------------------ integration: real runs
TINY = ["trainer.steps=6", "trainer.prompts_per_step=8", "trainer.eval_every=3", "runtime.threads=1", "seed=1",
        "trainer.pipeline=async", "trainer.max_staleness=1", "rollout.partial_chunk_tokens=2"]  # fmt: skip


@pytest.mark.integration
def test_a_partial_run_logs_per_token_staleness_and_resumes(tmp_path):
    """(restart's bookkeeping is checked on the scripted engine above; one mode runs here, for CI's budget)"""
    from harness.commands.cli import main

    mode = "continue"
    run_dir = tmp_path / mode
    main(["run", *TINY, "trainer.steps=3", f"rollout.partial={mode}", f"run_dir={run_dir}"])
    main(["run", *TINY, f"rollout.partial={mode}", f"run_dir={run_dir}"])  # resumed from step 3's checkpoint
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(7))
    for r in rows[1:]:
        assert 0 <= r["rollout/staleness_mean"] <= r["rollout/staleness_max"] <= 1
        assert 0 <= r["rollout/current_version_frac"] <= 1 and r["rollout/partial_segments"] >= 1
    info = json.loads((run_dir / "run.json").read_text())
    assert info["pipeline"]["partial"] == mode and f"partial {mode}/2" in info["pipeline"]["label"]
