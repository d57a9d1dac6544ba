"""The ``harness`` command.

    harness run [KEY=VALUE ...]        one training run (Hydra overrides; --help lists them)
    harness sweep [KEY=V1,V2 ...]      a Hydra multirun of `harness run`
    harness sweep --preset NAME [KEY=V ...]   a preset from sweeps/NAME.yaml (your overrides win)
    harness eval [RUN_DIR|MODEL_DIR] [--checkpoint step_N] [KEY=VALUE ...]
                                       score a model on a task's test split (samples=K for pass@k);
                                       a run dir: its last checkpoint's policy, on the run's task
    harness eval SWEEP_DIR [--protocols greedy,maj@8] [--checkpoints final|all] [KEY=VALUE ...]
                                       score every run of a sweep (resumable); the report shows the columns
    harness report DIR... [--baseline ALGO] [--out DIR] [--format md,csv,latex] [--target-accuracy X]
                                       tables (mean +- std, 95% CI over seeds) and plots from run dirs
    harness baselines check|record [--preset NAME] [KEY=VALUE ...]
                                       re-run the pinned baselines (sweeps/baselines.yaml) and fail
                                       when a result leaves its committed band (record: write the bands)
    harness serve [KEY=VALUE ...] [--host H] [--port P]
                                       a rollout server (hf or vllm engine) for runs with
                                       rollout.server.url=http://H:P (same model overrides as the run)
    harness list                       algorithms, checkers, tasks, environments, model presets
    harness plan [KEY=VALUE ...] [--device-gib N] [--prompt-tokens N]
                                       predicted memory per worker process (parameters, gradients,
                                       optimizer, activations, copies) and whether it fits N GiB
    harness doctor [KEY=VALUE ...]     the GPU preflight a GPU run makes: one line per check (exit 1 on a FAIL)
    harness data prepare TASK --source PATH_OR_HUB_ID --out DIR
    harness data pairs arith|gsm8k --out FILE   preference pairs for a reward model (offline)
    harness rm train [KEY=VALUE ...]   a Bradley-Terry reward model on pairs (rm.train_pairs=arith|FILE)
    harness docs                       print docs/algorithms.md (the table generated from the registry)

Each command takes --help. `harness run --help` lists every config field and its default.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from harness.core.registry import import_plugins  # stdlib only: `harness --help` stays fast

USAGE = __doc__


def _split_list(value: str) -> list[str]:
    value = value.strip()
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    return [v.strip().strip("'\"") for v in value.split(",") if v.strip()]


def _compose_or_exit(overrides: list[str]):
    """The composed config, or one line naming the bad override (not Hydra's stack trace)."""
    from hydra.errors import HydraException, MissingConfigException

    from harness.config import ConfigError, compose_config

    try:
        return compose_config(overrides)
    except (HydraException, MissingConfigException, ConfigError) as exc:
        message = str(exc).split("Config search path")[0]  # Hydra appends where it looked: not the user's problem
        raise SystemExit(f"error: {' '.join(message.split())}") from None


def _preload(overrides: list[str]) -> None:
    """Import plugin modules and check algo names and renamed keys before Hydra composes the config."""
    import algorithms
    from harness.config import ConfigError, check_renamed

    try:
        check_renamed(overrides)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None

    plugins = [v for o in overrides if o.split("=", 1)[0].lstrip("+") == "plugins" for v in _split_list(o.split("=", 1)[1])]
    try:
        import_plugins(plugins)
    except ImportError as exc:  # the message names the module and the fix
        raise SystemExit(f"error: {exc}") from None
    check_keys(overrides)
    from harness.data.tasks import DataError, get_task

    for o in overrides:
        key, _, value = o.partition("=")
        if key in ("task", "task.name"):
            for name in _split_list(value):
                try:
                    get_task(name)
                except DataError as exc:
                    raise SystemExit(f"error: {exc}") from None
        if key == "algo":
            for name in _split_list(value):
                if name not in algorithms.available():
                    raise SystemExit(
                        f"error: unknown algorithm {name!r}{algorithms.did_you_mean(name)}. Registered: "
                        f"{', '.join(algorithms.available())}.\n"
                        f"Add your own with @register_algorithm in a module and pass plugins=[your.module]."
                    )


def _selections(overrides: list[str]) -> list[list[str]]:
    """The config-group choices of these overrides (``algo=ppo``; a sweep's ``algo=grpo,ppo``: one list per
    value of the first multi-valued choice, the others at their first value), for composing without the rest."""
    groups = [(k, _split_list(v)) for k, _, v in (o.partition("=") for o in overrides)
              if k and "." not in k and not k.startswith(("hydra", "+", "~")) and k not in ("seed", "run_dir", "plugins")
              and "/" not in k and v and not v.startswith(("[", "{"))]  # fmt: skip
    multi = next((i for i, (_, vs) in enumerate(groups) if len(vs) > 1), None)
    first = [f"{k}={vs[0]}" for k, vs in groups]
    if multi is None:
        return [first]
    key, values = groups[multi]
    return [first[:multi] + [f"{key}={v}"] + first[multi + 1:] for v in values]


def check_keys(overrides: list[str]) -> None:
    """A misspelt key (``trainer.stepz=3``): one line naming the nearest real key, before Hydra's advice to
    append it with ``+``. Keys under an open dict, ``+``/``~`` overrides and hydra's own are left to Hydra."""
    import difflib

    from omegaconf import DictConfig, OmegaConf

    from harness.config import compose_config

    keys = [k for k, _, _ in (o.partition("=") for o in overrides)
            if "." in k and not k.startswith(("hydra", "+", "~")) and not k.endswith("]")]  # fmt: skip
    keys = [k for k in keys if not _in_schema(k, overrides)]  # the cheap check first: no composition
    if not keys:
        return
    configs = []
    for selection in _selections(overrides):
        try:
            configs.append(compose_config(selection))
        except Exception:  # a bad group choice: Hydra names it with its own message
            return
    for key in keys:
        parent = key.rsplit(".", 1)[0]
        for cfg in configs:
            node = OmegaConf.select(cfg, parent, default=None)
            if OmegaConf.select(cfg, key, default="\0missing") != "\0missing" or (
                    isinstance(node, DictConfig) and not OmegaConf.is_struct(node)):
                break  # present (or an open dict) under one of the choices
        else:
            known = sorted({k for cfg in configs for k in _flat_keys(OmegaConf.to_container(cfg, resolve=False))})
            near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]}?" if near else ""
            owners = _algorithms_with(key)
            if owners:
                hint = f" of {', '.join(str(c.algo.name) for c in configs)}: a setting of {', '.join(owners)}"
            raise SystemExit(f"error: {key} is not a config key{hint} (`harness run --help` lists them)")


def _in_schema(key: str, overrides: list[str]) -> bool:
    """Whether ``key`` is a field of the config's dataclasses (the chosen algorithms' for ``algo.*``), without
    composing: the common case costs milliseconds; a key not found here is looked up in the composed config."""
    import dataclasses

    from omegaconf import OmegaConf

    import algorithms
    from harness.config import Config

    head, _, rest = key.partition(".")
    if head == "algo":
        names = [v for o in overrides if o.partition("=")[0] == "algo" for v in _split_list(o.partition("=")[2])]
        try:
            classes = [algorithms.get_class(n).config_class for n in names or [algorithms.DEFAULT]]
        except KeyError:
            return False
        return "." not in rest and all(rest in {f.name for f in dataclasses.fields(c)} for c in classes)
    return OmegaConf.select(OmegaConf.structured(Config), key, default="\0missing") != "\0missing"


def _algorithms_with(key: str) -> list[str]:
    """The registered algorithms whose config has ``algo.X`` (for a setting of one algorithm given to another)."""
    import dataclasses

    import algorithms

    if not key.startswith("algo.") or key.count(".") != 1:
        return []
    field = key.split(".", 1)[1]
    return [name for name in algorithms.available()
            if field in {f.name for f in dataclasses.fields(algorithms.get_class(name).config_class)}]  # fmt: skip


def _flat_keys(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for name, sub in tree.items():
        out += _flat_keys(sub, f"{prefix}{name}.") if isinstance(sub, dict) and sub else [f"{prefix}{name}"]
    return out


def budget_warning(overrides: list[str]) -> str | None:
    """Before a sweep launches: the reason its algorithms would run on unequal budgets, or None.

    A steps budget (the default) gives every algorithm the same number of steps, so one that
    samples more per prompt or generates extra (refills, a greedy pass) spends more tokens and
    compute per step; a tokens budget charges all generation to the same limit.
    """
    import algorithms

    values = dict(o.split("=", 1) for o in overrides if "=" in o and not o.startswith(("hydra", "+", "~")))
    budgets = _split_list(values.get("trainer.budget", "steps"))
    if len(budgets) > 1:
        return f"unequal budgets: trainer.budget is swept ({', '.join(budgets)}); rows would compare different budgets."
    limits = {"steps": "trainer.steps", "tokens": "trainer.budget_tokens", "wall_s": "trainer.budget_wall_s"}
    shape = ["trainer.prompts_per_step", "rollout.max_response_tokens"]
    for key in [limits[budgets[0]], *(shape if budgets == ["steps"] else [])]:
        swept = _split_list(values.get(key, ""))
        if len(swept) > 1:
            return f"unequal budgets: {key} is swept ({', '.join(swept)}); each value is another budget."
    names = _split_list(values.get("algo", algorithms.DEFAULT))
    samples_swept = _split_list(values.get("algo.samples_per_prompt", ""))
    if budgets != ["steps"]:
        return None
    if len(samples_swept) > 1:
        return (f"unequal budgets: trainer.budget=steps with algo.samples_per_prompt swept ({', '.join(samples_swept)}); "
                f"add trainer.budget=tokens trainer.budget_tokens=N for an equal-token comparison.")
    if len(names) < 2:
        return None
    samples = samples_swept[0] if samples_swept else None
    shapes = {}
    for name in names:
        cls = algorithms.get_class(name)
        extra = str(cls.metadata.get("extra generation", "none"))
        k = samples or cls.config_class().samples_per_prompt
        shapes[name] = f"{k} samples/prompt" + ("" if extra == "none" else f" + {extra}")
    if len(set(shapes.values())) < 2:
        return None
    listed = "; ".join(f"{n}: {v}" for n, v in shapes.items())
    return (f"unequal budgets: trainer.budget=steps, and the swept algorithms generate different amounts per step "
            f"({listed}). Their rows would compare different token budgets; for an equal-token comparison add "
            f"trainer.budget=tokens trainer.budget_tokens=N (the presets do).")


def _hydra_main(overrides: list[str], multirun: bool, mode: str = "run", eval_source: Any = None) -> None:
    """Compose the config and run ``mode`` (run | eval | rm); ``eval_source``: a harness.commands.evaluate.EvalSource."""
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from harness.config import register_configs, register_resolvers

    register_resolvers(mode, eval_source.label if eval_source else "")
    register_configs()
    run_dirs = [o.split("=", 1)[1] for o in overrides if o.startswith("run_dir=")]
    if run_dirs and not multirun:  # Hydra's own files (.hydra/, the log) go with the run
        overrides = [*overrides, f"hydra.run.dir={run_dirs[-1]}"]

    @hydra.main(version_base=None, config_path="../conf", config_name="harness")
    def app(cfg) -> None:
        from harness.commands.evaluate import evaluate_model
        from harness.core.errors import HarnessError
        from harness.trainer import train

        import_plugins(list(cfg.plugins))  # a sweep's job may run in a fresh process (joblib, SLURM)
        run_dir = cfg.run_dir or HydraConfig.get().runtime.output_dir
        if not multirun:
            print(f"harness {mode}: writing to {run_dir}", flush=True)
        try:
            if eval_source is not None:
                cfg = eval_source.apply(cfg, overrides)
                import_plugins(list(cfg.plugins))  # the run's own plugins (its task, checker...)
            if mode == "rm":
                from harness.reward_model import train_reward_model

                train_reward_model(cfg, run_dir)
            else:
                (evaluate_model if mode == "eval" else train)(cfg, run_dir)
        except HarnessError as exc:  # bad input, a busy run dir, a diverged run: one clear line, no traceback
            logging.getLogger("harness").error("%s", exc)
            if not multirun:
                raise SystemExit(f"error: {exc}") from None
            raise

    sys.argv = [sys.argv[0]] + (["--multirun"] if multirun else []) + overrides
    sacct = _SacctOnce()
    logging.getLogger("submitit").addFilter(sacct)
    try:
        app()
    finally:
        logging.getLogger("submitit").removeFilter(sacct)
        if sacct.count > 1:
            logging.getLogger("harness").warning("submitit: %d sacct calls failed in all (shown once above); job states "
                                                 "came from the jobs' own files", sacct.count)  # fmt: skip


class _SacctOnce(logging.Filter):
    """submitit polls ``sacct`` every few seconds; where SLURM accounting is off (the local
    cluster of scripts/local_slurm.sh) each poll warns. Show the first, count the rest."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "Bypassing sacct error" not in record.getMessage():
            return True
        self.count += 1
        if self.count == 1:
            record.msg = f"{record.getMessage()} (SLURM accounting off? Later sacct failures are counted, not shown)"
            record.args = ()
        return self.count == 1


def _preset_arg(rest: list[str]) -> tuple[str, list[str]]:
    """(the --preset NAME|PATH, the other arguments)."""
    args, name, it = [], None, iter(rest)
    for a in it:
        if a == "--preset":
            name = next(it, None)
        elif a.startswith("--preset="):
            name = a.split("=", 1)[1]
        else:
            args.append(a)
    if not name:
        raise SystemExit("error: --preset needs a name (sweeps/NAME.yaml) or a path")
    return name, args


def _preset_help(rest: list[str]) -> None:
    """`harness sweep --preset NAME --help`: what the preset runs (its description, grid, control arms and
    overrides) instead of Hydra's error about the arms' keys."""
    from harness.commands.presets import PresetError, read_preset, resolve_preset

    name, _ = _preset_arg(rest)
    try:
        path = resolve_preset(name)
        preset = read_preset(path)
    except PresetError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"preset {path.stem} ({path}): {preset.get('description', '')}")
    for key, values in (preset.get("sweep") or {}).items():
        print(f"  grid: {key} = {values}")
    for member in preset.get("members") or []:
        print(f"  member: {member}")
    for arm in preset.get("controls") or []:
        print(f"  control arm: {' '.join(arm)}")
    print(f"  overrides: {' '.join(str(o) for o in preset.get('overrides') or [])}")
    print(f"run it: harness sweep --preset {path.stem} [KEY=VALUE ...] (your overrides win; `harness run --help` "
          f"lists every key)")


def _apply_preset(rest: list[str]) -> list[str]:
    """`--preset NAME|PATH`: the preset's overrides, then the user's (the user's win)."""
    from harness.commands.presets import PresetError, load_preset, merge_overrides, resolve_preset

    name, args = _preset_arg(rest)
    try:
        return merge_overrides(load_preset(resolve_preset(name)), args)
    except PresetError as exc:
        raise SystemExit(f"error: {exc}") from None


def _sweep_suite(rest: list[str]) -> bool:
    """`harness sweep --preset SUITE`: each member preset's sweep in turn (a process each: one Hydra
    launch per process); False when the preset is not a suite."""
    from harness.commands.presets import PresetError, resolve_preset, suite_member_overrides, suite_members

    name, args = _preset_arg(rest)
    try:
        suite = resolve_preset(name)
        members = suite_members(suite)
        sweeps = [(m, suite_member_overrides(suite, m, args)) for m in members]
    except PresetError as exc:
        raise SystemExit(f"error: {exc}") from None
    if not members:
        return False
    jobs = []
    for i, (member, overrides) in enumerate(sweeps, 1):
        into = next(o.split("=", 1)[1] for o in overrides if o.startswith("hydra.sweep.dir="))
        jobs.append((member.stem, f"suite {suite.stem}: member {i}/{len(sweeps)} {member.stem} -> {into}", overrides))
    _run_sweep_processes(jobs, f"error: suite {suite.stem}: the sweep of ")
    return True


def _run_sweep_processes(jobs: list[tuple[str, str, list[str]]], failure_prefix: str) -> None:
    """Each (name, heading, overrides) as `harness sweep` in a process of its own (one Hydra launch per
    process), in turn; the names of those that failed end it in one line (finished runs are kept)."""
    import subprocess

    failed = []
    for name, heading, overrides in jobs:
        print(heading, flush=True)
        if subprocess.run([sys.executable, "-m", "harness.commands.cli", "sweep", *overrides]).returncode != 0:
            failed.append(name)
    if failed:
        raise SystemExit(f"{failure_prefix}{', '.join(failed)} failed (finished runs are kept; the same command "
                         f"resumes)")  # fmt: skip


def _sweep_with_controls(rest: list[str]) -> bool:
    """`harness sweep --preset NAME` of a preset with control arms: the grid, then each arm, as sweeps
    into the same folder (a process each: one Hydra launch per process); False when it has none."""
    from harness.commands.presets import PresetError, control_sweeps, preset_controls, resolve_preset

    name, args = _preset_arg(rest)
    try:
        preset = resolve_preset(name)
        if not preset_controls(preset):
            return False
        sweeps = control_sweeps(preset, args)
    except PresetError as exc:
        raise SystemExit(f"error: {exc}") from None
    if len(sweeps) == 1:  # the command line changed the algorithms: the grid alone, in this process
        print(f"preset {preset.stem}: the command line sets algo or an algo.* knob, so its control arms do not "
              f"run (they control the preset's own comparison)", flush=True)  # fmt: skip
        return False
    arms = preset_controls(preset)
    names = ["the grid", *(f"control {i}/{len(arms)} ({' '.join(arm)})" for i, arm in enumerate(arms, 1))]
    _run_sweep_processes([(n, f"preset {preset.stem}: {n}", o) for n, o in zip(names, sweeps)],
                         f"error: preset {preset.stem}: ")  # fmt: skip
    return True


def _cmd_list() -> None:
    from rich.console import Console
    from rich.table import Table

    import algorithms
    import rewards
    from algorithms.corrections import available_corrections
    from algorithms.parts import ADVANTAGES, AGGREGATIONS, FILTERS, KL_ESTIMATORS, LOSSES, SHAPINGS
    from harness.data import envs
    from harness.data.tasks import available_tasks
    from harness.runtime.rollout import registered_backends

    console = Console()
    sections = [
        ("Algorithms (algo=NAME)", algorithms.summaries()),
        ("Advantage estimators (algo.advantage=NAME: in place of an algorithm's own)",
         {n: p.summary for n, p in ADVANTAGES.entries().items()}),
        ("Policy losses (algo.loss=NAME: in place of an algorithm's own)", {n: p.summary for n, p in LOSSES.entries().items()}),
        ("Loss aggregations (algo.loss_agg=NAME)", {n: p.summary for n, p in AGGREGATIONS.entries().items()}),
        ("Reward shaping (algo.shaping=NAME)", {n: p.summary for n, p in SHAPINGS.entries().items()}),
        ("Sampling filters (algo.filter=NAME)", {n: p.summary for n, p in FILTERS.entries().items()}),
        ("KL estimators (algo.kl_kind=NAME)",
         {n: p.summary + (f" (= {p.name})" if p.name != n else "") for n, p in KL_ESTIMATORS.entries().items()}),
        ("Checkers (task.checker=NAME)", rewards.summaries()),
        ("Tasks (task=NAME)", available_tasks()),
        ("Environments (env.name=NAME: multi-turn episodes)", {n: envs.summary(n) for n in envs.available()}),
        (
            "Models (model.path=...)",
            {
                "tiny": "built offline: small Qwen2-architecture LM + BPE tokenizer, SFT warm start (cached)",
                "<hub id or dir>": "any Hugging Face causal LM, e.g. Qwen/Qwen2.5-0.5B-Instruct",
            },
        ),
        ("Rollout backends (rollout.backend=NAME)", {n: s.summary for n, s in registered_backends().items()}),
        ("Rollout-training mismatch corrections (correction.name=NAME, bounds correction.cap and correction.low)",
         available_corrections()),
    ]
    for title, rows in sections:
        table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 2))
        for name, summary in rows.items():
            table.add_row(f"[bold]{name}[/]", summary)
        console.print(table)
        console.print()


def _cmd_plan(argv: list[str]) -> None:
    import algorithms
    from harness.plan import plan, render

    p = argparse.ArgumentParser(prog="harness plan", description="Predicted memory per training worker process "
                                "of the run these overrides describe (no model is loaded; model.path needs a local "
                                "config.json, or tiny). See harness/plan.py for what is counted.")  # fmt: skip
    p.add_argument("overrides", nargs="*", help="the run's KEY=VALUE overrides, as for harness run")
    p.add_argument("--device-gib", type=float, default=None, help="memory per device (GPU) or machine to check against")
    p.add_argument("--prompt-tokens", type=int, default=None,
                   help="longest prompt of a micro-batch (default: task.max_prompt_tokens, the cap)")
    args = p.parse_args(argv)
    _preload(args.overrides)
    cfg = _compose_or_exit(args.overrides)
    try:
        result = plan(cfg, list(algorithms.build(cfg.algo).needs.roles), prompt_tokens=args.prompt_tokens,
                      device_gib=args.device_gib)
    except FileNotFoundError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(render(result, args.device_gib))


def _cmd_doctor(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="harness doctor", description="The preflight every GPU run makes before it loads "
                                "a model (harness/runtime/driver/preflight.py): vLLM sleep mode vs PYTORCH_CUDA_ALLOC_CONF, "
                                "GPU compute mode, /dev/shm room, a C compiler, the compile cache, the vLLM version, "
                                "NCCL variables, GPUs per worker. One line per check; exit 1 when one fails.")  # fmt: skip
    p.add_argument("overrides", nargs="*", help="the run's KEY=VALUE overrides, as for harness run")
    args = p.parse_args(argv)
    _preload(args.overrides)
    from harness.runtime.workers.worker import resolve_device

    cfg = _compose_or_exit(args.overrides)
    if resolve_device(cfg.runtime.device) != "cuda":
        print(f"OK   device: runtime.device={cfg.runtime.device} is the CPU here: GPU checks skipped "
              "(give runtime.device=cuda to run them)")  # fmt: skip
        return 0
    from harness.trainer import gpu_preflight

    findings = gpu_preflight(cfg)
    for finding in findings:
        print(finding.line())
    return int(any(f.level == "fail" for f in findings))


def _cmd_serve(argv: list[str]) -> None:
    from pathlib import Path

    from harness.commands.serve import ServeLimits, ServeOptions, check_exposure, serve
    from harness.config import compose_config
    from harness.core.errors import HarnessError
    from harness.runtime.rollout.remote import TOKEN_ENV, shared_token

    d = ServeLimits()
    p = argparse.ArgumentParser(prog="harness serve", description="A rollout server: the engine rollout=hf|vllm "
                                "loaded with the model the overrides name, for `harness run rollout.server.url=http://HOST:PORT` "
                                "(start it with the run's model, task and rollout overrides). With a shared token "
                                f"(${TOKEN_ENV} or --token-file) every call must carry it; put a TLS reverse proxy in "
                                "front for traffic that leaves a trusted network (docs/async.md).")  # fmt: skip
    p.add_argument("overrides", nargs="*", help="KEY=VALUE overrides, as for harness run (model.*, task, rollout)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (another than loopback needs a token or --insecure)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--token-file", default="", help=f"file holding the shared token (default: ${TOKEN_ENV}); the run "
                   "gives the same with rollout.server.token_file or the variable")  # fmt: skip
    p.add_argument("--insecure", action="store_true", help="serve a non-loopback address with no token")
    p.add_argument("--weights-dir", default="", help="directory (shared with the run) that weights may be pushed "
                   "from by path (the run's rollout.server.weights_dir); default: bodies only")  # fmt: skip
    p.add_argument("--max-n", type=int, default=d.n, help=f"samples per prompt per call (default {d.n})")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help=f"new tokens per sample (default {d.max_tokens})")
    p.add_argument("--max-prompts", type=int, default=d.prompts, help=f"prompts per call (default {d.prompts})")
    p.add_argument("--max-prompt-tokens", type=int, default=d.prompt_tokens,
                   help=f"tokens per prompt (default {d.prompt_tokens})")
    p.add_argument("--max-sequences", type=int, default=d.sequences,
                   help=f"prompts x samples per call (default {d.sequences})")
    p.add_argument("--max-weights-mb", type=float, default=d.weights_mb,
                   help="a weight push's body in MiB (default: the model's float32 size + 10%%)")
    args = p.parse_args(argv)
    _preload(args.overrides)
    try:
        token = shared_token(args.token_file)
        check_exposure(args.host, token, args.insecure)
        weights_dir = Path(args.weights_dir).expanduser() if args.weights_dir else None
        if weights_dir is not None and not weights_dir.is_dir():
            raise SystemExit(f"error: --weights-dir {args.weights_dir}: not a directory")
        caps = {"--max-n": args.max_n, "--max-tokens": args.max_tokens, "--max-prompts": args.max_prompts,
                "--max-prompt-tokens": args.max_prompt_tokens, "--max-sequences": args.max_sequences}
        for flag, value in caps.items():
            if value < 1:
                raise SystemExit(f"error: {flag} {value}: a cap of at least 1")
        if args.max_weights_mb < 0:
            raise SystemExit(f"error: --max-weights-mb {args.max_weights_mb}: MiB, or 0 for the model's size + 10%")
        limits = ServeLimits(args.max_n, args.max_tokens, args.max_prompts, args.max_prompt_tokens, args.max_sequences,
                             args.max_weights_mb)
        serve(compose_config(args.overrides), args.host, args.port, ServeOptions(token, weights_dir, limits))
    except HarnessError as exc:
        raise SystemExit(f"error: {exc}") from None


def _cmd_data(argv: list[str]) -> None:
    from harness.config import task_presets
    from harness.data.tasks import DataError, prepare, registered_tasks

    parser = argparse.ArgumentParser(prog="harness data", description="Data utilities.")
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("prepare", help="write verl-compatible train/test parquet for a task")
    p.add_argument("task", choices=[n for n, spec in registered_tasks().items() if spec.row_parser is not None])
    p.add_argument("--source", required=True, help="raw jsonl/parquet file or directory, or a hub id")
    p.add_argument("--out", required=True, help="output directory for train.parquet / test.parquet")
    q = sub.add_parser("pairs", help="write preference pairs (prompt, chosen, rejected) for a reward model, offline",
                       description="arith: right vs wrong answer; gsm8k: the reference solution vs the same "
                                   "solution with a corrupted final answer (--source: a GSM8K jsonl file)")  # fmt: skip
    q.add_argument("task", choices=["arith", "gsm8k"])
    q.add_argument("--out", required=True, help="output file (.parquet or .jsonl)")
    q.add_argument("--split", choices=["train", "test"], default="train", help="arith: which split's problems")
    q.add_argument("--source", default="", help="gsm8k: the raw jsonl (e.g. ../shared/data/gsm8k/train.jsonl)")
    q.add_argument("--seed", type=int, default=0, help="draws the wrong answers")
    args = parser.parse_args(argv)
    try:
        if args.action == "pairs":
            from harness.data.pairs import arith_pairs, gsm8k_pairs, write_pairs

            if args.task == "gsm8k" and not args.source:
                raise DataError("data pairs gsm8k needs --source (a GSM8K jsonl file with question and answer)")
            preset = task_presets()[args.task]
            pairs = (arith_pairs(preset, args.split, args.seed) if args.task == "arith"
                     else gsm8k_pairs(args.source, preset.prompt_template, args.seed))  # fmt: skip
            ties = sum(p.chosen == p.rejected for p in pairs)  # a file holds none (load_pairs refuses them)
            pairs = [p for p in pairs if p.chosen != p.rejected]
            print(f"{write_pairs(pairs, args.out)}: {len(pairs)} pairs"
                  + (f" ({ties} whose two answers are equal left out: harness.data.pairs.arith_pairs)" if ties else ""))
            return
        counts = prepare(args.task, args.source, args.out, task_presets()[args.task])
    except DataError as exc:
        raise SystemExit(f"error: {exc}") from None
    for split, n in counts.items():
        print(f"{args.out}/{split}.parquet: {n} rows")


def _cmd_baselines(argv: list[str]) -> int:
    import json
    import time
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from analysis.baselines import METRICS, MIN_MARGIN, bands_path, check, make_bands, read_bands
    from analysis.collect import collect
    from harness.commands.presets import PresetError, load_preset, merge_overrides, resolve_preset
    from harness.models import cpu_flags

    parser = argparse.ArgumentParser(
        prog="harness baselines",
        description="Pinned baselines: run a small fixed sweep and compare each algorithm's mean over seeds with "
                    "the committed bands (check), or measure and write the bands (record).")
    parser.add_argument("action", choices=["check", "record"])
    parser.add_argument("--preset", default="baselines", help="preset name or path (default: sweeps/baselines.yaml); "
                        "bands live beside it in NAME.bands.json")
    parser.add_argument("--out", help="sweep folder (default: a new results/baselines/<action>-<time>; "
                        "an existing folder's finished runs are reused, not re-run)")
    parser.add_argument("--no-run", action="store_true", help="only compare the runs already in --out (needs --out)")
    parser.add_argument("--min-margin", type=float, default=None,
                        help="record: smallest half-width of every band (default per metric: eval_final 0.04, "
                             "auc 0.02, train_accuracy 0.01)")
    parser.add_argument("--se-multiple", type=float, default=3.0,
                        help="record: half-width = max(min-margin, this x sqrt(2) x standard error over seeds)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="extra Hydra overrides for every run")
    args = parser.parse_args(argv)
    console = Console(width=200) if not Console().is_terminal else Console()
    if args.no_run and not args.out:
        console.print("error: --no-run compares the runs in --out DIR: give --out", highlight=False)
        return 2
    try:
        preset = resolve_preset(args.preset)
        out = args.out or f"results/baselines/{args.action}-{time.strftime('%Y%m%d-%H%M%S')}"
        bands_file = bands_path(preset)
        bands = None if args.action == "record" else read_bands(bands_file)  # before minutes of training
        if not args.no_run:
            overrides = merge_overrides(load_preset(preset), [*args.overrides, f"hydra.sweep.dir={out}"])
            _preload(overrides)
            _hydra_main(_requeue_on_slurm(overrides), multirun=True)
        col = collect([out])
    except (PresetError, FileNotFoundError, ValueError) as exc:
        console.print(f"error: {exc}", highlight=False)
        return 2
    for d, why in col.skipped:
        console.print(f"[yellow]skipped[/] {d}: {why}", highlight=False)
    starts = sorted({str((json.loads((Path(d) / "run.json").read_text()).get("model_info") or {}).get("weights_sha256"))
                     for d in col.runs.get("run_dir", [])})
    console.print(f"warm start weights sha256 (from run.json): {', '.join(starts) or '-'}", highlight=False)
    console.print(f"CPU flags: {cpu_flags()}", highlight=False)
    if args.action == "record":
        if col.runs.empty or col.skipped:
            console.print(f"error: record needs every run of the preset finished ({len(col.runs)} finished, "
                          f"{len(col.skipped)} skipped): re-run, or check the skipped ones above", highlight=False)
            return 1
        if len(starts) > 1:
            console.print(f"error: runs from several warm starts ({', '.join(starts)}): record from one", highlight=False)
            return 1
        data = {"preset": preset.name, "recorded": time.strftime("%Y-%m-%d"), "cpu_flags": cpu_flags(),
                "git_sha": sorted({str(x) for x in col.runs["git_sha"]}),  # the code the runs ran
                "warm_start": starts, "min_margin": MIN_MARGIN if args.min_margin is None else args.min_margin,
                "se_multiple": args.se_multiple, "metrics": METRICS,
                "bands": make_bands(col.runs, args.min_margin, args.se_multiple)}
        bands_file.write_text(json.dumps(data, indent=2) + "\n")
        console.print(f"wrote {bands_file} from {len(col.runs)} run(s) in {out}", highlight=False)
        return 0
    results, missing = check(col.runs, bands["bands"])
    recorded_starts = {str(w)[:12] for w in bands.get("warm_start") or []}
    if recorded_starts and len(col.runs) and set(col.runs["warm_start"]) - recorded_starts:
        console.print(f"[bold red]FAIL[/] runs started from warm start(s) {sorted(set(col.runs['warm_start']))}, the "
                      f"bands from {sorted(recorded_starts)}: not comparable", highlight=False)
        missing = missing + ["(warm start)"]
    table = Table(title=f"pinned baselines ({preset}) vs {bands_file} (recorded {bands.get('recorded', '?')})",
                  title_justify="left", header_style="bold")
    for col_name in ("algo", "metric", "seeds", "now", "band", ""):
        table.add_column(col_name)
    for r in results:
        table.add_row(r.algo, r.metric, f"{r.n_seeds}/{r.expected_seeds or r.n_seeds}", f"{r.value:.4f}", f"[{r.lo:.4f}, {r.hi:.4f}]",
                      "[green]ok[/]" if r.ok else f"[bold red]{r.verdict}[/]")
    console.print(table)
    failed = [r for r in results if not r.ok]
    for algo in missing:
        console.print(f"[bold red]FAIL[/] {algo}: pinned, but no finished run in {out}", highlight=False)
    if failed or missing:
        console.print(f"[bold red]baselines check failed[/]: {len(failed)} value(s) out of band or short of seeds, "
                      f"{len(missing)} "
                      f"algorithm(s) missing. If the change is meant to move results, say so in the commit and "
                      f"re-record: harness baselines record", highlight=False)
        return 1
    console.print(f"[bold green]baselines check passed[/]: {len(results)} value(s) within their bands", highlight=False)
    return 0


_HYDRA_SPECIAL = set("=,[]{}()'\" :\\$")


def quote_paths(args: list[str]) -> list[str]:
    """``key=PATH`` with a PATH that exists and holds characters of Hydra's override grammar
    (a sweep's run dirs are named ``algo=grpo,seed=0``): the value quoted, so it reads as the path."""
    out = []
    for a in args:
        key, eq, value = a.partition("=")
        plain = "\\" not in value and "${" not in value and "'" not in value  # quoting cannot carry these as they are
        if eq and plain and not key.startswith("hydra") and _HYDRA_SPECIAL & set(value) and value[:1] != '"' \
                and os.path.exists(value):
            a = f"{key}='{value}'"
        out.append(a)
    return out


def _eval_source(args: list[str]):
    """`harness eval [PATH] [--checkpoint step_N] [KEY=VALUE ...]`: PATH is any argument that names
    an existing directory, or ``model.path=DIR`` of one (so a sweep's ``algo=grpo,seed=0`` needs no
    Hydra quoting, and a run's checkpoint is scored on the run's task and settings)."""
    from harness.commands.evaluate import EvalSource
    from harness.core.errors import HarnessError

    rest, paths, checkpoint, it = [], [], None, iter(args)
    for a in it:
        if a == "--checkpoint":
            checkpoint = next(it, None)
            if checkpoint is None:
                raise SystemExit("error: --checkpoint needs a value: step_N (a folder of RUN_DIR/checkpoints) or N")
        elif a.startswith("--checkpoint="):
            checkpoint = a.split("=", 1)[1]
        elif os.path.isdir(a):
            paths.append(a)
        elif a.startswith("model.path=") and os.path.isdir(a.split("=", 1)[1]):  # the same, spelled as an override
            paths.append(a.split("=", 1)[1])
        else:
            rest.append(a)
    if len(paths) > 1:
        raise SystemExit(f"error: harness eval scores one model at a time; got {len(paths)} paths: {', '.join(paths)}")
    if not paths:
        if checkpoint:
            raise SystemExit("error: --checkpoint picks a checkpoint of a run directory: harness eval RUN_DIR --checkpoint step_N")
        return rest, None
    if any(a.split("=", 1)[0] == "model.path" for a in rest):
        raise SystemExit(f"error: both a path ({paths[0]}) and model.path=... given: keep one")
    try:
        return rest, EvalSource.resolve(paths[0], checkpoint)
    except HarnessError as exc:
        raise SystemExit(f"error: {exc}") from None


def _sweep_eval_args(args: list[str]) -> tuple[str | None, dict[str, str], list[str]]:
    """(a sweep directory among ``args``, the --protocols/--checkpoints options, the other arguments)."""
    from harness.commands.eval_sweep import is_sweep_dir

    options, rest, sweep, it = {}, [], None, iter(args)
    for a in it:
        flag, eq, value = a.partition("=")
        if flag in ("--protocols", "--checkpoints"):
            value = value if eq else next(it, None)
            if value is None:
                raise SystemExit(f"error: {flag} needs a value (--protocols greedy,maj@8; --checkpoints final|all)")
            options[flag[2:]] = value
        elif sweep is None and not a.startswith("-") and os.path.isdir(a) and is_sweep_dir(a):
            sweep = a
        else:
            rest.append(a)
    return sweep, options, rest


def _eval_sweep(args: list[str]) -> bool:
    """`harness eval SWEEP_DIR [--protocols ...] [--checkpoints final|all] [KEY=VALUE ...]`; False when
    no sweep directory is named (then it is `harness eval` of one model)."""
    from harness.core.errors import HarnessError

    sweep, options, rest = _sweep_eval_args(args)
    if sweep is None:
        if options:
            raise SystemExit(f"error: --{next(iter(options))} applies to a sweep directory (harness eval SWEEP_DIR "
                             f"--protocols greedy,maj@8); for one model use samples=K")  # fmt: skip
        return False
    if "--checkpoint" in rest or any(a.startswith("--checkpoint=") for a in rest):
        raise SystemExit("error: --checkpoint picks one run's checkpoint; for a sweep use --checkpoints final|all")
    _preload(rest)
    from harness.commands.eval_sweep import evaluate_sweep

    try:
        status = evaluate_sweep(sweep, options.get("protocols", "greedy"), options.get("checkpoints", "final"), rest)
    except HarnessError as exc:
        raise SystemExit(f"error: {exc}") from None
    if status:
        raise SystemExit(status)
    return True


SLURM_REQUEUES = 3  # times a timed-out or preempted SLURM job is resubmitted (it resumes from its checkpoint)


def _requeue_on_slurm(args: list[str]) -> list[str]:
    """On SLURM, requeue timed-out/preempted jobs by default: submitit resubmits the same
    run, which resumes from its last checkpoint in its deterministic run directory."""
    if "hydra/launcher=submitit_slurm" in args and not any(a.startswith("hydra.launcher.max_num_timeout=") for a in args):
        return [*args, f"hydra.launcher.max_num_timeout={SLURM_REQUEUES}"]
    return args


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    cmd, rest = argv[0], argv[1:]
    if cmd == "sweep" and any(a == "--preset" or a.startswith("--preset=") for a in rest):
        if any(a in ("--help", "-h") for a in rest):
            return _preset_help(rest)
        if _sweep_suite(rest) or _sweep_with_controls(rest):
            return
        rest = _apply_preset(rest)
    if cmd == "sweep":
        rest = _requeue_on_slurm(rest)
    if cmd in ("run", "sweep", "eval"):
        asks_help = any(a in ("--help", "-h", "--hydra-help", "--info", "--cfg", "-c") for a in rest)
        source = None
        if cmd == "eval" and not asks_help:
            if _eval_sweep(rest):
                return
            rest, source = _eval_source(rest)
        rest = quote_paths(rest)
        _preload([] if asks_help else rest)
        warning = budget_warning(rest) if cmd == "sweep" and not asks_help else None
        if warning:  # before anything launches
            print(f"WARNING: {warning}", file=sys.stderr)
        _hydra_main(rest, multirun=cmd == "sweep", mode="eval" if cmd == "eval" else "run", eval_source=source)
    elif cmd == "rm":
        if not rest or rest[0] != "train":
            raise SystemExit("usage: harness rm train [KEY=VALUE ...]   (rm.train_pairs, rm.eval_pairs, rm.steps, model.path, ...)")
        _preload(rest[1:])
        _hydra_main(quote_paths(rest[1:]), multirun=False, mode="rm")
    elif cmd == "list":
        _cmd_list()
    elif cmd == "plan":
        _cmd_plan(rest)
    elif cmd == "doctor":
        raise SystemExit(_cmd_doctor(rest))
    elif cmd == "serve":
        _cmd_serve(rest)
    elif cmd == "data":
        _cmd_data(rest)
    elif cmd == "report":
        from analysis.report import main as report_main

        raise SystemExit(report_main(rest))
    elif cmd == "baselines":
        raise SystemExit(_cmd_baselines(rest))
    elif cmd == "docs":
        from harness.commands.docs_gen import algorithms_table

        print(algorithms_table(), end="")
    else:
        raise SystemExit(f"error: unknown command {cmd!r}\n{USAGE}")


if __name__ == "__main__":
    main()
