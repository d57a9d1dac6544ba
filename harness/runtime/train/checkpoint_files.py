"""The engine's part of a checkpoint on disk: every worker rank's shards of the trained models
(torch.distributed.checkpoint, ``checkpoints/step_N/engine/<model>/``, written by ``TrainEngine.save_sharded``),
read whole in one process for tools and tests, and checked for completeness before a resume."""

from __future__ import annotations

from pathlib import Path

import torch

from harness.core.errors import CheckpointError


def check_shards(checkpoint_dir: Path, state: dict) -> None:
    """Raise ``CheckpointError`` when state.pt names shards that are not there (a partial copy of a run
    directory): the resume then falls back to the checkpoint before it. DCP writes each index last."""
    engine = state.get("engine") or {}
    if engine.get("format") == "sharded":
        lost = [m for m in engine["models"] if not (Path(checkpoint_dir) / engine["dir"] / m / ".metadata").is_file()]
        if lost:
            raise CheckpointError(f"{Path(checkpoint_dir).name}: the shards of {', '.join(lost)} are missing "
                                  f"({engine['dir']}/<model>/.metadata)")  # fmt: skip


def read_engine_state(checkpoint_dir: Path, engine_state: dict | None = None) -> dict:
    """The trained models' full states in a checkpoint, ``{model: {"model": {name: tensor}, "optimizer": ...}}``,
    in one process (no process group; for tools, tests and the LoRA export): the sharded format's files are
    read whole, a checkpoint from before it is state.pt's. ``engine_state``: state.pt's "engine" if at hand."""
    # torch's own dcp_to_torch_save reads a checkpoint whole this way (the planner builds the dict from the metadata)
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    checkpoint_dir = Path(checkpoint_dir)
    if engine_state is None:
        engine_state = torch.load(checkpoint_dir / "state.pt", weights_only=True)["engine"]
    if engine_state.get("format") != "sharded":
        return engine_state
    out = {}
    for name, small in engine_state["models"].items():
        full: dict = {}
        reader = FileSystemReader(str(checkpoint_dir / engine_state["dir"] / name))
        _load_state_dict(full, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)
        out[name] = {**full, **small}
    return out
