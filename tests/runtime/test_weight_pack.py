"""The weight-sync wire format of the vllm backend (no vLLM needed: runs in every venv)."""

import torch

from harness.runtime.rollout.vllm_ext import pack_bucket, unpack_bucket


def test_pack_roundtrip_keeps_names_dtypes_shapes_and_values():
    tensors = {
        "model.embed_tokens.weight": torch.randn(7, 5),
        "model.norm.weight": torch.randn(5).bfloat16(),
        "odd": torch.randn(3, 3).double(),
        "ids": torch.arange(3),
        "flags": torch.tensor([True, False, True]),
        "transposed": torch.randn(4, 6).t(),  # non-contiguous input
        "scalar": torch.tensor(2.5),
    }
    meta, blob = pack_bucket(list(tensors.items()))
    assert all(start % 64 == 0 for _, _, _, start, _ in meta)  # aligned: views need it
    out = dict(unpack_bucket(meta, bytes(blob)))  # bytes: what arrives on the worker
    assert list(out) == list(tensors)
    for name, t in tensors.items():
        assert out[name].dtype == t.dtype and out[name].shape == t.shape
        assert torch.equal(out[name], t)


def test_empty_bucket():
    meta, blob = pack_bucket([])
    assert meta == [] and unpack_bucket(meta, bytes(blob)) == []


def test_shared_memory_file_roundtrip(tmp_path):
    import numpy as np

    from harness.runtime.rollout.vllm_ext import _views, write_bucket_file

    tensors = {"w": torch.randn(33, 17), "b": torch.randn(17).bfloat16(), "i": torch.arange(5)}
    path = str(tmp_path / "bucket")
    meta = write_bucket_file(list(tensors.items()), path)
    out = dict(_views(meta, torch.from_numpy(np.array(np.memmap(path, dtype=np.uint8, mode="r")))))
    for name, t in tensors.items():
        assert out[name].dtype == t.dtype and torch.equal(out[name], t)
