"""The engine's fast paths give the results of the plain ones.

- shared prompts: each distinct prompt runs once (training forward and HF prefill);
- on-policy updates reuse the update's own forward as old log-probs (no extra pass);
- bf16 (autocast) runs end to end on CPU.
"""

import pytest
import torch

from harness.runtime.rollout.hf import HFRollout
from harness.runtime.train.batching import length_buckets
from tests.harness.test_engine import build

# Prompts of different lengths (left padding) with the arith tokenizer's single-digit tokens.
PROMPTS = ["7+5=", "12+34=", "3+45=", "12+34="]  # the last repeats one: 3 distinct prompts


def batch_of(engine, n=3, temperature=1.0):
    torch.manual_seed(0)
    batch = engine.generate(PROMPTS, ["12", "46", "48", "46"], n, temperature)
    batch.scores = torch.linspace(0, 1, len(batch))
    return batch


def logp_and_grads(policy, batch):
    logp, entropy = policy.forward(batch, 1.0, with_entropy=True)
    mask = batch.response_mask
    (logp * mask).sum().backward()
    grads = {k: p.grad.full_tensor().clone() for k, p in policy.model.named_parameters()}
    policy.optimizer.zero_grad(set_to_none=True)
    return logp.detach(), entropy.detach(), grads


@pytest.mark.parametrize("width", [None, 1, 2])  # None: as sampled (up to 5 response tokens)
def test_shared_prompt_forward_equals_one_pass(compose_cfg, width):
    cfg, engine, algo, task, checker = build(compose_cfg, [])
    policy = engine.policy
    assert policy.share_prompts
    batch = batch_of(engine)
    if width:
        batch.response_ids, batch.response_mask = batch.response_ids[:, :width], batch.response_mask[:, :width]
    shared = logp_and_grads(policy, batch)
    policy.share_prompts = False
    plain = logp_and_grads(policy, batch)
    mask = batch.response_mask
    assert torch.allclose(shared[0][mask], plain[0][mask], atol=1e-5)
    assert torch.allclose(shared[1][mask], plain[1][mask], atol=1e-5)
    for name, g in plain[2].items():
        assert (shared[2][name] - g).abs().max() <= 1e-5 * g.abs().max() + 1e-8, name


def test_hf_shared_prefill_generates_what_generate_does(compose_cfg):
    cfg, engine, *_ = build(compose_cfg, [])
    model, tok = engine.rollout_backend.model, engine.tokenizer
    shared = HFRollout(model, tok, share_prompts=True).generate(PROMPTS, n=3, max_new_tokens=6, temperature=0.0)
    plain = HFRollout(model, tok, share_prompts=False).generate(PROMPTS, n=1, max_new_tokens=6, temperature=0.0)
    width = plain.response_ids.shape[1]
    assert torch.equal(shared.response_ids[:, :width], plain.response_ids.repeat_interleave(3, 0))
    assert torch.equal(shared.response_mask[:, :width], plain.response_mask.repeat_interleave(3, 0))
    assert torch.equal(shared.prompt_ids, plain.prompt_ids.repeat_interleave(3, 0))
    assert shared.group_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]


def test_on_policy_old_logp_reuse_equals_recomputation(compose_cfg):
    """One optimizer step per batch: old log-probs from the update's own forward == a separate pass."""
    grads_of = []
    for recompute in (False, True):
        cfg, engine, algo, task, checker = build(compose_cfg, [])
        assert engine.on_policy
        batch = batch_of(engine)
        batch.advantages, _ = algo.advantages(batch)
        if recompute:
            batch.old_logp = engine.compute("policy", batch)
        grads, step = {}, engine.policy.optimizer_step

        def capture_then_step(engine=engine, grads=grads, step=step):
            grads.update({k: p.grad.full_tensor().clone() for k, p in engine.policy.model.named_parameters()})
            return step()

        engine.policy.optimizer_step = capture_then_step
        stats = engine.update(batch, algo, step_seed=0)
        assert stats["policy/clipfrac"] == 0.0
        grads_of.append(grads)
    reuse, recomputed = grads_of
    assert any(g.abs().max() > 0 for g in reuse.values())
    for name, g in recomputed.items():
        assert (reuse[name] - g).abs().max() <= 1e-5 * g.abs().max() + 1e-8, name


def test_bf16_update_on_cpu(compose_cfg):
    logps = {}
    for precision in ("fp32", "bf16"):
        cfg, engine, algo, task, checker = build(compose_cfg, [f"trainer.precision={precision}"])
        batch = batch_of(engine)
        logps[precision] = engine.compute("policy", batch)
    mask = batch.response_mask
    assert logps["bf16"].dtype == torch.float32
    assert torch.allclose(logps["bf16"][mask], logps["fp32"][mask], atol=0.1)  # bf16 rounding only
    batch.advantages, _ = algo.advantages(batch)
    before = {k: v.clone() for k, v in engine.policy.full_state_dict().items()}
    stats = engine.update(batch, algo, step_seed=0)
    assert all(torch.isfinite(torch.tensor(v)) for v in stats.values())
    after = engine.policy.full_state_dict()
    assert all(v.dtype == torch.float32 for v in after.values())  # fp32 master weights
    assert any(not torch.equal(before[k], after[k]) for k in after)
    engine.sync_weights()
    assert engine.rollout_backend.autocast_dtype == torch.bfloat16  # generation under autocast too
    assert engine.rollout(task.train[:2], n=2).response_mask.any()


@pytest.mark.parametrize("share", [True, False])
def test_reference_logprobs_same_with_or_without_sharing(compose_cfg, share):
    cfg, engine, algo, task, checker = build(compose_cfg, [f"trainer.share_prompts={share}", "algo.kl_coef=0.1"])
    batch = batch_of(engine)
    ref = engine.compute("reference", batch)
    policy = engine.compute("policy", batch)  # same initial weights
    mask = batch.response_mask
    assert torch.allclose(ref[mask], policy[mask], atol=1e-5)
    assert engine.models["reference"].share_prompts == share


def test_length_buckets_partition_rows_and_cut_padding():
    lengths = torch.tensor([5, 1, 1, 2, 1, 5, 2, 1, 1, 1, 1, 1])
    buckets = length_buckets(lengths)
    rows = torch.cat(buckets)
    assert sorted(rows.tolist()) == list(range(len(lengths)))  # every row exactly once
    assert all(torch.equal(lengths[b], lengths[b].sort().values) for b in buckets)
    padded = sum(len(b) * int(lengths[b].max()) for b in buckets)
    assert len(buckets) > 1 and padded < len(lengths) * 5
    assert len(length_buckets(torch.full((8,), 3))) == 1  # nothing to save: one bucket
    assert len(length_buckets(lengths, max_buckets=1)) == 1


@pytest.mark.parametrize("share", [True, False])
def test_each_row_gets_its_logprobs_alone(compose_cfg, share):
    """Sharing, bucketing and padding change nothing: row by row equals the whole batch."""
    cfg, engine, algo, task, checker = build(compose_cfg, [f"trainer.share_prompts={share}"])
    batch = batch_of(engine)
    lengths = torch.tensor([1, 5, 2, 1, 1, 3, 1, 1, 5, 2, 1, 1])[: len(batch)]
    batch.response_mask = torch.arange(batch.response_ids.shape[1])[None, :] < lengths[:, None]
    logp, entropy = engine.policy.forward(batch, 0.7, with_entropy=True)
    for i in range(len(batch)):
        one = batch.select(torch.tensor([i]))
        alone, alone_entropy = engine.policy.forward(one, 0.7, with_entropy=True)
        m = one.response_mask[0]
        assert torch.allclose(logp[i][m], alone[0][m], atol=1e-5), i
        assert torch.allclose(entropy[i][m], alone_entropy[0][m], atol=1e-5), i


def test_holes_in_the_response_mask_keep_their_tokens(compose_cfg):
    """A mask with holes (e.g. tool output masked out) still runs up to its last real token."""
    cfg, engine, algo, task, checker = build(compose_cfg, [])
    batch = batch_of(engine)
    batch.response_mask = torch.ones_like(batch.response_mask)
    batch.response_mask[:, 1:-1] = False  # first and last token only
    logp, _ = engine.policy.forward(batch, 1.0)
    engine.policy.share_prompts = False
    plain, _ = engine.policy.forward(batch, 1.0)
    for i in range(len(batch)):
        one = batch.select(torch.tensor([i]))
        alone, _ = engine.policy.forward(one, 1.0)
        m = one.response_mask[0]
        assert torch.allclose(logp[i][m], alone[0][m], atol=1e-5) and torch.allclose(plain[i][m], alone[0][m], atol=1e-5)
