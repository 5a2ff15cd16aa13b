"""Recognise a checkpoint file from its bytes, without unpickling or running anything.

Containers recognised (by content; the extension is only used in the error message):

- ``torch-zip``: :func:`torch.save` since PyTorch 1.6, a zip with ``<name>/data.pkl``;
- ``torchscript``: :func:`torch.jit.save`, a zip with ``code/`` and ``constants.pkl``;
- ``pt2``: :func:`torch.export.save`, a zip with ``archive_format`` (``pt2``) or the older
  ``serialized_exported_program.json``;
- ``safetensors``: 8-byte little-endian header length, a JSON header, then raw tensor bytes;
- ``torch-legacy``: the pre-1.6 :func:`torch.save` layout, consecutive pickles, the first of
  which is torch's magic number;
- ``pickle``: any other pickle (protocol 2 to 5), such as :func:`pickle.dump` writes: not a
  checkpoint; only its globals are read, for ``curvcal inspect``.

Pickle globals are found by reading opcodes (:mod:`pickletools`), which never executes them.
"""

from __future__ import annotations

import _compat_pickle
import io
import json
import os
import pickle
import pickletools
import struct
import zipfile
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch

from curvcal import jsontext
from curvcal.errors import InputError, one_line
from curvcal.load.limits import open_zip
from curvcal.paths import readable_file

KNOWN_EXTENSIONS = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".pt2", ".tar")

_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_PROTO = 0x80
_SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024
# Legacy torch.save writes magic number, protocol version and system info, then the object,
# then the storage keys (five pickles), then raw storage bytes.
_LEGACY_PICKLES = 5


@dataclass(frozen=True)
class TensorSpec:
    """A tensor as a checkpoint stores it: name, shape, dtype name (``float32``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Container:
    """What a file is, as far as its bytes tell without running it.

    ``members`` are the zip member names without the archive's top folder; ``pickle_name`` is
    the member holding the main pickle (zip) or ``None``; ``header`` is the parsed safetensors
    header.
    """

    kind: str  # torch-zip | torchscript | pt2 | safetensors | torch-legacy | pickle
    members: tuple[str, ...] = ()
    pickle_name: str | None = None
    header: Mapping[str, Any] = field(default_factory=dict)


def sniff(path: Path) -> Container:
    """Identify the container of ``path``; raise :class:`InputError` naming the file otherwise."""
    what = str(path)
    size = readable_file(path, expected="checkpoint file").st_size
    if size == 0:
        raise InputError(what, "is empty (0 bytes)")
    with path.open("rb") as handle:
        head = handle.read(8)
    if head.startswith(_ZIP_MAGIC):
        return _sniff_zip(path)
    # safetensors first: its header length may begin with the pickle PROTO byte.
    if len(head) == 8:
        header = _safetensors_header(path, size)
        if header is not None:
            return Container(kind="safetensors", header=header)
    if head[0] == _PICKLE_PROTO and len(head) > 1 and 2 <= head[1] <= 5:
        return Container(kind="torch-legacy" if _starts_with_torch_magic(path) else "pickle")
    refuse_foreign(path, head)
    suffix = path.suffix or "(none)"
    known = ", ".join(KNOWN_EXTENSIONS)
    if path.suffix.lower() not in KNOWN_EXTENSIONS:
        why = f"unknown checkpoint extension {suffix} and unrecognised content"
    else:
        why = f"content is not a checkpoint (not a torch zip, safetensors or pickle; {size} bytes)"
    raise InputError(what, why, f"curvcal reads {known} files written by torch or safetensors")


# -- formats of other frameworks: named, with the routes that work ----------------------------

ONNX = "an ONNX model"
KERAS = "a Keras/HDF5 model"
SAVED_MODEL = "a TensorFlow SavedModel"
FLAX = "Flax weights (msgpack)"
GGUF = "a GGUF file (llama.cpp)"

#: What each foreign format can become: weights curvcal reads, or logits for ``curvcal metrics``.
_ROUTES = {
    ONNX: "an ONNX graph has no autograd for the Hessian: run it and give its logits and labels "
    "(.npz) to curvcal metrics, or measure the PyTorch model it was exported from",
    KERAS: "run it and give its logits and labels (.npz) to curvcal metrics; for curvature, "
    "rebuild the network in PyTorch and save its weights as safetensors",
    SAVED_MODEL: "run it and give its logits and labels (.npz) to curvcal metrics; for "
    "curvature, rebuild the network in PyTorch and save its weights as safetensors",
    FLAX: "transformers converts them: from_pretrained(FOLDER, from_flax=True) then "
    "save_pretrained writes model.safetensors; or give logits and labels (.npz) to curvcal metrics",
    GGUF: "convert the weights to safetensors for the PyTorch model (transformers reads GGUF "
    "with from_pretrained(..., gguf_file=...)), or give logits and labels (.npz) to curvcal metrics",
}
_FOREIGN_SUFFIXES = {
    ".onnx": ONNX,
    ".h5": KERAS,
    ".hdf5": KERAS,
    ".keras": KERAS,
    ".msgpack": FLAX,
    ".gguf": GGUF,
}
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_GGUF_MAGIC = b"GGUF"
_SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")


def foreign_format(path: Path, head: bytes = b"") -> str | None:
    """The other framework's format ``path`` holds (:data:`ONNX`, :data:`KERAS`,
    :data:`SAVED_MODEL`, :data:`FLAX`, :data:`GGUF`), from its name, its first bytes ``head``
    (HDF5's and GGUF's signatures) or, for a folder, a ``saved_model.pb`` in it; ``None`` for
    anything else. Reads nothing but ``head`` and the folder's listing."""
    if os.path.isdir(path):  # never raises (a name too long is simply not a folder)
        return SAVED_MODEL if any((path / name).is_file() for name in _SAVED_MODEL_FILES) else None
    if path.name in _SAVED_MODEL_FILES:
        return SAVED_MODEL
    if head.startswith(_HDF5_MAGIC):
        return KERAS
    if head.startswith(_GGUF_MAGIC):
        return GGUF
    return _FOREIGN_SUFFIXES.get(path.suffix.lower())


def raise_foreign(path: Path, name: str, instead: str = "") -> None:
    """Refuse ``path``, a file of the foreign format ``name``, saying what works instead."""
    raise InputError(
        str(path),
        f"is {name}, which curvcal does not read; it reads PyTorch checkpoints "
        f"({', '.join(KNOWN_EXTENSIONS)}) and model folders",
        instead or _ROUTES[name],
    )


def refuse_foreign(path: Path, head: bytes) -> None:
    """:func:`raise_foreign` when the file ``path``, whose first bytes are ``head`` and which no
    content test recognised, is of another framework's format; nothing otherwise."""
    found = foreign_format(path, head)
    if found is not None:
        raise_foreign(path, found)


def refuse_foreign_folder(path: Path) -> None:
    """:func:`raise_foreign` when the folder ``path`` is a TensorFlow SavedModel; nothing for
    anything else (a file, a missing path, another folder)."""
    if os.path.isdir(path) and foreign_format(path) is not None:
        raise_foreign(path, SAVED_MODEL)


def _starts_with_torch_magic(path: Path) -> bool:
    """Whether the first pickle in ``path`` is the legacy :func:`torch.save` magic number (an
    integer pickled on its own); read opcode by opcode, never unpickled."""
    with path.open("rb") as handle:
        head = io.BytesIO(handle.read(64))
    try:
        for opcode, arg, _pos in pickletools.genops(head):
            if opcode.name in ("PROTO", "FRAME"):
                continue
            return opcode.name in ("LONG1", "LONG4") and arg == torch.serialization.MAGIC_NUMBER
    except (ValueError, EOFError, struct.error):
        return False
    return False


def plain_pickle_globals(path: Path) -> tuple[str, ...]:
    """Every global a plain (non-torch) pickle file would import, read opcode by opcode without
    running anything; :class:`InputError` when the pickle is truncated or corrupt."""
    try:
        with _BoundedReader(path) as stream:
            return pickle_globals(stream).names
    except (ValueError, EOFError, IndexError, struct.error) as exc:
        raise InputError(str(path), f"truncated or corrupt pickle ({one_line(exc, 200)})") from exc


def _sniff_zip(path: Path) -> Container:
    what = str(path)
    try:
        with open_zip(path) as archive:
            names = archive.namelist()
            bad = archive.testzip()
            archive_format = _read_member(archive, names, "archive_format")
    except (
        zipfile.BadZipFile,
        OSError,
        EOFError,
        ValueError,
        NotImplementedError,  # an unsupported zip version or compression method
        zlib.error,  # a deflated member that does not inflate
    ) as exc:
        raise InputError(what, f"truncated or corrupt zip archive ({one_line(exc, 200)})") from exc
    if bad is not None:
        raise InputError(what, f"corrupt zip archive (member {bad} fails its CRC check)")
    members = tuple(_strip_top(names))
    member_set = set(members)
    if archive_format is not None or "serialized_exported_program.json" in member_set:
        return Container(kind="pt2", members=members)
    if "constants.pkl" in member_set and any(m.startswith("code/") for m in members):
        return Container(kind="torchscript", members=members)
    if "data.pkl" in member_set:
        return Container(kind="torch-zip", members=members, pickle_name="data.pkl")
    if path.suffix.lower() == ".keras" or {"config.json", "model.weights.h5"} <= member_set:
        raise_foreign(path, KERAS)
    raise InputError(
        what,
        "is a zip archive but not a torch checkpoint (no data.pkl, TorchScript code or pt2 layout)",
    )


def _read_member(archive: zipfile.ZipFile, names: list[str], leaf: str) -> bytes | None:
    for name in names:
        if name == leaf or name.endswith("/" + leaf):
            return archive.read(name)
    return None


def _strip_top(names: Iterable[str]) -> list[str]:
    """Member names without torch's single top-level folder (the archive's stem)."""
    names = list(names)
    tops = {n.split("/", 1)[0] for n in names if "/" in n}
    if len(tops) == 1 and all("/" in n for n in names):
        return [n.split("/", 1)[1] for n in names]
    return names


def _safetensors_header(path: Path, size: int) -> dict[str, Any] | None:
    """The parsed header if the file has a safetensors layout, ``None`` if it plainly does not;
    :class:`InputError` when it starts like one but is truncated or inconsistent."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        if length < 2 or length > _SAFETENSORS_MAX_HEADER:
            return None
        first = handle.read(1)
        if first != b"{":
            return None
        if 8 + length > size:
            raise InputError(str(path), "truncated safetensors file (header runs past the end)")
        raw = first + handle.read(length - 1)
    try:
        header = jsontext.loads(raw, f"{path} (its safetensors header)")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(header, dict):
        return None
    data_end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            if entry is not None and not (
                isinstance(entry, dict) and all(isinstance(v, str) for v in entry.values())
            ):
                raise InputError(str(path), "corrupt safetensors header (__metadata__)")
            continue
        if not _safetensors_entry_ok(entry):
            raise InputError(str(path), f"corrupt safetensors header (entry {name!r})")
        claimed = _safetensors_nbytes(entry)
        begin, end = entry["data_offsets"]
        if claimed is not None and claimed != end - begin:
            raise InputError(
                str(path),
                f"corrupt safetensors header: {name!r} claims shape {entry['shape']} of "
                f"{entry['dtype']} ({claimed:,} bytes) in {end - begin:,} bytes",
            )
        data_end = max(data_end, entry["data_offsets"][1])
    if 8 + length + data_end > size:
        raise InputError(
            str(path),
            f"truncated safetensors file ({size} bytes, the header describes {8 + length + data_end})",
        )
    return header


def _safetensors_entry_ok(entry: Any) -> bool:
    """A tensor entry as the format defines it: a dtype name, a shape of naturals and two
    ordered offsets (everything later code reads from the header without checking again)."""

    def natural(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str):
        return False
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    return (
        isinstance(shape, list)
        and all(natural(d) for d in shape)
        and isinstance(offsets, list)
        and len(offsets) == 2
        and all(natural(o) for o in offsets)
        and offsets[0] <= offsets[1]
    )


#: bytes per element of the safetensors dtypes (others are left to the safetensors library)
_SAFETENSORS_ITEMSIZE = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "C64": 8,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}  # fmt: skip


def _safetensors_nbytes(entry: Mapping[str, Any]) -> int | None:
    """Bytes the entry's shape and dtype need (``None`` for a dtype not listed above)."""
    size = _SAFETENSORS_ITEMSIZE.get(entry["dtype"])
    if size is None:
        return None
    for dim in entry["shape"]:
        size *= dim
    return size


def safetensors_specs(header: Mapping[str, Any]) -> tuple[TensorSpec, ...]:
    """Tensor names, shapes and dtypes from a safetensors header (file order)."""
    entries = [(k, v) for k, v in header.items() if k != "__metadata__"]
    entries.sort(key=lambda item: item[1]["data_offsets"][0])
    return tuple(
        TensorSpec(
            name, tuple(int(d) for d in v["shape"]), _SAFETENSORS_DTYPES.get(v["dtype"], v["dtype"])
        )
        for name, v in entries
    )


def safetensors_metadata(header: Mapping[str, Any]) -> dict[str, str]:
    meta = header.get("__metadata__") or {}
    return {str(k): str(v) for k, v in meta.items()}


_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def _pickle_stream(path: Path, container: Container) -> BinaryIO:
    """The main pickle of a torch zip (in memory), or the legacy file itself."""
    if container.kind == "torch-legacy":
        return _BoundedReader(path)
    with open_zip(path) as archive:
        data = _read_member(archive, archive.namelist(), container.pickle_name or "data.pkl")
    return io.BytesIO(data or b"")


class _BoundedReader(io.FileIO):
    """A file whose reads never ask for more than what is left of it: a corrupt length in a
    pickle opcode (up to 2**64) then reads short, which the opcode reader reports as a
    ValueError, instead of allocating that many bytes first."""

    def read(self, size: int | None = -1) -> bytes:
        if size is not None and size > 0:
            size = min(size, max(0, self._size - self.tell()))
        return super().read(size)

    def __init__(self, path: Path) -> None:
        super().__init__(path, "rb")
        self._size = path.stat().st_size


def pickle_globals(stream: BinaryIO, n_pickles: int = 1, object_index: int = 0) -> PickleGlobals:
    """Every global (``module.name``) the next ``n_pickles`` pickles in ``stream`` would import,
    and the global that builds the top-level object of pickle number ``object_index`` (``None``
    when that object is a plain dict, list or scalar).

    Reads opcodes only, never executes them. ``STACK_GLOBAL`` takes its names from the two
    strings pushed before it, whether pushed as literals or fetched back from the memo
    (``MEMOIZE``/``PUT`` then ``GET``: a pickle can stash ``'posix'`` and ``'system'``, push
    decoys, and fetch the real names just before ``STACK_GLOBAL``); when those are not strings
    it is recorded as ``<computed>``.
    """
    found: list[str] = []
    top_level: str | None = None
    for index in range(n_pickles):
        strings: list[str] = []
        first_op: str | None = None
        memo: dict[int, str | None] = {}
        last: str | None = None  # the string the last opcode pushed (None: not a string)
        for opcode, arg, _pos in pickletools.genops(stream):
            name = opcode.name
            slot = arg if isinstance(arg, int) else -1  # the memo index of PUT and GET ops
            if name in _GET_OPS and isinstance(memo.get(slot), str):
                last = memo[slot]
                strings.append(str(last))
                continue
            if name in _STRING_OPS:
                last = str(arg)
                strings.append(last)
                continue
            if name == "MEMOIZE":
                memo[len(memo)] = last
                continue
            if name in _PUT_OPS:
                memo[slot] = last
                continue
            if name in _NEUTRAL_OPS:
                continue
            last = None
            if name == "GLOBAL":
                qualified = _python3_name(*str(arg).split(" ", 1))
            elif name == "STACK_GLOBAL":
                qualified = _python3_name(*strings[-2:]) if len(strings) >= 2 else "<computed>"
            else:
                first_op = first_op or name
                continue
            if first_op is None and index == object_index:
                top_level = qualified
            first_op = first_op or name
            if qualified not in found:
                found.append(qualified)
    return PickleGlobals(tuple(found), top_level)


def _python3_name(module: str, name: str = "") -> str:
    """``module.name`` as Python 3 resolves a protocol-2 global (``__builtin__`` -> ``builtins``)."""
    module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
    module = _compat_pickle.IMPORT_MAPPING.get(module, module)
    return f"{module}.{name}"


@dataclass(frozen=True)
class PickleGlobals:
    """Globals a pickle imports (in order of appearance) and the one building its top object."""

    names: tuple[str, ...]
    top_level: str | None


_STRING_OPS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"})
_NEUTRAL_OPS = frozenset({"PROTO", "FRAME", "MARK"})
_PUT_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_GET_OPS = frozenset({"GET", "BINGET", "LONG_BINGET"})


def unsafe_globals(
    path: Path,
    container: Container,
    allowed: Iterable[str] = (),
    allowed_objects: Iterable[Any] = (),
) -> PickleGlobals:
    """The globals a weights-only load of ``path`` would refuse, and the top-level global.

    The allowlist is torch's own (what ``torch.load(weights_only=True)`` accepts) plus
    ``allowed`` (names) / ``allowed_objects`` (the imported classes). This never unpickles
    anything.
    """
    legacy = container.kind == "torch-legacy"
    try:
        with _pickle_stream(path, container) as stream:
            if legacy:
                scanned = pickle_globals(stream, _LEGACY_PICKLES - 1, _LEGACY_PICKLES - 2)
            else:
                scanned = pickle_globals(stream)
    except (ValueError, EOFError, IndexError, struct.error, zipfile.BadZipFile) as exc:
        raise InputError(str(path), f"truncated or corrupt pickle ({one_line(exc, 200)})") from exc
    names = list(scanned.names)
    if container.kind == "torch-zip":
        # torch's own static scan is the reference; ours adds STACK_GLOBAL and the top object.
        try:
            with torch.serialization.safe_globals(list(allowed_objects)):
                reported = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
        except (ValueError, RuntimeError, pickle.UnpicklingError, EOFError):
            reported = []
        names += sorted(set(reported) - set(names))
    safe = torch_safe_globals() | set(allowed)
    return PickleGlobals(tuple(g for g in names if g not in safe), scanned.top_level)


def torch_safe_globals() -> set[str]:
    """Names torch's weights-only unpickler accepts by default (and any the user allowlisted
    through :func:`torch.serialization.safe_globals`)."""
    from torch import _weights_only_unpickler as wou

    names = set(wou._get_allowed_globals().keys())
    names |= set(wou._get_user_allowed_globals().keys())
    return names


def pt2_weight_specs(path: Path) -> tuple[TensorSpec, ...]:
    """Weight names, shapes and dtypes of a ``torch.export`` archive, from its JSON config."""
    try:
        with open_zip(path) as archive:
            raw = _read_member(
                archive, archive.namelist(), "data/weights/model_weights_config.json"
            )
    except (zipfile.BadZipFile, OSError) as exc:
        raise InputError(str(path), f"corrupt pt2 archive ({one_line(exc, 200)})") from exc
    if raw is None:
        return ()
    specs = []
    # the listing is informative only (an exported program is never loaded without trust):
    # a config that is not UTF-8 JSON of the expected shape lists no weights
    try:
        for name, entry in jsontext.loads(raw, str(path))["config"].items():
            meta = entry.get("tensor_meta", {})
            shape = tuple(int(s.get("as_int", -1)) for s in meta.get("sizes", []))
            specs.append(TensorSpec(name, shape, _pt2_dtype(meta.get("dtype"))))
    except (ValueError, KeyError, TypeError, AttributeError):  # ValueError: bad UTF-8 or JSON
        return ()
    return tuple(specs)


def _pt2_dtype(code: Any) -> str:
    try:
        from torch._export.serde.schema import ScalarType

        name = ScalarType(int(code)).name.lower()
    except (ImportError, ValueError, TypeError):
        return str(code)
    return {"float": "float32", "double": "float64", "half": "float16", "long": "int64"}.get(
        name, name
    )


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def pickle_string_pairs(path: Path, container: Container) -> tuple[tuple[str, str], ...]:
    """The (key, value) pairs of strings a torch zip's pickle holds in its dicts and plain
    objects (``{"arch": "resnet18"}``, an ``argparse.Namespace`` with ``model="resnet18"``),
    in order: each string pushed right after another string, read opcode by opcode without
    running anything. A hint for ``curvcal inspect``, not a parse: a list of strings also
    yields pairs. Empty for other containers and for an unreadable pickle."""
    if container.kind != "torch-zip":
        return ()
    pairs: list[tuple[str, str]] = []
    memo: dict[int, str | None] = {}
    last: str | None = None  # the string the last opcode pushed
    key: str | None = None  # a string waiting for the string after it
    try:
        with _pickle_stream(path, container) as stream:
            for opcode, arg, _pos in pickletools.genops(stream):
                name = opcode.name
                if name in _NEUTRAL_OPS:
                    continue
                if name == "MEMOIZE":
                    memo[len(memo)] = last
                    continue
                if name in _PUT_OPS:
                    memo[arg if isinstance(arg, int) else -1] = last
                    continue
                value = None
                if name in _STRING_OPS:
                    value = str(arg)
                elif name in _GET_OPS:
                    value = memo.get(arg if isinstance(arg, int) else -1)
                last = value
                if value is None:
                    key = None
                elif key is None:
                    key = value
                else:
                    pairs.append((key, value))
                    key = None
    except (ValueError, EOFError, IndexError, struct.error, zipfile.BadZipFile):
        return ()
    return tuple(pairs)
