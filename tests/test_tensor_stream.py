"""The streamed safetensors writer against safetensors' own reader and writer."""

from __future__ import annotations

import io
import itertools
import json
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load, save

from curvcal.report.tensor_stream import header_bytes, write_stream


def _tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "v0/conv.weight": torch.randn(4, 1, 3, 3, generator=generator, dtype=torch.float32),
        "v0/conv.bias": torch.randn(4, generator=generator, dtype=torch.float32),
        "v1/conv.weight": torch.randn(4, 1, 3, 3, generator=generator, dtype=torch.float32),
        "v1/scalar": torch.tensor(2.5, dtype=torch.float32),
        "v1/odd": torch.randn(3, generator=generator, dtype=torch.float32),  # 12 bytes
    }


def _streamed(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    entries = [(name, t.dtype, tuple(t.shape)) for name, t in tensors.items()]
    out = io.BytesIO()
    write_stream(out, entries, metadata, iter(tensors.values()))
    return out.getvalue()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_safetensors_reads_back_every_tensor_and_the_metadata(dtype: torch.dtype, tmp_path) -> None:
    tensors = {name: t.to(dtype) for name, t in _tensors().items()}
    metadata = {"format": "curvcal-eigenvectors", "eigenvalues": json.dumps([3.5, 1.25])}
    data = _streamed(tensors, metadata)
    loaded = load(data)  # safetensors' own parser validates offsets, dtypes and sizes
    assert set(loaded) == set(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == dtype and torch.equal(loaded[name], tensor)
    path = tmp_path / "v.safetensors"
    path.write_bytes(data)
    with safe_open(str(path), framework="pt") as handle:
        assert handle.metadata() == metadata
    # the same tensors as safetensors' own writer stores (its layout may order them otherwise)
    reference = load(save(tensors, metadata=metadata))
    assert len(save(tensors, metadata=metadata)) - len(data) in range(-64, 65)
    assert all(torch.equal(reference[n], loaded[n]) for n in tensors)


def test_the_header_is_padded_to_eight_bytes_and_offsets_are_back_to_back() -> None:
    tensors = _tensors()
    header = header_bytes([(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()], {})
    (length,) = struct.unpack("<Q", header[:8])
    assert length == len(header) - 8 and length % 8 == 0
    parsed = json.loads(header[8:])
    offsets = [parsed[name]["data_offsets"] for name in tensors]
    assert offsets[0][0] == 0
    assert all(a[1] == b[0] for a, b in itertools.pairwise(offsets))
    assert offsets[-1][1] == sum(t.numel() * 4 for t in tensors.values())


def test_a_tensor_other_than_declared_is_refused() -> None:
    out = io.BytesIO()
    with pytest.raises(RuntimeError, match=r"tensor a: .* declared"):
        write_stream(out, [("a", torch.float32, (3,))], {}, iter([torch.zeros(4)]))
    with pytest.raises(ValueError):  # fewer tensors than entries
        write_stream(io.BytesIO(), [("a", torch.float32, (3,))], {}, iter([]))


def test_no_tensors_is_a_valid_empty_file() -> None:
    out = io.BytesIO()
    write_stream(out, [], {"format": "x"}, iter([]))
    assert load(out.getvalue()) == {}


def test_every_tensor_is_aligned_to_its_dtype() -> None:
    """Wider dtypes first, every offset is a multiple of its dtype's size and safetensors reads
    the file; a float64 tensor after 12 bytes of float32 (offset 12) is refused before any byte
    is written."""
    ordered = {
        "wide": torch.arange(3, dtype=torch.float64),
        "odd": torch.ones(3, dtype=torch.float32),
        "half": torch.ones(1, dtype=torch.bfloat16),
    }
    data = _streamed(ordered, {})
    parsed = json.loads(data[8 : 8 + struct.unpack("<Q", data[:8])[0]])
    for name, tensor in ordered.items():
        assert parsed[name]["data_offsets"][0] % tensor.element_size() == 0
    assert all(torch.equal(load(data)[n], t) for n, t in ordered.items())
    out = io.BytesIO()
    misaligned = {"odd": ordered["odd"], "wide": ordered["wide"]}
    with pytest.raises(ValueError, match=r"tensor wide: offset 12 .* 8-byte dtype F64"):
        write_stream(
            out,
            [(n, t.dtype, tuple(t.shape)) for n, t in misaligned.items()],
            {},
            iter(misaligned.values()),
        )
    assert out.getvalue() == b""
