"""Multi-turn episodes (harness/runtime/driver/episodes.py): token bookkeeping, limits, masking, exactness."""

from __future__ import annotations

import json
import math

import pytest
import torch

import algorithms
from algorithms.base import MicroBatch
from harness.commands.docs_gen import builtin_algorithms
from harness.data.envs import Turn
from harness.runtime.driver.episodes import episode_metrics, episode_tensors, observation_text, run_episodes
from harness.runtime.rollout.base import Generation
from tests.episode_envs import Digits
from tests.helpers import build, build_engine, make_batch

EOS = 0


def _gen(rows: list[list[int]], prompt_len: int = 2) -> Generation:
    """A Generation of the given response rows (EOS = 0 ends a turn)."""
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), 9)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = True
    return Generation(
        prompt_ids=torch.full((len(rows), prompt_len), 5), prompt_mask=torch.ones(len(rows), prompt_len, dtype=torch.bool),
        response_ids=ids, response_mask=mask, truncated=torch.tensor([EOS not in r for r in rows]),
        group_ids=torch.arange(len(rows)), rollout_logp=-torch.ones(len(rows), width) * mask,
    )  # fmt: skip


class Scripted:
    """A stand-in for the rollout engine in the bookkeeping tests: each call returns the next
    scripted turn of each live episode (the real engines are exercised below)."""

    def __init__(self, turns: dict[int, list[list[int]]]):
        self.turns, self.calls = turns, []

    def __call__(self, contexts, n, cap, seeds):
        self.calls.append((contexts, cap))
        k = len(self.calls)
        return _gen([self.turns[k][i][:cap] for i in range(len(contexts))])


def _play(first_rows, later, max_turns=3, span=20, turn_cap=0, obs=(7, 7, 7)):
    envs = [Digits(max_turns=max_turns) for _ in first_rows]
    for e in envs:
        e.reset(type("E", (), {"messages": []})())
    engine = Scripted(later)
    eps = run_episodes(engine, decode=lambda ids: " ".join(map(str, ids)), encode=lambda text, eos_id: list(obs),
                       first=_gen(first_rows), envs=envs, eos_ids=[EOS], max_span_tokens=span,
                       max_turn_tokens=turn_cap, seeds=lambda k: None)  # fmt: skip
    return eps, engine


def test_turns_and_observations_interleave_with_model_tokens_marked():
    eps, engine = _play([[1, 2, EOS], [3, EOS]], {1: [[4, EOS], [5, 6, EOS]], 2: [[8, EOS], [8, EOS]]})
    assert eps[0].tokens == [1, 2, EOS, 7, 7, 7, 4, EOS, 7, 7, 7, 8, EOS]
    assert eps[0].trained == [True] * 3 + [False] * 3 + [True] * 2 + [False] * 3 + [True] * 2
    assert eps[0].logps == [-1.0] * 3 + [0.0] * 3 + [-1.0] * 2 + [0.0] * 3 + [-1.0] * 2
    assert eps[0].end == "max_turns" and len(eps[0].turns) == 3
    assert eps[0].tool_calls == 3 and eps[0].tool_errors == 1
    # turn 2's contexts are the prompts' tokens plus everything so far, as token ids
    assert engine.calls[0][0][1] == [5, 5, 3, EOS, 7, 7, 7]
    t = episode_tensors(eps, pad_id=9)
    assert t["response_mask"].sum().item() == 7 + 7 and t["context_mask"].sum().item() == 13 + 13
    assert t["rollout_logp"][~t["response_mask"]].abs().sum() == 0


def test_span_limit_ends_episodes_and_cuts_turns_to_their_own_room():
    # span 9: ep0 has 3 + 3 tokens after turn 1, so 3 left; ep1 has 2 + 3 = 5, so 4 left
    eps, engine = _play([[1, 2, EOS], [3, EOS]], {1: [[4, 4, 4, 4, EOS], [5, 5, 5, 5, EOS]]}, span=9)
    assert engine.calls[0][1] == 4  # one call, capped by the largest room
    assert eps[0].tokens[6:] == [4, 4, 4] and eps[0].end == "max_tokens" and eps[0].truncated
    assert eps[1].tokens[5:] == [5, 5, 5, 5] and eps[1].end == "max_tokens"
    # an observation with no room after it ends the episode without being appended
    eps, _ = _play([[1, 1, 1, 1, 1, EOS]], {}, span=9)
    assert eps[0].tokens == [1, 1, 1, 1, 1, EOS] and eps[0].end == "max_tokens" and not eps[0].truncated


def test_a_turn_cut_by_the_turn_cap_ends_truncated():
    eps, _ = _play([[1, EOS]], {1: [[2, 2, 2, 2, 2, EOS]]}, turn_cap=3)
    assert eps[0].tokens == [1, EOS, 7, 7, 7, 2, 2, 2] and eps[0].end == "truncated" and eps[0].truncated


def test_the_loop_enforces_max_turns_whatever_the_environment_does():
    class Endless(Digits):
        def step(self, model_text):
            return Turn("12+3=", done=False)

    envs = [Endless(max_turns=99)]
    eps = run_episodes(Scripted({1: [[4, EOS]], 2: [[5, EOS]]}), decode=str, encode=lambda text, eos_id: [7],
                       first=_gen([[1, EOS]]), envs=envs, eos_ids=[EOS], max_span_tokens=50, max_turn_tokens=0,
                       seeds=lambda k: None, max_turns=2)  # fmt: skip
    assert eps[0].tokens == [1, EOS, 7, 4, EOS] and eps[0].end == "max_turns"


def test_concat_keeps_environment_tokens_of_every_part():
    """A refill (DAPO/PRIME) may concatenate episode batches with and without environment tokens:
    a part without a context mask reads as its response mask, in either order."""
    from algorithms import Batch

    a = make_batch([1.0, 0.0], [0, 0], T=3, mask=[[1, 1, 0], [1, 0, 0]])
    b = make_batch([1.0, 0.0], [0, 0], T=4, mask=[[1, 0, 0, 1], [1, 1, 1, 1]])
    b.context_mask = torch.ones(2, 4, dtype=torch.bool)
    for parts in ([a, b], [b, a]):
        out = Batch.concat(parts)
        assert out.context_mask.shape == (4, 4)
        rows_a = slice(0, 2) if parts[0] is a else slice(2, 4)
        rows_b = slice(2, 4) if parts[0] is a else slice(0, 2)
        assert torch.equal(out.context_mask[rows_a, :3], a.response_mask) and out.context_mask[rows_b].all()


def test_episode_metrics():
    ep = {"turns": torch.tensor([1, 3]), "tool_calls": torch.tensor([0, 2]), "tool_errors": torch.tensor([0, 1]),
          "end": ["answered", "max_turns"]}  # fmt: skip
    m = episode_metrics(ep)
    assert m["env/turns_mean"] == 2.0 and m["env/tool_calls_mean"] == 1.0 and m["env/tool_error_frac"] == 0.5
    assert m["env/tool_success_frac"] == 0.5 and m["env/end_answered_frac"] == 0.5 and m["env/end_max_turns_frac"] == 0.5
    assert episode_metrics(None) == {}


def test_observation_text_with_a_chat_template(shared_data):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(f"{shared_data}/tokenizers/qwen2")
    text = observation_text(tok, "<result>7</result>", use_chat_template=True, eos_texts=["<|im_end|>"])
    # this template writes a trailer after every rendering; the model's next turn follows it, as in the prompt
    assert text == "\n<|im_start|>user\n<result>7</result><|im_end|>\n<|im_start|>assistant\ntemplate ends here"
    assert observation_text(tok, "obs", use_chat_template=False) == "obs"


@pytest.mark.parametrize("name", algorithms.available())
def test_environment_tokens_get_no_gradient(name):
    """Every algorithm's policy loss: the log-probs at environment positions (response_mask False,
    context_mask True) receive exactly zero gradient, and changing them changes no other gradient."""
    algo = build(name)
    mask = [[1, 1, 0, 0, 1, 1], [1, 0, 0, 1, 1, 1], [1, 1, 1, 0, 0, 1], [1, 1, 0, 1, 1, 1]]
    batch = make_batch([1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1], T=6, mask=mask)
    batch.context_mask = torch.ones(4, 6, dtype=torch.bool)
    env_pos = batch.context_mask & ~batch.response_mask
    g = torch.Generator().manual_seed(0)
    batch.old_logp = -torch.rand(4, 6, generator=g)
    for role in algo.needs.roles:
        batch.outputs[role.name] = -torch.rand(4, 6, generator=g)
    batch.advantages = torch.randn(4, 6, generator=g) * batch.response_mask  # as every algorithm leaves them

    def grads(logp):
        logp = logp.clone().requires_grad_(True)
        entropy = torch.rand(4, 6, generator=torch.Generator().manual_seed(1))
        micro = MicroBatch(batch, minibatch_tokens=float(batch.response_mask.sum()), minibatch_seqs=4.0,
                           max_response_tokens=6)  # fmt: skip
        loss = algo.loss(logp, entropy, micro)
        loss = loss[0] if isinstance(loss, tuple) else loss
        (grad,) = torch.autograd.grad(loss, logp, allow_unused=True)
        return torch.zeros_like(logp) if grad is None else grad

    logp = batch.old_logp + 0.05 * torch.randn(4, 6, generator=g)
    base = grads(logp)
    assert base[env_pos].abs().max() == 0
    changed = grads(torch.where(env_pos, logp - 5.0, logp))
    torch.testing.assert_close(changed, base, rtol=0, atol=0)


def _episode_engine(compose_cfg, extra=()):
    cfg = compose_cfg(["algo=grpo", "model.tiny.sft_steps=20", "task.train_size=400", "task.eval_prompts=8",
                       "trainer.prompts_per_step=4", "algo.samples_per_prompt=2", "rollout.max_response_tokens=24",
                       "env.name=test_digits", "env.max_turns=3", "env.max_turn_tokens=6", *extra])  # fmt: skip
    return build_engine(cfg)


@pytest.mark.parametrize("share_prompts", [True, False])
def test_trainer_logps_of_an_episode_equal_an_unpadded_forward(compose_cfg, share_prompts):
    """The training forward over padded episodes reads what the rollout read: each model token's
    log-prob equals a plain forward over that row's real tokens alone (prompt + span, no padding),
    with each prompt run once for its samples (share_prompts) and in one pass."""
    engine, _, task, _, path = _episode_engine(compose_cfg, [f"trainer.share_prompts={share_prompts}"])
    try:
        torch.manual_seed(3)
        batch = engine.rollout(task.train[:4], n=2)
        assert batch.context_mask is not None and (batch.context_mask & ~batch.response_mask).any()
        assert batch.episode["turns"].float().mean() > 1
        logp = engine.compute("policy", batch)
        model = engine.rollout_backend.model
        for i in range(len(batch)):
            prompt = batch.prompt_ids[i][batch.prompt_mask[i]]
            span = batch.response_ids[i][batch.context_mask[i]]
            ids = torch.cat([prompt, span])[None]
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            ref = torch.log_softmax(logits, -1).gather(1, span[:, None])[:, 0]
            trained = batch.response_mask[i][batch.context_mask[i]]
            got = logp[i][batch.context_mask[i]]
            torch.testing.assert_close(got[trained], ref[trained], rtol=0, atol=2e-5)
    finally:
        engine.close()


def test_one_turn_environment_reproduces_a_single_turn_run(tmp_path, compose_cfg):
    """env.name=test_one_turn (every episode ends after one turn) logs the very metrics of a run
    without an environment, for the same seed and model."""
    import rewards
    from harness.data.tasks import load_task
    from harness.models import resolve_model
    from harness.trainer import train

    common = ["algo=grpo", "model.tiny.sft_steps=20", "task.train_size=400", "task.eval_prompts=8", "trainer.steps=2",
              "trainer.prompts_per_step=4", "algo.samples_per_prompt=4", "trainer.eval_every=1",
              "rollout.max_response_tokens=6"]  # fmt: skip
    cfg = compose_cfg(common)
    path, _ = resolve_model(cfg.model, load_task(cfg.task), rewards.get(cfg.task.checker), cfg.rollout.max_response_tokens)
    runs = {}
    for name, extra in (("plain", []), ("env", ["env.name=test_one_turn"])):
        cfg = compose_cfg([*common, f"model.path={path}", f"run_dir={tmp_path / name}", *extra])
        train(cfg, str(tmp_path / name))
        lines = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        assert any("env/turns_mean" in x for x in lines) == (name == "env")  # the episode path ran
        runs[name] = [{k: v for k, v in m.items() if not k.startswith(("perf/", "env/", "budget/wall_s"))
                       and "/turns_mean" not in k and "/tool_" not in k and "/end_" not in k} for m in lines]  # fmt: skip
    assert runs["env"] == runs["plain"]
    assert len(runs["plain"]) == 3


def test_episodes_on_two_workers(tmp_path, compose_cfg):
    """Episodes shard over worker processes like any rollout (each turn's contexts split by rows,
    token-id prompts merged back); the environment stays on the driver."""
    from harness.trainer import train

    cfg = compose_cfg(["algo=grpo", "model.tiny.sft_steps=20", "task.train_size=400", "task.eval_prompts=8",
                       "trainer.steps=2", "trainer.prompts_per_step=4", "algo.samples_per_prompt=2",
                       "rollout.max_response_tokens=24", "env.name=test_digits", "env.max_turns=3",
                       "env.max_turn_tokens=6", "runtime.workers=2", f"run_dir={tmp_path}"])  # fmt: skip
    train(cfg, str(tmp_path))
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "env/turns_mean" in r]
    assert len(steps) == 2 and all(r["env/turns_mean"] > 1 for r in steps)
    assert all(r["env/tool_calls_mean"] > 0 for r in steps)


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(builtin_algorithms()))
def test_every_algorithm_trains_on_episodes(name, tmp_path, compose_cfg):
    """Every built-in algorithm runs unchanged on multi-turn episodes (PPO's critic, PRIME's implicit
    reward model, ReMax's greedy episodes as baseline, DAPO's and PRIME's refills included)."""
    from harness.trainer import train

    cfg = compose_cfg([f"algo={name}", "model.tiny.sft_steps=20", "task.train_size=400", "task.eval_prompts=4",
                       "trainer.steps=2", "trainer.eval_every=2", "trainer.prompts_per_step=4", "algo.samples_per_prompt=2",
                       "rollout.max_response_tokens=16", "env.name=test_digits", "env.max_turns=3",
                       "env.max_turn_tokens=4", "teacher.sft_steps=10", f"run_dir={tmp_path}"])  # fmt: skip
    train(cfg, str(tmp_path))
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == 2 and all(r["env/turns_mean"] > 1 and "loss/policy" in r for r in steps)
    assert all(math.isfinite(r["loss/policy"]) for r in steps)
