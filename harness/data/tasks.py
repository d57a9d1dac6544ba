"""Tasks: prompts + ground truths + the name of the checker that scores them.

A task is registered once, with everything that is specific to it (the loader, the
``task=NAME`` preset of TaskConfig fields, the answer format the tiny warm start teaches,
the raw-row parser of `harness data prepare`)::

    @register_task("my_task", summary="...", preset={"checker": "gsm8k", "prompt_template": "..."})
    def load_my_task(cfg) -> Task: ...

A user's task lives in their own package: load it with ``plugins=[my_pkg.my_task]`` or an
entry point in the group ``harness.tasks``; no file of the harness changes.

Built in:
- ``arith``: synthetic arithmetic, deterministic from ``task.data_seed``; no files needed.
- ``reasoning``: multi-step word problems in GSM8K's form, generated (harness/data/reasoning.py).
- ``gsm8k``, ``math``, ``math500``: read verl-compatible parquet (data_source, prompt as a
  chat list, ability, reward_model.ground_truth, extra_info), the raw jsonl of the
  original releases, or a hub id (needs ``datasets`` and a network).

``harness data prepare gsm8k|math --source PATH_OR_HUB_ID --out DIR`` writes the parquet.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core.errors import DataError as DataError  # re-exported: raised here
from harness.core.group import ConfigGroup
from harness.core.registry import Registry

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@dataclass
class TaskConfig(ConfigGroup):
    """``task.*``, the group Hydra fills and a task's loader reads; ``task=NAME`` applies the task's preset."""

    name: str = "arith"  # a registered task: arith | arith_calc | reasoning | gsm8k | math | math500 | a plugin's (see `harness list`)
    checker: str = "arith"  # reward checker name (see `harness list`)
    source: str = ""  # data: a directory of train/test parquet or jsonl, or a hub id; '' = task default
    prompt_template: str = "{question}"  # how the question becomes the user message
    use_chat_template: bool = True  # render prompts with the tokenizer's chat template when it has one
    eval_prompts: int = 128  # held-out prompts scored greedily at each eval
    max_prompt_tokens: int = 256  # longer prompts are dropped at load time (logged)
    # arith only: a deterministic synthetic problem pool
    digits: int = 2  # max digits per operand
    operators: str = "+"  # operators drawn from, e.g. '+-*'
    terms: int = 2  # operands per problem
    train_size: int = 20000  # problems in the training pool
    data_seed: int = 1234  # seed of the problem pool (fixed across run seeds, so eval sets match)



@dataclass
class Example:
    messages: list[dict[str, str]]  # chat list; for plain LMs the contents are joined
    ground_truth: str
    meta: dict[str, Any] = field(default_factory=dict)  # subject, level, index...


@dataclass
class Task:
    name: str
    checker: str
    train: list[Example]
    test: list[Example]
    config: TaskConfig | None = None  # the TaskConfig it was built from (keys the tiny-model cache)


# ---------------------------------------------------------------------------- registry

ENTRY_POINT_GROUP = "harness.tasks"


@dataclass(frozen=True)
class TaskSpec:
    name: str
    load: Callable[[TaskConfig], Task]
    summary: str
    preset: dict[str, Any]  # TaskConfig fields `task=NAME` sets (checker, prompt_template, ...)
    answer_format: Callable[[str], str] = str  # ground truth -> the response the tiny warm start teaches
    row_parser: Callable[[dict, TaskConfig], Example] | None = None  # raw row -> Example (`harness data prepare`)


# Built-in tasks in modules of their own, which import this registry (imported by name: no cycle).
REGISTRY: Registry[TaskSpec] = Registry(
    "task", builtin_modules=("harness.data.reasoning",), entry_point_group=ENTRY_POINT_GROUP, setting="task.name",
    how_to_add="Register your own with @register_task in a module and pass plugins=[your.module]",
    owner=lambda spec: spec.load,
)


def register_task(name: str, *, summary: str, preset: dict[str, Any] | None = None,
                  answer_format: Callable[[str], str] = str,
                  row_parser: Callable[[dict, TaskConfig], Example] | None = None) -> Callable:  # fmt: skip
    """Decorator: register ``load(cfg) -> Task`` as task ``name``."""

    def wrap(load: Callable[[TaskConfig], Task]) -> Callable[[TaskConfig], Task]:
        REGISTRY.add(name, TaskSpec(name, load, summary, {**(preset or {}), "name": name}, answer_format, row_parser))
        return load

    return wrap


def registered_tasks() -> dict[str, TaskSpec]:
    """Every registered task (built-ins, entry points ``harness.tasks``, imported plugins), by name."""
    return REGISTRY.entries()


def get_task(name: str) -> TaskSpec:
    return REGISTRY.get(name, DataError)


# ---------------------------------------------------------------------------- arith


def _arith_value(operands: list[int], ops: list[str]) -> int:
    """Value with the usual precedence ('*' before '+'/'-'), computed on our own ints."""
    terms, signs = [operands[0]], []
    for op, x in zip(ops, operands[1:]):
        if op == "*":
            terms[-1] *= x
        else:
            terms.append(x)
            signs.append(op)
    total = terms[0]
    for sign, x in zip(signs, terms[1:]):
        total = total + x if sign == "+" else total - x
    return total


def arith_problems(cfg: TaskConfig) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(train, test) lists of (question, answer); test is held out, disjoint from train."""
    bad = set(cfg.operators) - set("+-*")
    if not cfg.operators or bad:
        raise DataError(f"task.operators={cfg.operators!r}: use a non-empty mix of '+', '-', '*'")
    if cfg.digits < 1 or cfg.terms < 2:
        raise DataError(f"task.digits={cfg.digits}, task.terms={cfg.terms}: need digits >= 1 and terms >= 2")
    if cfg.train_size < 1 or cfg.eval_prompts < 1:
        raise DataError(f"task.train_size={cfg.train_size}, task.eval_prompts={cfg.eval_prompts}: arith needs at least "
                        f"one training and one eval problem")  # fmt: skip
    items = list(_arith_items(int(cfg.digits), int(cfg.terms), str(cfg.operators), int(cfg.train_size) +
                              int(cfg.eval_prompts), int(cfg.data_seed)))  # fmt: skip
    test, train = items[: cfg.eval_prompts], items[cfg.eval_prompts :]
    if not train:
        raise DataError(
            f"task arith: only {len(items)} distinct problems exist for digits={cfg.digits}, "
            f"terms={cfg.terms}; lower task.eval_prompts or raise task.digits"
        )
    return train, test


ARITH_CACHE_VERSION = 1  # raise when _draw_arith's output changes


@functools.lru_cache(maxsize=8)
def _arith_items(digits: int, terms: int, operators: str, wanted: int, seed: int) -> tuple[tuple[str, int], ...]:
    """``_draw_arith``'s problems, kept in $HARNESS_CACHE/data (drawing the default pool takes ~2.5 s, most of a
    short run's start); an unreadable or corrupt cache file is drawn again and rewritten."""
    args = [digits, terms, operators, wanted, seed, ARITH_CACHE_VERSION]
    key = hashlib.sha256(json.dumps(args).encode()).hexdigest()[:16]
    path = Path(os.environ.get("HARNESS_CACHE", "~/.cache/harness")).expanduser() / "data" / f"arith-{key}.json"
    try:
        cached = json.loads(path.read_text())
        if cached["args"] == args:
            return tuple((str(q), int(a)) for q, a in cached["items"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    items = _draw_arith(digits, terms, operators, wanted, seed)
    try:  # written whole, then renamed: parallel runs never read half a file
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"args": args, "items": items}))
        os.replace(tmp, path)
    except OSError as exc:  # a read-only cache: every run draws them
        log.debug("arith problems not cached in %s: %s", path, exc)
    return tuple(items)


def _draw_arith(digits: int, terms: int, operators: str, wanted: int, seed: int) -> list[tuple[str, int]]:
    """``wanted`` distinct problems (fewer when fewer exist), in the order a seeded rng draws them."""
    rng = random.Random(seed)
    # Stop once every distinct question has been drawn (the defaults ask for more problems
    # than exist); the insertion order, and so the data, is what the full loop would give.
    distinct = 10 ** (digits * terms) * len(set(operators)) ** (terms - 1)
    seen: dict[str, int] = {}
    attempts = 0
    while len(seen) < min(wanted, distinct) and attempts < 20 * wanted:
        attempts += 1
        operands = [rng.randrange(10**digits) for _ in range(terms)]
        ops = [rng.choice(operators) for _ in range(terms - 1)]
        # Operands are zero-padded to ``digits`` so every digit sits at a fixed position
        # (units under units); a tiny LM then learns the digit-wise algorithm quickly.
        question = "".join(f"{x:0{digits}d}{op}" for x, op in zip(operands, ops + [""])) + "="
        seen.setdefault(question, _arith_value(operands, ops))
    return list(seen.items())  # insertion order is the rng order: deterministic


@register_task("arith", summary="synthetic integer arithmetic, deterministic from task.data_seed (checker arith)",
               preset={"checker": "arith"})
def load_arith(cfg: TaskConfig) -> Task:
    train, test = arith_problems(cfg)

    def to_examples(items):
        return [
            Example([{"role": "user", "content": cfg.prompt_template.format(question=q)}], str(a))
            for q, a in items
        ]

    return Task("arith", cfg.checker, to_examples(train), to_examples(test), cfg)


@register_task("arith_calc", summary="arith with 3-digit products, too large for the tiny model's head: "
               "the calculator environment's task (env.name=calculator)",
               preset={"checker": "arith", "digits": 3, "operators": "*", "terms": 2})
def load_arith_calc(cfg: TaskConfig) -> Task:
    task = load_arith(cfg)
    return Task("arith_calc", task.checker, task.train, task.test, cfg)


# ------------------------------------------------------------------ gsm8k / math


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} or \\fbox{...} in ``text`` (brace-matched), else None."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        return None
    depth = 0
    for i in range(brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[brace + 1 : i]
    return None


def _gsm8k_row(row: dict, cfg: TaskConfig) -> Example:
    answer = row["answer"].split("####")[-1].strip().replace(",", "")
    content = cfg.prompt_template.format(question=row["question"])
    return Example([{"role": "user", "content": content}], answer, {"question": row["question"]})


def _math_row(row: dict, cfg: TaskConfig) -> Example:
    answer = row.get("answer")
    if answer is None:
        answer = last_boxed(row["solution"])
    if answer is None:
        raise DataError("row has neither 'answer' nor a \\boxed{} answer in 'solution'")
    meta = {"subject": row.get("subject", row.get("type", "")), "level": str(row.get("level", ""))}
    content = cfg.prompt_template.format(question=row["problem"])
    return Example([{"role": "user", "content": content}], str(answer), meta)


def _verl_row(row: dict, cfg: TaskConfig) -> Example:
    prompt = row["prompt"]
    messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
    extra = row.get("extra_info") or {}
    meta = {k: v for k, v in extra.items() if isinstance(v, (str, int, float))}
    return Example(messages, str(row["reward_model"]["ground_truth"]), meta)


def _read_rows(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
    return rows


def _split_file(source: Path, split: str, task: str) -> Path | None:
    if source.is_file():
        return source
    names = [f"{split}.parquet", f"{split}.jsonl"]
    if task == "math500" and split == "test":
        names.insert(0, "math500_test.jsonl")
    for name in names:
        if (source / name).exists():
            return source / name
    return None


def _rows_from_hub(hub_id: str, split: str) -> list[dict]:
    try:
        import datasets
    except ImportError as exc:
        raise DataError(
            f"task.source={hub_id!r} is not a local path and `datasets` is not installed; "
            f"pip install datasets (and be online), or pass a local directory"
        ) from exc
    kwargs = {"name": "main"} if hub_id.endswith("gsm8k") else {}
    return list(datasets.load_dataset(hub_id, split=split, **kwargs))


def _to_examples(rows: list[dict], task: str, cfg: TaskConfig, origin: str) -> list[Example]:
    parser = _verl_row if rows and "reward_model" in rows[0] else get_task(task).row_parser
    examples, skipped = [], 0
    for i, row in enumerate(rows):
        try:
            examples.append(parser(row, cfg))
        except (KeyError, TypeError, DataError) as exc:
            skipped += 1
            if skipped <= 3:
                log.warning("%s row %d skipped: %s %s", origin, i, type(exc).__name__, exc)
    if skipped:
        log.warning("%s: skipped %d of %d rows that could not be parsed", origin, skipped, len(rows))
    if not examples:
        raise DataError(f"{origin}: no usable rows (expected {task} raw jsonl or verl parquet)")
    return examples


def load_split(task: str, source: str, split: str, cfg: TaskConfig) -> list[Example]:
    path = Path(source).expanduser()
    if path.exists():
        file = _split_file(path, split, task)
        if file is None:
            if split == "train" and task == "math500":
                return []
            raise DataError(f"task.source={source}: no {split}.parquet or {split}.jsonl there")
        return _to_examples(_read_rows(file), task, cfg, str(file))
    if "/" in source and not source.startswith((".", "/", "~")):
        return _to_examples(_rows_from_hub(source, split), task, cfg, f"{source}[{split}]")
    raise DataError(f"task.source={source!r} does not exist (a directory, a file, or a hub id owner/name)")


def load_task(cfg: TaskConfig) -> Task:
    """Build the task named by ``cfg.name`` (a TaskConfig) with its registered loader."""
    return get_task(cfg.name).load(cfg)


def check_prompts(task: Task, tokenizer: PreTrainedTokenizerBase, examples: list[Example] | None = None, sample: int = 512,
                  expect_template: bool = True) -> None:  # fmt: skip
    """Refuse what cannot run, with one line naming the fix: a task without examples, or prompts all
    longer than ``task.max_prompt_tokens`` (rendered, tokenized; the first ``sample`` examples).
    Warn when only some are longer (they are cut) or when a chat template is asked for but the
    tokenizer has none (prompts go as plain text; ``expect_template=False`` for tokenizers built
    without one, like the tiny model's)."""
    cfg = task.config
    if examples is None:
        if not task.train or not task.test:
            raise DataError(f"task {task.name} has {len(task.train)} train and {len(task.test)} test examples; "
                            f"check task.source / task.train_size (every run trains on train and evaluates on test)")  # fmt: skip
        examples = task.train
    if not examples:
        raise DataError(f"task {task.name}: no examples to run on (check task.source, eval_limit)")
    if cfg.use_chat_template and expect_template and not getattr(tokenizer, "chat_template", None):
        log.warning("task.use_chat_template=true but the tokenizer has no chat template: prompts are plain text "
                    "(set task.use_chat_template=false to say so, or use the instruct model's tokenizer)")
    texts = [render_prompt(ex.messages, tokenizer, cfg.use_chat_template) for ex in examples[:sample]]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    over = sum(n > cfg.max_prompt_tokens for n in lengths)
    if over == len(lengths):
        raise DataError(f"every prompt of task {task.name} is longer than task.max_prompt_tokens={cfg.max_prompt_tokens} "
                        f"(shortest {min(lengths)} tokens): raise task.max_prompt_tokens")  # fmt: skip
    if over:
        log.warning("%d of %d prompts of task %s are longer than task.max_prompt_tokens=%d and will be cut",
                    over, len(lengths), task.name, cfg.max_prompt_tokens)


def available_tasks() -> dict[str, str]:
    return {name: spec.summary for name, spec in registered_tasks().items()}


def _file_task(name: str, default_source: str, train_from_test: bool = False) -> Callable[[TaskConfig], Task]:
    """Loader of a task read from files (raw jsonl, verl parquet) or a hub id."""

    def load(cfg: TaskConfig) -> Task:
        source = cfg.source or default_source
        test = load_split(name, source, "test", cfg)
        train = test if train_from_test else load_split(name, source, "train", cfg)
        return Task(name, cfg.checker, train, test, cfg)

    load.__qualname__ = f"load_{name}"
    return load


_STEP_BY_STEP = "{question} Let's think step by step and output the final answer"
register_task("gsm8k", summary="grade-school math word problems, answer after #### (checker gsm8k)",
              preset={"checker": "gsm8k", "max_prompt_tokens": 512,
                      "prompt_template": _STEP_BY_STEP + ' after "####".'},
              answer_format=lambda truth: f"The answer is #### {truth}", row_parser=_gsm8k_row,
              )(_file_task("gsm8k", "openai/gsm8k"))
for _name, _summary, _source in (
    ("math", "MATH competition problems, answer in \\boxed{} (checker math)", "hendrycks/competition_math"),
    ("math500", "the MATH-500 test subset (checker math; eval only, trains on its own test set)",
     "HuggingFaceH4/MATH-500"),
):
    register_task(_name, summary=_summary,
                  preset={"checker": "math", "max_prompt_tokens": 512,
                          "prompt_template": _STEP_BY_STEP + " within \\boxed{{}}."},
                  answer_format=lambda truth: f"The answer is \\boxed{{{truth}}}", row_parser=_math_row,
                  )(_file_task(_name, _source, train_from_test=_name == "math500"))


def prepare(task: str, source: str, out: str, cfg: TaskConfig) -> dict[str, int]:
    """Write verl-compatible ``train.parquet``/``test.parquet`` for ``task`` into ``out``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parsable = [n for n, spec in registered_tasks().items() if spec.row_parser is not None]
    if task not in parsable:
        raise DataError(f"data prepare: task {task!r} has no raw-row parser; tasks that have one: {', '.join(parsable)}")
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    splits = ["test"] if task == "math500" else ["train", "test"]
    for split in splits:
        examples = load_split(task, source, split, cfg)
        rows = [
            {
                "data_source": task,
                "prompt": ex.messages,
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": ex.ground_truth},
                "extra_info": {"split": split, "index": i, **{k: str(v) for k, v in ex.meta.items()}},
            }
            for i, ex in enumerate(examples)
        ]
        tmp = out_dir / f".{split}.parquet.tmp"
        pq.write_table(pa.Table.from_pylist(rows), tmp)
        tmp.replace(out_dir / f"{split}.parquet")  # atomic: never a half-written file
        counts[split] = len(rows)
    return counts


def render_prompt(messages: list[dict[str, str]], tokenizer: PreTrainedTokenizerBase, use_chat_template: bool) -> str:
    """Chat template where the tokenizer has one (and it is enabled); plain text otherwise."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return "\n".join(m["content"] for m in messages)
