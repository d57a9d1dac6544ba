"""Build a tiny warm start and write it to harness/warmstart/tiny-<task>/ (committed, ~2 MB).

    python scripts/ship_warm_start.py [--check] [KEY=VALUE ...]

With no overrides it builds the default (task arith); overrides select another task and the
settings its runs will use (a run finds the shipped start only if its settings give the same key)::

    python scripts/ship_warm_start.py task=reasoning rollout.max_response_tokens=160

Run only when the build recipe changes (harness/models.py TINY_BUILD_VERSION, the tiny or
arith defaults): every machine then starts from these bits instead of building its own,
because CPUs with other float kernels (AVX2 vs AVX-512) build different weights from the
same seed. ``--check`` rebuilds into a temporary folder and prints whether this machine
reproduces the shipped weights (informative: a mismatch is the reason for shipping).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rewards  # noqa: E402
from harness.config import compose_config  # noqa: E402
from harness.data.tasks import load_task  # noqa: E402
from harness.models import SHIPPED_DIR, build_tiny, tiny_cache_key, weights_sha256  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="rebuild in a temp dir and compare with the shipped one")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides (task=..., model.tiny.*)")
    args = parser.parse_args()
    cfg = compose_config(args.overrides)
    task = load_task(cfg.task)
    env = cfg.env if cfg.env.name else None  # an environment's warm start (env.name=...) is keyed by it
    key = tiny_cache_key(cfg.model, task.config, cfg.rollout.max_response_tokens, env)
    target = SHIPPED_DIR / f"tiny-{task.name}"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "build"
        out.mkdir()
        info = build_tiny(cfg.model.tiny, task, rewards.get(cfg.task.checker), out, cfg.rollout.max_response_tokens, env)
        info["cache_key"] = key
        (out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
        if args.check:
            shipped_info = json.loads((target / "build_info.json").read_text())
            shipped = shipped_info["weights_sha256"]
            same = weights_sha256(out) == shipped
            print(f"this machine ({info['cpu_flags']}) builds {info['weights_sha256']}; shipped {shipped}: "
                  f"{'identical' if same else 'DIFFERENT (expected on other float kernels)'}")
            history = [list(h) for h in info["sft_history"]]
            print(f"held-out accuracy by SFT step: {history} (shipped: {shipped_info['sft_history']})")
            return 0
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(out, target)
    print(f"wrote {target} (weights sha256 {info['weights_sha256']}, key {key}, "
          f"held-out accuracy {info['sft_holdout_accuracy']:.3f} after {info['sft_steps']} SFT steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
