"""Every command in a code block of README.md and docs/*.md runs as a user would type it.

Each documented command belongs to one scenario below (run by ``bash -c`` in a fresh working
directory, in order, with the venv's ``harness`` on PATH and ``../shared`` beside it, as in a
checkout) or is listed in SKIPPED with the reason it cannot run here (a GPU, a hub model, a
cluster, minutes of work CI runs elsewhere). Sizes are shrunk by overrides appended to (or
replacing the same key in) each harness command; placeholders such as ``results/runs/X/...`` are
replaced by what an earlier command of the scenario wrote. A command added to the docs without
an entry here fails ``test_every_documented_command_is_covered``.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGS = ("bash", "sh", "shell", "console")


def documented_commands() -> dict[str, list[str]]:
    """command (comment stripped, whitespace collapsed) -> the files that show it."""
    found: dict[str, list[str]] = {}
    for doc in DOCS:
        for m in re.finditer(r"```(\w*)\n(.*?)```", doc.read_text(), re.S):
            lang, body = m.group(1), m.group(2).replace("\\\n", " ")
            for line in body.splitlines():
                cmd = _strip_comment(line)
                if not cmd or (lang not in SHELL_LANGS and not cmd.startswith(("harness ", "make "))):
                    continue
                found.setdefault(cmd, []).append(doc.name)
    return found


def _strip_comment(line: str) -> str:
    line = line.strip()
    if line.startswith("#"):
        return ""
    cut = re.search(r"\s#\s", line + " ")  # a comment starts at ' # ' (never inside a value here)
    return " ".join((line[: cut.start()] if cut else line).split())


# What a harness command is shrunk by (key=value replaces the same key in the command).
SHRINK_RUN = ["trainer.steps=2", "trainer.eval_every=2", "trainer.checkpoint_every=0", "task.eval_prompts=8",
              "trainer.prompts_per_step=4", "runtime.threads=1"]  # fmt: skip
SHRINK_SWEEP = [*SHRINK_RUN, "seed=0", "trainer.budget_tokens=120", "trainer.eval_every_tokens=120"]
SHRINK = {"run": SHRINK_RUN, "sweep": SHRINK_SWEEP, "eval": ["eval_limit=8"], "rm": ["rm.steps=4", "rm.eval_every=2"]}


@dataclass
class Scenario:
    commands: list[str]  # documented commands, in order, in one fresh directory
    extra: dict[str, list[str]] = field(default_factory=dict)  # per command: more shrinking overrides
    subst: dict[str, str] = field(default_factory=dict)  # placeholder -> glob in the directory (the last match)
    setup: list[str] = field(default_factory=list)  # commands the docs imply (run first, unshrunk)
    files: dict[str, str] = field(default_factory=dict)  # files the user would have written
    env: dict[str, str] = field(default_factory=dict)
    needs: str = ""  # 'shared' (../shared/data), 'slurm' (HARNESS_TEST_SLURM=1)
    expect: dict[str, str] = field(default_factory=dict)  # command -> text its output must hold
    timeout_s: int = 600


def _doc_block(page: str, title: str = "## The code") -> str:
    """The python code block under heading ``title`` of ``page``: what a user would save as a file."""
    text = (ROOT / page).read_text()
    section = text[text.index(title):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


TWO_ALGOS = ["algo=grpo,rloo"]
# A preset's joblib launcher (n_jobs=2) starts two worker processes, each importing torch and the harness again: ~10 s
# of CPU per sweep, and under make test's -n 2 on 2 cores no parallelism to buy back. n_jobs=1 runs the shrunk runs
# through the same launcher in the sweep's own process. Parallel joblib stays covered: the sweeps scenario's
# `hydra/launcher=joblib hydra.launcher.n_jobs=2` command, and the lighter preset scenarios keep the presets' n_jobs=2.
IN_PROCESS = ["hydra.launcher.n_jobs=1"]
TINY_RM = ["rm.steps=4", "rm.eval_every=2"]
# A 4-step warm start, not a preset's 800-2000: its held-out checks (128 prompts, at steps 0 and 4) are most of a build
SMALL_WARM_START = ["model.tiny.sft_steps=4", "model.tiny.sft_eval_every=4"]
# The reasoning preset allows 160-token responses: a barely trained start rambles to that limit, and DAPO (16 samples
# per prompt) regenerated 4 rounds of them (16 s a step); 32 tokens and 4 samples keep every code path.
SHORT_REASONING = ["rollout.max_response_tokens=32", "algo.samples_per_prompt=4", "trainer.sequences_per_minibatch=16"]
def _preset_scenario(preset: str, extra: list[str], expect: str) -> Scenario:
    """A docs page's pair `harness sweep --preset P` + `harness report ... --baseline grpo` on the reasoning testbed, shrunk."""
    sweep, report = f"harness sweep --preset {preset}", f"harness report results/sweeps/{preset} --baseline grpo"
    return Scenario([sweep, report], extra={sweep: [*SMALL_WARM_START, "rollout.max_response_tokens=32",
                                                    "trainer.sequences_per_minibatch=16", *extra]},
                    expect={report: expect})  # fmt: skip


SCENARIOS: dict[str, Scenario] = {
    "cli_basics": Scenario([
        "harness list",
        "harness run --help",
        "harness docs",
        "harness eval --help",
        "harness rm train --help",
    ], expect={"harness run --help": "Choices of enumerated fields", "harness list": "Algorithms",
               "harness eval --help": "--checkpoint", "harness docs": "grpo"}),
    "runs": Scenario([
        "harness run algo=grpo algo.kl_coef=0 seed=1",
        "harness run trainer.budget=tokens trainer.budget_tokens=2000000",
        "harness run algo=grpo model.lora.rank=8",
        "harness run algo=ppo model.lora.rank=16 model.lora.roles=[critic]",
        "harness run trainer.pipeline=one_step_off",
        "harness run trainer.pipeline=async trainer.max_staleness=2",
        "harness run trainer.pipeline=async rollout.partial=continue",
        "harness run logging.sinks=[jsonl,tensorboard]",
    ], extra={"harness run trainer.budget=tokens trainer.budget_tokens=2000000": ["trainer.budget_tokens=200"]}),
    "workers": Scenario([
        "harness run runtime.workers=2",
        "harness run runtime=ray runtime.workers=8",
    ], extra={"harness run runtime=ray runtime.workers=8": ["runtime.workers=2"]}),
    # The plug-in guides, each page's code saved as the user would, then its command; last, a report of those runs
    # with the report-column guide's column.
    "plugins": Scenario(
        ["harness run plugins=[my_pkg.my_algo] algo=my_algo",
         "harness run plugins=[my_pkg.my_task] task=echo",
         "harness run plugins=[my_pkg.my_backend] rollout.backend=counting",
         "harness run plugins=[my_pkg.my_env] env.name=recheck env.max_turns=2",
         "harness run algo=grpo algo.advantage=rloo algo.loss=gspo",
         "harness run plugins=[my_pkg.my_parts] algo=grpo algo.advantage=median",
         "harness run plugins=[my_pkg.my_parts] algo=loo_gspo",
         "harness run algo=grpo algo.filter=dynamic algo.shaping=overlong",
         "harness report results/runs --plugins my_pkg.my_columns"],
        files={"my_pkg/my_columns.py": _doc_block("docs/adding_a_report_column.md"),"my_pkg/__init__.py": "", "my_pkg/my_algo.py": _doc_block("docs/adding_an_algorithm.md"),
               "my_pkg/my_parts.py": _doc_block("docs/adding_an_algorithm.md", "## A part of your own"),
               "my_pkg/my_task.py": _doc_block("docs/adding_a_task.md"),
               "my_pkg/my_backend.py": _doc_block("docs/adding_a_backend.md"),
               "my_pkg/my_env.py": _doc_block("docs/adding_an_environment.md")},
        extra={"harness run plugins=[my_pkg.my_task] task=echo": SMALL_WARM_START,
               "harness run plugins=[my_pkg.my_env] env.name=recheck env.max_turns=2": ["rollout.max_response_tokens=24"]},
        env={"PYTHONPATH": "."},
        expect={"harness run algo=grpo algo.advantage=rloo algo.loss=gspo": "grpo [advantage=rloo, loss=gspo] on",
                "harness run plugins=[my_pkg.my_parts] algo=loo_gspo": "loo_gspo [advantage=rloo, loss=gspo] on",
                "harness run algo=grpo algo.filter=dynamic algo.shaping=overlong":
                "grpo [shaping=overlong, filter=dynamic] on",
                "harness report results/runs --plugins my_pkg.my_columns": "response tokens (truncated)"},
    ),
    "quick_then_eval": Scenario([
        "harness sweep --preset quick",
        "harness report results/sweeps/quick --baseline grpo",
        "harness eval model.path=results/runs/X/checkpoints/step_0000150/policy",
        "harness eval task=math500 task.source=../shared/data/math model.path=DIR samples=8",
        "harness eval results/sweeps/quick/algo=grpo,seed=0",
        "harness eval results/runs/default --checkpoint step_0000025",
        "harness eval results/sweeps/quick --protocols greedy,maj@8 task.eval_prompts=1000",
    ], extra={"harness sweep --preset quick": [*TWO_ALGOS, *IN_PROCESS]},
        expect={"harness eval results/sweeps/quick --protocols greedy,maj@8 task.eval_prompts=1000":
                "4/4 evaluation(s) finished"},
        setup=["harness run trainer.steps=2 trainer.eval_every=1 trainer.checkpoint_every=1 task.eval_prompts=8 "
               "runtime.threads=1"],
        subst={"results/runs/X/checkpoints/step_0000150/policy": "results/runs/*/checkpoints/step_*/policy",
               "model.path=DIR": "model.path=results/runs/*/checkpoints/step_*/policy",
               "results/sweeps/quick/algo=grpo,seed=0": "results/sweeps/quick/algo=grpo,seed=0*",
               "results/runs/default": "results/runs/*", "step_0000025": "step_0000001"},
        needs="shared"),
    "sweeps": Scenario([
        "harness sweep algo=grpo,ppo,rloo seed=0,1,2",
        "harness sweep algo=grpo,rloo hydra/launcher=joblib hydra.launcher.n_jobs=2 runtime.threads=1",
        "WANDB_MODE=offline harness sweep algo=grpo,rloo seed=0,1 logging.sinks=[jsonl,wandb]",
        "harness sweep --preset lora && harness report results/sweeps/lora --baseline grpo",
        "harness sweep --preset pipelines && harness report results/sweeps/pipelines --baseline grpo",
        "harness sweep --preset newer",
        "harness sweep --preset arith_all",
    ], extra={"harness sweep algo=grpo,ppo,rloo seed=0,1,2": ["algo=grpo,rloo"],
              "harness sweep --preset lora && harness report results/sweeps/lora --baseline grpo": IN_PROCESS,
              "harness sweep --preset newer": ["algo=gmpo,kl_cov", *IN_PROCESS],
              "harness sweep --preset arith_all": ["algo=gpg", *IN_PROCESS]}),  # pipelines: n_jobs=1 already
    "slurm": Scenario(
        ["harness sweep --preset quick hydra/launcher=submitit_slurm hydra.launcher.partition=debug"],
        extra={"harness sweep --preset quick hydra/launcher=submitit_slurm hydra.launcher.partition=debug":
               ["algo=grpo"]}, needs="slurm"),  # fmt: skip
    # The reward model starts from the shipped arith warm start's directory (model.path=... is a user's model; `tiny`
    # would key a new warm-start build under the prompt cap below). Its held-out checks score all 1319 GSM8K test
    # pairs: ~30 s each at the 256-token prompt cap, so prompts are cut to 64 tokens and checked at steps 0 and 4 only.
    "data": Scenario([
        "harness data prepare gsm8k --source ../shared/data/gsm8k --out data/gsm8k",
        "harness data pairs gsm8k --source ../shared/data/gsm8k/train.jsonl --out pairs/gsm8k.parquet",
        "harness data pairs gsm8k --source ../shared/data/gsm8k/test.jsonl --out pairs/gsm8k_test.parquet",
        "harness rm train rm.train_pairs=pairs/gsm8k.parquet rm.eval_pairs=pairs/gsm8k_test.parquet model.path=...",
    ], subst={"model.path=...": f"model.path={ROOT / 'harness/warmstart/tiny-arith'}"}, needs="shared", extra={
        "harness rm train rm.train_pairs=pairs/gsm8k.parquet rm.eval_pairs=pairs/gsm8k_test.parquet model.path=...":
        ["rm.pairs_per_step=4", "rm.eval_every=4", "task.max_prompt_tokens=64"]}),  # fmt: skip
    "reward_models": Scenario([
        "harness rm train",
        "harness rm train rm.train_pairs=arith+arith_samples",
        "harness rm train rm.train_pairs=pairs/train.parquet rm.eval_pairs=pairs/test.parquet model.path=...",
        "harness run algo=grpo reward.source=model reward.model_path=results/reward_models/<run>/reward_model",
        "harness run algo=ppo reward.source=model reward.model_path=tiny",
        "harness run algo=grpo reward.source=mix reward.model_weight=0.5 reward.model_path=tiny",
        "harness sweep --preset rm_arith && harness report results/sweeps/rm_arith --baseline grpo",
    ], setup=["harness data pairs arith --out pairs/train.parquet",
              "harness data pairs arith --split test --out pairs/test.parquet"],
        subst={"model.path=...": "model.path=tiny", "results/reward_models/<run>/reward_model":
               "results/reward_models/*/reward_model"},  # fmt: skip
        extra={"harness sweep --preset rm_arith && harness report results/sweeps/rm_arith --baseline grpo":
               [*TWO_ALGOS, *TINY_RM, *IN_PROCESS],  # the tiny reward model trained for 4 steps, not 1500 (cached apart)
               "harness run algo=ppo reward.source=model reward.model_path=tiny": TINY_RM,
               "harness run algo=grpo reward.source=mix reward.model_weight=0.5 reward.model_path=tiny": TINY_RM}),
    "calculator": Scenario([
        "harness run algo=grpo task=arith_calc env.name=calculator model.tiny.sft_steps=800 rollout.max_response_tokens=40",
        "harness sweep --preset calculator",
    ], extra={"harness sweep --preset calculator": [*TWO_ALGOS, *SMALL_WARM_START],  # not the 800-step build
              "harness run algo=grpo task=arith_calc env.name=calculator model.tiny.sft_steps=800 "
              "rollout.max_response_tokens=40": SMALL_WARM_START}),
    "suite": Scenario([
        "harness sweep --preset suite_cpu",
        "harness report results/sweeps/suite_cpu --baseline grpo",
    ], extra={"harness sweep --preset suite_cpu": [*TWO_ALGOS, *SMALL_WARM_START]},  # both members shrunk
        expect={"harness report results/sweeps/suite_cpu --baseline grpo": "Suite: 2 tasks"}),
    "reasoning": Scenario([
        "harness sweep --preset reasoning && harness report results/sweeps/reasoning --baseline grpo",
        "harness sweep --preset reasoning algo=dapo algo.clip_high=0.2",
        "harness sweep --preset reasoning algo=dapo algo.overlong_penalty=0",
        "harness report results/sweeps/reasoning --algos grpo,dr_grpo --baseline grpo --out results/sweeps/reasoning/report/lengths",
        "harness report results/sweeps/reasoning --algos dapo --baseline dapo --out results/sweeps/reasoning/report/dapo",
        "harness sweep --preset reasoning algo=grpo algo.kl_coef=0,0.04 logging.kl_from_start=true "
        "hydra.sweep.dir=results/sweeps/reasoning_kl",
        "harness report results/sweeps/reasoning_kl --baseline grpo",
    ], extra={"harness sweep --preset reasoning && harness report results/sweeps/reasoning --baseline grpo":
              ["algo=grpo,dr_grpo,dapo", *SMALL_WARM_START, *SHORT_REASONING, *IN_PROCESS],  # not the 2000-step build
              **{f"harness sweep --preset reasoning algo={a}": [*SMALL_WARM_START, *SHORT_REASONING, *IN_PROCESS]
                 for a in ("dapo algo.clip_high=0.2", "dapo algo.overlong_penalty=0")},
              "harness sweep --preset reasoning algo=grpo algo.kl_coef=0,0.04 logging.kl_from_start=true "
              "hydra.sweep.dir=results/sweeps/reasoning_kl": [*SMALL_WARM_START, *SHORT_REASONING, *IN_PROCESS]}),
    "reasoning_quick": Scenario([  # make run's two commands, as the README shows them
        "harness sweep --preset reasoning_quick",
        "harness report results/sweeps/reasoning_quick --baseline grpo",
    ], extra={"harness sweep --preset reasoning_quick": [  # 3 algos + the control (no algo.* key: it would skip the control)
        *SMALL_WARM_START, "rollout.max_response_tokens=32", "trainer.sequences_per_minibatch=16"]},
        expect={"harness report results/sweeps/reasoning_quick --baseline grpo": "control: random reward p=0.29"}),
    # docs/controls.md: the controls preset shrunk to two of its grid's algorithms, one seed, one step per run (an
    # algo override runs the grid alone: the arms' regimes run in tests/algorithms/test_control_regimes.py; all 12
    # arms here took 218 s of CI); the report then names the controls it has no runs for
    "controls": Scenario([
        "harness sweep --preset controls",
        "harness report results/sweeps/controls --baseline grpo --controls controls",
    ], extra={"harness sweep --preset controls": ["algo=grpo,dr_grpo", *SMALL_WARM_START, "rollout.max_response_tokens=32",
                                                  "trainer.sequences_per_minibatch=16"]},
        expect={"harness report results/sweeps/controls --baseline grpo --controls controls": "| length bias"}),
    # docs/ablation.md: the factorial preset shrunk to two advantages x two losses, one seed, so the report
    # names the design and says one run per cell cannot be tested
    "ablation": Scenario([
        "harness sweep --preset ablation",
        "harness report results/sweeps/ablation --reference algo.advantage=group --reference algo.loss=ppo_clip",
        "harness report results/sweeps/ablation --factors algo.advantage,algo.loss",
    ], extra={"harness sweep --preset ablation": ["algo.advantage=group,rloo", "algo.loss=ppo_clip,gspo", *SMALL_WARM_START,
                                                  "rollout.max_response_tokens=32", "trainer.sequences_per_minibatch=16"]},
        expect={"harness report results/sweeps/ablation --factors algo.advantage,algo.loss":
                "one run per cell: no within-cell variance"}),
    # docs/mismatch.md's presets, shrunk: the top-p pair; one correction and the no-correction arm of the others
    "mismatch_top_p": _preset_scenario("mismatch_top_p", [], "rollout.mask_replay=True"),
    "mismatch_async": _preset_scenario("mismatch_async", ["correction.name=icepop"], "trainer.behaviour_logp=behaviour"),
    "mismatch_bf16": _preset_scenario("mismatch_bf16", ["correction.name=icepop"], "correction.name=none"),
    # the dial's comparison, shrunk: the grid's two arms and the five corrections, each final checkpoint evaluated with
    # exact weights, then the report with those scores beside the in-training ones
    "mismatch_quant": Scenario([
        "harness sweep --preset mismatch_quant",
        "harness eval results/sweeps/mismatch_quant rollout.weight_quant=none",
        "harness report results/sweeps/mismatch_quant --baseline grpo",
    ], extra={"harness sweep --preset mismatch_quant": [*SMALL_WARM_START, "rollout.max_response_tokens=32",
                                                        "trainer.sequences_per_minibatch=16", *IN_PROCESS]},
        expect={"harness eval results/sweeps/mismatch_quant rollout.weight_quant=none": "7/7 evaluation(s) finished",
                "harness report results/sweeps/mismatch_quant --baseline grpo": "final ckpt"}),
    # the other corrections under int4, and the int3 dial's comparison: their grids only (algo=grpo leaves the
    # correction arms out; mismatch_quant's scenario runs a preset's arms, and tests/sweeps/test_presets.py validates
    # every arm of every preset)
    "mismatch_quant_more": _preset_scenario("mismatch_quant_more", ["algo=grpo", *IN_PROCESS], "1 run(s) in 1 setting(s)"),
    "mismatch_int3": Scenario([
        "harness sweep --preset mismatch_int3",
        "harness eval results/sweeps/mismatch_int3 rollout.weight_quant=none",
        "harness report results/sweeps/mismatch_int3 --baseline grpo",
    ], extra={"harness sweep --preset mismatch_int3": ["algo=grpo", *SMALL_WARM_START, "rollout.max_response_tokens=32",
                                                       "trainer.sequences_per_minibatch=16", *IN_PROCESS]},
        expect={"harness eval results/sweeps/mismatch_int3 rollout.weight_quant=none": "2/2 evaluation(s) finished",
                "harness report results/sweeps/mismatch_int3 --baseline grpo": "final ckpt"}),
    "distillation": Scenario([
        "harness run algo=opd",
        "harness run algo=opd algo.teacher_path=results/runs/<run>/checkpoints/step_0000200/policy",
        "harness plan algo=opd teacher.hidden_size=256 teacher.num_layers=4",
        "harness sweep --preset newer algo=grpo,opd hydra.sweep.dir=results/sweeps/opd",
        "harness sweep --preset newer algo=opd algo.reward_coef=1 hydra.sweep.dir=results/sweeps/opd",
        "harness eval results/sweeps/opd --protocols greedy task.eval_prompts=1000",
        "harness report results/sweeps/opd --baseline grpo",
    ], subst={"results/runs/<run>/checkpoints/step_0000200/policy": "results/runs/*/checkpoints/step_*/policy"},
        # a 10-step tiny teacher, not the 2000-step build; the first run's last step is checkpointed: the second run's
        # teacher (a run of its own for that took 7 s)
        extra={"harness run algo=opd": ["teacher.sft_steps=10", "trainer.checkpoint_every=2"],
               **{c: ["teacher.sft_steps=10", *IN_PROCESS] for c in (
                   "harness sweep --preset newer algo=grpo,opd hydra.sweep.dir=results/sweeps/opd",
                   "harness sweep --preset newer algo=opd algo.reward_coef=1 hydra.sweep.dir=results/sweeps/opd")}},
        expect={"harness plan algo=opd teacher.hidden_size=256 teacher.num_layers=4": "teacher (frozen, tiny)",
                "harness eval results/sweeps/opd --protocols greedy task.eval_prompts=1000":
                "3/3 evaluation(s) finished"}),
    "server": Scenario([
        "harness serve --port 8000 &",
        "harness run rollout.server.url=http://127.0.0.1:8000 trainer.pipeline=one_step_off",
    ]),
    "plan": Scenario(
        ["harness plan algo=ppo model.path=/models/Qwen2.5-0.5B-Instruct rollout.max_response_tokens=512 --device-gib 80"],
        subst={"/models/Qwen2.5-0.5B-Instruct": "models/Qwen2.5-0.5B-Instruct"},
        files={"models/Qwen2.5-0.5B-Instruct/config.json": (  # the published config's shape fields
            '{"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, '
            '"num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": true, '
            '"max_position_embeddings": 32768, "torch_dtype": "bfloat16"}')},
        expect={"harness plan algo=ppo model.path=/models/Qwen2.5-0.5B-Instruct rollout.max_response_tokens=512 "
                "--device-gib 80": "total (peak estimate)"}),  # fmt: skip
}

MULTIHOST = "hosts as network namespaces (root): tests/runtime/test_multihost.py runs it, one test at a time"
REHEARSAL = "a 0.5B-shaped rehearsal: ~12 min and up to 18.5 GiB each (make rehearsal; docs/scale.md)"
SKIPPED: dict[str, str] = {
    "make run": "the main job, ~10 min: its two commands (harness sweep --preset reasoning_quick, harness report) "
                "run here shrunk (the reasoning_quick scenario)",
    "make test": "CI's own command (.ci/run runs it)",
    ". .venv/bin/activate": "shell set-up: these tests put the venv's bin/ on PATH",
    "harness run task=gsm8k task.source=../shared/data/gsm8k model.path=Qwen/Qwen2.5-0.5B-Instruct":
        "a hub model (no hub here) and a GPU to be useful",
    "harness baselines check": "CI runs it (make baselines, ~3 min)",
    "harness run runtime=ray runtime.ray_address=auto": "needs a running Ray cluster (ray start --head); "
        "tests/runtime/test_ray.py covers the Ray launcher",
    "sbatch --nodes=2 --gpus-per-node=8 scripts/ray_slurm.sbatch harness run runtime.workers=16 ...":
        "a multi-node SLURM allocation with GPUs; tests/runtime/test_multihost.py runs it on 2 CPU nodes",
    # docs/scale.md, "Several hosts": the hosts are global (one test at a time), so these run, as typed,
    # in tests/runtime/test_multihost.py (its sbatch with test_workers.py's EQUIV_RUN (4 steps) for the run's
    # overrides, and --parsable, --output, --time added)
    "scripts/local_slurm.sh start --nodes 2": MULTIHOST,
    "source /tmp/harness-slurm-nodes/env.sh": "shell set-up: test_multihost.py passes SLURM_CONF",
    "scripts/netns_hosts.sh exec 1 srun --nodes=2 hostname": MULTIHOST,
    "scripts/netns_hosts.sh exec 1 sbatch --nodes=2 --cpus-per-task=1 --wait scripts/ray_slurm.sbatch harness run "
    "runtime.workers=2 trainer.steps=4": MULTIHOST,
    "scripts/local_slurm.sh stop --nodes 2": MULTIHOST,
    "tensorboard --logdir results/runs": "a UI server; tests/harness/test_sinks.py reads the event files it shows",
    "wandb sync results/sweeps/*/*/wandb/offline-run-*": "uploads to W&B: needs the network",
    "harness run logging.sinks=[jsonl,mlflow] logging.mlflow_tracking_uri=http://host:5000":
        "an MLflow server at host:5000; tests/harness/test_sinks.py runs the mlflow sink on a file store",
    "harness sweep --preset gsm8k_calculator": "Qwen2.5-0.5B-Instruct from the hub and a GPU",
    "export HARNESS_SERVE_TOKEN=$(python -c \"import secrets; print(secrets.token_hex(32))\")":
        "a shell variable for the two hosts' commands below; tests/runtime/test_service.py runs a server and a run "
        "with a token",
    "harness serve --host 0.0.0.0 --port 8000 rollout=vllm model.path=/models/Qwen2.5-0.5B-Instruct task=gsm8k":
        "vLLM and a 0.5B model on a rollout node; make test-vllm runs a vLLM server",
    "harness run rollout.server.url=http://rollout-node:8000 model.path=/models/Qwen2.5-0.5B-Instruct task=gsm8k "
    "trainer.pipeline=one_step_off": "vLLM and a 0.5B model on a second host; the server scenario runs the same on "
    "loopback, tests/runtime/test_multihost.py on another host",
    ".venv/bin/python bench/bench_rank_memory.py --ranks 1,2,4": "the 105M bench, 2 min and 1.9 GiB at its peak: "
        "tests/runtime/test_meta_init.py runs the same script at 27M parameters",
    ".venv/bin/python bench/bench_mask_replay.py": "a timing bench (its seconds are the point, not CI's): "
        "tests/bench/test_bench_mask_replay.py runs it as typed at a 2000-token vocabulary",
    ".venv/bin/python bench/bench_fake_ranks.py --shape 7b --world 16": "7B's shapes: 15 GB of disk, 17 GiB of RAM "
        "and 8 min; tests/runtime/test_meta_init.py runs the same script at its tiny shape",
    "python bench/rehearsal.py --algo grpo --rollout hf --workers 1 --steps 1": REHEARSAL,
    "python bench/rehearsal.py --lora 8 --workers 2 --steps 1": REHEARSAL,
    ".venv-vllm/bin/python bench/rehearsal.py --lora 8 --workers 1 --steps 1 --rollout vllm": REHEARSAL,
    ".venv-vllm/bin/python bench/rehearsal.py --lora 8 --workers 2 --steps 1 --rollout vllm --micro 1 "
    "model.dtype=bfloat16 rollout.vllm.dtype=bfloat16 rollout.vllm.kv_cache_gib=0.5": REHEARSAL,
    "python bench/rehearsal.py --algo ppo --lora 8 --workers 2 --micro 1 --steps 1 model.dtype=bfloat16 "
    "'model.lora.roles=[critic]'": REHEARSAL,
}  # fmt: skip


def _covered() -> set[str]:
    return {c for s in SCENARIOS.values() for c in s.commands} | set(SKIPPED)


def _bench_perf_commands() -> dict[str, str]:
    """docs/performance.md's rehearsal lines (long, with many flags): skipped like the others."""
    return {c: REHEARSAL for c in documented_commands() if c.startswith("python bench/rehearsal.py --shape")}


def test_every_documented_command_is_covered():
    documented = set(documented_commands())
    covered = _covered() | set(_bench_perf_commands())
    missing = sorted(documented - covered)
    stale = sorted(covered - documented)
    assert not missing, "documented commands with no scenario or skip reason in tests/test_docs_commands.py:\n" + "\n".join(missing)
    assert not stale, "entries for commands no doc shows any more:\n" + "\n".join(stale)
    for command, reason in {**SKIPPED, **_bench_perf_commands()}.items():
        assert len(reason) > 20, f"{command}: say why it is skipped"


def test_shrink_replaces_keys_and_appends_the_rest():
    assert shrink("harness sweep algo=grpo,ppo seed=0,1,2", ["algo=grpo"]) == (
        "harness sweep algo=grpo seed=0 " + " ".join(o for o in SHRINK_SWEEP if not o.startswith("seed=")))
    assert shrink("harness list") == "harness list"
    assert shrink("harness eval --help") == "harness eval --help"
    assert shrink("A=1 harness rm train && harness report x", []).startswith("A=1 harness rm train rm.steps=4")


def shrink(command: str, extra: list[str] | None = None) -> str:
    """``command`` with each harness run/sweep/eval/rm part's sizes shrunk."""
    parts = []
    for part in command.split(" && "):
        words = shlex.split(part)
        i = next((k for k, w in enumerate(words) if w == "harness"), None)
        kind = words[i + 1] if i is not None and i + 1 < len(words) else ""
        if kind not in SHRINK or any(w in ("--help", "-h") for w in words):
            parts.append(part)
            continue
        overrides = [*SHRINK[kind], *(extra or [])]
        by_key = {o.split("=", 1)[0]: o for o in overrides}
        kept = []
        for w in words:
            key = w.split("=", 1)[0] if "=" in w and not w.startswith("-") else None
            if key in by_key:
                kept.append(by_key.pop(key))
            else:
                kept.append(w)
        parts.append(" ".join(shlex.quote(w) if "=" not in w else w for w in kept + list(by_key.values())))
    return " && ".join(parts)


def _written_report(command: str, cwd: Path) -> str:
    """The report.md a `harness report DIR` command wrote (its tables unwrapped: the console wraps a long cell when
    the table is wider than the terminal), else ''."""
    words = shlex.split(command)
    if words[:2] != ["harness", "report"] or len(words) < 3:
        return ""
    written = cwd / words[2] / "report" / "report.md"
    return written.read_text() if written.is_file() else ""


def _substitute(command: str, subst: dict[str, str], cwd: Path) -> str:
    for placeholder, pattern in subst.items():
        if placeholder not in command:
            continue
        if "*" in pattern:
            prefix, _, path_glob = pattern.rpartition("=") if "=" in pattern.split("/")[0] else ("", "", pattern)
            matches = sorted(glob.glob(path_glob, root_dir=cwd))
            assert matches, f"{command}: nothing matches {path_glob} for {placeholder}"
            value = (f"{prefix}=" if prefix else "") + matches[-1]
        else:
            value = pattern
        command = command.replace(placeholder, value)
    return command


def _run(command: str, cwd: Path, env: dict[str, str], timeout_s: int) -> str:
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"`{command}` exited {proc.returncode}:\n{out[-4000:]}"
    return out


def _wait_for_server(url: str, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"no server at {url} after {timeout_s} s")


@pytest.mark.integration
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xdist_group("ray")) if n == "workers" else n
                                  for n in sorted(SCENARIOS)])
def test_documented_commands_run(name, tmp_path):
    scenario = SCENARIOS[name]
    if scenario.needs == "shared" and not (SHARED / "data").exists():
        pytest.skip("../shared/data is not beside the checkout")
    if scenario.needs == "slurm" and not os.environ.get("HARNESS_TEST_SLURM"):
        pytest.skip("no SLURM cluster (HARNESS_TEST_SLURM=1 with scripts/local_slurm.sh start: .ci/run does)")
    cwd = tmp_path / "work"
    cwd.mkdir()
    if SHARED.exists():
        (tmp_path / "shared").symlink_to(SHARED)  # ../shared as beside a checkout
    for rel, text in scenario.files.items():
        (cwd / rel).parent.mkdir(parents=True, exist_ok=True)
        (cwd / rel).write_text(text)
    user_env = {k: v for k, v in os.environ.items() if k != "HARNESS_SERVE_TOKEN"}  # the server commands run tokenless
    env = {**user_env, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", **scenario.env}  # fmt: skip
    env.pop("PYTHONPATH", None) if "PYTHONPATH" not in scenario.env else None
    servers: list[subprocess.Popen] = []
    try:
        for command in scenario.setup:
            _run(command, cwd, env, scenario.timeout_s)
        for documented in scenario.commands:
            command = shrink(_substitute(documented, scenario.subst, cwd), scenario.extra.get(documented))
            if command.endswith("&"):  # a server: started, waited for, stopped at the end
                port = re.search(r"--port (\d+)", command).group(1)
                servers.append(subprocess.Popen(["bash", "-c", f"exec {command[:-1].strip()}"], cwd=cwd, env=env,
                                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                                start_new_session=True))  # fmt: skip
                _wait_for_server(f"http://127.0.0.1:{port}", servers[-1])
                continue
            out = _run(command, cwd, env, scenario.timeout_s)
            if documented in scenario.expect:
                assert scenario.expect[documented] in out + _written_report(command, cwd), f"`{command}` printed:\n{out[-3000:]}"
    finally:
        for proc in servers:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
