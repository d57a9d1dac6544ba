"""Environments (#17, first slice): the registry, and the calculator tool and its environment."""

from __future__ import annotations

import builtins
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.data.envs import Environment, Turn, available, make_env, register_env
from harness.data.envs.calculator import MAX_CHARS, CalcError, evaluate, run_tool, show
from harness.data.envs.calculator_env import tool_call
from harness.data.tasks import Example


@pytest.mark.parametrize("expression, value", [
    ("2+3*4", 14), ("(2+3)*4", 20), ("-3 - -2", -1), ("8-3-2", 3), ("10/4*2", 5), ("+5", 5),
    ("12345 * 678", 8369910), ("1.5*4", 6), ("7/2", Fraction(7, 2)), (" ( ( 1 ) ) ", 1),
    ("-(2+3)*-(1+1)", 10), ("0.1+0.2", Fraction(3, 10)),
])  # fmt: skip
def test_values_by_hand(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("value, text", [
    (Fraction(14), "14"), (Fraction(-3), "-3"), (Fraction(7, 2), "3.5"), (Fraction(1, 3), "0.333333"),
    (Fraction(2, 3), "0.666667"), (Fraction(-1, 3), "-0.333333"), (Fraction(1, 10**9), "0"), (Fraction(-1, 8), "-0.125"),
])  # fmt: skip
def test_results_are_shown_exactly_or_rounded(value, text):
    assert show(value) == text


@pytest.mark.parametrize("expression, error", [
    ("1/0", "division by zero"), ("1/(2-2)", "division by zero"), ("2**3", "expected a number or '\\('"),
    ("abs(3)", "unexpected character 'a'"), ("__import__('os').system('x')", "unexpected character '_'"),
    ("(" * 33 + "1" + ")" * 33, "nested more than 32"), ("-" * 40 + "1", "nested more than 32"),
    ("9" * 41, "more than 40 digits"), ("9" * 40 + "*" + "9" * 40, "a value has more than 40 digits"),
    ("1" * (MAX_CHARS + 1), "longer than 256"), ("", "empty"), ("   ", "empty"), ("(1+2", "ends too early"),
    ("(1+2]", "unexpected character"), ("1 2", "unexpected '2' after"), ("1.", "unexpected character '.'"), ("\u0663+1", "unexpected character"),
])  # fmt: skip
def test_bad_expressions_are_errors_that_say_why(expression, error):
    with pytest.raises(CalcError, match=error):
        evaluate(expression)
    text, ok = run_tool(expression)
    assert not ok and text.startswith("<error>") and text.endswith("</error>")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789+-*/(). ", max_size=300))
def test_any_expression_gives_a_value_or_a_calc_error(expression):
    try:
        value = evaluate(expression)
    except CalcError:
        return
    assert isinstance(value, Fraction)


def test_model_text_is_never_executed(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("eval/exec called on model text")

    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "exec", refuse)
    assert run_tool("6*7") == ("<result>42</result>", True)
    assert run_tool("__import__('os')")[1] is False


@pytest.mark.parametrize("turn, expected", [
    ("The answer is 5.", None),
    ("Let me compute <calc>12*34</calc> first", ("call", "12*34")),
    ("<python>print(1)</python>", ("error", "unknown tool tag <python>")),
    ("</calc> stray", ("error", "unknown tool tag </calc>")),
    ("<result>5</result>", ("error", "unknown tool tag <result>")),
    ("<calc>1+1 and no end", ("error", "not closed")),
    ("<calc>1</calc><calc>2</calc>", ("call", "1")),  # the first call of a turn counts
    ("<think>multiply first</think> <calc>6*7</calc>", ("call", "6*7")),  # reasoning tags pass
    ("<think>so it is 42</think> 42", None),
])  # fmt: skip
def test_tool_calls_in_a_turn(turn, expected):
    got = tool_call(turn)
    if expected is None or expected[0] == "call":
        assert got == expected
    else:
        assert got[0] == "error" and expected[1] in got[1]


@pytest.mark.parametrize("turn", [
    "<calc>" + "(" * 10**6 + "</calc>",  # 10^6 characters: refused by length, before parsing
    "<calc>" + "1+" * 500_000 + "1</calc>",
    "<a" * 500_000,  # a million-character near-tag
    "<calc>" + "9" * 10**6,  # never closed
    "<calc>1/0</calc>",
    "<calc>((((((((((((((((((((((((((((((((((1))))))))))))))))))))))))))))))))))</calc>",
    "<unknown>x</unknown>",
])  # fmt: skip
def test_adversarial_turns_get_an_error_observation(turn):
    env = make_env("calculator", max_turns=4)
    env.reset(Example([{"role": "user", "content": "What is 1+1?"}], "2"))
    step = env.step(turn)
    if step.done:  # "<a<a<a...": no tool tag, so the turn is a (wrong) final answer
        assert step.end_reason == "answered" and turn.startswith("<a")
    else:
        assert step.observation.startswith("<error>") and step.info == {"tool_calls": 1, "tool_errors": 1}
        assert len(step.observation) < 200


def test_an_episode_with_a_tool_call_then_an_answer():
    env = make_env("calculator", max_turns=3)
    messages = env.reset(Example([{"role": "user", "content": "What is 12*34?"}], "408"))
    assert messages[0]["role"] == "system" and "<calc>" in messages[0]["content"]
    assert messages[1]["content"] == "What is 12*34?"
    first = env.step("<calc>12*34</calc>")
    assert first == Turn("<result>408</result>", done=False, info={"tool_calls": 1, "tool_errors": 0})
    last = env.step("408")
    assert last.done and last.end_reason == "answered" and last.observation is None


def test_max_turns_ends_the_episode():
    env = make_env("calculator", max_turns=2)
    env.reset(Example([{"role": "user", "content": "q"}], "1"))
    assert not env.step("<calc>1+1</calc>").done
    end = env.step("<calc>2+2</calc>")
    assert end.done and end.end_reason == "max_turns" and end.info["tool_calls"] == 1


def test_registry_plugins_and_did_you_mean():
    assert "calculator" in available()
    with pytest.raises(KeyError, match="did you mean 'calculator'"):
        make_env("calcualtor")

    @register_env("echo_test", summary="echoes once, then ends")
    class Echo(Environment):
        def reset(self, example):
            return list(example.messages)

        def step(self, model_text):
            return Turn(None, done=True, end_reason="answered")

    assert "echo_test" in available() and make_env("echo_test").step("x").done
    with pytest.raises(TypeError, match="subclass of harness.envs.Environment"):
        register_env("bad", summary="")(object)


def test_plugin_api_paths_are_the_registries_themselves(monkeypatch):
    """harness.tasks and harness.envs, the paths a user's plugin imports, are the registries in harness/data/:
    a plugin registered through them is found by name (tests/episode_envs.py and the plugin fixture use them)."""
    import harness.data.envs
    import harness.data.tasks
    import harness.envs
    import harness.tasks

    assert harness.tasks.register_task is harness.data.tasks.register_task
    assert harness.envs.register_env is harness.data.envs.register_env
    assert harness.envs.Environment is harness.data.envs.Environment
    monkeypatch.setattr(harness.data.envs.REGISTRY, "_entries", dict(harness.data.envs.REGISTRY._entries))  # this test's only

    @harness.envs.register_env("shim_probe", summary="registered through the plugin API path")
    class Probe(harness.envs.Environment):
        pass

    assert "shim_probe" in harness.data.envs.available()
