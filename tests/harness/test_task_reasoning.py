"""Task ``reasoning`` (harness/data/reasoning.py) and the no-signal warning (issue #30)."""

from __future__ import annotations

import re

import pytest
import torch

import rewards
from harness.data.tasks import load_task, registered_tasks
from harness.trainer import no_signal_warning


@pytest.fixture(scope="module")
def task():
    from harness.config import compose_config

    return load_task(compose_config(["task=reasoning"]).task)


def test_registered_with_its_preset():
    spec = registered_tasks()["reasoning"]
    assert spec.preset["checker"] == "gsm8k" and spec.preset["eval_prompts"] >= 512


def test_splits_are_disjoint_and_deterministic(task, compose_cfg):
    assert len(task.test) == 512 and len(task.train) == 20000
    assert not {ex.messages[0]["content"] for ex in task.test} & {ex.messages[0]["content"] for ex in task.train}
    again = load_task(compose_cfg(["task=reasoning"]).task)
    assert [ex.meta["solution"] for ex in again.test] == [ex.meta["solution"] for ex in task.test]
    other = load_task(compose_cfg(["task=reasoning", "task.data_seed=7"]).task)
    assert other.test[0].messages != task.test[0].messages


def test_every_solution_is_a_chain_of_correct_steps_the_gsm8k_checker_accepts(task):
    checker = rewards.get("gsm8k")
    for ex in task.train[:3000] + task.test:
        *lines, final = ex.meta["solution"].split("\n")
        assert 2 <= len(lines) <= 4 and final == f"#### {ex.ground_truth}"
        previous = None
        for line in lines:  # one computation each, right, chained: each starts from a value already in play
            a, op, b, c = re.search(r"(\d+) ([-+*/]) (\d+) = (\d+)", line).groups()
            assert eval(f"{a} {op} {b}") == int(c), line  # noqa: S307  (our own digits and operator)
            previous = int(c)
        assert previous == int(ex.ground_truth)
        assert checker.score(ex.meta["solution"], ex.ground_truth).correct


def test_more_steps_and_digits_make_harder_problems(compose_cfg):
    hard = load_task(compose_cfg(["task=reasoning", "task.terms=6", "task.digits=3", "task.train_size=500"]).task)
    steps = [ex.meta["steps"] for ex in hard.train]
    assert min(steps) == 2 and max(steps) == 6
    assert max(int(ex.ground_truth) for ex in hard.train) >= 1000


def test_the_tokenizer_round_trips_the_task_text_exactly(task, tmp_path):
    """Trained on the task's text, saved, and loaded as the harness loads a tiny build
    (as saved): every question and solution decodes to itself, spaces and newlines kept."""
    import json

    from harness.models import train_tokenizer
    from harness.runtime.loading import load_tokenizer

    texts = [ex.messages[0]["content"] + "\n" + ex.meta["solution"] for ex in task.train[:3000]]
    train_tokenizer(texts, 512).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    tok = load_tokenizer(str(tmp_path))
    for ex in task.test[:200]:
        for text in (ex.messages[0]["content"], ex.meta["solution"]):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert tok.decode(ids) == text
    lengths = [len(tok(ex.meta["solution"], add_special_tokens=False)["input_ids"]) for ex in task.test]
    assert 30 <= sorted(lengths)[len(lengths) // 10] and sorted(lengths)[-len(lengths) // 10] <= 150


def test_no_signal_warning_rule():
    flat = [{"rollout/zero_std_group_frac": 0.95, "reward/accuracy": 0.01}] * 10
    assert "almost no learning signal" in no_signal_warning(flat, 8)
    learning = [{"rollout/zero_std_group_frac": 0.5, "reward/accuracy": 0.12}] * 10
    assert no_signal_warning(learning, 8) is None
    assert no_signal_warning([{"rollout/zero_std_group_frac": 1.0, "reward/accuracy": 0.3}], 1) is None  # k=1: a critic
    assert no_signal_warning([{"rollout/zero_std_group_frac": 1.0, "reward/accuracy": 0.0}], 1) is not None
    cut = [{"rollout/zero_std_group_frac": 1.0, "reward/accuracy": 0.0, "rollout/truncated_frac": 0.9}] * 10
    assert "raise rollout.max_response_tokens" in no_signal_warning(cut, 8, 16)  # the fix for answers cut short


def test_the_signal_check_warns_only_when_enabled(caplog):
    """An algorithm that does not learn from the reward (a teacher's signal) is not warned about flat rewards."""
    from harness.trainer import SignalCheck

    flat = {"rollout/zero_std_group_frac": 1.0, "reward/accuracy": 0.0}
    for enabled, warnings in ((True, 1), (False, 0)):
        caplog.clear()
        check = SignalCheck(steps=20, samples_per_prompt=8, max_response_tokens=16, enabled=enabled)
        for _ in range(20):
            check.observe(flat)
        assert sum("almost no learning signal" in r.getMessage() for r in caplog.records) == warnings


@pytest.mark.integration
def test_a_run_without_signal_warns_once(tmp_path, capfd, fast_run):
    """A 20-step warm start on 3-digit products: almost every group scores all-wrong."""
    from harness.commands.cli import main

    main(["run", *fast_run, "task.digits=3", "task.operators=*", "trainer.steps=3", "runtime.threads=1",
          f"run_dir={tmp_path / 'run'}"])  # fmt: skip
    out = capfd.readouterr()
    assert (out.out + out.err).count("almost no learning signal") == 1


@pytest.mark.parametrize("sft_steps, floor, every, expected_steps, expected_checks", [
    (-1, 1.0, 2, 9, [0, 2, 4, 6, 8, 9]),  # the rule, floor out of reach: on to sft_max_steps, then a warning
    (-1, 0.0, 2, 4, [0, 2, 4]),  # the rule, floor met at once: the least steps
    (-1, 1.0, 3, 9, [0, 3, 4, 7, 9]),  # checks every 3 up to the least steps, then every 3 from there
    (3, 1.0, 2, 3, [0, 2, 3]),  # a fixed count ignores the floor
])  # fmt: skip
def test_warm_start_sizing_rule(tmp_path, compose_cfg, caplog, sft_steps, floor, every, expected_steps,
                                expected_checks):  # fmt: skip
    """model.tiny.sft_steps=-1: at least sft_min_steps, then SFT until the held-out accuracy floor
    (checked every sft_eval_every steps), at most sft_max_steps; N >= 0: exactly N."""
    import harness.models as models

    cfg = compose_cfg(["task.train_size=300", "task.eval_prompts=8", f"model.tiny.sft_steps={sft_steps}", "model.tiny.sft_min_steps=4",
                       f"model.tiny.sft_eval_every={every}", "model.tiny.sft_max_steps=9",
                       f"model.tiny.sft_accuracy_floor={floor}", "model.tiny.sft_sequences_per_step=4"])  # fmt: skip
    info = models.build_tiny(cfg.model.tiny, load_task(cfg.task), rewards.get("arith"), tmp_path, 8)
    assert info["sft_steps"] == expected_steps
    assert [step for step, _ in info["sft_history"]] == expected_checks
    assert ("below model.tiny.sft_accuracy_floor" in caplog.text) == (sft_steps < 0 and floor == 1.0)


def test_sizing_rule_fields_are_validated(compose_cfg):
    from harness.config import ConfigError, validate

    with pytest.raises(ConfigError, match="sft_steps=-2"):
        validate(compose_cfg(["model.tiny.sft_steps=-2"]))
    with pytest.raises(ConfigError, match="sft_direct_frac=1.5"):
        validate(compose_cfg(["model.tiny.sft_direct_frac=1.5"]))
    with pytest.raises(ConfigError, match="model.tiny.sft_max_new_tokens=-1: the build's held-out generation cap"):
        validate(compose_cfg(["model.tiny.sft_max_new_tokens=-1"]))


def test_direct_answers_need_worked_solutions(compose_cfg):
    """On a task without worked solutions the knob would change nothing but the cache key (a needless
    rebuild that skips the shipped start): an error that says so."""
    from harness.models import ModelError, warm_start_turns

    with pytest.raises(ModelError, match="task arith has no worked solutions"):
        warm_start_turns(load_task(compose_cfg(["task.train_size=200"]).task), direct_frac=0.5)


def test_run_dirs_from_before_the_sizing_rule_resume_and_pool(compose_cfg):
    """An arith run written when the default was 200 fixed SFT steps started from the same shipped
    weights the rule builds: its config compares equal (resume, report rows); another task's does not."""
    from omegaconf import OmegaConf

    from harness.rundir.schema import flat_config

    new = OmegaConf.to_container(compose_cfg([]), resolve=True)
    old = OmegaConf.to_container(compose_cfg(["model.tiny.sft_steps=200"]), resolve=True)
    for key in ("sft_min_steps", "sft_accuracy_floor", "sft_max_steps"):
        del old["model"]["tiny"][key]
    assert flat_config(old)["model.tiny.sft_steps"] == flat_config(new)["model.tiny.sft_steps"] == -1
    old["task"]["name"] = "gsm8k"
    assert flat_config(old)["model.tiny.sft_steps"] == 200


def test_rollout_metrics_split_lengths_by_outcome():
    """Mean response tokens of the correct and the incorrect responses, each side only when present."""
    from harness.trainer import rollout_metrics
    from tests.helpers import make_batch

    batch = make_batch([1.0, 0.0, 0.0], [0, 0, 0], T=4, mask=[[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]])
    batch.correct = torch.tensor([True, False, False])
    m = rollout_metrics(batch)
    assert m["rollout/response_tokens_correct_mean"] == 2.0 and m["rollout/response_tokens_incorrect_mean"] == 3.5
    batch.correct = torch.tensor([False, False, False])
    assert "rollout/response_tokens_correct_mean" not in rollout_metrics(batch)


def test_direct_answer_fraction_of_the_warm_start(task):
    """model.tiny.sft_direct_frac: about that fraction of the 3+-step problems is taught the bare
    '#### N'; 2-step problems and the default (0) keep their worked solutions."""
    from harness.models import warm_start_turns

    worked = warm_start_turns(task)
    mixed = warm_start_turns(task, direct_frac=0.6)
    assert [t for _, t in worked] == [[ex.meta["solution"]] for ex in task.train]
    long = [(ex, t[0]) for ex, t in mixed if ex.meta["steps"] > 2]
    bare = {id(ex) for ex, text in long if text == f"#### {ex.ground_truth}"}  # ids: a list's `in` made this 60 s
    assert abs(len(bare) / len(long) - 0.6) < 0.02
    assert all(t == [ex.meta["solution"]] for ex, t in mixed if ex.meta["steps"] == 2)
    assert all(text == ex.meta["solution"] for ex, text in long if id(ex) not in bare)


def test_new_tiny_fields_at_their_defaults_keep_the_cache_key(compose_cfg):
    """tie_embeddings=true and sft_direct_frac=0 (the defaults) key builds as before they existed, so
    the shipped arith start is still found; other values key a different build."""
    from harness.models import shipped_warm_start, tiny_cache_key

    def key(overrides):
        cfg = compose_cfg(overrides)
        return tiny_cache_key(cfg.model, load_task(cfg.task).config, cfg.rollout.max_response_tokens)

    assert shipped_warm_start(key([])) is not None
    from harness.commands.presets import read_preset, resolve_preset

    preset = [o for o in read_preset(resolve_preset("reasoning"))["overrides"] if not o.startswith("hydra")]
    assert shipped_warm_start(key(preset)).name == "tiny-reasoning"  # the reasoning preset's runs find theirs
    assert key(["model.tiny.tie_embeddings=true", "model.tiny.sft_direct_frac=0"]) == key([])
    assert key(["model.tiny.tie_embeddings=false"]) != key([]) != key(["model.tiny.sft_direct_frac=0.5"])


def test_a_shorter_cap_starts_from_the_start_built_at_sft_max_new_tokens(compose_cfg):
    """The controls preset's overlong arm (an 80-token cap, model.tiny.sft_max_new_tokens=160) starts from the shipped
    reasoning start, not a build of its own; without the field the 80-token cap keys another build."""
    from harness.commands.presets import read_preset, resolve_preset
    from harness.models import resolve_model

    preset = read_preset(resolve_preset("controls"))
    fixed = [o for o in preset["overrides"] if not o.startswith("hydra")]
    arm = next(a for a in preset["controls"] if "algo.overlong_penalty=0.0" in a)
    cfg = compose_cfg([*fixed, *arm])
    path, info = resolve_model(cfg.model, load_task(cfg.task), None, cfg.rollout.max_response_tokens)
    assert cfg.rollout.max_response_tokens == 80 and info["source"] == "shipped" and path.endswith("tiny-reasoning")
    from harness.models import shipped_warm_start, tiny_cache_key

    assert shipped_warm_start(tiny_cache_key(cfg.model, load_task(cfg.task).config, 80)) is None


def test_untied_tiny_model(tmp_path, compose_cfg):
    import harness.models as models

    cfg = compose_cfg(["model.tiny.tie_embeddings=false", "model.tiny.sft_steps=0"])
    models.build_tiny(cfg.model.tiny, load_task(cfg.task), rewards.get("arith"), tmp_path, 8)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
