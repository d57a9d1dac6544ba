"""Preference pairs for reward models: read, check, and build them offline.

Schema (the one TRL's reward trainer reads): one row per pair with ``prompt``, ``chosen`` and
``rejected``; each a string or a chat list ``[{"role": ..., "content": ...}, ...]``. ``chosen``
and ``rejected`` are the responses (a chat list of assistant turns is joined). Files: jsonl or
parquet. A row with a missing, empty or mistyped field stops the load with the file, the row
and the field named.

Builders make pairs from data that ships, with no model and no network:

- ``arith``: the right answer vs a wrong one (off by a random non-zero amount), both in the
  form the task's warm start answers in.
- ``gsm8k``: the reference solution vs the same solution with its final answer corrupted (the
  number after ``####`` and its last occurrence in the working changed by the same amount), so
  the two differ only where the answer is wrong.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.errors import DataError
from harness.data.tasks import TaskConfig, get_task, load_task

FIELDS = ("prompt", "chosen", "rejected")


@dataclass(frozen=True)
class Pair:
    prompt: list[dict[str, str]]  # chat messages
    chosen: str
    rejected: str

    def row(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "chosen": self.chosen, "rejected": self.rejected}


def _text(value: Any, where: str) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, list) and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in value):
        text = "".join(m["content"] for m in value)
    else:
        raise DataError(f"{where}: expected a string or a list of {{role, content}} messages, got {type(value).__name__}")
    if not text.strip():
        raise DataError(f"{where}: empty")
    return text


def _messages(value: Any, where: str) -> list[dict[str, str]]:
    if isinstance(value, str):
        return [{"role": "user", "content": _text(value, where)}]
    _text(value, where)  # type and emptiness
    return [{"role": str(m.get("role", "user")), "content": m["content"]} for m in value]


def parse_row(row: Any, where: str) -> Pair:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object with fields {', '.join(FIELDS)}")
    for name in FIELDS:
        if name not in row or row[name] is None:
            raise DataError(f"{where}: field '{name}' is missing (a pair needs {', '.join(FIELDS)})")
    pair = Pair(_messages(row["prompt"], f"{where}: field 'prompt'"), _text(row["chosen"], f"{where}: field 'chosen'"),
                _text(row["rejected"], f"{where}: field 'rejected'"))  # fmt: skip
    if pair.chosen == pair.rejected:
        raise DataError(f"{where}: 'chosen' and 'rejected' are the same text")
    return pair


def _rows(path: Path, what: str) -> list[Any]:
    """The rows of a jsonl or parquet file (blank lines skipped); a bad line names its row."""
    if not path.is_file():
        raise DataError(f"{path}: no such file ({what})")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: row {len(rows)}: not JSON ({exc.msg})") from None
    return rows


def load_pairs(path: str | Path) -> list[Pair]:
    """Every pair of a jsonl or parquet file, checked row by row."""
    path = Path(path)
    rows = _rows(path, f"pairs (jsonl or parquet with {', '.join(FIELDS)})")
    if not rows:
        raise DataError(f"{path}: no pairs")
    return [parse_row(row, f"{path}: row {i}") for i, row in enumerate(rows)]


def write_pairs(pairs: list[Pair], path: str | Path) -> Path:
    """Parquet (``.parquet``) or jsonl, written to a temporary name and renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist([p.row() for p in pairs]), tmp)
    else:
        tmp.write_text("".join(json.dumps(p.row()) + "\n" for p in pairs))
    tmp.replace(path)
    return path


def _wrong_number(value: str, rng: random.Random) -> str:
    """A wrong answer near ``value``: half the time off in the units (1-9), half the time in a
    higher digit with the units kept (10-90 or 100-900), so no single digit tells right from wrong
    (with units-only offsets a reward model learned to check the units digit, and RL against it
    drove accuracy down)."""
    number = float(value) if "." in value else int(value)
    scale = rng.choice([1, 1, 10, 100])
    offset = rng.choice([d for d in range(-9, 10) if d != 0]) * scale
    out = number + offset
    return str(out) if isinstance(out, int) else f"{out:g}"


def arith_pairs(task_cfg: TaskConfig, split: str, seed: int) -> list[Pair]:
    """Right vs wrong answer for every arith problem of ``split`` (train or test).

    A wrong answer below zero is written without its sign: arith answers are non-negative, and the
    arith tokenizer has no '-' (it would become <unk>, a token no policy sample holds, which a
    reward model learns as a shortcut: GRPO and PPO against such a model gained nothing in 400
    steps, against +0.12 and +0.09 on this one, docs/reward_models.md). Until the tokenizer loaded as trained, the '-' was dropped at tokenization, so these
    pairs are the ones every measured reward model was trained on. 4 of the 9,872 train pairs
    (an offset of minus twice the answer) then equal the right answer; equal inputs get equal
    rewards, so they add no gradient, and `harness data pairs` leaves them out of its files (which
    refuse such rows). Dropping them here too would change the measured reward models: left for a
    re-measurement of docs/reward_models.md."""
    task = load_task(task_cfg)
    fmt = get_task("arith").answer_format
    rng = random.Random(seed)
    return [Pair(ex.messages, fmt(ex.ground_truth), fmt(_wrong_number(ex.ground_truth, rng).lstrip("-")))
            for ex in (task.train if split == "train" else task.test)]  # fmt: skip


_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)\s*$")


def gsm8k_pairs(source: str | Path, prompt_template: str, seed: int) -> list[Pair]:
    """Reference solution vs the same solution with a corrupted final answer, for every row of a
    GSM8K jsonl file (fields ``question`` and ``answer``)."""
    rng, out = random.Random(seed), []
    for i, row in enumerate(_rows(Path(source), "GSM8K (jsonl with question and answer)")):
        where = f"{source}: row {i}"
        for name in ("question", "answer"):
            if not isinstance(row.get(name), str) or not row[name].strip():
                raise DataError(f"{where}: field '{name}' is missing or empty (GSM8K rows have question and answer)")
        solution = row["answer"].strip()
        match = _FINAL.search(solution)
        if match is None:
            raise DataError(f"{where}: field 'answer' has no final '#### <number>' line")
        final = match.group(1).replace(",", "")
        wrong = _wrong_number(final, rng)
        working = solution[: match.start()]
        cut = working.rfind(final)  # the last time the working states the answer
        if cut >= 0:
            working = working[:cut] + wrong + working[cut + len(final) :]
        messages = [{"role": "user", "content": prompt_template.format(question=row["question"])}]
        out.append(Pair(messages, solution, f"{working}#### {wrong}"))
    return out
