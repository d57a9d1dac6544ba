"""What runs are trained and scored on: tasks and their loaders (``tasks.py``, ``reasoning.py``),
preference pairs for reward models (``pairs.py``) and multi-turn environments (``envs/``).

A user's plugin imports the registries through ``harness.tasks`` and ``harness.envs``.
"""
