"""The environment plugin API: what a user's multi-turn environment imports (docs/adding_an_environment.md).

    from harness.envs import Environment, Turn, register_env

The registry and the built-in calculator live in harness/data/envs/; this path stays stable for plugins.
"""

from harness.data.envs import (
    END_REASONS,
    ENTRY_POINT_GROUP,
    Environment,
    Turn,
    available,
    make_env,
    register_env,
)

__all__ = ["END_REASONS", "ENTRY_POINT_GROUP", "Environment", "Turn", "available", "make_env", "register_env"]
