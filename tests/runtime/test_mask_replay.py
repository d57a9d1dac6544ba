"""Mask replay (rollout.mask_replay, issue #64): with top_p < 1 or top_k > 0 the rollout samples from a
truncated distribution, which the trainer's full softmax is not.

- plain (false): the recorded log-prob is the truncated one, so on a synchronous run the ratio
  pi_trainer / pi_rollout is the kept mass Z (<= 1): the IS corrections read truncation as mismatch
  (TRL#6789);
- replay (true): the rollout also records the size of each kept set, and the trainer masks its logits to
  its own that-many highest (the sampled token always kept) before the log-softmax
  (algorithms/ops.py ``replay_kept_set``): pi_train is the truncated policy, and the ratio is 1.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from algorithms.ops import MASKED_LOGIT, logprobs_from_logits, replay_kept_set
from harness.config import validate
from harness.core.errors import ConfigError
from harness.runtime.rollout.hf import SampledLogprobs


def test_the_recorder_by_hand():
    """logits [2, 1, 0, -1]: p = softmax = [.644, .237, .087, .032]; top-p 0.8 keeps {0, 1} (cumulative .644,
    .881), so Z = .881 and |K| = 2; top-k 3 keeps 3 (Z = .968); both: top-k first, then top-p of what is left
    (.665, .245: still 2). Sampled token 0: log(.644 / Z). Nothing cut: no sizes recorded."""
    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    p = torch.softmax(scores, -1)[0]
    for top_p, top_k, size, mass in ((0.8, 0, 2, p[:2].sum()), (1.0, 3, 3, p[:3].sum()), (0.8, 3, 2, p[:2].sum())):
        recorder = SampledLogprobs(1.0, top_p=top_p, top_k=top_k)
        assert torch.equal(recorder(torch.zeros(1, 3, dtype=torch.long), scores), scores)  # logits pass unchanged
        logp, kept = recorder.finish(torch.zeros(1, 4, dtype=torch.long))  # token 0 sampled
        assert float(logp[0, 0]) == pytest.approx(math.log(p[0] / mass), abs=1e-6)
        assert kept.tolist() == [[size]] and kept.dtype == torch.int32
    plain = SampledLogprobs(1.0, top_p=0.8)
    plain(torch.zeros(1, 3, dtype=torch.long), scores)
    assert float(plain.finish(torch.full((1, 4), 3))[0][0, 0]) == -math.inf  # a token outside K: never sampled
    whole = SampledLogprobs(1.0)
    whole(torch.zeros(1, 3, dtype=torch.long), scores)
    logp, kept = whole.finish(torch.zeros(1, 4, dtype=torch.long))
    assert kept is None and float(logp[0, 0]) == pytest.approx(math.log(p[0]), abs=1e-6)


def test_the_rebuilt_set_by_hand_keeps_the_sampled_token_and_leaves_uncut_positions_whole():
    """Position 0: kept 2 of [3, 1, 2, 0] -> {0, 2}; position 1: kept 1 of [0, 5, 4, 1] but token 2 was sampled
    (the rollout's logits ranked it first; the trainer's put it second): {1, 2}; position 2: kept 0 (nothing
    cut, or padding): all four."""
    logits = torch.tensor([[[3.0, 1.0, 2.0, 0.0], [0.0, 5.0, 4.0, 1.0], [1.0, 2.0, 3.0, 4.0]]])
    labels = torch.tensor([[0, 2, 3]])
    masked = replay_kept_set(logits, labels, torch.tensor([[2, 1, 0]]))
    kept = masked > MASKED_LOGIT
    assert kept.tolist() == [[[True, False, True, False], [False, True, True, False], [True] * 4]]
    assert torch.equal(masked[kept], logits[kept])
    logp = logprobs_from_logits(masked, labels)
    assert float(logp[0, 1]) == pytest.approx(4.0 - math.log(math.exp(5.0) + math.exp(4.0)), abs=1e-6)
    assert replay_kept_set(logits, labels, torch.zeros(1, 3, dtype=torch.int32)) is logits  # nothing cut


def test_the_replayed_gradient_is_the_masked_softmax_gradient_built_by_hand():
    """d log pi_K(y) / d logits = onehot(y) - softmax over K (0 outside K): compared with autograd of a
    log-softmax over -inf-masked logits built from a sort, on random logits and kept sizes."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 50, generator=g, requires_grad=True)
    labels = torch.randint(0, 50, (3, 5), generator=g)
    kept = torch.randint(0, 12, (3, 5), generator=g)
    logprobs_from_logits(replay_kept_set(logits, labels, kept), labels).sum().backward()
    got = logits.grad.clone()
    by_hand = logits.detach().clone().requires_grad_(True)
    order = by_hand.detach().argsort(-1, descending=True)
    mask = torch.zeros_like(by_hand, dtype=torch.bool)
    for b in range(3):
        for t in range(5):
            k = int(kept[b, t])
            if k == 0:
                mask[b, t] = True
                continue
            mask[b, t, order[b, t, :k]] = True
            mask[b, t, labels[b, t]] = True
    logp = torch.log_softmax(by_hand.masked_fill(~mask, -math.inf), -1).gather(-1, labels[..., None])
    logp.sum().backward()
    assert torch.allclose(got, by_hand.grad, atol=1e-6)
    assert (got[~mask] == 0).all()


@pytest.fixture(scope="module")
def policy():
    """A tiny untrained policy over 14 tokens (near-uniform: top-p 0.9 drops about a tenth of the mass at every step, top-k 5
    most of it) as the hf rollout holds it and as the trainer holds it (FSDP2, world size 1), the same weights."""
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


@pytest.mark.parametrize("temperature, top_p, top_k", [(1.0, 0.9, 0), (0.7, 0.9, 0), (1.0, 1.0, 5), (0.7, 0.9, 5)])
def test_replayed_ratio_is_one_on_a_synchronous_run_and_the_plain_one_is_the_kept_mass(policy, temperature, top_p, top_k):
    from harness.models import load_causal_lm
    from harness.runtime.rollout.hf import HFRollout

    path, tok, prompts, trainer = policy
    engine = HFRollout(load_causal_lm(path, "float32"), tok, return_logp=True)
    gen = engine.generate(prompts, 4, 12, temperature=temperature, top_p=top_p, seeds=list(range(len(prompts))),
                          top_k=top_k)  # fmt: skip
    mask = gen.response_mask
    assert gen.rollout_kept is not None and (gen.rollout_kept[mask] >= 1).all() and (gen.rollout_kept[~mask] == 0).all()
    if top_k:
        assert gen.rollout_kept.max() <= top_k
    with torch.no_grad():
        plain, _ = trainer.forward(gen, temperature)
        replayed, _ = trainer.forward(gen, temperature, kept=gen.rollout_kept)
    assert (replayed - gen.rollout_logp)[mask].abs().max() <= 1e-5  # ratio 1 to 1e-5
    # plain: log Z, the kept mass of each step: at most 0 (Z <= 1), and not 1 on average
    log_z = (plain - gen.rollout_logp)[mask]
    assert log_z.max() <= 1e-5 and log_z.mean() < -0.01
    if not top_k:
        assert log_z.min() >= math.log(top_p) - 1e-5  # top-p alone keeps >= top_p of the mass


def test_the_config_of_mask_replay_top_k_and_the_old_key(compose_cfg):
    validate(compose_cfg(["rollout.top_p=0.9", "correction.name=tis"]))  # hf reports the truncated sampling's log-probs
    validate(compose_cfg(["rollout.top_k=20", "correction.name=tis", "rollout.mask_replay=true"]))
    validate(compose_cfg(["rollout=vllm", "rollout.top_k=20", "rollout.top_p=0.9", "rollout.mask_replay=true"]))
    with pytest.raises(ConfigError, match=r"rollout.mask_replay=true with rollout=vllm needs rollout.top_k > 0"):
        validate(compose_cfg(["rollout=vllm", "rollout.top_p=0.9", "rollout.mask_replay=true"]))
    with pytest.raises(ConfigError, match=r"rollout.mask_replay=true replays the kept set of a truncated sampler"):
        validate(compose_cfg(["rollout.mask_replay=true"]))
    with pytest.raises(ConfigError, match=r"rollout.top_k=-1 must be >= 0"):
        validate(compose_cfg(["rollout.top_k=-1"]))
    with pytest.raises(ConfigError, match=r"rollout.mask_replay=true with env.name set"):
        validate(compose_cfg(["rollout.top_p=0.9", "rollout.mask_replay=true", "env.name=calculator", "task=gsm8k"]))
    with pytest.raises(ConfigError, match=r"^rollout.top_p_replay is now rollout.mask_replay: the trainer now masks its "
                                          r".*; use rollout.mask_replay=true$"):  # fmt: skip
        compose_cfg(["rollout.top_p=0.9", "rollout.top_p_replay=true"])


@pytest.mark.integration
def test_a_truncated_run_logs_the_gap_plain_and_replayed(tmp_path):
    """The whole path (worker, driver, metrics): a synchronous hf run at top_p 0.9 reports its rollout log-probs and
    kept sets, and rollout/logp_gap_mean reads the mean |log Z| plainly and ~0 replayed."""
    from harness.commands.cli import main

    gaps = {}
    for replay in ("false", "true"):
        run_dir = tmp_path / replay
        main(["run", "trainer.steps=2", "trainer.prompts_per_step=4", "trainer.eval_every=100", "runtime.threads=1",
              "rollout.top_p=0.9", f"rollout.mask_replay={replay}", "correction.name=tis", f"run_dir={run_dir}"])  # fmt: skip
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        gaps[replay] = [r["rollout/logp_gap_mean"] for r in rows if "rollout/logp_gap_mean" in r]
    assert len(gaps["true"]) == len(gaps["false"]) == 2
    assert max(gaps["true"]) < 1e-5
    assert min(gaps["false"]) > 1e-3
