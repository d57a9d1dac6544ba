"""The task plugin API: what a user's task module imports (docs/adding_a_task.md).

    from harness.tasks import Example, Task, register_task

The registry and the built-in loaders live in harness/data/tasks.py; this path stays stable for plugins
(tests/algorithms/test_plugins.py imports a plugin written against it).
"""

from harness.data.tasks import (
    ENTRY_POINT_GROUP,
    Example,
    Task,
    TaskSpec,
    get_task,
    register_task,
    registered_tasks,
)

__all__ = ["ENTRY_POINT_GROUP", "Example", "Task", "TaskSpec", "get_task", "register_task", "registered_tasks"]
