"""LoRA (model.lora.*): adapters train alone, the base is the reference, merged weights reach the
rollout engine, checkpoints hold the adapters and export a merged model, resume is exact."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import rewards
from harness.commands.cli import main
from harness.config import ConfigError, validate
from harness.data.tasks import load_task
from harness.models import load_causal_lm, resolve_model
from harness.runtime.train import lora
from harness.runtime.train.checkpoint_files import read_engine_state
from harness.runtime.workers.worker import FrozenBase
from harness.scoring import score
from harness.trainer import PromptStream
from tests.helpers import build_engine

SETTINGS = SimpleNamespace(rank=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"], roles=[])
SMALL = ["task.train_size=300", "task.eval_prompts=8", "trainer.prompts_per_step=4", "algo.samples_per_prompt=4",
         "rollout.max_response_tokens=5", "model.lora.rank=8", "trainer.lr=3e-3", "algo.kl_coef=0.05",
         "model.tiny.sft_steps=20"]  # a 20-step start: the sizing rule would build one for this task size (~3 min)  # fmt: skip


def shipped_model(compose_cfg):
    cfg = compose_cfg([])
    task = load_task(cfg.task)
    path, _ = resolve_model(cfg.model, task, rewards.get(cfg.task.checker), cfg.rollout.max_response_tokens)
    return path


def randomised(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Adapters with non-zero B (fresh ones are zero: the merge would be trivially W0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def test_merge_is_w0_plus_scaled_ba_and_equals_peft(compose_cfg):
    path = shipped_model(compose_cfg)
    model = randomised(lora.add_adapters(load_causal_lm(path, "float32"), SETTINGS))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    mine = lora.merged(state, lora.scaling(SETTINGS))
    # By hand for one layer: W0 + (alpha / r) B A.
    pre = "base_model.model.model.layers.1.mlp.down_proj"
    w0, a, b = state[f"{pre}.base_layer.weight"], state[f"{pre}.lora_A.default.weight"], state[f"{pre}.lora_B.default.weight"]
    assert torch.allclose(mine["model.layers.1.mlp.down_proj.weight"], w0 + 2.0 * b @ a, atol=1e-7)
    assert torch.equal(mine["model.layers.1.mlp.up_proj.weight"], state["base_model.model.model.layers.1.mlp.up_proj.weight"])
    # the sync's stream (one gathered tensor at a time): the same tensors, bit for bit (a merged weight comes
    # after its layer's bias, once its A and B have passed)
    streamed = dict(lora.merged_stream(iter(state.items()), lora.scaling(SETTINGS)))
    assert set(streamed) == set(mine) and all(torch.equal(streamed[k], mine[k]) for k in mine)
    theirs = model.merge_and_unload().state_dict()
    assert set(mine) == set(theirs)
    assert max(float((mine[k] - theirs[k]).abs().max()) for k in mine) < 1e-6


def test_the_streamed_merge_holds_one_adapted_matrix_and_names_a_missing_part():
    """The stream yields each merged matrix as soon as its W0, A and B have passed: a consumer that frees what it
    drew never sees more than one pending module. A base without its adapters (or the reverse) is an error."""
    w0, a, b = torch.ones(4, 3), torch.ones(2, 3), torch.full((4, 2), 0.5)
    pre = "base_model.model.model.layers.0.self_attn.q_proj"
    pairs = [("base_model.model.model.embed_tokens.weight", torch.zeros(5, 3)), (f"{pre}.base_layer.weight", w0),
             (f"{pre}.base_layer.bias", torch.zeros(4)), (f"{pre}.lora_A.default.weight", a),
             (f"{pre}.lora_B.default.weight", b), ("base_model.model.lm_head.weight", torch.zeros(5, 3))]  # fmt: skip
    drawn = []
    for name, tensor in lora.merged_stream(iter(pairs), 2.0):
        drawn.append(name)
        if name.endswith("q_proj.weight"):
            assert torch.equal(tensor, w0 + 2.0 * b @ a)  # 1 + 2 x (2 x 0.5) = 3 everywhere
            assert "model.layers.0.self_attn.q_proj.bias" in drawn  # the bias came as it passed
    assert drawn == ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.bias",
                     "model.layers.0.self_attn.q_proj.weight", "lm_head.weight"]  # fmt: skip
    with pytest.raises(ValueError, match="lack a base weight or an adapter"):
        list(lora.merged_stream(iter(pairs[:3]), 2.0))


def test_only_adapters_are_trainable(compose_cfg):
    model = lora.add_adapters(load_causal_lm(shipped_model(compose_cfg), "float32"), SETTINGS)
    trainable, total = lora.count_parameters(model)
    names = lora.trainable_names(model)
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    # 2 layers x (q: 128->128, v: 128->64, down: 512->128) at rank 4: A [4, in] + B [out, 4]
    assert trainable == 2 * 4 * ((128 + 128) + (128 + 64) + (512 + 128))
    assert total == 494_464 + trainable


def test_no_matching_layer_is_one_line(compose_cfg):
    bad = SimpleNamespace(**{**vars(SETTINGS), "target_modules": ["qkv"]})
    with pytest.raises(ValueError, match=r"matches no layer.*q_proj"):
        lora.add_adapters(load_causal_lm(shipped_model(compose_cfg), "float32"), bad)


def test_reference_is_the_base_and_updates_train_adapters_only(compose_cfg):
    engine, algo, task, checker, path = build_engine(compose_cfg(SMALL))
    assert isinstance(engine.models["reference"], FrozenBase)  # no second copy of the weights
    base = load_causal_lm(path, "float32")
    plain = {k: v.clone() for k, v in base.state_dict().items()}
    before = {k: v.clone() for k, v in engine.policy.full_state_dict().items()}
    for step in range(3):
        torch.manual_seed(step)
        batch = engine.rollout(PromptStream(task.train, 4, step).next(), n=4)
        score(batch, checker)
        batch.scores = torch.linspace(0, 1, len(batch))
        engine.annotate(batch, algo.needs)
        batch.advantages, _ = algo.advantages(batch)
        stats = engine.update(batch, algo, step_seed=step)
        assert stats["policy/grad_norm"] > 0, step  # the adapters keep training after reference passes
        engine.sync_weights()
    after = engine.policy.full_state_dict()
    moved = [k for k in after if not torch.equal(before[k], after[k])]
    assert moved and all(".lora_" in k for k in moved)
    # The reference (adapters off) is the starting model exactly; the policy has moved away from it.
    ref = engine.compute("reference", batch)
    pol = engine.compute("policy", batch)
    from harness.runtime.train.fsdp import TrainEngine

    plain_engine = TrainEngine(base, "cpu", "fp32", None)
    want, _ = plain_engine.forward(batch)
    mask = batch.response_mask
    assert torch.allclose(ref[mask], want[mask], atol=1e-6)
    assert float((pol - ref)[mask].abs().max()) > 1e-3
    # The rollout engine holds the merged weights, and samples what the trainer scores.
    rollout = dict(engine.rollout_backend.model.named_parameters())
    merged = lora.merged(after, lora.scaling(engine.settings.model.lora))
    assert all(torch.equal(p.detach(), merged[k]) for k, p in rollout.items())
    assert not torch.equal(rollout["model.layers.0.self_attn.q_proj.weight"], plain["model.layers.0.self_attn.q_proj.weight"])
    enc = engine.tokenizer(batch.prompts[:4], return_tensors="pt", padding=True, padding_side="left",
                           add_special_tokens=False)  # fmt: skip
    out = engine.rollout_backend.model.generate(**enc, do_sample=False, max_new_tokens=5, output_scores=True,
                                                return_dict_in_generate=True, pad_token_id=engine.tokenizer.pad_token_id)  # fmt: skip
    from algorithms import Batch
    from harness.runtime.rollout.base import response_mask_from_ids

    resp = out.sequences[:, enc["input_ids"].shape[1]:]
    rmask, trunc = response_mask_from_ids(resp, engine.rollout_backend.eos_ids)
    gen_lp = torch.stack([torch.log_softmax(s, -1) for s in out.scores], 1).gather(-1, resp[..., None])[..., 0]
    greedy = Batch(enc["input_ids"], enc["attention_mask"].bool(), resp, rmask, torch.arange(4), batch.prompts[:4],
                   [""] * 4, [""] * 4, trunc)  # fmt: skip
    gap = (engine.compute("policy", greedy) - gen_lp)[rmask].abs()
    assert float(gap.max()) < 1e-4


def test_lora_roles_must_be_declared_trainable_models(tmp_path, fast_run, compose_cfg):
    with pytest.raises(SystemExit, match=r"algo=grpo declares no trainable model named \['critic'\]"):
        main(["run", *fast_run, "model.lora.rank=4", "model.lora.roles=[critic]", f"run_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"model.lora.roles=\['critic'\] needs model.lora.rank > 0"):
        validate(compose_cfg(["model.lora.roles=[critic]"]))
    with pytest.raises(ConfigError, match="model.lora: rank=-1"):
        validate(compose_cfg(["model.lora.rank=-1"]))


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


TIMING = ("perf/", "budget/wall_s", "rollout/tokens_per_s")
WARM = ["model.tiny.sft_steps=150", "model.tiny.sft_eval_every=50"]  # rewards vary: adapters get gradients


def comparable(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


@pytest.mark.integration
def test_lora_run_checkpoints_adapters_exports_merged_and_resumes_exactly(tmp_path, fast_run):
    args = [*fast_run, *WARM, "trainer.steps=4", "trainer.checkpoint_every=2", "model.lora.rank=8", "trainer.lr=3e-3",
            "algo.kl_coef=0.05"]  # fmt: skip
    main(["run", *args, f"run_dir={tmp_path / 'whole'}"])
    main(["run", *[a if a != "trainer.steps=4" else "trainer.steps=2" for a in args], f"run_dir={tmp_path / 'split'}"])
    main(["run", *args, f"run_dir={tmp_path / 'split'}"])
    assert comparable(metrics(tmp_path / "whole")) == comparable(metrics(tmp_path / "split"))
    info = json.loads((tmp_path / "whole" / "run.json").read_text())
    assert info["tuning"]["tuning"] == "lora" and info["tuning"]["rank"] == 8
    assert 0 < info["tuning"]["parameters"]["policy"]["trainable"] < info["tuning"]["parameters"]["policy"]["total"] / 5
    ckpt = tmp_path / "whole" / "checkpoints" / "step_0000004"
    policy_state = read_engine_state(ckpt)["policy"]["model"]
    assert policy_state and all(".lora_" in k for k in policy_state)  # the adapters alone
    # The export is the merged model; peft's own loader on the adapter directory gives the same weights.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    exported = load_file(ckpt / "policy" / "model.safetensors")
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(info["model_path"]),
                                           ckpt / "policy_adapter")  # fmt: skip
    theirs = peft_model.merge_and_unload().state_dict()
    assert max(float((exported[k] - theirs[k]).abs().max()) for k in exported) < 1e-6
    start = load_file(f"{info['model_path']}/model.safetensors")
    assert max(float((exported[k] - start[k]).abs().max()) for k in exported) > 1e-4
    # harness eval on the export reproduces the accuracy logged at step 4.
    main(["eval", f"model.path={ckpt / 'policy'}", "eval_limit=8", "task.train_size=400", "task.eval_prompts=8",
          "rollout.max_response_tokens=6", f"run_dir={tmp_path / 'eval'}"])  # fmt: skip
    logged = [r for r in metrics(tmp_path / "whole") if "eval/arith/accuracy" in r][-1]["eval/arith/accuracy"]
    assert metrics(tmp_path / "eval")[0]["eval/arith/accuracy"] == logged


@pytest.mark.integration
def test_lora_on_two_workers_matches_one(tmp_path):
    from tests.runtime.test_workers import EQUIV_RUN

    args = [*EQUIV_RUN, "model.lora.rank=8", "trainer.lr=3e-3"]
    main(["run", *args, f"run_dir={tmp_path / 'w1'}"])
    main(["run", *args, "runtime.workers=2", f"run_dir={tmp_path / 'w2'}"])
    one, two = metrics(tmp_path / "w1"), metrics(tmp_path / "w2")
    for key in ("rollout/generated_tokens", "reward/mean", "eval/arith/accuracy"):
        assert [r.get(key) for r in one] == [r.get(key) for r in two], key
    for key in ("loss/policy", "policy/grad_norm", "loss/kl"):
        assert [r[key] for r in one[1:]] == pytest.approx([r[key] for r in two[1:]], rel=1e-4, abs=1e-6), key
    assert min(r["policy/grad_norm"] for r in one[1:]) > 0


@pytest.mark.integration
def test_ppo_with_a_lora_critic(tmp_path, fast_run):
    main(["run", *fast_run, *WARM, "algo=ppo", "model.lora.rank=4", "model.lora.roles=[critic]", f"run_dir={tmp_path}"])
    info = json.loads((tmp_path / "run.json").read_text())
    params = info["tuning"]["parameters"]
    assert params["critic"]["trainable"] < params["critic"]["total"] / 5  # adapters + the value head
    critic = read_engine_state(tmp_path / "checkpoints" / "step_0000003")["critic"]["model"]
    assert any("value_head" in k for k in critic) and all(".lora_" in k or "value_head" in k for k in critic)
    assert float(critic["base_model.model.value_head.weight"].abs().max()) > 0  # the head trained off zero


def test_a_checkpoint_of_other_lora_settings_is_refused(compose_cfg, tmp_path):
    from harness.core.errors import CheckpointError
    from harness.runtime.train.fsdp import TrainEngine, init_distributed

    init_distributed("cpu")
    optim = SimpleNamespace(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=0, grad_clip=1.0)

    def engine(settings):
        return TrainEngine(lora.add_adapters(load_causal_lm(shipped_model(compose_cfg), "float32"), settings), "cpu",
                           "fp32", optim)  # fmt: skip

    own, other = engine(SETTINGS), engine(SimpleNamespace(**{**vars(SETTINGS), "target_modules": ["q_proj", "k_proj"]}))
    small = own.save_sharded(str(tmp_path / "own"))
    assert set(read_engine_state(tmp_path, {"format": "sharded", "dir": ".", "models": {"own": small}})["own"]["model"]) \
        == own.trainable  # the adapters alone
    own.load_sharded(str(tmp_path / "own"), small)  # its own: fine
    other_small = other.save_sharded(str(tmp_path / "other"))
    with pytest.raises(CheckpointError, match="do not match this model's"):
        own.load_sharded(str(tmp_path / "other"), other_small)
    with pytest.raises(CheckpointError, match="do not match this model's"):  # a checkpoint of the earlier, full format
        own.load_state({"model": {k.replace("lora_A", "lora_X"): torch.zeros(1) for k in own.trainable}})


def test_a_run_dir_from_before_lora_resumes_only_without_it(tmp_path, fast_run):
    """An old run dir's config has no model.lora keys: it ran fully fine-tuned, so resuming it with
    LoRA on is a config change (refused), and without it the same run (resumes)."""
    import yaml

    main(["run", *fast_run, "trainer.steps=2", f"run_dir={tmp_path}"])
    cfg = yaml.safe_load((tmp_path / "config.yaml").read_text())
    del cfg["model"]["lora"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(SystemExit, match=r"model.lora.rank: 0 -> 8"):
        main(["run", *fast_run, "trainer.steps=3", "model.lora.rank=8", f"run_dir={tmp_path}"])
    main(["run", *fast_run, "trainer.steps=3", f"run_dir={tmp_path}"])
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]
