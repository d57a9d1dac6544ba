"""The checkpoint's format: every rank writes its shards (torch.distributed.checkpoint), the policy is exported
one gathered tensor at a time, and checkpoints written before the sharded format still resume."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from harness.commands.cli import main
from harness.models import load_causal_lm
from harness.runtime.loading import write_safetensors
from harness.runtime.train.checkpoint_files import check_shards, read_engine_state
from tests.helpers import metrics_without_timings

RUN = ["trainer.prompts_per_step=4", "trainer.eval_every=2", "task.eval_prompts=8", "runtime.threads=1",
       "trainer.checkpoint_every=2", "trainer.steps=4"]  # fmt: skip


def test_streamed_export_splits_into_files_transformers_loads(tmp_path):
    """Past ``shard_bytes`` the weights go into numbered files with an index; a file holds whole tensors."""
    tensors = {f"w{i}": torch.full((4, 8), float(i)) for i in range(5)}  # 128 bytes each
    write_safetensors(iter(tensors.items()), str(tmp_path / "many"), shard_bytes=300)
    files = sorted(p.name for p in (tmp_path / "many").glob("*.safetensors"))
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]  # 2 + 2 + 1 tensors
    index = json.loads((tmp_path / "many" / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 5 * 128
    assert index["weight_map"] == {"w0": files[0], "w1": files[0], "w2": files[1], "w3": files[1], "w4": files[2]}
    back = {k: v for f in files for k, v in load_file(tmp_path / "many" / f).items()}
    assert all(torch.equal(back[k], v) for k, v in tensors.items()) and len(back) == 5
    write_safetensors(iter(tensors.items()), str(tmp_path / "one"))
    assert [p.name for p in (tmp_path / "one").iterdir()] == ["model.safetensors"]


@pytest.mark.integration
def test_checkpoint_is_sharded_and_an_old_full_checkpoint_still_resumes(tmp_path):
    """A run's checkpoint holds no tensor in state.pt (the shards are under engine/), its policy/ loads in
    transformers with the trained weights, and a checkpoint of the earlier format (the full state in
    state.pt) resumes to the same run bit for bit."""
    straight = tmp_path / "straight"
    main(["run", *RUN, f"run_dir={straight}"])
    ckpt = straight / "checkpoints" / "step_0000002"
    small = torch.load(ckpt / "state.pt", weights_only=True)
    assert small["engine"]["format"] == "sharded" and (ckpt / "engine" / "policy" / ".metadata").is_file()
    assert not any(isinstance(v, torch.Tensor) for v in _leaves(small))
    full = read_engine_state(ckpt)
    assert set(full["policy"]) == {"model", "optimizer", "scheduler"}
    exported = load_causal_lm(str(ckpt / "policy"), "float32").state_dict()
    trained = full["policy"]["model"]
    assert all(torch.equal(exported[k], trained[k]) for k in trained) and len(trained) > 10

    # The earlier format: state.pt holds every model's full state; no engine/ directory.
    old = tmp_path / "old"
    main(["run", *RUN[:-1], "trainer.steps=2", f"run_dir={old}"])
    old_ckpt = old / "checkpoints" / "step_0000002"
    shutil.rmtree(old_ckpt / "engine")
    torch.save({**small, "engine": full}, old_ckpt / "state.pt")
    main(["run", *RUN, f"run_dir={old}"])  # resumes from step 2
    assert metrics_without_timings(old) == metrics_without_timings(straight)


def _leaves(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _leaves(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _leaves(v)
    else:
        yield obj


def test_a_checkpoint_whose_shards_are_lost_is_skipped_for_the_one_before(tmp_path, compose_cfg):
    """state.pt loads but engine/ is gone (a partial copy of the run directory): resume warns and takes the
    checkpoint before it, as it does for an unreadable state.pt."""
    main(["run", *RUN[:-2], "trainer.checkpoint_every=1", "trainer.steps=2", f"run_dir={tmp_path}"])
    shutil.rmtree(tmp_path / "checkpoints" / "step_0000002" / "engine")
    from harness.rundir.writer import RunDir

    cfg = compose_cfg([*RUN[:-2], "trainer.checkpoint_every=1", "trainer.steps=2", f"run_dir={tmp_path}"])
    with RunDir(tmp_path, cfg) as run:
        path, state = run.load_latest_checkpoint(check=check_shards)
    assert path.name == "step_0000001" and state["step"] == 1
