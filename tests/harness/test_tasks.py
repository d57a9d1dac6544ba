"""Tasks: the synthetic arith pool, GSM8K/MATH loaders, parquet round trip."""

import json

import pytest

from harness.config import TASK_PRESETS, TaskConfig
from harness.data.tasks import DataError, arith_problems, last_boxed, load_task, prepare, render_prompt


def test_arith_is_deterministic_and_held_out():
    cfg = TaskConfig(train_size=500, eval_prompts=50)
    train_a, test_a = arith_problems(cfg)
    train_b, test_b = arith_problems(cfg)
    assert train_a == train_b and test_a == test_b
    assert len(test_a) == 50 and len(train_a) == 500
    assert not {q for q, _ in train_a} & {q for q, _ in test_a}


def test_arith_problems_are_cached_on_disk_and_a_corrupt_cache_is_redrawn(tmp_path, monkeypatch):
    from harness.data import tasks

    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path))
    cfg = TaskConfig(train_size=300, eval_prompts=20, data_seed=77)
    tasks._arith_items.cache_clear()
    drawn = arith_problems(cfg)
    (cached,) = (tmp_path / "data").glob("arith-*.json")
    tasks._arith_items.cache_clear()
    assert arith_problems(cfg) == drawn  # read back from the file
    cached.write_text('{"args": [1, 2')  # torn
    tasks._arith_items.cache_clear()
    assert arith_problems(cfg) == drawn and json.loads(cached.read_text())["items"][0] == list(drawn[1][0])
    tasks._arith_items.cache_clear()


def test_arith_answers_follow_precedence():
    cfg = TaskConfig(operators="+-*", terms=3, digits=1, train_size=200, eval_prompts=10)
    train, _ = arith_problems(cfg)
    for question, answer in train:
        expr = question.rstrip("=")
        # independent check: a tiny shunting evaluation via Python ints on our own strings
        terms = expr.replace("-", "+-").split("+")
        total = 0
        for term in terms:
            sign = -1 if term.startswith("-") else 1
            prod = 1
            for f in term.lstrip("-").split("*"):
                prod *= int(f)
            total += sign * prod
        assert total == answer, question


def test_arith_pool_smaller_than_asked_is_drawn_whole():
    # 1-digit a+b / a-b: 10 x 10 x 2 = 200 distinct questions, fewer than the 520 asked for.
    train, test = arith_problems(TaskConfig(digits=1, terms=2, operators="+-", train_size=500, eval_prompts=20))
    questions = [q for q, _ in train + test]
    assert len(test) == 20 and len(questions) == len(set(questions)) == 200


def test_arith_default_pool_is_pinned():
    """The defaults ask for more problems than the 10,000 that exist; generation stops when all
    are drawn, in the same order as drawing the full attempt budget did (data unchanged)."""
    train, test = arith_problems(TaskConfig())
    assert (len(train), len(test)) == (9872, 128)
    assert test[:3] == [("99+56=", 155), ("00+11=", 11), ("85+88=", 173)]
    assert train[-2:] == [("04+06=", 10), ("76+00=", 76)]


def test_arith_seed_changes_pool():
    a, _ = arith_problems(TaskConfig(train_size=100, eval_prompts=10, data_seed=1))
    b, _ = arith_problems(TaskConfig(train_size=100, eval_prompts=10, data_seed=2))
    assert a != b


@pytest.mark.parametrize("bad", [dict(operators="/"), dict(operators=""), dict(terms=1)])
def test_arith_bad_knobs(bad):
    with pytest.raises(DataError):
        arith_problems(TaskConfig(**bad))


def test_last_boxed_brace_matching():
    assert last_boxed(r"so \boxed{\frac{1}{2}} and \boxed{3}") == "3"
    assert last_boxed(r"\fbox{a{b}c}") == "a{b}c"
    assert last_boxed(r"\boxed{unclosed") is None
    assert last_boxed("nothing") is None


def test_gsm8k_raw_jsonl(shared_data):
    cfg = TASK_PRESETS["gsm8k"]
    cfg = TaskConfig(**{**cfg.__dict__, "source": f"{shared_data}/gsm8k"})
    task = load_task(cfg)
    assert (len(task.train), len(task.test)) == (7473, 1319)
    assert task.train[0].ground_truth == "72"
    assert "####" in task.train[0].messages[0]["content"]


def test_math_and_math500(shared_data):
    cfg = TaskConfig(**{**TASK_PRESETS["math"].__dict__, "source": f"{shared_data}/math"})
    task = load_task(cfg)
    assert len(task.test) == 5000 and task.test[0].meta["subject"]
    cfg500 = TaskConfig(**{**TASK_PRESETS["math500"].__dict__, "source": f"{shared_data}/math"})
    t500 = load_task(cfg500)
    assert len(t500.test) == 500 and t500.test[0].ground_truth


def test_prepare_writes_verl_parquet_and_loads_back(tmp_path):
    src = tmp_path / "raw"
    src.mkdir()
    rows = [{"question": f"What is {i}+1?", "answer": f"step\n#### {i + 1:,}"} for i in range(1000, 1005)]
    for split in ("train", "test"):
        (src / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "parquet"
    counts = prepare("gsm8k", str(src), str(out), TASK_PRESETS["gsm8k"])
    assert counts == {"train": 5, "test": 5}
    import pyarrow.parquet as pq

    table = pq.read_table(out / "train.parquet").to_pylist()
    assert set(table[0]) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert table[0]["reward_model"]["ground_truth"] == "1001"
    assert table[0]["prompt"][0]["role"] == "user"
    task = load_task(TaskConfig(**{**TASK_PRESETS["gsm8k"].__dict__, "source": str(out)}))
    assert [e.ground_truth for e in task.test] == ["1001", "1002", "1003", "1004", "1005"]


def test_bad_rows_are_skipped_with_a_log_and_empty_data_fails(tmp_path, caplog):
    src = tmp_path / "raw"
    src.mkdir()
    good = json.dumps({"question": "q", "answer": "#### 3"})
    (src / "test.jsonl").write_text(good + "\n" + json.dumps({"nope": 1}) + "\n")
    (src / "train.jsonl").write_text(json.dumps({"nope": 1}) + "\n")
    cfg = TaskConfig(**{**TASK_PRESETS["gsm8k"].__dict__, "source": str(src)})
    with pytest.raises(DataError, match="no usable rows"):
        load_task(cfg)
    assert "skipped" in caplog.text
    (src / "train.jsonl").write_text("{not json\n")
    with pytest.raises(DataError, match="train.jsonl:1"):
        load_task(cfg)


def test_missing_source_names_the_field():
    cfg = TaskConfig(**{**TASK_PRESETS["gsm8k"].__dict__, "source": "./does/not/exist"})
    with pytest.raises(DataError, match="task.source"):
        load_task(cfg)


def test_render_prompt_uses_chat_template_when_present():
    class Tok:
        chat_template = "x"

        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            return "<chat>" + messages[0]["content"] + "<assistant>"

    msgs = [{"role": "user", "content": "hi"}]
    assert render_prompt(msgs, Tok(), True) == "<chat>hi<assistant>"
    assert render_prompt(msgs, Tok(), False) == "hi"
    assert render_prompt(msgs, None, True) == "hi"
