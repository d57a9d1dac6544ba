"""Task ``reasoning``: procedurally generated multi-step word problems in GSM8K's form (issue #30).

Each problem is a short story about one person's collection of things: an English question
(templates, names, items and units drawn from fixed lists, often with a distractor sentence whose
number plays no part), a worked solution of ``2 .. task.terms`` steps with one computation each,
and a final ``#### N``, scored by the real ``gsm8k`` checker. Every intermediate value is a
non-negative integer (divisions are exact), so the chain never needs fractions.

Difficulty: ``task.terms`` is the most steps a problem takes (2-6, uniform from 2), ``task.digits``
the digits of the starting quantity (operands of later steps stay smaller, like GSM8K's). Splits are
seeded by ``task.data_seed``: the first ``task.eval_prompts`` distinct questions are the test split,
the next ``task.train_size`` the training pool; the two never share a question.

A problem (steps=3, with a distractor)::

    Maya has 34 stickers. Her brother has 9 stickers. She buys 3 packs of 6 stickers each.
    Then she gives 12 stickers to Omar. How many stickers does Maya have now?

    3 packs of 6 stickers are 3 * 6 = 18 stickers.
    Maya has 34 + 18 = 52 stickers.
    After giving 12 away, she has 52 - 12 = 40 stickers.
    #### 40
"""

from __future__ import annotations

import random

from harness.data.tasks import DataError, Example, Task, TaskConfig, register_task

NAMES = [("Maya", "she", "Her"), ("Omar", "he", "His"), ("Lena", "she", "Her"), ("Ravi", "he", "His"),
         ("Zoe", "she", "Her"), ("Theo", "he", "His"), ("Ines", "she", "Her"), ("Kofi", "he", "His"),
         ("Ana", "she", "Her"), ("Sam", "he", "His")]  # fmt: skip
ITEMS = ["stickers", "marbles", "apples", "pencils", "cards", "coins", "books", "shells", "beads", "stamps"]
RELATIVES = ["brother", "sister", "cousin", "friend", "neighbour"]
CONTAINERS = ["packs", "boxes", "bags", "jars"]


def _step(rng: random.Random, value: int, item: str, who: tuple[str, str, str], friend: str, digits: int):
    """One step on ``value``: (question sentence, solution lines, new value), one computation each
    line; None when no step of the drawn kind fits (a subtraction larger than the value...)."""
    name, pron, _ = who
    small = max(2, 10 ** max(digits - 1, 1) // 2)
    kind = rng.choice(["buy", "give", "packs", "times", "share", "lose"])
    if kind == "buy":
        b = rng.randint(2, small)
        return (f"{pron.capitalize()} buys {b} more {item}.", [f"After buying {b} more, {name} has {value} + {b} = {value + b} {item}."],
                value + b)  # fmt: skip
    if kind == "give" and value > 2:
        b = rng.randint(1, value - 1)
        return (f"Then {pron} gives {b} {item} to {friend}.",
                [f"After giving {b} away, {pron} has {value} - {b} = {value - b} {item}."], value - b)  # fmt: skip
    if kind == "lose" and value > 2:
        b = rng.randint(1, value - 1)
        return (f"{pron.capitalize()} loses {b} {item} on the way home.",
                [f"After losing {b}, {pron} has {value} - {b} = {value - b} {item}."], value - b)  # fmt: skip
    if kind == "packs":
        k, per, box = rng.randint(2, 6), rng.randint(2, 12), rng.choice(CONTAINERS)
        return (f"{pron.capitalize()} buys {k} {box} of {per} {item} each.",
                [f"{k} {box} of {per} {item} are {k} * {per} = {k * per} {item}.",
                 f"{name} has {value} + {k * per} = {value + k * per} {item}."], value + k * per)  # fmt: skip
    if kind == "times" and value <= 10 ** digits:
        k = rng.randint(2, 4)
        return (f"By the end of the month {pron} has {k} times as many {item}.",
                [f"{k} times as many is {value} * {k} = {value * k} {item}."], value * k)  # fmt: skip
    if kind == "share":
        divisors = [k for k in range(2, 7) if value % k == 0 and value // k >= 1]
        if divisors:
            k = rng.choice(divisors)
            return (f"{pron.capitalize()} splits them equally into {k} piles and keeps one pile.",
                    [f"One of {k} equal piles is {value} / {k} = {value // k} {item}."], value // k)  # fmt: skip
    return None


def make_problem(rng: random.Random, steps: int, digits: int) -> tuple[str, str, int]:
    """(question, worked solution ending in ``#### N``, N) with exactly ``steps`` computations."""
    who = rng.choice(NAMES)
    name, pron, poss = who
    item = rng.choice(ITEMS)
    friend = rng.choice([n for n, _, _ in NAMES if n != name])
    value = rng.randint(10 ** (digits - 1) + 1, 10**digits - 1) if digits > 1 else rng.randint(2, 9)
    sentences, lines = [f"{name} has {value} {item}."], []
    if rng.random() < 0.5:  # a distractor: a number that plays no part
        other = rng.choice([i for i in ITEMS if i != item])
        sentences.append(f"{poss} {rng.choice(RELATIVES)} has {rng.randint(2, 10 ** digits)} {other}.")
    while len(lines) < steps:
        drawn = _step(rng, value, item, who, friend, digits)
        if drawn is None or len(lines) + len(drawn[1]) > steps:
            continue
        sentence, solution, value = drawn
        sentences.append(sentence)
        lines += solution
    sentences.append(f"How many {item} does {name} have now?")
    return " ".join(sentences), "\n".join([*lines, f"#### {value}"]), value


def reasoning_problems(cfg: TaskConfig) -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]:
    """(train, test) lists of (question, solution, answer), deterministic from ``cfg.data_seed``."""
    max_steps, digits = int(cfg.terms), int(cfg.digits)
    if not 2 <= max_steps <= 6 or not 1 <= digits <= 4:
        raise DataError(f"task reasoning: task.terms={max_steps} (most steps, 2-6) and task.digits={digits} (1-4)")
    if cfg.train_size < 1 or cfg.eval_prompts < 1:
        raise DataError(f"task.train_size={cfg.train_size}, task.eval_prompts={cfg.eval_prompts}: need at least one each")
    rng = random.Random(int(cfg.data_seed))
    seen: dict[str, tuple[str, str, int]] = {}
    wanted = int(cfg.eval_prompts) + int(cfg.train_size)
    for _ in range(4 * wanted):
        if len(seen) == wanted:
            break
        question, solution, answer = make_problem(rng, rng.randint(2, max_steps), digits)
        seen.setdefault(question, (question, solution, answer))
    items = list(seen.values())
    return items[int(cfg.eval_prompts) :], items[: int(cfg.eval_prompts)]


@register_task("reasoning", summary="multi-step word problems in GSM8K's form, generated (2-6 steps, #### N; "
               "checker gsm8k): the CPU reasoning testbed",
               preset={"checker": "gsm8k", "terms": 4, "digits": 2, "eval_prompts": 512, "train_size": 20000,
                       "max_prompt_tokens": 128, "prompt_template": "{question}\n"},
               answer_format=lambda truth: f"#### {truth}")  # fmt: skip
def load_reasoning(cfg: TaskConfig) -> Task:
    train, test = reasoning_problems(cfg)

    def to_examples(items):
        return [Example([{"role": "user", "content": cfg.prompt_template.format(question=q)}], str(a),
                        {"solution": s, "steps": s.count("\n")})
                for q, s, a in items]  # fmt: skip

    return Task("reasoning", cfg.checker, to_examples(train), to_examples(test), cfg)
