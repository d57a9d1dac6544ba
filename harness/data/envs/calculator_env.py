"""``env=calculator``: the model may call an exact calculator between its turns.

Tool syntax (documented to the model in a system message, and in docs/environments.md):
the model writes ``<calc>12345 * 678</calc>``; the environment answers with
``<result>8369910</result>`` (or ``<error>division by zero</error>``) as the next observation,
and the model goes on. A turn with no tool tag is the final answer and ends the episode
("answered"); the environment also ends it after ``max_turns`` model turns ("max_turns").

Only the first tag of a turn counts (``<think>``/``</think>`` are passed over): a known call is evaluated (harness/data/envs/calculator.py,
never eval), any other tag (``<python>``, a stray ``</calc>``, the model writing ``<result>``
itself) is answered with an error observation naming the syntax. Scanning a turn is linear in
its length (one bounded regex search and one ``str.find``), so a huge turn costs little.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from harness.data.envs import Environment, Turn, register_env
from harness.data.envs.calculator import CalcError, evaluate, run_tool, show

if TYPE_CHECKING:
    from harness.data.tasks import Example

CALL_OPEN, CALL_CLOSE = "<calc>", "</calc>"
TAG = re.compile(r"<(/?)([A-Za-z_][\w-]{0,31})>")  # the first tag of a turn (bounded name: linear scan)
PASS_TAGS = ("think",)  # reasoning models' <think>...</think> is not a tool call
SYSTEM = (
    "You can use a calculator. Write <calc>expression</calc> with numbers, + - * / and parentheses; "
    "the result comes back as <result>value</result>. When you know the answer, give it without a tag."
)


def tool_call(text: str) -> tuple[str, str] | None:
    """("call", expression) | ("error", message) | None (no tag: a final answer)."""
    m = next((t for t in TAG.finditer(text) if t.group(2) not in PASS_TAGS), None)
    if m is None:
        return None
    closing, name = m.group(1), m.group(2)
    if name != "calc" or closing:
        return "error", f"unknown tool tag <{closing}{name}>: call the calculator as {CALL_OPEN}expression{CALL_CLOSE}"
    end = text.find(CALL_CLOSE, m.end())
    if end < 0:
        return "error", f"a {CALL_OPEN} call is not closed with {CALL_CLOSE}"
    return "call", text[m.end() : end]


@register_env("calculator", summary="exact arithmetic tool: <calc>expr</calc> -> <result>value</result>")
class CalculatorEnv(Environment):
    def __init__(self, max_turns: int = 4, **settings: Any):
        super().__init__(max_turns=max_turns, **settings)
        self.turns = 0

    def reset(self, example: Example) -> list[dict[str, str]]:
        self.turns = 0
        return [{"role": "system", "content": SYSTEM}, *example.messages]

    def step(self, model_text: str) -> Turn:
        self.turns += 1
        call = tool_call(model_text)
        if call is None:
            return Turn(None, done=True, end_reason="answered")
        kind, payload = call
        observation, ok = run_tool(payload) if kind == "call" else (f"<error>{payload}</error>", False)
        info = {"tool_calls": 1, "tool_errors": 0 if ok else 1}
        if self.turns >= self.max_turns:  # no turn is left to read the observation
            return Turn(None, done=True, end_reason="max_turns", info=info)
        return Turn(observation, done=False, info=info)

    def final_answer(self, model_turns: list[str]) -> str:
        """The last turn, unless it was a tool call cut off by max_turns (that is no answer)."""
        last = model_turns[-1] if model_turns else ""
        return "" if tool_call(last) is not None else last

    def demo(self, example: Example) -> list[str] | None:
        """For a question that is an expression (arith: ``123*456=``): call the calculator on it,
        then answer with the ground truth. Other questions: None."""
        question = example.messages[-1]["content"].strip().rstrip("=").strip() if example.messages else ""
        try:
            value = show(evaluate(question))
        except CalcError:
            return None
        return [f"{CALL_OPEN}{question}{CALL_CLOSE}", f"<result>{value}</result>", str(example.ground_truth)]
