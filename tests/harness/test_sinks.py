"""Trackers mirror metrics.jsonl (TensorBoard event files, an offline W&B run, an MLflow file
store) and a failing one never changes the run."""

import glob
import json
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from harness.commands.cli import main

pytestmark = pytest.mark.integration


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def numeric(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def test_tensorboard_scalars_equal_metrics_jsonl(tmp_path, fast_run):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    main(["run", *fast_run, "logging.sinks=[jsonl,tensorboard]", f"run_dir={run_dir}"])
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0}).Reload()
    rows = metrics(run_dir)
    expected = {(k, r["step"]): v for r in rows for k, v in numeric(r).items()}
    got = {(tag, e.step): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}
    assert set(got) == set(expected) and len(got) > 50
    assert all(got[key] == np.float32(value) for key, value in expected.items())  # TensorBoard stores float32
    assert "config" in " ".join(events.Tags()["tensors"])  # the resolved config rides along as text


def _wandb_records(run_file: str) -> tuple[list[dict], list, list[str]]:
    """History rows, run records and all record types of an offline W&B run file (a LevelDB-style log of
    protobuf records)."""
    from wandb.proto import wandb_internal_pb2

    raw, block, pos, chunks, out, runs, kinds = Path(run_file).read_bytes(), 32768, 7, [], [], [], []  # 7: header
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # a block's tail too short for a record header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if pos + 7 + length > len(raw):  # the writer is mid-record: read what is complete
            break
        chunks.append(raw[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            kinds.append(record.WhichOneof("record_type"))
            if record.WhichOneof("record_type") == "history":
                out.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
            elif record.WhichOneof("record_type") == "run":
                runs.append(record.run)
    return out, runs, kinds


def _finished_wandb_records(run_file: str, wait_s: float = 60.0) -> tuple[list[dict], list, list[str]]:
    """The records once the file ends with the run's exit record: wandb-core's writer is a separate process
    whose buffered file can lag ``run.finish()`` returning on a loaded machine (seen in CI: header only, and a
    half-flushed record that does not parse). A read that fails while the writer may still be writing is retried."""
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + wait_s
    while True:
        try:
            records = _wandb_records(run_file)
        except DecodeError:
            if time.monotonic() >= deadline:
                raise
            records = None
        if records is not None and ("exit" in records[2] or time.monotonic() >= deadline):
            return records
        time.sleep(0.5)


def test_offline_wandb_run_holds_the_same_scalars(tmp_path, fast_run, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "sweep" / "grpo-seed0"
    main(["run", *fast_run, "logging.sinks=[jsonl,wandb]", f"run_dir={run_dir}"])
    [run_file] = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    history, runs, kinds = _finished_wandb_records(run_file)
    assert len(runs) == 1, f"one run record expected; the file holds {kinds}"
    assert runs[0].run_group == "sweep" and runs[0].job_type == "grpo"  # a sweep's runs appear grouped
    rows = metrics(run_dir)
    assert [h["_step"] for h in history] == [r["step"] for r in rows]
    for h, r in zip(history, rows):
        assert {k: h[k] for k in numeric(r)} == pytest.approx(numeric(r))


def test_mlflow_file_store_holds_the_same_scalars(tmp_path, fast_run):
    mlflow = pytest.importorskip("mlflow")
    run_dir = tmp_path / "run"
    main(["run", *fast_run, "logging.sinks=[jsonl,mlflow]", f"run_dir={run_dir}"])
    client = mlflow.tracking.MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    rows = metrics(run_dir)
    for key in ("reward/mean", "eval/arith/accuracy", "policy/grad_norm"):
        history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        assert history == pytest.approx({r["step"]: r[key] for r in rows if key in r}), key
    assert run.data.params["algo.name"] == "grpo" and run.data.tags["algo"] == "grpo"


def test_a_sink_that_always_fails_changes_nothing(tmp_path, fast_run, monkeypatch, capsys):
    pytest.importorskip("tensorboard")
    import harness.rundir.sinks

    calls = []

    def broken(self, metrics, step):
        calls.append(step)
        raise ConnectionError("quota exceeded")

    monkeypatch.setattr(harness.rundir.sinks.TensorBoardSink, "log", broken)
    plain, mirrored = tmp_path / "plain", tmp_path / "mirrored"
    main(["run", *fast_run, f"run_dir={plain}"])
    main(["run", *fast_run, "logging.sinks=[jsonl,tensorboard]", f"run_dir={mirrored}"])  # exits normally
    out = capsys.readouterr().out
    assert out.count("logging sink tensorboard failed") == 1 and "quota exceeded" in out  # warned once
    assert calls == [0]  # then switched off: no retries slow the run
    drop = ("perf/", "budget/wall_s")
    same = [[{k: v for k, v in r.items() if not k.startswith(drop)} for r in metrics(d)] for d in (plain, mirrored)]
    assert same[0] == same[1]
    assert json.loads((mirrored / "run.json").read_text())["status"] == "finished"


def test_unknown_sink_is_refused_with_a_suggestion(tmp_path, fast_run):
    with pytest.raises(SystemExit, match="unknown sink 'tensorbord' \\(did you mean 'tensorboard'\\?\\)"):
        main(["run", *fast_run, "logging.sinks=[jsonl,tensorbord]", f"run_dir={tmp_path}"])
