"""GPU check: pass/fail, with thresholds, of what only a GPU can show (docs/scale.md, GPU readiness).

    python bench/gpu_check.py [--shape qwen0.5b|tiny] [--steps 4] [--rollout auto|vllm|hf] [--out DIR]
                              [--cpu] [--skip STAGE,...] [OVERRIDES...]

Each stage prints PASS or FAIL with the value it measured against its threshold; the exit status is
the number of failed stages (0: all passed). No stage can pass on a run that does not crash but is
broken: each measures the property itself. Every training run starts with the preflight
(harness/runtime/driver/preflight.py), which stops it in one line per failed check.

1. ``learning``: GRPO with an entropy bonus (random weights earn no reward, so the bonus is what makes
   the gradient non-zero) at the GPU presets' precision: ``model.dtype=bfloat16``, bf16 compute,
   ``trainer.lr=1e-6``, ``rollout.verify_sync=true``. Thresholds:
   - every step's ``policy/grad_norm`` > 0 (there is a signal to apply);
   - > 99% of a decoder matrix's entries moved in the fp32 master copy between the first and the last
     checkpoint (bf16 masters round such steps away: 0.77% moved);
   - after every sync the engine holds exactly what was sent, tensor by tensor: the per-tensor fingerprints
     (harness/runtime/rollout/fingerprint.py) agree (``rollout/sync_checksum_rel_err`` <= 1e-9, no
     ``rollout/sync_mismatched_tensors``);
   - the rollout/trainer log-prob gap: mean < ``--max-gap-mean``, max < ``--max-gap-max`` (vllm only).
   ``plan`` (CUDA): the learning run's device memory per phase (``perf/memory/*``: the allocator's bytes,
   harness/runtime/workers/phase_memory.py) against ``harness plan`` for its config, within
   ``--plan-tolerance`` (25%): what the trainer keeps after an update, the update's peak, the sync's peak.
   ``sync``: the sync check's negative control: one step whose push leaves out a decoder matrix
   (``HARNESS_PLANT_SYNC_FAULT``) must report exactly one mismatched tensor.
   ``warmstart``: learning, not only gradient flow: the main job's GRPO arm (sweeps/reasoning_quick.yaml:
   the shipped warm start of the reasoning testbed, 50k generated tokens) with bf16 compute over fp32
   masters must raise greedy eval accuracy on the 512 test problems by ``--min-gain`` (0.09; on CPU in
   bf16 it gained +0.18 to +0.22 over 3 seeds: tests/bench/test_gpu_check.py).
   ``contract`` (vllm): tests/runtime/test_vllm_contract.py against the installed vLLM (pyproject.toml's
   extra [vllm] pins the range it was run on).
2. ``memory`` (vllm with sleep mode): after training, the trainer's process holds a cached block of
   ``--peak-frac`` of the device (as an activation peak leaves it); the engine's wake must then
   succeed, and ``torch.cuda.memory_reserved()`` must have dropped below ``--peak-frac`` / 2 of the
   device (released before the wake; without the release the wake fails for want of memory).
3. ``workers`` (>= 2 GPUs; 2 gloo ranks in a CPU dry run): the learning run with ``runtime.workers=2``,
   FSDP's collectives over NCCL. Thresholds: the two ranks on two distinct GPUs by torch's UUIDs
   (run.json's ``worker_devices``; nvidia-smi's process list is often empty in containers), every
   step trained with ``policy/grad_norm`` > 0, no mismatched tensor after any sync on either worker,
   one shard file per rank in the checkpoint, and > 99% of the fp32 master matrix moved. (Equality
   with the 1-worker run is checked on CPU, tests/runtime/test_workers.py; on GPUs each worker's engine
   samples its own batch in bf16, whose logits depend on the batch, so the samples may differ.)
4. ``fakerank``: one rank of 8 of Qwen2.5-7B's shapes (``--fake-shape``, ``--fake-world``) on this GPU through
   torch's fake process group (bench/bench_fake_ranks.py ``--device cuda --precision bf16``: random bf16
   weights written once under ``<out>``, 15 GB, then load, two optimizer steps, the cast-then-gather sync, the
   sharded checkpoint and its export, removed after). Thresholds: what the rank keeps after training and
   the train phase's peak (torch's allocator) within ``--plan-tolerance`` of ``harness plan``'s terms, as
   docs/scale.md's CPU table compares them. Last: the longest stage, and the one most likely to outlast a
   lent machine; a CPU dry run plays rank 0 of 4 at the bench's tiny shape and checks only that each
   phase was measured (RSS at that size is mostly allocator noise).

Each threshold's failure is shown on CPU with a planted fault (tests/bench/test_gpu_check.py): an engine
that ignores the pushed weights (learning), a push without one tensor (sync), measurements 40% off the
plan (plan), a learning rate of 1e-9 (warmstart).

``--shape qwen0.5b`` (default) builds a random Qwen2.5-0.5B-shaped model (hidden 896, 24 layers, 14
heads, 2 KV heads, vocab 151936 with the shared Qwen2 tokenizer, else a small BPE one) in bf16;
``--shape tiny`` a 2-layer one, for a dry run of the script on CPU (``--cpu --rollout hf``;
tests/bench/test_gpu_check.py runs it). Writes ``<out>/gpu_check.json`` after every stage (the checks so far,
the stages done and pending), so a run cut short still returns what it measured. A stage that raises is a
failed check ("raised", with the exception) and the next stages run; one that reads a failed stage's run
(plan after learning) is recorded as not run.

``--rollout auto`` (default): vllm when it imports, else hf, saying in one line what that skips (the
``memory`` stage and the log-prob gap checks need vLLM). Without a CUDA device (and without ``--cpu``)
it stops in one line naming the first stage that needs one. scripts/gpu_check.sh runs it on a bare
CUDA image with no network from a wheelhouse (scripts/wheelhouse.sh).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    "qwen0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                     intermediate_size=4864, vocab_size=151936),
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=256, vocab_size=None),
}  # fmt: skip
TOKENIZER_CANDIDATES = [ROOT / "shared/data/tokenizers/qwen2", ROOT.parent / "shared/data/tokenizers/qwen2"]
MATRIX = "model.layers.0.mlp.up_proj.weight"
STAGES = ("learning", "plan", "sync", "warmstart", "contract", "memory", "workers", "fakerank")  # in the order they run
DEPENDS = {"plan": "learning"}  # a stage that reads another's run: not run when that one failed


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen0.5b")
    p.add_argument("--steps", type=int, default=4, help="GRPO steps of the learning stage")
    p.add_argument("--prompts", type=int, default=16, help="trainer.prompts_per_step")
    p.add_argument("--n", type=int, default=4, help="algo.samples_per_prompt")
    p.add_argument("--max-new", type=int, default=128, help="rollout.max_response_tokens")
    p.add_argument("--rollout", default="auto", choices=["auto", "vllm", "hf"],
                   help="auto: vllm when it imports, else hf (and the stages that need vLLM are skipped)")
    p.add_argument("--cpu", action="store_true", help="dry run on CPU (with --shape tiny --rollout hf)")
    p.add_argument("--skip", default="",
                   help="stages to skip, comma-separated: learning, plan, sync, warmstart, contract, memory, workers")
    p.add_argument("--warm-tokens", type=int, default=50_000,
                   help="warmstart stage: generated tokens of training (the main job's budget, sweeps/reasoning_quick.yaml)")
    p.add_argument("--min-gain", type=float, default=0.09,
                   help="warmstart stage: greedy eval accuracy gain, last eval minus first (CPU: +0.17 to +0.20)")
    p.add_argument("--max-gap-mean", type=float, default=0.02, help="threshold: mean |rollout - trainer| log-prob")
    p.add_argument("--max-gap-max", type=float, default=1.0, help="threshold: max |rollout - trainer| log-prob")
    p.add_argument("--plan-tolerance", type=float, default=0.25,
                   help="plan stage: largest |measured / predicted - 1| of each phase's memory against harness plan")
    p.add_argument("--peak-frac", type=float, default=0.5, help="memory stage: the trainer's cached peak, of the device")
    p.add_argument("--fake-shape", default="7b", help="fakerank stage: bench/bench_fake_ranks.py's --shape on CUDA")
    p.add_argument("--fake-world", type=int, default=8, help="fakerank stage: the job's ranks (this GPU plays rank 0)")
    p.add_argument("--tokenizer", default="", help="Qwen2 tokenizer dir (vocab.json + merges.txt)")
    p.add_argument("--out", default=str(ROOT / "results/gpu_check"))
    p.add_argument("overrides", nargs="*", help="extra harness overrides for every stage")
    args = p.parse_intermixed_args(argv)  # overrides may come before, between or after the options
    unknown = set(filter(None, args.skip.split(","))) - set(STAGES)
    if unknown:
        p.error(f"--skip {','.join(sorted(unknown))}: not a stage; the stages: {', '.join(STAGES)}")
    return args


class Stages:
    """Collects each stage's checks: (name, passed, measured, threshold)."""

    def __init__(self):
        self.rows: list[dict] = []

    def check(self, stage: str, what: str, ok: bool, measured, threshold: str) -> None:
        self.rows.append({"stage": stage, "check": what, "ok": bool(ok), "measured": measured, "threshold": threshold})
        print(f"  [{'PASS' if ok else 'FAIL'}] {stage}: {what}: {measured} (threshold {threshold})", flush=True)

    @property
    def failed(self) -> int:
        return sum(not r["ok"] for r in self.rows)


def build_model(model_dir: Path, shape: str, tokenizer_arg: str, cuda: bool) -> dict:
    """A random-init model of ``shape`` (bf16 safetensors) with a tokenizer, built once."""
    import torch
    from transformers import AutoTokenizer

    from harness.models import new_qwen2, train_tokenizer

    if (model_dir / "build.json").exists():
        return json.loads((model_dir / "build.json").read_text())
    q = SHAPES[shape]
    tok_dir = next((c for c in ([Path(tokenizer_arg)] if tokenizer_arg else TOKENIZER_CANDIDATES)
                    if (c / "vocab.json").exists()), None) if q["vocab_size"] else None  # fmt: skip
    model_dir.mkdir(parents=True, exist_ok=True)
    if tok_dir is not None:
        for f in tok_dir.iterdir():
            if f.is_file():
                shutil.copy(f, model_dir / f.name)
        tok, vocab = AutoTokenizer.from_pretrained(model_dir), q["vocab_size"]
    else:
        tok = train_tokenizer([f"What is {a} + {b}? {a + b}" for a in range(100) for b in range(100)], 256)
        tok.save_pretrained(model_dir)
        vocab = len(tok)
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = new_qwen2(tok, q["hidden_size"], q["intermediate_size"], q["num_hidden_layers"], q["num_attention_heads"],
                          q["num_key_value_heads"], max_positions=4096, vocab_size=vocab, rope_theta=1_000_000.0,
                          torch_dtype="bfloat16").to(torch.bfloat16)  # fmt: skip
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    info = {"params": sum(p.numel() for p in model.parameters()), "vocab_size": vocab, "tokenizer": str(tok_dir or "BPE")}
    (model_dir / "build.json").write_text(json.dumps(info))
    return info


def run_overrides(args, model_dir: Path, run_dir: Path, cuda: bool) -> list[str]:
    return [f"model.path={model_dir}", f"rollout={args.rollout}", "model.dtype=bfloat16", "trainer.precision=bf16",
            "trainer.lr=1e-6", "algo=grpo", "algo.entropy_coef=0.01", "algo.kl_coef=0", "rollout.verify_sync=true",
            f"runtime.device={'cuda' if cuda else 'cpu'}", f"trainer.steps={args.steps}",
            f"trainer.prompts_per_step={args.prompts}", f"algo.samples_per_prompt={args.n}",
            f"rollout.max_response_tokens={args.max_new}", "trainer.checkpoint_every=1",
            f"trainer.eval_every={10 * args.steps}", "task.eval_prompts=16", "task.use_chat_template=false",
            f"run_dir={run_dir}", *args.overrides]  # fmt: skip


def stage_learning(args, stages: Stages, model_dir: Path, out: Path, cuda: bool) -> None:
    import torch
    from rich.console import Console

    from harness.config import compose_config
    from harness.runtime.rollout.fingerprint import TOLERANCE
    from harness.runtime.train.checkpoint_files import read_engine_state
    from harness.trainer import train

    run_dir = out / "learning"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = run_overrides(args, model_dir, run_dir, cuda)
    print("learning stage:\n  harness run " + " ".join(overrides), flush=True)
    t0 = time.perf_counter()
    train(compose_config(overrides), str(run_dir), console=Console())
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    steps = [r for r in rows if "policy/grad_norm" in r]
    print(f"  {len(steps)} steps in {time.perf_counter() - t0:.0f} s; median step "
          f"{sorted(r['perf/step_s'] for r in steps)[len(steps) // 2]:.2f} s", flush=True)  # fmt: skip
    stages.check("learning", "steps trained", len(steps) == args.steps, len(steps), f"== {args.steps}")
    norms = [r["policy/grad_norm"] for r in steps]
    stages.check("learning", "min policy/grad_norm", min(norms, default=0) > 0, min(norms, default=0), "> 0")
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    first, last = (read_engine_state(c)["policy"]["model"][MATRIX] for c in (checkpoints[0], checkpoints[-1]))
    moved = (first != last).float().mean().item()
    stages.check("learning", f"master {MATRIX} dtype", first.dtype == torch.float32, str(first.dtype), "float32")
    stages.check("learning", f"fraction of {MATRIX} moved, {checkpoints[0].name} -> {checkpoints[-1].name}",
                 moved > 0.99, round(moved, 5), "> 0.99")  # fmt: skip
    errs = [r.get("rollout/sync_checksum_rel_err") for r in steps]
    worst = max((e for e in errs if e is not None), default=None)
    stages.check("learning", "max rollout/sync_checksum_rel_err (per tensor)",
                 worst is not None and None not in errs and worst <= TOLERANCE, worst, f"<= {TOLERANCE} at every step")
    lost = max((r.get("rollout/sync_mismatched_tensors", -1) for r in steps), default=-1)
    stages.check("learning", "rollout/sync_mismatched_tensors (worst step)", lost == 0, lost, "== 0")
    if args.rollout == "vllm":
        gaps = [(r["rollout/logp_gap_mean"], r["rollout/logp_gap_max"]) for r in steps if "rollout/logp_gap_mean" in r]
        mean = max((g[0] for g in gaps), default=None)
        top = max((g[1] for g in gaps), default=None)
        stages.check("learning", "rollout/logp_gap_mean (worst step)", mean is not None and mean < args.max_gap_mean,
                     mean, f"< {args.max_gap_mean}")  # fmt: skip
        stages.check("learning", "rollout/logp_gap_max", top is not None and top < args.max_gap_max, top,
                     f"< {args.max_gap_max}")  # fmt: skip


def longest_prompt_tokens(cfg, model_dir: Path) -> int:
    """The longest training prompt of the run's task in tokens (``harness plan --prompt-tokens``: the plan's
    activations then use the prompts the run has, not the ``task.max_prompt_tokens`` cap)."""
    from transformers import AutoTokenizer

    from harness.data.tasks import load_task, render_prompt

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    texts = [render_prompt(e.messages, tokenizer, bool(cfg.task.use_chat_template)) for e in load_task(cfg.task).train]
    return min(max(len(ids) for ids in tokenizer(texts)["input_ids"]), int(cfg.task.max_prompt_tokens))


def plan_comparison(cfg, rows: list[dict], prompt_tokens: int) -> list[tuple[str, float | None, float]]:
    """(phase, measured GiB, ``harness plan``'s GiB) for the run of ``cfg`` whose metrics are ``rows``, each
    phase on its own so that one term's error is not hidden in a total: what the trainer keeps after an update
    (models, optimizer state, a colocated engine's weights), what the update holds above that at its peak
    (gradients, logits, activations, bf16 compute copies) and what a sync holds above what it started with (the
    gathered tensor). Measured: ``perf/memory/*`` (harness/runtime/workers/phase_memory.py), the largest over
    the steps; the plan's host-only terms (process overhead, a checkpoint's mapped file pages) are left out:
    CUDA's allocator counts the device's tensors only."""
    import algorithms
    from harness.plan import GIB, plan

    result = plan(cfg, list(algorithms.build(cfg.algo).needs.roles), prompt_tokens=prompt_tokens)
    parts = result["worker_bytes"]
    host = sum(v for k, v in parts.items() if k.startswith(("process overhead", "checkpoint file pages")))
    sync = sum(v for k, v in parts.items() if k.startswith("weight sync"))
    kept = result["worker_persistent_bytes"] - host
    update = result["worker_total_bytes"] - result["worker_persistent_bytes"] - sync

    def largest(key: str, base: str) -> float | None:
        values = [r[key] - r[base] for r in rows if key in r and base in r]
        return max(values) if values else None

    kept_values = [r["perf/memory/train_after_gib"] for r in rows if "perf/memory/train_after_gib" in r]
    return [("kept after an update", max(kept_values) if kept_values else None, kept / GIB),
            ("update: peak above what it kept", largest("perf/memory/train_peak_gib", "perf/memory/train_after_gib"),
             update / GIB),
            ("sync: peak above what it kept", largest("perf/memory/sync_peak_gib", "perf/memory/sync_after_gib"),
             sync / GIB)]  # fmt: skip


def check_plan(stages: Stages, comparison: list[tuple[str, float | None, float]], tolerance: float) -> None:
    for phase, measured, predicted in comparison:
        error = None if measured is None else measured / predicted - 1
        stages.check("plan", f"{phase}: measured vs harness plan ({predicted:.3f} GiB)",
                     error is not None and abs(error) <= tolerance,
                     None if measured is None else f"{measured:.3f} GiB ({error:+.0%})", f"within {tolerance:.0%}")


def stage_plan(args, stages: Stages, model_dir: Path, out: Path) -> None:
    """Each phase's device memory in the learning stage's run against ``harness plan``'s prediction for its config."""
    from harness.config import compose_config

    run_dir = out / "learning"
    cfg = compose_config(run_overrides(args, model_dir, run_dir, True))
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    prompt_tokens = longest_prompt_tokens(cfg, model_dir)
    print(f"plan stage: harness plan of the learning stage's config, longest prompt {prompt_tokens} tokens", flush=True)
    check_plan(stages, plan_comparison(cfg, rows, prompt_tokens), args.plan_tolerance)


def stage_sync_fault(args, stages: Stages, model_dir: Path, out: Path, cuda: bool) -> None:
    """The negative control of the sync check: one step whose push leaves out one tensor must be caught."""
    from rich.console import Console

    from harness.config import compose_config
    from harness.runtime.rollout.fingerprint import FAULT_ENV
    from harness.trainer import train

    run_dir = out / "sync_fault"
    shutil.rmtree(run_dir, ignore_errors=True)
    one_step = argparse.Namespace(**{**vars(args), "steps": 1})
    os.environ[FAULT_ENV] = f"drop:{MATRIX}"  # read by the rollout backend at each push (fingerprint.py)
    try:
        train(compose_config(run_overrides(one_step, model_dir, run_dir, cuda)), str(run_dir), console=Console())
    finally:
        del os.environ[FAULT_ENV]
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    lost = [r.get("rollout/sync_mismatched_tensors") for r in rows if "policy/grad_norm" in r]
    stages.check("sync", f"planted fault (a push without {MATRIX}): tensors mismatched", lost == [1.0], lost, "== [1]")


def warmstart_overrides(args, run_dir: Path, cuda: bool) -> list[str]:
    """The main job's GRPO arm (sweeps/reasoning_quick.yaml: the shipped warm start of the reasoning testbed,
    its lengths, batch and learning rate) at the GPU presets' precision, less the preset's devices and launcher."""
    from harness.commands.presets import read_preset, resolve_preset

    preset = read_preset(resolve_preset("reasoning_quick"))
    keep = [o for o in preset["overrides"] if not o.startswith(("hydra", "runtime.", "trainer.budget_tokens"))]
    return [*keep, "algo=grpo", "seed=0", f"trainer.budget_tokens={args.warm_tokens}", f"rollout={args.rollout}",
            "model.dtype=bfloat16", "trainer.precision=bf16", f"runtime.device={'cuda' if cuda else 'cpu'}",
            f"run_dir={run_dir}", *args.overrides]  # fmt: skip


def stage_warmstart(args, stages: Stages, out: Path, cuda: bool) -> None:
    """Learning, not only gradient flow: GRPO from the shipped warm start of the reasoning testbed must raise
    its greedy eval accuracy by ``--min-gain`` with bf16 compute over fp32 masters."""
    from rich.console import Console

    from harness.config import compose_config
    from harness.trainer import train

    run_dir = out / "warmstart"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = warmstart_overrides(args, run_dir, cuda)
    print("warmstart stage:\n  harness run " + " ".join(overrides), flush=True)
    t0 = time.perf_counter()
    train(compose_config(overrides), str(run_dir), console=Console())
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    evals = [r["eval/reasoning/accuracy"] for r in rows if "eval/reasoning/accuracy" in r]
    gain = round(evals[-1] - evals[0], 4) if len(evals) >= 2 else None
    print(f"  eval accuracy {' -> '.join(f'{e:.3f}' for e in evals)} in {time.perf_counter() - t0:.0f} s", flush=True)
    stages.check("warmstart", "greedy eval accuracy gain (last eval - first), GRPO from the shipped warm start",
                 gain is not None and gain >= args.min_gain, gain, f">= {args.min_gain}")  # fmt: skip


def stage_contract(stages: Stages) -> None:
    """tests/runtime/test_vllm_contract.py against this machine's vLLM: every name the harness calls exists."""
    if importlib.util.find_spec("pytest") is None:
        stages.check("contract", "tests/runtime/test_vllm_contract.py", False, "pytest absent",
                     "passes (scripts/wheelhouse.sh carries pytest)")  # fmt: skip
        return
    cmd = [sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider",
           "tests/runtime/test_vllm_contract.py"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    last = (proc.stdout.strip().splitlines() or ["no output"])[-1]
    if proc.returncode:
        print(proc.stdout[-3000:] + proc.stderr[-2000:], flush=True)
    import vllm

    stages.check("contract", f"tests/runtime/test_vllm_contract.py on vllm {vllm.__version__}", proc.returncode == 0,
                 last, "exit 0")  # fmt: skip


def stage_memory(args, stages: Stages, model_dir: Path, out: Path) -> None:
    """The trainer's cached peak must not block vLLM's wake (harness/runtime/rollout/vllm.py release_cached_memory)."""
    import torch

    import algorithms
    from harness.config import compose_config, runtime_settings, validate
    from harness.runtime.driver.hybrid_engine import HybridEngine

    overrides = run_overrides(args, model_dir, out / "memory", True) + ["rollout.vllm.enable_sleep_mode=true",
                                                                        "rollout.vllm.gpu_memory_utilization=0.4"]
    cfg = compose_config(overrides)
    sizes = validate(cfg)
    engine = HybridEngine(runtime_settings(cfg), algorithms.build(cfg.algo).needs, str(model_dir), sizes)
    try:
        engine._rollout_sleep()  # as after a rollout, while the trainer works
        total = torch.cuda.get_device_properties(0).total_memory
        peak = torch.empty(int(args.peak_frac * total), dtype=torch.uint8, device="cuda")  # an activation peak
        del peak  # freed, but still reserved by the caching allocator
        reserved_before = torch.cuda.memory_reserved() / total
        stages.check("memory", "cached after the peak (of the device)", reserved_before >= args.peak_frac * 0.9,
                     round(reserved_before, 3), f">= {args.peak_frac * 0.9:.2f} (the setup holds)")  # fmt: skip
        try:
            engine.sync_weights()  # wakes the engine: weights, then its KV cache
            woke = True
        except Exception as exc:  # noqa: BLE001  (the failure this stage guards against)
            woke, reason = False, f"{type(exc).__name__}: {str(exc)[:200]}"
        reserved_after = torch.cuda.memory_reserved() / total
        stages.check("memory", "vLLM woke beside the trainer", woke, "yes" if woke else reason, "wakes")
        stages.check("memory", "reserved by the trainer after the release (of the device)",
                     reserved_after < args.peak_frac / 2, round(reserved_after, 3), f"< {args.peak_frac / 2:.2f}")
    finally:
        engine.close()


def stage_workers(args, stages: Stages, model_dir: Path, out: Path, cuda: bool) -> None:
    """The learning run with ``runtime.workers=2``: FSDP's collectives across two ranks (NCCL on GPUs, gloo in
    a CPU dry run), each rank on its own GPU by torch's UUID (run.json's ``worker_devices``), every sync exact
    on both workers, every rank writing its own shards of the checkpoint, and the fp32 masters moving."""
    import torch
    from rich.console import Console

    from harness.config import compose_config
    from harness.runtime.train.checkpoint_files import read_engine_state
    from harness.trainer import train

    run_dir = out / "workers"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = run_overrides(args, model_dir, run_dir, cuda) + ["runtime.workers=2"]
    if args.rollout == "vllm":
        overrides.append("rollout.vllm.gpu_memory_utilization=0.3")
    print("workers stage:\n  harness run " + " ".join(overrides), flush=True)
    train(compose_config(overrides), str(run_dir), console=Console())
    devices = json.loads((run_dir / "run.json").read_text()).get("worker_devices", [])
    if cuda:
        stages.check("workers", "distinct GPUs of the 2 workers (torch UUIDs)", len(set(devices)) == 2, devices, "2")
    steps = [r for r in (json.loads(line) for line in open(run_dir / "metrics.jsonl")) if "policy/grad_norm" in r]
    stages.check("workers", "steps trained", len(steps) == args.steps, len(steps), f"== {args.steps}")
    norms = [r["policy/grad_norm"] for r in steps]
    stages.check("workers", "min policy/grad_norm", min(norms, default=0) > 0, min(norms, default=0), "> 0")
    lost = max((r.get("rollout/sync_mismatched_tensors", -1) for r in steps), default=-1)
    stages.check("workers", "rollout/sync_mismatched_tensors (worst step, worst worker)", lost == 0, lost, "== 0")
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    shards = sorted(f.name for f in (checkpoints[-1] / "engine" / "policy").glob("*.distcp"))
    stages.check("workers", f"shard files of the policy in {checkpoints[-1].name}", len(shards) == 2, shards, "one per rank")
    first, last = (read_engine_state(c)["policy"]["model"][MATRIX] for c in (checkpoints[0], checkpoints[-1]))
    moved = (first != last).float().mean().item()
    stages.check("workers", f"fraction of {MATRIX} moved (fp32 masters)", moved > 0.99 and first.dtype == torch.float32,
                 round(moved, 5), "> 0.99")  # fmt: skip


def stage_fakerank(args, stages: Stages, out: Path, cuda: bool) -> None:
    """bench/bench_fake_ranks.py as its own process (it sets the allocator's environment before torch loads)."""
    shape, world = (args.fake_shape, args.fake_world) if cuda else ("tiny", 4)
    model_dir, report = out / f"fakerank-{shape}", out / "fakerank.json"
    cmd = [sys.executable, str(ROOT / "bench" / "bench_fake_ranks.py"), "--shape", shape, "--world", str(world),
           "--device", "cuda" if cuda else "cpu", "--precision", "bf16" if cuda else "fp32", "--dir", str(model_dir),
           "--out", str(report)]  # fmt: skip
    print("fakerank stage:\n  " + " ".join(cmd[1:]), flush=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
        print(proc.stdout[-3000:], proc.stderr[-2000:] if proc.returncode else "", flush=True)
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)  # 15 GB of random weights at 7B
    stages.check("fakerank", f"bench_fake_ranks {shape}, rank 0 of {world}: exit status", proc.returncode == 0,
                 proc.returncode, "0")  # fmt: skip
    if proc.returncode:
        return
    result = json.loads(report.read_text())
    phases = [p for p in ("load", "train", "sync", "checkpoint") if p in result["measured"]]
    stages.check("fakerank", "phases measured", len(phases) == 4, phases, "load, train, sync, checkpoint")
    if not cuda:
        return
    for what, (got, want) in result["against_plan"].items():
        off = (got - want) / want if want else float("inf")
        stages.check("fakerank", f"{what} (GiB) vs harness plan's {want:.2f}", abs(off) <= args.plan_tolerance,
                     f"{got:.2f} ({off:+.0%})", f"within {args.plan_tolerance:.0%}")  # fmt: skip


def vllm_importable() -> bool:
    return importlib.util.find_spec("vllm") is not None


def plan_stages(args, cuda: bool, devices: int) -> tuple[list[str], list[str]]:
    """(stages to run, in order; stages skipped, each with why): the same rules main() runs them by."""
    skip = set(filter(None, args.skip.split(",")))
    why = {
        "learning": "--skip" if "learning" in skip else "",
        "plan": "--skip" if "plan" in skip else "needs the learning stage" if "learning" in skip else
                "" if cuda else "needs a CUDA device",
        "sync": "--skip" if "sync" in skip else "",
        "warmstart": "--skip" if "warmstart" in skip else "",
        "contract": "--skip" if "contract" in skip else "needs vLLM" if args.rollout != "vllm" else "",
        "memory": "--skip" if "memory" in skip else "needs vLLM" if args.rollout != "vllm" else
                  "" if cuda else "needs a CUDA device",
        "workers": "--skip" if "workers" in skip else "" if devices >= 2 or not cuda else "needs 2 CUDA devices",
        "fakerank": "--skip" if "fakerank" in skip else "",
    }  # fmt: skip
    run = [stage for stage, reason in why.items() if not reason]
    return run, [f"{stage} ({reason})" for stage, reason in why.items() if reason]


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.rollout == "auto":
        args.rollout = "vllm" if vllm_importable() else "hf"
        if args.rollout == "hf":
            print("vllm absent: rollout=hf; stages skipped: memory (vLLM sleep/wake), contract (vLLM's API), "
                  "learning's log-prob gap checks (vLLM vs trainer)", flush=True)  # fmt: skip
    elif args.rollout == "vllm" and not vllm_importable():
        print("error: --rollout vllm but vllm does not import here (--rollout auto or hf runs without it)",
              file=sys.stderr)  # fmt: skip
        return 2
    import torch

    cuda = torch.cuda.is_available() and not args.cpu
    if not cuda and not args.cpu:
        first = (plan_stages(args, True, 2)[0] or ["(none: every stage skipped)"])[0]
        print(f"no CUDA device: stopping before stage {first} (torch {torch.__version__}; "
              "a dry run on CPU: --cpu --shape tiny --rollout hf)", file=sys.stderr)  # fmt: skip
        return 2
    out = Path(args.out)
    t0 = time.perf_counter()
    info = build_model(out / f"model-{args.shape}", args.shape, args.tokenizer, cuda)
    print(f"model: {info['params'] / 1e6:.1f}M params, vocab {info['vocab_size']}, tokenizer {info['tokenizer']} "
          f"({time.perf_counter() - t0:.0f} s); torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(0) if cuda else 'CPU'} x {torch.cuda.device_count() if cuda else 0}", flush=True)
    stages = Stages()
    run, skipped = plan_stages(args, cuda, torch.cuda.device_count() if cuda else 0)
    print(f"stages: {', '.join(run)}" + (f"; skipped: {', '.join(skipped)}" if skipped else ""), flush=True)
    model_dir = out / f"model-{args.shape}"
    stage_runs = {
        "learning": lambda: stage_learning(args, stages, model_dir, out, cuda),
        "plan": lambda: stage_plan(args, stages, model_dir, out),
        "sync": lambda: stage_sync_fault(args, stages, model_dir, out, cuda),
        "warmstart": lambda: stage_warmstart(args, stages, out, cuda),
        "contract": lambda: stage_contract(stages),
        "memory": lambda: stage_memory(args, stages, model_dir, out),
        "workers": lambda: stage_workers(args, stages, model_dir, out, cuda),
        "fakerank": lambda: stage_fakerank(args, stages, out, cuda),
    }
    failed_stages: list[str] = []
    for i, stage in enumerate(run):
        before = stages.failed
        dep = DEPENDS.get(stage)
        if dep in failed_stages:
            stages.check(stage, "not run", False, f"{dep} failed", f"runs after {dep} passes")
        else:
            try:
                stage_runs[stage]()
            except Exception as exc:  # one stage's crash must not hide what the others measure
                traceback.print_exc()
                stages.check(stage, "raised", False, f"{type(exc).__name__}: {str(exc)[:500]}", "no exception")
        if stages.failed > before:
            failed_stages.append(stage)
        # written after every stage: a first run that dies later (the machine taken back) still returns this
        write_report(out, info, stages, done=run[: i + 1], pending=run[i + 1:], skipped=skipped)
    print(f"\ngpu_check: {len(stages.rows) - stages.failed} passed, {stages.failed} failed ({out / 'gpu_check.json'})")
    return stages.failed


def write_report(out: Path, info: dict, stages: Stages, done: list[str], pending: list[str], skipped: list[str]) -> None:
    """gpu_check.json, atomically: the model, every check so far, the stages run, still to run and skipped."""
    tmp = out / "gpu_check.json.tmp"
    tmp.write_text(json.dumps({"model": info, "checks": stages.rows, "stages_done": done, "stages_pending": pending,
                               "stages_skipped": skipped}, indent=2))
    tmp.replace(out / "gpu_check.json")


if __name__ == "__main__":  # vLLM spawns workers: the guard is required
    sys.exit(main())
