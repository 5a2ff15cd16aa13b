"""Read and write dictionaries of tensors in ``.pt``, ``.npz`` and ``.safetensors`` files.

Shared by the dataset loader (``x``/``y`` files) and the logits loader. Reading is always safe:
``.pt`` through ``torch.load(weights_only=True)``, ``.npz`` with ``allow_pickle=False``. Every
failure is an :class:`~curvcal.errors.InputError` naming the file.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from curvcal.atomic import atomic_output
from curvcal.errors import InputError
from curvcal.load.files.state_dict import tensor_problem
from curvcal.load.limits import check_npy_members, check_zip_sizes
from curvcal.paths import readable_file

TENSOR_FILE_SUFFIXES = (".pt", ".npz", ".safetensors")


def is_tensor_file(path: Path) -> bool:
    """True when the suffix is one of :data:`TENSOR_FILE_SUFFIXES` (``.pth`` counts as ``.pt``)."""
    return path.suffix.lower() in (*TENSOR_FILE_SUFFIXES, ".pth")


def _known_suffix(path: Path) -> str:
    """The lower-case suffix of a tensor file, refused when it names no format curvcal reads."""
    suffix = path.suffix.lower()
    if suffix not in (*TENSOR_FILE_SUFFIXES, ".pth"):
        from curvcal.load.files.formats import foreign_format

        found = foreign_format(path) if path.exists() else None
        raise InputError(
            str(path),
            f"is {found}, not a file of tensors"
            if found
            else f"unknown file type '{path.suffix or '(none)'}'",
            "use a .pt, .npz or .safetensors file",
        )
    return suffix


def read_tensor_file(path: Path) -> dict[str, torch.Tensor]:
    """Read every tensor stored in ``path`` (on the CPU), keyed by name."""
    suffix = _known_suffix(path)
    readable_file(path)
    try:
        if suffix == ".npz":
            tensors = _read_npz(path)
        elif suffix == ".safetensors":
            from safetensors.torch import load_file

            tensors = dict(load_file(str(path), device="cpu"))
        else:
            tensors = _read_pt(path)
    except InputError:
        raise
    except Exception as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(
            str(path), f"cannot be read as a {suffix} file ({reason})", "is it truncated?"
        ) from exc
    return {key: _computable(path, key, tensor) for key, tensor in tensors.items()}


#: dtypes torch stores but computes little with: 8-bit floats, and unsigned integers past uint8
_STORAGE_ONLY_FLOATS = {
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, name)
}
_WIDE_UNSIGNED = {
    getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)
}


def _computable(path: Path, key: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as a dense tensor curvcal can compute with; an InputError naming the file and
    the tensor for a sparse or meta tensor, an 8-bit float, or an unsigned integer past int64
    (wide unsigned integers within it become int64)."""
    why = tensor_problem(tensor)
    if why is not None:
        raise InputError(str(path), f"'{key}' is {why}")
    if tensor.dtype in _STORAGE_ONLY_FLOATS:
        raise InputError(
            str(path),
            f"'{key}' has dtype {str(tensor.dtype).removeprefix('torch.')}, which curvcal does "
            "not compute with",
            "store float16, bfloat16, float32 or float64",
        )
    if tensor.dtype in _WIDE_UNSIGNED:
        array = tensor.numpy()
        if array.size and int(array.max()) > 2**63 - 1:
            raise InputError(
                str(path),
                f"'{key}' ({str(tensor.dtype).removeprefix('torch.')}) holds {int(array.max())}, "
                "outside the 64-bit signed range curvcal computes in",
            )
        return torch.from_numpy(array.astype("int64"))
    return tensor


def read_safetensors_metadata(path: Path) -> dict[str, str]:
    """The string metadata of a ``.safetensors`` file (empty when it has none)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            return dict(handle.metadata() or {})
    except Exception as exc:
        raise InputError(str(path), f"cannot be read as a .safetensors file ({exc})") from exc


def read_safetensors_shapes(path: Path) -> list[tuple[int, ...]]:
    """The shape of every tensor of a ``.safetensors`` file, from its header (no tensor read)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            keys = handle.keys()  # a safe_open handle is not iterable itself
            return [tuple(handle.get_slice(key).get_shape()) for key in keys]
    except Exception as exc:
        raise InputError(str(path), f"cannot be read as a .safetensors file ({exc})") from exc


def _read_npz(path: Path) -> dict[str, torch.Tensor]:
    import zipfile

    import numpy as np

    if not zipfile.is_zipfile(path):  # numpy would try it as a pickle, or as one .npy array
        with open(path, "rb") as handle:
            start = handle.read(6)
        if start == b"\x93NUMPY":
            raise InputError(
                str(path),
                "is one .npy array, not an .npz archive",
                "save named arrays with numpy.savez",
            )
        reason = (
            "it is empty"
            if not start
            else "the zip archive is cut short"
            if start.startswith(b"PK")
            else "it is not a zip archive of arrays"
        )
        raise InputError(str(path), f"cannot be read as a .npz file ({reason})", "is it truncated?")

    check_zip_sizes(path)
    check_npy_members(path)
    with np.load(path, allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    tensors = {}
    for key, array in arrays.items():
        if array.dtype.kind not in "biuf":
            raise InputError(
                str(path), f"array '{key}' has dtype {array.dtype}; only numbers are read"
            )
        tensors[key] = torch.from_numpy(np.ascontiguousarray(array))
    return tensors


def _read_pt(path: Path) -> dict[str, torch.Tensor]:
    check_zip_sizes(path)
    try:
        with warnings.catch_warnings():
            # torch warns while validating a sparse tensor: the refusal of its layout says it
            warnings.simplefilter("ignore", UserWarning)
            content = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        if "Unsupported global" in str(exc):
            raise InputError(
                str(path),
                "holds Python objects other than tensors and is not loaded",
                "save a plain dict of tensors, e.g. torch.save({'x': x, 'y': y}, path)",
            ) from exc
        # Corrupt bytes also fail inside the weights-only unpickler; its message leads with
        # advice about weights_only=False, which would be wrong here: keep only the cause.
        cause = str(exc).partition("WeightsUnpickler error:")[2].partition("Check the doc")[0]
        reason = " ".join((cause or str(exc)).split()) or type(exc).__name__
        raise InputError(
            str(path), f"cannot be read as a .pt file ({reason})", "is it truncated or corrupt?"
        ) from exc
    if not isinstance(content, Mapping):
        raise InputError(
            str(path),
            f"holds a {type(content).__name__}, not a dict of tensors",
            "save a dict, e.g. torch.save({'x': x, 'y': y}, path)",
        )
    tensors = {}
    for key, value in content.items():
        if isinstance(value, torch.Tensor):
            tensors[str(key)] = value
    return tensors


def write_tensor_file(
    path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``tensors`` to ``path`` in the format its suffix names, atomically.

    The file is written to a temporary file in the same folder and moved into place with
    ``os.replace``, so a reader never sees half a file. ``metadata`` is kept only by
    ``.safetensors``.
    """
    suffix = _known_suffix(path)
    plain = {key: t.detach().to("cpu").contiguous() for key, t in tensors.items()}
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(str(path), f"folder {folder} does not exist")
    with atomic_output(path) as stream:
        if suffix == ".npz":
            import numpy as np

            arrays: dict[str, Any] = {key: t.numpy() for key, t in plain.items()}
            np.savez(stream, **arrays)
        elif suffix == ".safetensors":
            from safetensors.torch import save

            stream.write(save(plain, metadata=dict(metadata) if metadata else None))
        else:
            torch.save(plain, stream)


def as_labels(values: torch.Tensor, what: str) -> torch.Tensor:
    """Check class labels and return them as int64 ``(N,)``.

    Integer tensors are accepted; floating tensors only when every value is a whole number
    (a common result of saving through numpy). Negative labels are rejected. One-hot labels,
    ``(N, K)`` with K ≥ 2 and each row all zeros but a single one (any dtype, bool too), are
    their argmax; other 2-D labels (soft or multi-label targets) are refused with the first
    row that is not one-hot.
    """
    if values.dim() == 2 and values.shape[1] >= 2:
        values = _one_hot_indices(values, what)
    if values.dim() != 1:
        raise InputError(what, f"labels must be one-dimensional, got shape {tuple(values.shape)}")
    if values.dtype == torch.bool or values.is_complex():
        raise InputError(what, f"labels must be integers, got dtype {values.dtype}")
    if values.is_floating_point():
        finite = torch.isfinite(values)
        whole = finite & (values == torch.round(values)) & (values.abs() < 2.0**63)
        if not bool(whole.all()):
            row = int((~whole).nonzero()[0, 0])
            raise InputError(
                what,
                f"label {row} is {values[row].item()!r}; labels must be whole numbers "
                "in the 64-bit range",
            )
    labels = values.to(torch.int64)
    if labels.numel() and int(labels.min()) < 0:
        row = int((labels < 0).nonzero()[0, 0])
        raise InputError(what, f"label {row} is {int(labels[row])}; labels must be >= 0")
    return labels


def _one_hot_indices(values: torch.Tensor, what: str) -> torch.Tensor:
    """The class index of each row of one-hot labels ``(N, K)``; an :class:`InputError` naming
    the first row that is not one 1 among zeros."""
    if values.is_complex():
        raise InputError(what, f"labels must be integers, got dtype {values.dtype}")
    numbers = values.to(torch.float64)
    one_hot = ((numbers == 0) | (numbers == 1)).all(dim=1) & (numbers.sum(dim=1) == 1)
    if not bool(one_hot.all()):
        row = int((~one_hot).nonzero()[0, 0])
        cells = ", ".join(f"{float(v):g}" for v in numbers[row, :6])
        more = ", ..." if numbers.shape[1] > 6 else ""
        raise InputError(
            what,
            f"labels have shape {tuple(values.shape)} but row {row} ([{cells}{more}]) is not "
            "one-hot; soft or multi-label targets are not class labels",
            "give one integer class per sample, shape (N,)",
        )
    return numbers.argmax(dim=1)
