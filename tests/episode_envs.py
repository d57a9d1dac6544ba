"""Environments the episode tests register (imported as tests.episode_envs, so once)."""

from harness.envs import Environment, Turn, register_env  # the plugin API path, as a user writes it


@register_env("test_one_turn", summary="ends every episode after the model's first turn (tests)")
class OneTurn(Environment):
    def reset(self, example):
        return list(example.messages)

    def step(self, model_text):
        return Turn(None, done=True, end_reason="answered")


@register_env("test_digits", summary="answers every turn with the digits '12+3=' until max_turns (tests)")
class Digits(Environment):
    def reset(self, example):
        self.turns = 0
        return list(example.messages)

    def step(self, model_text):
        self.turns += 1
        if self.turns >= self.max_turns:
            return Turn(None, done=True, end_reason="max_turns", info={"tool_calls": 1})
        return Turn("12+3=", done=False, info={"tool_calls": 1, "tool_errors": int(self.turns == 1)})
