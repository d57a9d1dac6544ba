"""The shared runtime every algorithm runs on (the loop in harness/trainer.py drives it).

* ``driver/``: ``HybridEngine``, the single controller's handle on the workers; the rollout
  pipeline (one_step_off, async); multi-turn episodes.
* ``workers/``: the ``Worker`` (policy, declared roles, a rollout backend, on one rank) and the
  groups that host workers: in-process, local processes, Ray actors.
* ``rollout/``: the rollout backend protocol, ``Generation`` and the registry; hf, vllm, remote.
* ``train/``: the FSDP2 train engine, micro-batch layout, LoRA.
* ``loading.py``: loading Hugging Face models and tokenizers.
* ``settings.py``: the runtime's config groups, defined once (instances built by ``harness.config.runtime_settings``).
"""
