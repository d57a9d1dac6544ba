"""`harness rm train`: Bradley-Terry by hand, the run directory, an exact Hugging Face export,
and (learning tier) held-out pair accuracy >= 0.9 on arith."""

import json
import math

import pytest
import torch

from harness.commands.cli import main
from tests.algorithms.test_learning import THRESHOLD
from tests.helpers import LEARNING_SEED


def test_bradley_terry_loss_by_hand():
    from harness.reward_model import bt_loss

    loss, stats = bt_loss(torch.tensor([2.0, 0.0, 1.0, 1.0]))  # chosen 2, 0; rejected 1, 1
    expected = (-math.log(1 / (1 + math.exp(-1.0))) - math.log(1 / (1 + math.exp(1.0)))) / 2
    assert loss.item() == pytest.approx(expected)
    assert stats == {"pair_accuracy": 0.5, "margin": 0.0}


@pytest.mark.integration
def test_rm_train_writes_a_run_dir_and_an_exact_hf_export(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from harness.config import task_presets
    from harness.data.pairs import arith_pairs
    from harness.data.tasks import render_prompt
    from harness.runtime.loading import load_tokenizer

    run_dir = tmp_path / "rm"
    main(["rm", "train", "rm.steps=40", "rm.eval_every=20", "runtime.threads=1", f"run_dir={run_dir}"])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(41)) and rows[-1]["eval/pair_accuracy"] > 0.5  # from 0 (ties)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["kind"] == "reward_model" and info["status"] == "finished" and info["eval_pairs"] == 128
    # The exported classifier scores the held-out pairs exactly as training measured them.
    model = AutoModelForSequenceClassification.from_pretrained(run_dir / "reward_model").eval()
    tok = load_tokenizer(str(run_dir / "reward_model"))  # as the harness loads it
    pairs = arith_pairs(task_presets()["arith"], "test", seed=0)

    def score(pair, response):
        ids = tok(render_prompt(pair.prompt, tok, True) + response, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            return float(model(input_ids=torch.tensor([ids + [tok.eos_token_id]])).logits[0, 0])

    margins = torch.tensor([score(p, p.chosen) - score(p, p.rejected) for p in pairs])
    assert float((margins > 0).float().mean()) == pytest.approx(rows[-1]["eval/pair_accuracy"])
    assert float(margins.mean()) == pytest.approx(rows[-1]["eval/margin"], abs=1e-4)


@pytest.mark.integration  # a learning run: not in the fast tier (make test-fast: -m "not integration")
@pytest.mark.learning
def test_reward_model_ranks_held_out_arith_pairs(tmp_path, record_property):
    run_dir = tmp_path / "rm"
    main(["rm", "train", "runtime.threads=1", f"seed={LEARNING_SEED}", f"run_dir={run_dir}"])  # the defaults: 1500 steps of 32 pairs
    info = json.loads((run_dir / "run.json").read_text())
    record_property("accuracy", info["eval_final"])
    # Half the smallest measured accuracy over chance (0.922 - 0.5, tests/algorithms/test_learning.py MEASURED_GAINS).
    assert info["eval_final"] >= 0.5 + THRESHOLD["reward model"], info["eval_final"]
