"""Every built-in algorithm learns `arith` (learning tier, fixed seed, default settings; CI runs one
algorithm per mechanism not guarded elsewhere, `make test-learning-full` all: see FULL_ONLY).

Each run starts from the same cached warm start (greedy accuracy 0.117 on the 128 held-out
eval prompts) and trains with the algorithm's defaults. The eval set's binomial standard
error near p = 0.15 is ~0.03 and single evals wander, so the test compares the mean of the
evals in the last quarter of the run (3 evals, standard error ~0.017) with the start: it
must be ``MIN_GAIN`` higher. A policy that does not improve, or collapses (as PPO with one
sample per prompt x 4 epochs did, 0.117 -> 0.016), fails. Runs are deterministic for a fixed
seed and thread count; the step counts are what each algorithm needs on this task (PRIME
trains on the ~20% of groups its accuracy filter keeps, so it starts slowly; ReMax's greedy
baseline is right more often than its samples, so most of its signal pushes down wrong
samples and greedy accuracy moves late).

Measured (2 idle cores; whole module 17.5 min, 13 min since arith data generation got fast),
final eval and last-quarter gain:
cispo 0.320 (+0.21), dapo 0.406 (+0.34), dr_grpo 0.281 (+0.08), grpo 0.438 (+0.20),
gspo 0.281 (+0.15), ppo 0.453 (+0.26), prime 0.336 (+0.17), reinforce_pp 0.234 (+0.11),
reinforce_pp_baseline 0.273 (+0.15), remax 0.336 (+0.20; seed 1: +0.12),
rloo 0.250 (+0.15; seed 1: +0.12; with its old k = 4 it stayed flat, -0.02).
Those figures were measured with 2 torch threads per run. Since 2026-12-01 the tier runs two test
processes side by side with 1 thread each (make test-learning: pytest -n 2), which rounds
differently and so follows other trajectories; every test kept its margin (18 passed, 19 min 24 s,
against 41 min one at a time).
"""

from __future__ import annotations

import json

import pytest

from harness.commands.cli import main
from harness.commands.docs_gen import builtin_algorithms
from tests.helpers import LEARNING_SEED

pytestmark = [pytest.mark.integration, pytest.mark.learning]

MIN_GAIN = 0.04  # the full tier's arith runs (make test-learning-full); CI's tier has its own below

# CI's learning tier (make test-learning): the gain each test measured, by CPU kind and seed, and its threshold,
# at most half the smallest gain (tests/algorithms/test_learning_margins.py checks that, and that no threshold is
# within 0.02 of a measured value). Gains: arith, the mean of the last 3 evals minus the start (0.117); the
# reasoning run, the last eval minus the first, and mean response tokens of the last 3 steps minus the first 3;
# the calculator, tool-call success of the last 5 steps minus the first 5 and the best eval minus the first; the
# reward model, held-out pair accuracy minus chance (0.5). Kinds: "xeon" = 2-core Intel Xeon (Sapphire Rapids,
# AVX-512 + AMX), 2026-12-04, seeds 0, 1, 2 (HARNESS_LEARNING_SEED); "xeon-avx2" = the same machine with an AVX2
# CPU's kernel paths forced (ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2), seed 0; "epyc" = 2-core AMD
# EPYC (Zen 4: AVX-512, AVX-512 BF16, no AMX), 2026-12-06, seeds 0, 1, 2 (seed 0's arith gains equal those of its CI
# run of 2026-12-03 to the 2 decimals recorded then); "zen4" = the Xeon with the EPYC's kernel
# paths forced (KERNEL_PATHS in tests/algorithms/test_pinned_metrics.py), 2026-12-06, seed 0. At these step counts, 2 test
# processes of 1 thread. Next to a threshold this low (reinforce_pp, prime), a run that learns nothing clears it
# by chance about 7% of the time (the 3-eval mean's standard error near 0.12 is 0.016); a collapse still fails.
# rloo runs 300 steps (200 until 2026-12-07): at 200 steps, seeds 1 and 2 on the Zen 4 EPYC ended near the start
# (+0.018, +0.023; seed 1's curve peaked at +0.09 at step 150 and fell back) and the test guarded only against a
# collapse. Its curve still rises after step 200 on every seed and kernel path measured: 2026-12-07 on the Xeon
# (native, avx2 and zen4 paths, seeds 0-2, 300 steps, 2 runs of 1 thread side by side) the last three evals (280,
# 290, 300) sat 0.135-0.273 over the start, against 0.089-0.214 at step 200 (8 native seeds at 200 steps: 0.102-
# 0.214). Its gradient norm (1.5 -> 3.8, token sums over responses) is clipped at trainer.grad_clip=1.0 on most
# steps, so its steps are small and its curve noisy. The Zen 4 EPYC itself was not measured at 300 steps (no such
# machine since 2026-12-06); its emulation on the Xeon (the "zen4" kernel paths) did not reproduce its 200-step
# stall either (+0.104 and +0.089 for seeds 1 and 2), so the threshold below is what the measured kinds support.
# "zen3" = a 2-core AMD EPYC Zen 3 (family 25 model 1, AVX2 only), 2026-12-07: the whole tier (make test-learning,
# 2 processes of 1 thread), after conftest's SLOWEST_FIRST put gpu_check's warmstart stage first (9 min 20 s,
# against 11 min 08 s in CI the same day with it last); its rloo (then 200 steps) gained +0.122 / +0.172 / +0.0885,
# and at 300 steps (the test's command, seeds 0-2, later that day) +0.169 / +0.219 / +0.185.
MEASURED_GAINS: dict[str, dict[str, float]] = {
    "dapo": {"xeon s0": 0.138, "xeon s1": 0.099, "xeon s2": 0.128, "xeon-avx2 s0": 0.133, "zen4 s0": 0.138, "epyc s0": 0.148, "epyc s1": 0.096, "epyc s2": 0.13, "zen3 s0": 0.143},
    "opd": {"xeon s0": 0.117, "xeon s1": 0.229, "xeon s2": 0.162, "xeon-avx2 s0": 0.141, "zen4 s0": 0.159, "epyc s0": 0.19, "epyc s1": 0.175, "epyc s2": 0.146, "zen3 s0": 0.138},
    "prime": {"xeon s0": 0.135, "xeon s1": 0.151, "xeon s2": 0.052, "xeon-avx2 s0": 0.133, "zen4 s0": 0.208, "epyc s0": 0.12, "epyc s1": 0.055, "epyc s2": 0.148, "zen3 s0": 0.151},
    "reinforce_pp": {"xeon s0": 0.094, "xeon s1": 0.089, "xeon s2": 0.068, "xeon-avx2 s0": 0.050, "zen4 s0": 0.086, "epyc s0": 0.073, "epyc s1": 0.083, "epyc s2": 0.055, "zen3 s0": 0.086},
    "rloo": {"xeon s0": 0.227, "xeon s1": 0.273, "xeon s2": 0.25, "xeon-avx2 s0": 0.221, "xeon-avx2 s1": 0.164, "xeon-avx2 s2": 0.247,
             "zen4 s0": 0.216, "zen4 s1": 0.24, "zen4 s2": 0.135, "zen3 s0": 0.169, "zen3 s1": 0.219, "zen3 s2": 0.185},
    "grpo+lora": {"xeon s0": 0.109, "xeon s1": 0.086, "xeon s2": 0.094, "xeon-avx2 s0": 0.109, "zen4 s0": 0.109, "epyc s0": 0.109, "epyc s1": 0.086, "epyc s2": 0.094, "zen3 s0": 0.109},
    "calculator tool success": {"xeon s0": 0.700, "xeon s1": 0.709, "xeon s2": 0.766, "xeon-avx2 s0": 0.700, "zen4 s0": 0.700, "epyc s0": 0.7, "epyc s1": 0.709, "epyc s2": 0.766, "zen3 s0": 0.7},
    "calculator eval": {"xeon s0": 0.891, "xeon s1": 0.859, "xeon s2": 0.836, "xeon-avx2 s0": 0.891, "zen4 s0": 0.891, "epyc s0": 0.891, "epyc s1": 0.859, "epyc s2": 0.836, "zen3 s0": 0.891},
    "reasoning partial": {"xeon s0": 0.203, "xeon s1": 0.188, "xeon s2": 0.193, "xeon-avx2 s0": 0.207, "zen4 s0": 0.207, "epyc s0": 0.219, "epyc s1": 0.211, "epyc s2": 0.193, "zen3 s0": 0.211},
    "reasoning partial tokens": {"xeon s0": 22.3, "xeon s1": 23.3, "xeon s2": 16.4, "xeon-avx2 s0": 16.5, "zen4 s0": 20.2, "epyc s0": 21.1, "epyc s1": 20.8, "epyc s2": 16.4, "zen3 s0": 16.9},
    "reward model": {"xeon s0": 0.477, "xeon s1": 0.422, "xeon s2": 0.477, "xeon-avx2 s0": 0.469, "zen4 s0": 0.461, "epyc s0": 0.484, "epyc s1": 0.422, "epyc s2": 0.461, "zen3 s0": 0.492},
}  # fmt: skip
THRESHOLD = {"dapo": 0.04, "opd": 0.04, "prime": 0.025, "reinforce_pp": 0.024, "rloo": 0.06, "grpo+lora": 0.04,
             "calculator tool success": 0.2, "calculator eval": 0.04, "reasoning partial": 0.09,
             "reasoning partial tokens": 8.0, "reward model": 0.2}  # fmt: skip
DEFAULT_STEPS = 200
# reinforce_pp: measured 0.117 -> 0.234 (step 75) -> 0.242 (100) -> 0.156 (125): its learning
# horizon here is 100 steps (global whitening with the KL in the reward wanders after that).
# ppo, dapo, prime: the fewest steps whose last-quarter evals clear MIN_GAIN by 2x or more on the curves
# measured 2026-12-03 (2-core Xeon, seed 0, 1 thread, evals every 10-15 steps): ppo 0.117 -> 0.227 (step
# 90), 0.242 (100), 0.203 (120); dapo 0.289 (80), 0.367 (90), 0.281 (100); prime 0.273 (120), 0.234 (135,
# 150). remax's greedy baseline makes it slow: 0.148 (200), 0.203 (350), 0.297 (500).
# GRPO with LoRA (test_grpo_with_lora_learns_arith): 180 steps, evals every 15, so the three evals it averages are
# the measured points 150, 165, 180 (mean 0.227: +0.11 over the start, 2.7x MIN_GAIN).
LORA_STEPS, LORA_EVAL_EVERY = 180, 15
# dapo, rloo, opd, reinforce_pp: measured again 2026-12-03 (Xeon, seed 0, 1 thread) with evals every 10 steps,
# which the test then uses, so the three evals it averages are measured points (mean gain over 0.117):
#   dapo 0.266 (40), 0.266 (50), 0.234 (60): +0.14; later 0.289 (80), 0.367 (90)
#   rloo 0.195 (120), 0.250 (130), 0.227 (140): +0.11; later 0.273 (200)
#   opd 0.234 (100), 0.188 (110), 0.242 (120): +0.10; later 0.305 (200)
#   reinforce_pp 0.195 (70), 0.219 (80), 0.234 (90): +0.10; then 0.180 (100)
# The same seed trains differently on another CPU (float rounding). On the AMD EPYC CI ran on later the same day
# (2026-12-03), rloo at 140 steps fell below MIN_GAIN (0.172, 0.117, 0.141: +0.026) and opd and reinforce_pp
# cleared it by 0.004 only, so they run longer; their last three evals on the EPYC (evals every 10):
#   rloo 0.266 (180), 0.281 (190), 0.297 (200): +0.16 (Xeon: 0.273 at 200)
#   opd 0.258 (180), 0.328 (190), 0.336 (200): +0.19 (Xeon: 0.305 at 200)
#   reinforce_pp 0.148 (80), 0.188 (90), 0.234 (100): +0.07 (Xeon: +0.09, above)
# dapo (+0.15) and prime (+0.12) cleared it on the EPYC at their steps.
STEPS = {"prime": 150, "remax": 500, "reinforce_pp": 100, "ppo": 120, "dapo": 60, "rloo": 300, "opd": 200}
EVAL_EVERY = {"dapo": 10, "rloo": 10, "opd": 10, "reinforce_pp": 10}  # else steps // 8
# CI's learning tier (make test-learning) trains one algorithm per mechanism: leave-one-out (rloo), global
# whitening (reinforce_pp), dynamic sampling (dapo), an implicit PRM (prime), a teacher (opd). Two mechanisms
# are guarded elsewhere in CI: a group baseline (grpo) learns in four other tests of this tier (with LoRA,
# async, the calculator and the reasoning testbed), and a learned critic (ppo) in `make baselines`, whose
# ppo band for the eval curve's area lies above the warm start (lo 0.132 vs 0.117 over 3 seeds: a ppo that
# stops learning leaves it). The others share their mechanism with one of these and differ in the loss or
# the advantage, which tests/algorithms/test_ops*.py and each algorithm's own tests check against hand values;
# their learning runs are in `make test-learning-full` (marker "full"), with remax's 500 steps and the
# reward-model-only runs: CI's 45-min budget has no room for them on a 2-core Xeon.
FULL_ONLY = {"grpo", "ppo", "dr_grpo", "cispo", "gspo", "gmpo", "gpg", "sapo", "clip_cov", "kl_cov", "reinforce_pp_baseline", "remax"}


def _evals(run_dir) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["eval/arith/accuracy"]) for r in rows if "eval/arith/accuracy" in r]


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.full) if n in FULL_ONLY else n
                                  for n in sorted(builtin_algorithms())])
def test_algorithm_learns_arith(name, tmp_path, record_property):
    steps = STEPS.get(name, DEFAULT_STEPS)
    run_dir = tmp_path / name
    main(["run", f"algo={name}", f"trainer.steps={steps}", f"trainer.eval_every={EVAL_EVERY.get(name, steps // 8)}",
          "trainer.checkpoint_every=0", f"seed={LEARNING_SEED}", "runtime.threads=1", f"run_dir={run_dir}"])
    evals = _evals(run_dir)
    start = evals[0][1]
    late = [acc for _, acc in evals[-3:]]  # the last quarter of the run
    assert evals[-1][0] == steps
    gain = sum(late) / len(late) - start
    record_property("gain", round(gain, 4))
    assert gain >= THRESHOLD.get(name, MIN_GAIN), f"{name}: eval accuracy {start:.3f} -> {late} (curve {evals})"


def test_grpo_with_lora_learns_arith(tmp_path, record_property):
    """GRPO's defaults with rank-8 adapters on every attention and MLP projection (the policy's
    45,056 trainable of 539,520 parameters; the reference is the base with adapters off).
    Measured: 0.117 -> 0.242 at 200 steps (last-quarter gain +0.12) in 57 s; full fine-tuning
    reaches 0.438 (+0.20) in 76 s. The test runs LORA_STEPS: on 2026-12-03 (Xeon, seed 0, 1 thread, evals
    every 15 steps) the curve read 0.195 (120), 0.148 (135), 0.234 (150), 0.227 (165), 0.219 (180), 0.242 (200)."""
    run_dir = tmp_path / "grpo_lora"
    main(["run", "algo=grpo", "model.lora.rank=8", f"trainer.steps={LORA_STEPS}",
          f"trainer.eval_every={LORA_EVAL_EVERY}", "trainer.checkpoint_every=0", f"seed={LEARNING_SEED}", "runtime.threads=1",
          f"run_dir={run_dir}"])  # fmt: skip
    evals = _evals(run_dir)
    late = [acc for _, acc in evals[-3:]]
    gain = sum(late) / len(late) - evals[0][1]
    record_property("gain", round(gain, 4))
    assert gain >= THRESHOLD["grpo+lora"], f"grpo+lora: {evals}"


# The calculator tool task (issue #17): env.name=calculator on task=arith_calc (3-digit products). 30 steps: measured
# 2026-12-03 (Xeon, seed 0, 1 thread) tool success 0.23 (steps 1-5) -> 0.93 (26-30), eval 0.000 -> 0.633 -> 0.891
# -> 0.883 (steps 10, 20, 30); on vLLM 0.19 -> 0.92 and 0.000 -> 0.859.
TOOL_RUN = ["algo=grpo", "task=arith_calc", "env.name=calculator", "model.tiny.sft_steps=800", "rollout.max_response_tokens=40",
            "trainer.prompts_per_step=8", "trainer.steps=30", "trainer.eval_every=10", "trainer.checkpoint_every=0",
            f"seed={LEARNING_SEED}", "runtime.threads=1"]  # fmt: skip


def tool_task_curve(run_dir) -> tuple[list[float], list[float]]:
    """(training rollouts' tool-call success rate per step, eval accuracy per eval) of a tool run."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    success = [r["env/tool_success_frac"] for r in rows if "env/tool_success_frac" in r]
    evals = [r["eval/arith_calc/accuracy"] for r in rows if "eval/arith_calc/accuracy" in r]
    return success, evals


def test_grpo_learns_to_use_the_calculator(tmp_path, record_property):
    """15% of the warm start's examples show a calculator episode, the rest a direct answer (3-digit
    products: it cannot multiply them in its head), so it samples a tool call now and then and
    greedy decoding answers directly. GRPO's multi-turn rollouts must raise the rate of successful
    tool calls and the greedy eval accuracy over the warm start. Measured (100 steps, 128 eval
    prompts): tool success 0.125 -> 0.95, eval accuracy 0.000 -> 0.82 (step 20) -> 0.922 (step 100)."""
    run_dir = tmp_path / "grpo_calc"
    main(["run", *TOOL_RUN, f"run_dir={run_dir}"])
    success, evals = tool_task_curve(run_dir)
    first, last = sum(success[:5]) / 5, sum(success[-5:]) / 5
    record_property("gain", round(last - first, 4))
    record_property("eval_gain", round(max(evals[1:]) - evals[0], 4))
    assert last >= first + THRESHOLD["calculator tool success"], f"tool-call success {first:.3f} -> {last:.3f} ({success})"
    assert max(evals[1:]) >= evals[0] + THRESHOLD["calculator eval"], f"eval accuracy {evals}"


# Both pipelines run in make test-learning-full. CI's tier keeps the async pipeline's learning through
# test_grpo_learns_the_reasoning_testbed_with_partial_rollouts (async K=2, interrupted mid-batch at most steps);
# tests/runtime/test_pipeline.py checks one_step_off's ordering, staleness and log-probs step by step.
# (steps, eval_every). async: 105 steps with evals every 15, so the three evals it averages are the points measured
# 2026-12-03 (Xeon, seed 0, 1 thread): 0.117 -> 0.266 (75), 0.305 (90), 0.352 (105): +0.19; later 0.516 (200).
# With rollout.partial=continue (chunk 2; no push ever came mid-batch on arith, whose generation is shorter than the
# update): 0.25, 0.25, 0.266 (+0.14). An async run's trajectory also depends on timing, hence the margin.
PIPELINE_STEPS = {"one_step_off": (DEFAULT_STEPS, DEFAULT_STEPS // 8), "async": (105, 15)}


@pytest.mark.full
@pytest.mark.parametrize("pipeline", ["one_step_off", "async"])
def test_grpo_learns_arith_with_rollout_ahead_of_training(pipeline, tmp_path):
    """trainer.pipeline (issue #18) at its defaults: one_step_off trains every batch one version
    after the weights that generated it; async lets the producer run up to max_staleness=2 ahead.
    Old log-probs are the rollout's own (the behaviour policy)."""
    steps, eval_every = PIPELINE_STEPS[pipeline]
    run_dir = tmp_path / pipeline
    main(["run", "algo=grpo", f"trainer.pipeline={pipeline}", f"trainer.steps={steps}",
          f"trainer.eval_every={eval_every}", "trainer.checkpoint_every=0", f"seed={LEARNING_SEED}", "runtime.threads=1",
          f"run_dir={run_dir}"])  # fmt: skip
    evals = _evals(run_dir)
    late = [acc for _, acc in evals[-3:]]
    assert sum(late) / len(late) - evals[0][1] >= MIN_GAIN, f"grpo {pipeline}: {evals}"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][1:]
    stale = [r["rollout/staleness_max"] for r in rows]
    assert max(stale) <= (1 if pipeline == "one_step_off" else 2) and sum(stale) > 0


# The preset's GRPO runs after 100k of their 200k tokens (2026-12-02, 5 seeds): greedy accuracy 0.336 ->
# 0.521-0.570 (gain +0.185 to +0.234), mean response tokens of steps 1-3 -> 12-14: 45-49 -> 68-72 (+21 to
# +25). The margins leave room for other CPUs' rounding, which changes trajectories.
REASONING_TOKENS = 100_000
REASONING_MIN_GAIN = 0.12
REASONING_MIN_LENGTH_GAIN = 10.0  # mean response tokens, last 3 steps vs first 3


def reasoning_preset_overrides() -> list[str]:
    """The run settings of sweeps/reasoning.yaml (its start, lengths, batch and learning rate), less
    its budget, evals and launcher, which the test sets."""
    from harness.commands.presets import read_preset, resolve_preset

    preset = read_preset(resolve_preset("reasoning"))
    skip = ("hydra", "trainer.budget", "trainer.eval_every", "trainer.steps")
    return [o for o in preset["overrides"] if not o.startswith(skip)]


def reasoning_run(name: str, tmp_path, extra: tuple[str, ...] = ()) -> tuple[list[float], list[float], list[dict]]:
    """Train ``name`` on the reasoning preset's settings for REASONING_TOKENS (seed 0; ``extra``: more
    overrides); returns (greedy accuracy at 0, half and all of the tokens; mean response tokens per
    step; the training steps' metrics)."""
    run_dir = tmp_path / f"{name}_reasoning"
    main(["run", *reasoning_preset_overrides(), f"algo={name}", "trainer.budget=tokens",
          f"trainer.budget_tokens={REASONING_TOKENS}", f"trainer.eval_every_tokens={REASONING_TOKENS // 2}",
          f"seed={LEARNING_SEED}", *extra, f"run_dir={run_dir}"])  # fmt: skip
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval/reasoning/accuracy"] for r in rows if "eval/reasoning/accuracy" in r]
    lengths = [r["rollout/response_tokens_mean"] for r in rows if "rollout/response_tokens_mean" in r]
    return evals, lengths, rows[1:]


@pytest.mark.full
def test_grpo_learns_to_work_problems_out(tmp_path):
    """The reasoning testbed's mechanism (docs/reasoning.md): its start answers many 3+-step problems
    with a bare '#### N' (a guess); GRPO must raise greedy accuracy on the 512 test problems and
    lengthen responses as it learns to work them out (margins measured on 5 seeds: REASONING_MIN_GAIN).
    Seed 0 at 1 thread follows the sweep's seed-0 run: 0.336 -> 0.570, 47 -> 70 tokens."""
    evals, lengths, _ = reasoning_run("grpo", tmp_path)
    assert evals[-1] - evals[0] >= REASONING_MIN_GAIN, f"eval accuracy {evals}"
    assert sum(lengths[-3:]) / 3 >= sum(lengths[:3]) / 3 + REASONING_MIN_LENGTH_GAIN, f"response tokens {lengths}"


PARTIAL = ("trainer.pipeline=async", "rollout.partial=continue", "rollout.partial_chunk_tokens=32")


def test_grpo_learns_the_reasoning_testbed_with_partial_rollouts(tmp_path, record_property):
    """trainer.pipeline=async (K=2) with rollout.partial=continue on the reasoning testbed, whose response
    lengths have a long tail (median 54, p90 97 tokens, cap 160): generating a batch takes longer than the
    update here, so pushes go through mid-batch and sequences continue under newer weights; the update
    uses each token's own behaviour log-prob. GRPO must learn as in the sync test (accuracy and response
    length, the testbed's mechanism), and the run must have been interrupted (else this is only the async
    test). In CI this test guards the testbed's mechanism; the sync one runs in make test-learning-full.
    Measured 2026-12-03 (Xeon, 1 thread): 0.336 -> 0.518 -> 0.557, response tokens 46 -> 69, 13 interrupts
    in 14 steps (another run: 0.336 -> 0.508 -> 0.527, 14 in 15); generation 3.2 s against 2.5 s of update
    per step. A machine whose update is the slower side would see no interrupt and fail the last
    assertion, which then says so."""
    evals, lengths, rows = reasoning_run("grpo", tmp_path, PARTIAL)
    interrupts = sum(r["rollout/partial_interrupts"] for r in rows)
    record_property("gain", round(evals[-1] - evals[0], 4))
    record_property("length_gain", round(sum(lengths[-3:]) / 3 - sum(lengths[:3]) / 3, 2))
    print(f"grpo async+partial: eval accuracy {evals}; {interrupts} interrupts in {len(rows)} steps; "
          f"current-version tokens {[round(r['rollout/current_version_frac'], 2) for r in rows]}; response tokens "
          f"{[round(x, 1) for x in lengths]}")
    assert evals[-1] - evals[0] >= THRESHOLD["reasoning partial"], f"eval accuracy {evals}"
    length_gain = sum(lengths[-3:]) / 3 - sum(lengths[:3]) / 3
    assert length_gain >= THRESHOLD["reasoning partial tokens"], f"response tokens {lengths}"
    assert interrupts > 0 and any(r["rollout/partial_resumed_frac"] > 0 for r in rows), (
        "no push came mid-batch: here the update outlasted every batch's generation (perf/rollout_s vs perf/update_s)")
    assert all(r["rollout/staleness_max"] <= 2 for r in rows)


# The newer policy-gradient families (issue #32) on the reasoning testbed, at their defaults and the preset's
# settings (make test-learning-full). They must raise greedy accuracy as GRPO does; response length is reported,
# not asserted (lengthening is GRPO's measured mechanism here, not a requirement of every loss). OPD is left
# out: on this task it needs a reasoning teacher (teacher.sft_steps=2000 on 20k worked problems), a build of
# its own far past this tier's budget; its learning test is on arith (test_algorithm_learns_arith[opd]).
@pytest.mark.full
@pytest.mark.parametrize("name", ["gmpo", "gpg", "sapo", "clip_cov", "kl_cov"])
def test_newer_algorithms_learn_the_reasoning_testbed(name, tmp_path):
    evals, lengths, _ = reasoning_run(name, tmp_path)
    print(f"{name}: eval accuracy {evals}; response tokens, first/last 3 steps: "
          f"{sum(lengths[:3]) / 3:.1f} -> {sum(lengths[-3:]) / 3:.1f}")
    assert evals[-1] - evals[0] >= REASONING_MIN_GAIN, f"{name}: eval accuracy {evals}"
