"""trainer.pipeline: the producer thread's schedule (fast tier) and pipelined runs (integration)."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest
import torch

from algorithms.ops import truncated_is_weight
from analysis.collect import pipeline_label
from harness.commands.cli import main
from harness.config import compose_config, validate
from harness.core.errors import ConfigError
from harness.runtime.driver.pipeline import RolloutPipeline


class FakeRollout:
    """A rollout engine whose weights are a version number: checks that they never change during a
    generation and records which version generated each step."""

    def __init__(self, produce_s: float = 0.0, jitter: bool = False):
        self.weights, self.busy, self.produce_s, self.jitter = 0, False, produce_s, jitter
        self.generated: dict[int, int] = {}
        self.lock = threading.Lock()

    def produce(self, step: int) -> int:
        self.busy = True
        start = self.weights
        time.sleep(self.produce_s * (random.random() if self.jitter else 1.0))
        assert self.weights == start, "weights moved during a generation"
        self.generated[step] = start
        self.busy = False
        return step

    def sync(self) -> float:
        assert not self.busy, "weights pushed while a generation runs"
        self.weights += 1
        return 0.0


def drive(mode: str, k: int, steps: int, rollout: FakeRollout, train_s: float, first: int = 1) -> list[tuple[int, int]]:
    """The trainer's side: (step, staleness) of every batch it got."""
    pipe = RolloutPipeline(rollout.produce, rollout.sync, mode, k, first=first, last=steps)
    seen = []
    try:
        for step in range(first, steps + 1):
            produced, _ = pipe.get(step)
            assert produced.item == step
            seen.append((step, produced.staleness()))
            time.sleep(train_s)  # the update
            pipe.synced()
    finally:
        pipe.close()
    return seen


def test_one_step_off_is_exactly_one_version_behind_whatever_the_timing():
    for produce_s, train_s in ((0.0, 0.01), (0.01, 0.0), (0.005, 0.005)):
        rollout = FakeRollout(produce_s)
        seen = drive("one_step_off", 0, 8, rollout, train_s)
        assert seen == [(1, 0)] + [(s, 1) for s in range(2, 9)]
        assert rollout.generated == {1: 0, **{s: s - 2 for s in range(2, 9)}}


def test_async_runs_ahead_up_to_max_staleness_and_never_further():
    # A fast producer and a slow trainer: the producer runs K batches ahead.
    seen = drive("async", 2, 10, FakeRollout(0.0), train_s=0.02)
    assert max(s for _, s in seen) == 2 and seen[:3] == [(1, 0), (2, 1), (3, 2)]
    # Random timings: the bound always holds.
    random.seed(0)
    for k in (1, 2, 3):
        seen = drive("async", k, 12, FakeRollout(0.004, jitter=True), train_s=0.003)
        assert all(0 <= s <= k for _, s in seen), seen


def test_async_with_staleness_zero_waits_for_every_update():
    rollout = FakeRollout(0.001)
    assert drive("async", 0, 6, rollout, train_s=0.002) == [(s, 0) for s in range(1, 7)]
    assert rollout.generated == {s: s - 1 for s in range(1, 7)}


def test_a_resumed_pipeline_starts_at_the_checkpoint_version():
    rollout = FakeRollout(0.0)
    rollout.weights = 4  # 4 updates restored
    seen = drive("one_step_off", 0, 8, rollout, train_s=0.001, first=5)
    assert seen == [(5, 0), (6, 1), (7, 1), (8, 1)]


def test_a_producer_failure_reaches_the_trainer():
    def produce(step):
        if step == 3:
            raise ValueError("generation broke")
        return step

    pipe = RolloutPipeline(produce, lambda: 0.0, "async", 2, first=1, last=5)
    try:
        pipe.get(1)
        pipe.get(2)
        with pytest.raises(RuntimeError, match="before step 3") as info:
            pipe.get(3)
        assert isinstance(info.value.__cause__, ValueError)
    finally:
        pipe.close()


def test_close_stops_a_waiting_producer_promptly():
    pipe = RolloutPipeline(lambda s: s, lambda: 0.0, "async", 1, first=1, last=100)
    pipe.get(1)  # the producer then waits for an update that never comes
    t0 = time.perf_counter()
    pipe.close()
    assert not pipe.thread.is_alive() and time.perf_counter() - t0 < 5


def test_truncated_is_clips_tokens_over_the_cap():
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]]))
    rollout = torch.log(torch.tensor([[0.5, 0.25, 0.1, 0.5]]))  # ratios 1, 2, 5, 1
    mask = torch.tensor([[True, True, True, False]])
    assert torch.allclose(truncated_is_weight(old, rollout, mask, 3.0), torch.tensor([[1.0, 2.0, 3.0, 0.0]]))


@pytest.mark.parametrize("override, message", [
    ("trainer.pipeline=asynk", "did you mean 'async'"),
    ("trainer.max_staleness=-1", "trainer.max_staleness=-1"),
    ("trainer.behaviour_logp=old", "trainer.behaviour_logp='old'"),
    ("correction.name=clip", "correction.name='clip'"),
    ("correction.name=icepop trainer.pipeline=one_step_off trainer.behaviour_logp=recompute",
     "correction.name=icepop needs correction.low > 0 \\(IcePop masks both sides"),
    ("correction.name=token_veto trainer.pipeline=one_step_off trainer.behaviour_logp=recompute",
     "correction.name=token_veto needs correction.low > 0 \\(the floor"),
    ("correction.name=mask correction.low=3 correction.cap=2", "correction.low=3 and correction.cap=2: need 0 <= low < cap"),
    ("correction.exclude_rejected=true", "correction.exclude_rejected=true with correction.name=none"),
    ("rollout.hf_dtype=bf16", "rollout.hf_dtype='bf16': use auto, bfloat16, float32"),
    ("rollout=vllm rollout.hf_dtype=bfloat16", "rollout.hf_dtype=bfloat16 is read by the hf engine only; rollout=vllm ignores it"),
])  # fmt: skip
def test_bad_pipeline_settings_name_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose_config(override.split()))


def test_importance_weights_on_hf_need_a_pipeline():
    with pytest.raises(ConfigError, match="trainer.pipeline=sync"):
        validate(compose_config(["correction.name=tis"]))
    with pytest.raises(ConfigError, match="weighs nothing"):
        validate(compose_config(["correction.name=tis", "trainer.pipeline=one_step_off"]))
    validate(compose_config(["correction.name=tis", "trainer.pipeline=one_step_off", "trainer.behaviour_logp=recompute"]))
    validate(compose_config(["trainer.pipeline=one_step_off"]))  # none (the default) needs nothing


@pytest.mark.parametrize("old, new", [
    ("rollout.tis_cap=2", "use correction.name=tis correction.cap=2"),
    ("rollout.tis_cap=0", "use correction.name=none"),
    ("rollout.correction=mask", "use correction.name=mask"),
    ("rollout.correction_low=0.5", "use correction.low=0.5"),
])  # fmt: skip
def test_the_old_correction_keys_are_refused_in_one_line_naming_the_new(old, new):
    with pytest.raises(ConfigError, match=rf"^{old.split('=')[0]} is now correction\.\w+: .*; {new}$"):
        compose_config([old])


def test_pipeline_labels_of_the_report():
    """run.json's record, or for older run dirs (no label in run.json) the same record made from their config."""
    assert pipeline_label({}, {}) == "sync"
    assert pipeline_label({}, {"trainer.pipeline": "async", "trainer.max_staleness": 0}) == "sync"
    assert pipeline_label({}, {"trainer.pipeline": "async", "trainer.max_staleness": 2}) == "async K=2 (old_logp behaviour)"
    assert (pipeline_label({}, {"trainer.pipeline": "one_step_off", "trainer.behaviour_logp": "recompute",
                                "correction.name": "mask", "correction.cap": 2.0})
            == "one_step_off (old_logp recompute, mask 2)")  # fmt: skip
    assert pipeline_label({}, {"correction.name": "tis", "correction.cap": 2.0}) == "sync (tis 2)"  # a vllm run
    # a run directory from before the correction group: flat_config reads rollout.tis_cap > 0 as the correction on
    from harness.rundir.schema import flat_config

    old = flat_config({"rollout": {"tis_cap": 2.0, "correction": "mask", "correction_low": 0.5}})
    assert (old["correction.name"], old["correction.cap"], old["correction.low"]) == ("mask", 2.0, 0.5)
    assert "rollout.tis_cap" not in old and pipeline_label({}, old) == "sync (mask 2)"
    assert flat_config({"rollout": {"tis_cap": 0.0, "correction": "tis"}})["correction.name"] == "none"
    assert flat_config({})["correction.name"] == "none"
    assert pipeline_label({"pipeline": {"label": "async K=3 (old_logp behaviour)"}}, {}) == "async K=3 (old_logp behaviour)"


# ------------------------------------------------------------------ integration: real runs
TINY = ["trainer.steps=4", "trainer.prompts_per_step=8", "trainer.eval_every=2", "runtime.threads=1", "seed=1"]


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _comparable(rows: list[dict]) -> list[dict]:
    """Everything but timings and the pipeline's own bookkeeping."""
    drop = ("perf/", "budget/wall_s", "rollout/policy_version", "rollout/staleness")
    return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in rows]


@pytest.mark.integration
def test_async_with_staleness_zero_equals_sync_exactly(tmp_path):
    main(["run", *TINY, f"run_dir={tmp_path / 'sync'}"])
    main(["run", *TINY, "trainer.pipeline=async", "trainer.max_staleness=0", f"run_dir={tmp_path / 'async0'}"])
    sync, async0 = _metrics(tmp_path / "sync"), _metrics(tmp_path / "async0")
    assert [r["rollout/staleness_max"] for r in async0[1:]] == [0, 0, 0, 0]
    assert _comparable(sync) == _comparable(async0)


@pytest.mark.integration
def test_one_step_off_trains_on_the_rollout_policy_and_is_reproducible(tmp_path):
    runs = []
    for name in ("a", "b"):
        main(["run", *TINY, "trainer.pipeline=one_step_off", f"run_dir={tmp_path / name}"])
        runs.append(_metrics(tmp_path / name))
    a, b = runs
    assert _comparable(a) == _comparable(b)  # the schedule is fixed, so are the samples
    assert [r["rollout/policy_version"] for r in a[1:]] == [0, 0, 1, 2]
    assert [r["rollout/staleness_max"] for r in a[1:]] == [0, 1, 1, 1]
    # Step 1 (fresh weights): old_logp is the trainer's own pass, the hf rollout's log-probs agree with it;
    # later steps train on the rollout's log-probs themselves (the behaviour policy).
    assert 0 < a[1]["rollout/logp_gap_max"] < 1e-4
    assert all(r["rollout/logp_gap_max"] == 0.0 for r in a[2:])
    info = json.loads((tmp_path / "a" / "run.json").read_text())
    assert info["pipeline"] == {"mode": "one_step_off", "max_staleness": 1, "behaviour_logp": "behaviour",
                                "correction": "none", "partial": "off",
                                "label": "one_step_off (old_logp behaviour)"}  # fmt: skip
    assert pipeline_label(info, {}) == "one_step_off (old_logp behaviour)"  # the report reads run.json's record


@pytest.mark.integration
def test_a_pipelined_run_resumes_without_losing_or_repeating_a_step(tmp_path):
    run_dir = tmp_path / "run"
    main(["run", *TINY, "trainer.steps=2", "trainer.pipeline=async", f"run_dir={run_dir}"])
    main(["run", *TINY, "trainer.pipeline=async", f"run_dir={run_dir}"])
    rows = _metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[3]["rollout/policy_version"] == 2  # the resumed weights generate the first resumed batch
    tokens = [r["budget/generated_tokens"] for r in rows[1:]]
    assert tokens == sorted(tokens) and tokens[2] - tokens[1] == rows[3]["rollout/generated_tokens"]


def test_timing_model():
    from harness.runtime.driver.pipeline import predicted_step_s

    assert predicted_step_s(0.7, 0.3, 0.02, "sync") == pytest.approx(1.02)
    assert predicted_step_s(0.7, 0.3, 0.02, "one_step_off") == pytest.approx(0.72)  # 1.42x
    assert predicted_step_s(0.3, 0.7, 0.0, "async") == pytest.approx(0.7)
    # partial rollouts: the producer's generation in segments, 1.2x faster (hf) or 0.9x (re-prefills)
    assert predicted_step_s(0.72, 0.3, 0.02, "async", segment_speedup=1.2) == pytest.approx(0.62)
    assert predicted_step_s(0.72, 0.3, 0.02, "async", segment_speedup=0.9) == pytest.approx(0.82)
    assert predicted_step_s(0.36, 0.6, 0.02, "async", segment_speedup=1.2) == pytest.approx(0.62)  # update-bound


@pytest.mark.integration
def test_a_bf16_rollout_engine_is_a_mismatch_the_corrections_see(tmp_path):
    """rollout.hf_dtype=bfloat16 dials a mismatch on CPU: the hf engine samples with bf16 weights while training
    stays fp32, in lockstep. It reports its sampled log-probs, the gap to the trainer's is logged, and a
    correction acts on it; at the default (the trainer's dtype) there is no gap to log."""
    run_dir = tmp_path / "bf16"
    main(["run", *TINY, "rollout.hf_dtype=bfloat16", "correction.cap=1.01", "correction.name=mask",
          "correction.low=0.99", f"run_dir={run_dir}"])  # fmt: skip
    rows = [r for r in _metrics(run_dir) if "policy/grad_norm" in r]
    assert len(rows) == 4
    # bf16 rounding of the weights: a real gap (measured 0.0024-0.0048 nats/token; fp32 engine: 1e-6)
    assert all(r["rollout/logp_gap_mean"] > 1e-3 for r in rows)
    assert all(r["rollout/ratio_p05"] < 1.0 < r["rollout/ratio_p95"] for r in rows)  # on both sides of 1
    # the band [0.99, 1.01] drops some tokens (the ratio's 5-95% span was ~[0.984, 1.017]), never all
    assert sum(r["rollout/correction_dropped_frac"] for r in rows) > 0
    assert all(r["rollout/correction_dropped_frac"] < 0.5 for r in rows)
    main(["run", *TINY, f"run_dir={tmp_path / 'fp32'}"])
    assert not any("rollout/logp_gap_mean" in r for r in _metrics(tmp_path / "fp32"))


@pytest.mark.integration
@pytest.mark.parametrize("correction", ["tis", "mask", "icepop", "seq_tis", "seq_mask"])
def test_recomputed_old_logp_with_importance_weights(correction, tmp_path):
    """behaviour_logp=recompute: a stale batch's old_logp is the current weights', and the IS weights
    exp(old - rollout) correct for the policy having moved since the batch was generated; every
    correction logs its dropped fraction and the ratio's quantiles."""
    run_dir = tmp_path / correction
    low = ["correction.low=0.95"] if correction in ("icepop", "seq_mask") else []
    main(["run", *TINY, "trainer.pipeline=one_step_off", "trainer.behaviour_logp=recompute", "correction.cap=1.05",
          f"correction.name={correction}", *low, f"run_dir={run_dir}"])  # fmt: skip
    rows = _metrics(run_dir)[1:]
    assert all(r["rollout/logp_gap_max"] > 1e-3 for r in rows[1:])  # the policy moved between generation and training
    assert all(0 <= r["rollout/correction_dropped_frac"] < 1 for r in rows[1:])
    assert all(r["rollout/ratio_p05"] <= r["rollout/ratio_p50"] <= r["rollout/ratio_p95"] for r in rows[1:])
    assert any(r["rollout/ratio_p95"] > 1.0 for r in rows[1:])
    # the mismatch metrics (algorithms/corrections.py): divergences >= 0 where the policy moved, an ESS in (0, 1]
    assert all(r["mismatch/k3"] > 0 and r["mismatch/seq_k3"] > 0 and r["mismatch/chi2"] > 0 for r in rows[1:])
    assert all(0 < r["mismatch/ess"] <= 1 and 0 <= r["mismatch/rejected_seq_frac"] <= 1 for r in rows[1:])
    assert all(r["mismatch/seq_ratio_p05"] <= r["mismatch/seq_ratio_p50"] <= r["mismatch/seq_ratio_p95"] for r in rows[1:])
    if correction == "seq_tis":  # never drops: min(R, C), R the product over the response's tokens
        assert all(r["mismatch/rejected_seq_frac"] == 0 for r in rows[1:])
    if correction == "seq_mask":  # whole sequences kept (weight 1) or dropped (0)
        assert all(r["rollout/tis_weight_mean"] == pytest.approx(1 - r["rollout/correction_dropped_frac"]) for r in rows[1:])
        return
    assert all(0 < r["rollout/tis_capped_frac"] < 1 for r in rows[1:])
    weights = [r["rollout/tis_weight_mean"] for r in rows[1:]]
    assert all(0 < w <= 1.05 for w in weights)  # clipped at the cap (tis), or out-of-band tokens dropped
