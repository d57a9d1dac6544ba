"""On-policy distillation: advantages computed by hand from the reverse-KL formula, the teacher role
the run builds (tiny teacher, a directory, a refused tokenizer), and the teacher in `harness plan`."""

import json
import shutil

import pytest
import torch

from algorithms import MicroBatch
from harness.commands.cli import main
from tests.helpers import build, make_batch


def _batch(old, teacher, scores, groups, mask=None):
    batch = make_batch(scores, groups, T=len(old[0]), mask=mask)
    batch.old_logp = torch.tensor(old)
    batch.outputs["teacher"] = torch.tensor(teacher)
    return batch


def test_advantage_is_the_negative_per_token_reverse_kl():
    # k_t = log pi_old - log pi_T; A_t = -k_t on the response's tokens, 0 on padding
    batch = _batch([[-1.0, -0.5, -2.0], [-0.2, -3.0, -1.0]], [[-0.5, -2.5, -9.0], [-0.2, -1.0, -4.0]],
                   [1.0, 0.0], [0, 0], mask=[[1, 1, 0], [1, 1, 1]])
    adv, stats = build("opd", whiten=False).advantages(batch)
    torch.testing.assert_close(adv, torch.tensor([[0.5, -2.0, 0.0], [0.0, 2.0, -3.0]]))
    # k over the masked tokens: [-0.5, 2.0 | 0.0, -2.0, 3.0]: mean 2.5 / 5, per sequence 1.5 and 1.0
    assert stats["opd/reverse_kl_per_token"] == pytest.approx(0.5)
    assert stats["opd/reverse_kl_per_seq"] == pytest.approx((1.5 + 1.0) / 2)
    # the coefficient scales it
    adv2, _ = build("opd", teacher_kl_coef=0.5, whiten=False).advantages(batch)
    torch.testing.assert_close(adv2, adv * 0.5)
    # the default whitens -k over the 5 tokens: mean -0.5, unbiased std
    white, _ = build("opd").advantages(batch)
    neg = torch.tensor([0.5, -2.0, 0.0, 2.0, -3.0])
    want = (neg - neg.mean()) / neg.std()
    torch.testing.assert_close(white[batch.response_mask], want, atol=1e-5, rtol=0)
    assert white[0, 2] == 0.0


def test_reward_mixing_adds_the_group_normalised_outcome():
    # scores 1, 0 in one group: GRPO's advantage +-1/std, std (unbiased) of {1, 0} = 0.7071
    batch = _batch([[-1.0, -1.0], [-1.0, -1.0]], [[-1.0, -1.0], [-1.0, -1.0]], [1.0, 0.0], [0, 0])
    adv, _ = build("opd", reward_coef=0.5).advantages(batch)
    a = 0.5 * 0.5 / (0.5**0.5 + 1e-6)
    torch.testing.assert_close(adv, torch.tensor([[a, a], [-a, -a]]))
    # all-equal rewards: the outcome term is 0, and a teacher equal to the student leaves nothing
    batch = _batch([[-1.0, -2.0], [-1.0, -2.0]], [[-1.0, -2.0], [-1.0, -2.0]], [1.0, 1.0], [0, 0])
    adv, stats = build("opd", reward_coef=1.0).advantages(batch)
    assert torch.equal(adv, torch.zeros(2, 2)) and stats["opd/reverse_kl_per_token"] == 0.0


def test_empty_masks_and_the_loss_gradient():
    # a response with no token: advantage 0 there, stats finite
    batch = _batch([[-1.0, -1.0], [-1.0, -1.0]], [[-3.0, -0.5], [-9.0, -9.0]], [0.0, 0.0], [0, 1],
                   mask=[[1, 1], [0, 0]])
    algo = build("opd", whiten=False)
    adv, stats = algo.advantages(batch)
    assert adv[1].abs().sum() == 0 and all(torch.isfinite(torch.tensor(v)) for v in stats.values())
    # on-policy (ratio 1), token_mean: loss = -mean_t A_t; its gradient pushes log pi up where the teacher is higher
    batch.advantages = adv
    logp = batch.old_logp.clone().requires_grad_(True)
    loss, _ = algo.loss(logp, torch.zeros(2, 2), MicroBatch(batch, 2.0, 2.0, 2))
    loss.backward()
    assert loss.item() == pytest.approx(-(-2.0 + 0.5) / 2)
    assert logp.grad[0, 0] > 0 and logp.grad[0, 1] < 0 and logp.grad[1].abs().sum() == 0  # descent lowers token 0 (the teacher gives it less mass), raises 1


def test_needs_a_frozen_teacher_and_logp_before_advantages():
    needs = build("opd", teacher_path="/models/t").needs
    (teacher,) = needs.roles
    assert teacher.name == "teacher" and teacher.init == "/models/t" and not teacher.trainable
    assert needs.logp_before_advantages and needs.old_logp
    assert [r.name for r in build("opd", kl_coef=0.01).needs.roles] == ["teacher", "reference"]


def test_a_run_builds_the_tiny_teacher_and_records_it(tmp_path, fast_run):
    run_dir = tmp_path / "run"
    main(["run", *fast_run, "algo=opd", "teacher.sft_steps=60", "trainer.steps=2", f"run_dir={run_dir}"])
    info = json.loads((run_dir / "run.json").read_text())
    teacher = info["role_models"]["teacher"]
    assert teacher["sft_steps"] == 60 and len(teacher["weights_sha256"]) == 64
    assert info["algorithm"]["teacher"] == "tiny"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[1]["opd/reverse_kl_per_token"] != 0.0  # 60 vs 20 SFT steps: the two models differ
    # a directory works too (the teacher just built), and the run records its path
    run2 = tmp_path / "run2"
    main(["run", *fast_run, "algo=opd", f"algo.teacher_path={teacher['path']}", "trainer.steps=1", f"run_dir={run2}"])
    info2 = json.loads((run2 / "run.json").read_text())
    assert info2["role_models"]["teacher"]["weights_sha256"] == teacher["weights_sha256"]


def test_a_teacher_with_another_tokenizer_is_refused_in_one_line(tmp_path, fast_run):
    from harness.models import load_tokenizer

    run_dir = tmp_path / "run"
    main(["run", *fast_run, "trainer.steps=1", "trainer.checkpoint_every=1", f"run_dir={run_dir}"])
    policy = next((run_dir / "checkpoints").iterdir()) / "policy"
    other = tmp_path / "other"
    shutil.copytree(policy, other)
    tok = load_tokenizer(str(other))
    tok.add_tokens(["<teacher-only>"])
    tok.save_pretrained(other)
    with pytest.raises(SystemExit, match=r"algo.teacher_path=.*other: its tokenizer differs from the policy's"):
        main(["run", *fast_run, "algo=opd", f"algo.teacher_path={other}", f"run_dir={tmp_path / 'r2'}"])
    with pytest.raises(SystemExit, match=r"algo.teacher_path=/nonexistent: not a model directory"):
        main(["run", *fast_run, "algo=opd", "algo.teacher_path=/nonexistent", f"run_dir={tmp_path / 'r3'}"])


def test_plan_counts_the_teacher(capsys):
    main(["plan", "algo=opd"])
    out = capsys.readouterr().out
    assert "teacher (frozen, tiny)" in out
    from omegaconf import OmegaConf

    from harness.config import Config, teacher_model_config
    from harness.models import ModelShape, model_shape

    cfg = OmegaConf.structured(Config)
    cfg.teacher.hidden_size, cfg.teacher.num_layers = 256, 4
    shape = model_shape(cfg, "tiny")
    assert (shape.hidden, shape.layers, shape.intermediate) == (256, 4, 512)
    assert teacher_model_config(cfg.model, cfg.teacher).tiny.sft_steps == 2000
    assert shape.parameters > model_shape(cfg).parameters and isinstance(shape, ModelShape)
