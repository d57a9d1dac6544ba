"""Top-p mask replay (rollout.top_p_replay, issue #49): with top_p < 1 the rollout samples from the
truncated distribution, which the trainer's full softmax is not.

- plain (false): the recorded log-prob is the truncated one, so on a synchronous run the ratio
  pi_trainer / pi_rollout is the kept mass Z (<= 1, >= top_p): the IS corrections read truncation as
  mismatch (TRL#6789);
- replay (true): renormalised back by the kept mass recorded at sampling: the ratio is 1.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from harness.config import validate
from harness.core.errors import ConfigError
from harness.runtime.rollout.hf import SampledLogprobs


def test_the_recorder_by_hand():
    """logits [2, 1, 0, -1]: p = softmax = [.644, .237, .087, .032]; top-p 0.8 keeps {0, 1} (cumulative
    .644, .881), so Z = .881. Sampled token 0: plain log(.644 / .881), replayed log .644."""
    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    p = torch.softmax(scores, -1)[0]
    z = float(p[0] + p[1])
    for replay, want in ((False, math.log(p[0] / z)), (True, math.log(p[0]))):
        recorder = SampledLogprobs(1.0, top_p=0.8, replay=replay)
        assert torch.equal(recorder(torch.zeros(1, 3, dtype=torch.long), scores), scores)  # logits pass unchanged
        got = recorder.finish(torch.zeros(1, 4, dtype=torch.long))  # token 0 sampled
        assert float(got[0, 0]) == pytest.approx(want, abs=1e-6)
    plain = SampledLogprobs(1.0, top_p=0.8)
    plain(torch.zeros(1, 3, dtype=torch.long), scores)
    assert float(plain.finish(torch.full((1, 4), 3))[0, 0]) == -math.inf  # a token outside K: never sampled


@pytest.fixture(scope="module")
def policy():
    """A tiny untrained policy (near-uniform: top-p 0.9 drops about a tenth of the mass at every step)
    as the hf rollout holds it and as the trainer holds it (FSDP2, world size 1), the same weights."""
    import rewards
    from harness.data.tasks import load_task, render_prompt
    from harness.models import load_causal_lm, load_tokenizer, resolve_model
    from harness.runtime.train.fsdp import TrainEngine, init_distributed
    from tests.conftest import compose

    cfg = compose(["model.tiny.sft_steps=0", "task.train_size=300"])
    task = load_task(cfg.task)
    path, _ = resolve_model(cfg.model, task, rewards.get(cfg.task.checker), cfg.rollout.max_response_tokens)
    tok = load_tokenizer(path)
    prompts = [render_prompt(ex.messages, tok, True) for ex in task.train[:6]]
    init_distributed("cpu")
    trainer = TrainEngine(load_causal_lm(path, "float32"), "cpu", "fp32", None)
    return path, tok, prompts, trainer


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_replayed_ratio_is_one_on_a_synchronous_run_and_the_plain_one_is_the_kept_mass(policy, temperature):
    from harness.models import load_causal_lm
    from harness.runtime.rollout.hf import HFRollout

    path, tok, prompts, trainer = policy
    log_ratio = {}
    for replay in (False, True):
        engine = HFRollout(load_causal_lm(path, "float32"), tok, return_logp=True, top_p_replay=replay)
        gen = engine.generate(prompts, 4, 12, temperature=temperature, top_p=0.9, seeds=list(range(len(prompts))))
        with torch.no_grad():
            trainer_logp, _ = trainer.forward(gen, temperature)
        log_ratio[replay] = (trainer_logp - gen.rollout_logp)[gen.response_mask]
    replayed, plain = log_ratio[True], log_ratio[False]
    assert replayed.abs().max() <= 1e-5  # ratio 1 to 1e-5
    # plain: log Z, the kept mass of each step: at most 0 (Z <= 1), at least log 0.9 (top-p keeps >= 0.9)
    assert plain.max() <= 1e-5 and plain.min() >= math.log(0.9) - 1e-5
    assert plain.mean() < -0.01  # the plain ratio is not 1


def test_tis_with_top_p_on_hf_sync_is_allowed_and_vllm_replay_needs_temperature_1(compose_cfg):
    validate(compose_cfg(["rollout.top_p=0.9", "rollout.tis_cap=2"]))  # hf reports the truncated sampling's log-probs
    validate(compose_cfg(["rollout=vllm", "rollout.top_p=0.9", "rollout.top_p_replay=true"]))  # raw log-probs, T = 1
    with pytest.raises(ConfigError, match=r"rollout.top_p_replay=true with rollout=vllm needs rollout.temperature=1 "
                                          r"\(got 0.7\)"):  # fmt: skip
        validate(compose_cfg(["rollout=vllm", "rollout.top_p=0.9", "rollout.top_p_replay=true", "rollout.temperature=0.7"]))


@pytest.mark.integration
def test_a_top_p_run_logs_the_gap_plain_and_replayed(tmp_path):
    """The whole path (worker, driver, metrics): a synchronous hf run at top_p 0.9 now reports its rollout
    log-probs, and rollout/logp_gap_mean reads the mean |log Z| plainly and ~0 replayed."""
    from harness.commands.cli import main

    gaps = {}
    for replay in ("false", "true"):
        run_dir = tmp_path / replay
        main(["run", "trainer.steps=2", "trainer.prompts_per_step=4", "trainer.eval_every=100", "runtime.threads=1",
              "rollout.top_p=0.9", f"rollout.top_p_replay={replay}", "rollout.tis_cap=2", f"run_dir={run_dir}"])  # fmt: skip
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        gaps[replay] = [r["rollout/logp_gap_mean"] for r in rows if "rollout/logp_gap_mean" in r]
    assert len(gaps["true"]) == len(gaps["false"]) == 2
    assert max(gaps["true"]) < 1e-5
    assert min(gaps["false"]) > 1e-3
