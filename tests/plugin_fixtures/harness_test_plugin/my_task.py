"""A test-only task plugin: ``echo`` (repeat a number), registered from outside harness/."""

from harness.tasks import Example, Task, register_task


@register_task("echo", summary="repeat a number (test plugin)", preset={"checker": "arith"})
def load_echo(cfg) -> Task:
    def examples(start: int, n: int) -> list[Example]:
        return [Example([{"role": "user", "content": f"Repeat {i}"}], str(i)) for i in range(start, start + n)]

    return Task("echo", cfg.checker, examples(1000, 300), examples(10, cfg.eval_prompts), cfg)  # disjoint
