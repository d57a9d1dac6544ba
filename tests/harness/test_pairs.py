"""Preference pairs: the builders (checked by the task's own checker) and bad-input errors."""

import json

import pytest

import rewards
from harness.commands.cli import main
from harness.config import task_presets
from harness.core.errors import DataError
from harness.data.pairs import Pair, arith_pairs, gsm8k_pairs, load_pairs, write_pairs


def test_arith_pairs_right_vs_wrong_by_the_checker():
    pairs = arith_pairs(task_presets()["arith"], "test", seed=0)
    checker = rewards.get("arith")
    assert len(pairs) == task_presets()["arith"].eval_prompts
    from harness.data.tasks import load_task

    truths = [ex.ground_truth for ex in load_task(task_presets()["arith"]).test]
    assert all(checker.score(p.chosen, t).correct for p, t in zip(pairs, truths))
    assert not any(checker.score(p.rejected, t).correct for p, t in zip(pairs, truths))


def test_arith_pairs_stay_in_the_arith_tokenizers_alphabet():
    """No '-' (the arith tokenizer has none: it would be <unk>, a shortcut for a reward model); the pairs
    every measured reward model was trained on (the '-' used to vanish at tokenization)."""
    from pathlib import Path

    from harness.runtime.loading import load_tokenizer

    tok = load_tokenizer(str(Path(__file__).resolve().parents[2] / "harness" / "warmstart" / "tiny-arith"))
    pairs = arith_pairs(task_presets()["arith"], "train", seed=0)
    ids = tok([p.chosen for p in pairs] + [p.rejected for p in pairs], add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in {i for row in ids for i in row}
    assert sum(p.rejected == p.chosen for p in pairs) == 4  # offset = -2 x answer, folded: no gradient (docstring)


def test_gsm8k_pairs_on_the_shipped_data(shared_data):
    source = f"{shared_data}/gsm8k/test.jsonl"
    pairs = gsm8k_pairs(source, task_presets()["gsm8k"].prompt_template, seed=0)
    rows = [json.loads(line) for line in open(source)]
    assert len(pairs) == len(rows) == 1319
    checker = rewards.get("gsm8k")
    truths = [r["answer"].split("####")[-1].strip().replace(",", "") for r in rows]
    assert sum(checker.score(p.chosen, t).correct for p, t in zip(pairs, truths)) == 1319
    assert sum(checker.score(p.rejected, t).correct for p, t in zip(pairs, truths)) == 0
    # the two differ only around the answer: same working up to the last statement of it
    first = pairs[0]
    assert first.chosen.endswith("#### 18") and first.rejected.startswith(first.chosen.split("$<<9*2=18>>")[0])


def test_pairs_round_trip_and_cli(tmp_path, shared_data):
    pairs = [Pair([{"role": "user", "content": "1+1="}], "2", "3")]
    for name in ("p.jsonl", "p.parquet"):
        assert load_pairs(write_pairs(pairs, tmp_path / name)) == pairs
    main(["data", "pairs", "gsm8k", "--source", f"{shared_data}/gsm8k/test.jsonl", "--out", str(tmp_path / "g.parquet")])
    assert len(load_pairs(tmp_path / "g.parquet")) == 1319


@pytest.mark.parametrize("row, message", [
    ({"prompt": "q", "chosen": "a"}, "row 1: field 'rejected' is missing"),
    ({"prompt": "q", "chosen": " ", "rejected": "b"}, "row 1: field 'chosen': empty"),
    ({"prompt": 3, "chosen": "a", "rejected": "b"}, "row 1: field 'prompt': expected a string or a list"),
    ({"prompt": "q", "chosen": "a", "rejected": "a"}, "row 1: 'chosen' and 'rejected' are the same text"),
])  # fmt: skip
def test_bad_pairs_name_file_row_and_field(tmp_path, row, message):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=f"{path}: {message}"):
        load_pairs(path)
    path.write_text("{not json\n")
    with pytest.raises(DataError, match="row 0: not JSON"):
        load_pairs(path)
