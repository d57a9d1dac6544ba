"""The algorithm protocol's guard rails: roles, the typed batch's concat, old-protocol plug-ins."""

import pytest
import torch

from algorithms import Algorithm, Batch, register_algorithm
from algorithms.base import Needs, Role


def batch_of(n: int, T: int = 2) -> Batch:
    return Batch(
        prompt_ids=torch.ones(n, 1, dtype=torch.long), prompt_mask=torch.ones(n, 1, dtype=torch.bool),
        response_ids=torch.ones(n, T, dtype=torch.long), response_mask=torch.ones(n, T, dtype=torch.bool),
        group_ids=torch.zeros(n, dtype=torch.long), prompts=[""] * n, responses=[""] * n, ground_truths=[""] * n,
        truncated=torch.zeros(n, dtype=torch.bool),
    )


def test_roles_are_checked_when_declared():
    with pytest.raises(ValueError, match="'policy' is the engine's own"):
        Role("policy")
    with pytest.raises(ValueError, match="head='value'"):
        Role("v", head="value")
    with pytest.raises(ValueError, match="trainable but has no loss"):
        Role("v", trainable=True)
    with pytest.raises(ValueError, match="names a model twice"):
        Needs(roles=(Role("reference"), Role("reference")))


def test_concat_pads_outputs_on_the_right_and_fills_missing_filler():
    a, b = batch_of(1, T=2), batch_of(2, T=3)
    a.outputs["critic"], b.outputs["critic"] = torch.tensor([[1.0, 2.0]]), torch.ones(2, 3)
    b.filler = torch.tensor([True, False])
    a.max_response_tokens, b.max_response_tokens = 2, 3
    out = Batch.concat([a, b])
    assert out.outputs["critic"].tolist() == [[1.0, 2.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    assert out.filler.tolist() == [False, True, False] and out.max_response_tokens == 3
    b.outputs.pop("critic")
    with pytest.raises(ValueError, match="different outputs"):
        Batch.concat([a, b])


def test_old_protocol_update_aux_is_refused_at_registration():
    with pytest.raises(TypeError, match="update_aux is no longer called: declare the model as a Role"):

        @register_algorithm("test_old_protocol")
        class Old(Algorithm):
            def update_aux(self, batch, engine):
                return {}


def test_old_one_value_returns_get_an_error_naming_the_fix():
    from harness.trainer import _checked

    algo = Algorithm(None)
    with pytest.raises(TypeError, match=r"Algorithm.select must return \(Batch, metrics dict\); got Batch"):
        _checked(algo, "select", batch_of(1), Batch)
    adv = torch.zeros(1, 2)
    with pytest.raises(TypeError, match=r"advantages must return \(Tensor, metrics dict\); got Tensor"):
        _checked(algo, "advantages", adv, torch.Tensor)
    assert _checked(algo, "advantages", (adv, {}), torch.Tensor) == (adv, {})
