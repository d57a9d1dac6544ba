"""A test-only rollout backend plugin: ``recording``, the hf backend with every call written down.

Registered from outside harness/ with ``@register_backend``; a run selects it with
``plugins=[harness_test_plugin.my_backend] rollout.backend=recording``. Each call appends one JSON
line (method, process id, sizes) to the file named by $HARNESS_TEST_ROLLOUT_LOG, so a test sees the
calls of worker processes too.
"""

import json
import os

from harness.runtime.rollout import RolloutContext, get_backend, register_backend


class Recording:
    def __init__(self, inner):
        self.inner = inner
        self.pad_id, self.eos_ids = inner.pad_id, inner.eos_ids

    def _log(self, method: str, **sizes) -> None:
        with open(os.environ["HARNESS_TEST_ROLLOUT_LOG"], "a") as f:
            f.write(json.dumps({"method": method, "pid": os.getpid(), **sizes}) + "\n")

    def generate(self, prompts, n, max_new_tokens, temperature=1.0, top_p=1.0, seeds=None):
        self._log("generate", prompts=len(prompts), n=n, max_new_tokens=max_new_tokens, temperature=temperature)
        return self.inner.generate(prompts, n, max_new_tokens, temperature, top_p, seeds=seeds)

    def load_weights(self, state_dict) -> None:
        self._log("load_weights", tensors=len(state_dict))
        self.inner.load_weights(state_dict)


@register_backend("recording", summary="hf, with every call written to $HARNESS_TEST_ROLLOUT_LOG (test plugin)")
def build(ctx: RolloutContext) -> Recording:
    return Recording(get_backend("hf").build(ctx))
