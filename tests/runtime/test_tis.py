"""Truncated importance sampling of the rollout/trainer mismatch (correction.name=tis, correction.cap), by hand."""

import dataclasses
import math

import pytest
import torch

from algorithms import MicroBatch, ops
from harness.config import ConfigError, validate
from tests.helpers import build as build_algo
from tests.helpers import make_batch


def test_weight_is_the_capped_ratio_of_trainer_to_rollout_probabilities():
    old = torch.tensor([[0.0, -1.0, -2.0, -0.5]])
    rollout = torch.tensor([[-1.0, -1.0, 0.0, -9.0]])
    mask = torch.tensor([[True, True, True, False]])
    w = ops.truncated_is_weight(old, rollout, mask, cap=2.0)
    # e^(0 - -1) = 2.718 -> capped at 2; e^0 = 1; e^(-2 - 0) = 0.135; padding -> 0
    assert torch.allclose(w, torch.tensor([[2.0, 1.0, math.exp(-2.0), 0.0]]))
    with pytest.raises(ValueError, match="cap"):
        ops.truncated_is_weight(old, rollout, mask, cap=0.0)


def test_policy_gradient_term_is_weighted_per_token():
    """GRPO, on-policy (ratio 1, nothing clipped), no KL: per-token loss -A_t, times w_t."""
    algo = build_algo("grpo", kl_coef=0.0, loss_agg="token_mean")
    batch = make_batch([1.0, 0.0], [0, 0], T=2)
    batch.advantages = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -1.5]], requires_grad=True)
    batch.old_logp = logp.detach().clone()
    w = torch.tensor([[2.0, 0.5], [1.0, 0.25]])
    loss, _ = algo.loss(logp, None, MicroBatch(batch, 4.0, 2.0, 2, pg_weight=w))
    # token_mean of -A * w: (-2 - 0.5 + 1 + 0.25) / 4
    assert float(loss.detach()) == pytest.approx((-2.0 - 0.5 + 1.0 + 0.25) / 4)
    loss.backward()
    # d/dlogp of -A * rho * w at rho = 1 is -A * w / N_tok
    assert torch.allclose(logp.grad, -batch.advantages * w / 4)
    unweighted, _ = algo.loss(logp, None, MicroBatch(batch, 4.0, 2.0, 2))
    assert float(unweighted.detach()) == pytest.approx(0.0)  # (-1 - 1 + 1 + 1) / 4: the weights made the difference


def _update_capturing_gradients(engine, batch, algo) -> tuple[dict, dict]:
    """One update of the policy; its metrics and the full gradient of each parameter just before the step."""
    captured, step = {}, engine.policy.optimizer_step

    def capture_then_step():
        for name, p in engine.policy.model.named_parameters():
            captured[name] = p.grad.full_tensor().clone()
        return step()

    engine.policy.optimizer_step = capture_then_step
    return engine.update(batch, algo, step_seed=0), captured


def test_engine_applies_the_capped_weight(compose_cfg):
    """rollout_logp = trainer logp - log 2 everywhere: weights 2, capped at 1.5, so the update's
    gradient is 1.5 x the uncorrected one; the gap metric reads log 2."""
    from tests.harness.test_engine import build, sampled_batch

    grads = {}
    for cap in (0.0, 1.5):  # 0: correction.name=none
        cfg, engine, algo, task, checker = build(compose_cfg, ["trainer.micro_batch_sequences=16"])
        worker = engine.group.worker  # the cap set after validation: rollout=hf reports no rollout log-probs itself
        corr = dataclasses.replace(worker.settings.correction, name="tis" if cap else "none", cap=cap or 2.0)
        worker.settings = dataclasses.replace(worker.settings, correction=corr)
        batch = sampled_batch(engine, algo, task, checker)
        batch.old_logp = engine.compute("policy", batch)
        batch.rollout_logp = (batch.old_logp - math.log(2.0)) * batch.response_mask
        stats, grads[cap] = _update_capturing_gradients(engine, batch, algo)
        assert stats["rollout/logp_gap_mean"] == pytest.approx(math.log(2.0), abs=1e-5)
        if cap:
            assert stats["rollout/tis_weight_mean"] == pytest.approx(1.5)
            assert stats["rollout/tis_capped_frac"] == pytest.approx(1.0)
    for name, g in grads[0.0].items():  # float32 rounding: compare at the tensor's scale
        assert (grads[1.5][name] - 1.5 * g).abs().max() <= 1e-5 * g.abs().max(), name
    assert any(g.abs().max() > 0 for g in grads[0.0].values())


def test_a_correction_needs_rollout_logprobs(compose_cfg):
    with pytest.raises(ConfigError, match="correction.name=tis corrects rollout-engine log-probs"):
        validate(compose_cfg(["correction.name=tis"]))
    with pytest.raises(ConfigError, match="correction.low=0 and correction.cap=-1: need 0 <= low < cap"):
        validate(compose_cfg(["rollout=vllm", "correction.name=tis", "correction.cap=-1"]))
    validate(compose_cfg(["rollout=vllm", "correction.name=tis", "correction.cap=2"]))


def test_excluding_rejected_tokens_takes_them_out_of_the_denominator(compose_cfg):
    """correction.name=mask with the band [0.9, 1.1]: rollout log-probs log 2 above the trainer's on every other
    token (r = 0.5: dropped), equal elsewhere (r = 1: kept). GRPO without KL, token_mean: the loss is the kept
    tokens' sum over the minibatch's token count, so taking the dropped tokens out of the response mask
    (correction.exclude_rejected) scales the gradient by N / N_kept exactly; the share is logged."""
    from tests.harness.test_engine import build, sampled_batch

    grads, stats = {}, {}
    for exclude in (False, True):
        cfg, engine, algo, task, checker = build(compose_cfg, ["trainer.micro_batch_sequences=16", "algo.kl_coef=0",
                                                               "algo.loss_agg=token_mean"])  # fmt: skip
        worker = engine.group.worker
        corr = dataclasses.replace(worker.settings.correction, name="mask", cap=1.1, low=0.9, exclude_rejected=exclude)
        worker.settings = dataclasses.replace(worker.settings, correction=corr)
        batch = sampled_batch(engine, algo, task, checker)
        batch.old_logp = engine.compute("policy", batch)
        dropped = (torch.arange(batch.response_mask.shape[1]) % 2 == 1).expand_as(batch.response_mask) & batch.response_mask
        batch.rollout_logp = (batch.old_logp + math.log(2.0) * dropped) * batch.response_mask
        stats[exclude], grads[exclude] = _update_capturing_gradients(engine, batch, algo)
    n, n_dropped = float(batch.response_mask.sum()), float(dropped.sum())
    assert 0 < n_dropped < n
    assert stats[True]["rollout/excluded_token_frac"] == pytest.approx(n_dropped / n)
    assert "rollout/excluded_token_frac" not in stats[False]
    for name, g in grads[False].items():
        assert (grads[True][name] - g * n / (n - n_dropped)).abs().max() <= 1e-5 * g.abs().max(), name
    assert any(g.abs().max() > 0 for g in grads[False].values())
