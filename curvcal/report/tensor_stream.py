"""A safetensors file written a tensor at a time, never whole in memory.

The format (safetensors' own specification): an unsigned 64-bit little-endian header length
n, then n bytes of JSON — ``{"__metadata__": {str: str}, name: {"dtype", "shape",
"data_offsets": [begin, end]}}``, offsets relative to the end of the header, padded with
spaces to a multiple of 8 bytes — then the tensors' bytes (little-endian, C order), back to
back in the order of their offsets, with no gap. Every name, dtype and shape is known before
the first byte of data, so the header is written first and each tensor as it arrives.

Each tensor's offset is a multiple of its dtype's size, as in the files safetensors' own writer
makes (it orders the tensors by alignment): a reader that maps the file may then view every
tensor in place. With no gap allowed, that is the caller's order to keep (wider dtypes first);
an entry that would break it is refused.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import BinaryIO

import torch

#: safetensors' names of the dtypes a curvature vector may have
DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
}


def header_bytes(
    entries: Sequence[tuple[str, torch.dtype, Sequence[int]]], metadata: Mapping[str, str]
) -> bytes:
    """The length field and the JSON header of a file holding ``entries`` (name, dtype, shape)
    back to back in their order. Raises ValueError for an entry whose offset would not be a
    multiple of its dtype's size (a narrower dtype listed before it)."""
    header: dict[str, object] = {"__metadata__": dict(metadata)}
    offset = 0
    for name, dtype, shape in entries:
        if offset % dtype.itemsize:
            raise ValueError(
                f"tensor {name}: offset {offset} is not a multiple of its {dtype.itemsize}-byte "
                f"dtype {DTYPES[dtype]}; list the wider dtypes first"
            )
        size = dtype.itemsize
        for dim in shape:
            size *= int(dim)
        header[name] = {
            "dtype": DTYPES[dtype],
            "shape": [int(dim) for dim in shape],
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_stream(
    out: BinaryIO,
    entries: Sequence[tuple[str, torch.dtype, Sequence[int]]],
    metadata: Mapping[str, str],
    tensors: Iterable[torch.Tensor],
) -> None:
    """Write to ``out`` a safetensors file of ``entries`` (name, dtype, shape), whose values
    ``tensors`` yields one at a time in the same order (each checked against its entry)."""
    if sys.byteorder != "little":  # safetensors stores little-endian values
        raise RuntimeError("writing safetensors needs a little-endian machine")
    out.write(header_bytes(entries, metadata))
    count = 0
    for (name, dtype, shape), tensor in zip(entries, tensors, strict=True):
        if tensor.dtype != dtype or tuple(tensor.shape) != tuple(shape):
            raise RuntimeError(
                f"tensor {name}: {tensor.dtype} {tuple(tensor.shape)}, declared {dtype} "
                f"{tuple(shape)}"
            )
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        out.write(flat.view(torch.uint8).numpy().data)
        count += 1
    if count != len(entries):  # pragma: no cover - zip(strict=True) raises first
        raise RuntimeError(f"{count} tensors written of {len(entries)}")


__all__ = ["DTYPES", "header_bytes", "write_stream"]
