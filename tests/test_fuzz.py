"""Fuzzing the loaders: byte-level mutations of every file format curvcal reads.

Each case takes one good file (a checkpoint in every container curvcal accepts, a tensor-data
file, a logits file, a policy, a report, a calibrator), mutates its bytes with a seeded generator
and runs the cheapest command that reads it, in-process. The contract is the bad-input one, with
the outcome left open: exit 0, 1, 2 or 3 (never 70, "internal error"), no traceback, at most one
``curvcal: error:`` line, no file written anywhere (no output option is given) and the mutated
input byte for byte unchanged.

Beside byte mutations, structured kinds: JSON/TOML values nested up to 200,000 deep and integers
past int64, a float and the int-string limit; sparse, meta, complex, bool and float8 tensors (and
unusual arrays); pickles that call a dangerous global or import a module with a side effect (the
case also checks that nothing was imported or run); and a named pipe in place of the file (a
reader that opens it gets end-of-file rather than hanging, and the case checks nobody did).

CI runs :data:`DEFAULT_CASES` cases from :data:`DEFAULT_SEED`. A long run::

    CURVCAL_FUZZ_CASES=5000 CURVCAL_FUZZ_SEED=1234 python -m pytest -m fuzz tests/test_fuzz.py

(``make fuzz`` picks and prints a fresh seed). A failing case is named ``test_fuzz[SEED-FORMAT-
MUTATION]``; rerun it alone with ``CURVCAL_FUZZ_SEED=SEED CURVCAL_FUZZ_CASES=1``.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import pickle
import random
import struct
import sys
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from curvcal.models import DigitsCNN

pytestmark = pytest.mark.fuzz

DEFAULT_SEED = 20261123
DEFAULT_CASES = 300
BASE_SEED = int(os.environ.get("CURVCAL_FUZZ_SEED", DEFAULT_SEED))
N_CASES = int(os.environ.get("CURVCAL_FUZZ_CASES", DEFAULT_CASES))

K = 3
ARCH = ("--arch", "curvcal:DigitsCNN", "-k", "width=1")
ARCH_META = {
    "curvcal.arch": "curvcal:DigitsCNN",
    "curvcal.arch_kwargs": '{"num_classes": 3, "width": 1}',
}
POLICY = """\
# a gate over the metrics report
[settings]
seed = 0
val_split = 0.5

[accuracy]
min = 0.1

[ece]            # uncalibrated
max = 0.9
max_increase = 0.5

[ts.ece]
max = 0.9
max_rel_increase = 0.25

[focal_ts.nll]
max = 10.0
"""


# --- the good files -------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    root: Path
    files: dict[str, Path]  # format name -> good file


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return build_corpus(tmp_path_factory.mktemp("fuzz-corpus"))


def build_corpus(root: Path) -> Corpus:
    """Write one good file of every format into ``root``."""
    torch.manual_seed(0)
    model = DigitsCNN(num_classes=K, width=1).eval()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    files: dict[str, Path] = {}

    def put(name: str, filename: str) -> Path:
        files[name] = root / filename
        return files[name]

    torch.save(state, put("ckpt-zip", "weights.pt"))
    torch.save({"model_state_dict": state, "epoch": 3}, put("ckpt-wrapped", "wrapped.pt"))
    torch.save(state, put("ckpt-legacy", "legacy.pt"), _use_new_zipfile_serialization=False)
    save_file(state, str(put("ckpt-safetensors-meta", "model.safetensors")), ARCH_META)
    save_file(state, str(put("ckpt-safetensors", "plain.safetensors")))
    put("ckpt-raw-pickle", "raw.pkl").write_bytes(
        pickle.dumps({"weights": [0.5, -1.0], "epoch": 3, "name": "digits"}, protocol=4)
    )
    torch.jit.script(model).save(str(put("ckpt-torchscript", "scripted.pt")))
    example = (torch.zeros(2, 1, 8, 8),)
    torch.export.save(torch.export.export(model, example), str(put("ckpt-exported", "exp.pt2")))

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(12, 1, 8, 8, generator=generator)
    y = torch.arange(12) % K
    torch.save({"x": x, "y": y}, put("data-pt", "data.pt"))
    np.savez(put("data-npz", "data.npz"), x=x.numpy(), y=y.numpy())
    save_file({"x": x, "y": y}, str(put("data-safetensors", "data.safetensors")))

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((30, K)) * 2
    labels = np.arange(30) % K
    np.savez(put("logits-npz", "logits.npz"), logits=logits, labels=labels)
    torch.save(
        {"logits": torch.from_numpy(logits), "labels": torch.from_numpy(labels)},
        put("logits-pt", "logits.pt"),
    )
    save_file(
        {"logits": torch.from_numpy(logits), "labels": torch.from_numpy(labels)},
        str(put("logits-safetensors", "logits.safetensors")),
    )

    from curvcal.cli import main

    report = put("report-json", "report.json")
    calibrator = put("calibrator-json", "calibrator.json")
    argv = ["metrics", str(files["logits-npz"]), "--val-split", "0.5", "-q", "-o", str(report)]
    assert main([*argv, "--save-calibrator", str(calibrator)]) == 0
    put("policy-toml", "policy.toml").write_text(POLICY)
    modules = root / "modules"
    modules.mkdir()
    (modules / f"{SIDE_EFFECT_MODULE}.py").write_text(
        f"open({SIDE_EFFECT_MARK!r}, 'w').close()  # imported: leave a mark\n"
        f"def touch(*args):\n    open({SIDE_EFFECT_MARK!r}, 'w').close()\n"
    )
    for path in files.values():
        path.chmod(0o444)  # a loader that writes into its input fails loudly
    return Corpus(root=root, files=files)


# --- how each format is read ----------------------------------------------------------------

Command = Callable[[Corpus, Path], list[str]]


def _inspect(c: Corpus, f: Path) -> list[str]:
    return ["inspect", str(f)]


def _calibrate(*arch: str) -> Command:
    def command(c: Corpus, f: Path) -> list[str]:
        data = str(c.files["data-pt"])
        return ["calibrate", str(f), *arch, "--data", data, "--device", "cpu", "--method", "none"]

    return command


def _as_data(c: Corpus, f: Path) -> list[str]:
    model = str(c.files["ckpt-safetensors-meta"])
    return ["calibrate", model, "--data", str(f), "--device", "cpu", "--method", "none"]


def _metrics(c: Corpus, f: Path) -> list[str]:
    return ["metrics", str(f), "--bins", "5"]


def _apply(c: Corpus, f: Path) -> list[str]:
    # the scores of the .npz the calibrator was fitted on (a --val-split of it), from another
    # file: applied to the .npz itself it would be refused as measured on its fit rows
    return ["metrics", str(c.files["logits-pt"]), "--bins", "5", "--apply", str(f)]


def _policy(c: Corpus, f: Path) -> list[str]:
    report = str(c.files["report-json"])
    return ["compare", report, report, "--policy", str(f)]


def _new_report(c: Corpus, f: Path) -> list[str]:
    return ["compare", str(f), str(c.files["report-json"]), "--policy", str(c.files["policy-toml"])]


def _old_report(c: Corpus, f: Path) -> list[str]:
    return ["compare", str(c.files["report-json"]), str(f), "--policy", str(c.files["policy-toml"])]


COMMANDS: dict[str, tuple[Command, ...]] = {
    "ckpt-zip": (_inspect, _calibrate(*ARCH)),
    "ckpt-wrapped": (_inspect, _calibrate(*ARCH)),
    "ckpt-legacy": (_inspect, _calibrate(*ARCH)),
    "ckpt-safetensors-meta": (_inspect, _calibrate()),
    "ckpt-safetensors": (_inspect, _calibrate(*ARCH)),
    "ckpt-raw-pickle": (_inspect, _calibrate(*ARCH)),
    "ckpt-torchscript": (_inspect, _calibrate()),
    "ckpt-exported": (_inspect, _calibrate()),
    "data-pt": (_as_data,),
    "data-npz": (_as_data,),
    "data-safetensors": (_as_data,),
    "logits-npz": (_metrics,),
    "logits-pt": (_metrics,),
    "logits-safetensors": (_metrics,),
    "report-json": (_new_report, _old_report),
    "calibrator-json": (_apply,),
    "policy-toml": (_policy,),
}


# --- mutations ------------------------------------------------------------------------------

Mutation = Callable[[bytes, random.Random], bytes]


def _position(data: bytes, rng: random.Random) -> int:
    """A position, biased towards the start where headers live."""
    if not data:
        return 0
    if rng.random() < 0.5:
        return rng.randrange(min(len(data), 256))
    return rng.randrange(len(data))


def bit_flips(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if out:
            out[_position(data, rng)] ^= 1 << rng.randrange(8)
    return bytes(out)


def byte_replacement(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    specials = (0, 0xFF, 0x7F, 0x80, ord("{"), ord('"'), ord("["), 0x2E)
    for _ in range(rng.randint(1, 16)):
        if out:
            out[_position(data, rng)] = (
                rng.choice(specials) if rng.random() < 0.3 else rng.randrange(256)
            )
    return bytes(out)


def truncation(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data))] if data else data


def insertion(data: bytes, rng: random.Random) -> bytes:
    at = _position(data, rng)
    return data[:at] + rng.randbytes(rng.randint(1, 64)) + data[at:]


def chunk_duplication(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    start = rng.randrange(len(data))
    chunk = data[start : start + rng.randint(1, 512)]
    at = rng.randrange(len(data) + 1)
    return data[:at] + chunk * rng.randint(1, 4) + data[at:]


def chunk_deletion(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    start = _position(data, rng)
    return data[:start] + data[start + rng.randint(1, 256) :]


BYTE_MUTATIONS: dict[str, Mutation] = {
    "bitflip": bit_flips,
    "replace": byte_replacement,
    "truncate": truncation,
    "insert": insertion,
    "duplicate": chunk_duplication,
    "delete": chunk_deletion,
}


def safetensors_length(data: bytes, rng: random.Random) -> bytes:
    """Tamper with the little-endian u64 header length."""
    (n,) = struct.unpack("<Q", data[:8])
    value = rng.choice(
        [
            0,
            1,
            2,
            n - 1,
            n + 1,
            n + 8,
            len(data),
            len(data) - 8,
            2**31,
            2**63,
            2**64 - 1,
            rng.randrange(2**64),
        ]
    )
    return struct.pack("<Q", max(0, min(value, 2**64 - 1))) + data[8:]


def safetensors_header(data: bytes, rng: random.Random) -> bytes:
    """Edit one value of the JSON header and write it back with a consistent length."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    name = rng.choice(sorted(header))
    entry = header[name]
    weird: list[object] = [-1, 0, 2**40, 2**64, "x", None, [], [1, 2, 3], 1.5, {"a": 1}]
    if name == "__metadata__":
        key = rng.choice(sorted(entry))
        entry[key] = rng.choice(["", "{", "null", "[]", '{"num_classes": -1}', "tv:nope", "1e999"])
    else:
        field = rng.choice(["dtype", "shape", "data_offsets"])
        if field == "dtype":
            entry[field] = rng.choice(["F64", "I8", "BOOL", "F8_E4M3", "U64", "XX", 3])
        elif field == "shape":
            entry[field] = rng.choice([[], [0], [2**62, 2**62], [-1], *weird])
        else:
            begin, end = entry[field]
            entry[field] = rng.choice(
                [[end, begin], [begin, begin], [0, end + 1], [begin, 2**63], *weird]
            )
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data[8 + n :]


def zip_member_in_place(data: bytes, rng: random.Random) -> bytes:
    """Corrupt the stored bytes of one member (its CRC no longer matches)."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        info = rng.choice(archive.infolist())
    # local header: 30 bytes + name + extra, then the data
    start = info.header_offset
    name_len, extra_len = struct.unpack("<HH", data[start + 26 : start + 30])
    begin = start + 30 + name_len + extra_len
    if info.compress_size == 0:
        return bit_flips(data, rng)
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        out[begin + rng.randrange(info.compress_size)] ^= 1 << rng.randrange(8)
    return bytes(out)


def zip_member_rewritten(data: bytes, rng: random.Random) -> bytes:
    """Mutate one member's content and rebuild the archive with valid CRCs, so the corruption
    reaches the reader of that member (the pickle, a tensor's storage, a .npy header)."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = [(info, archive.read(info)) for info in archive.infolist()]
    index = rng.randrange(len(members))
    # favour the members that are parsed: pickles, .npy arrays, version files, JSON
    parsed = [
        i
        for i, (m, _) in enumerate(members)
        if m.filename.endswith((".pkl", ".npy", ".json", "version", "byteorder"))
    ]
    if parsed and rng.random() < 0.7:
        index = rng.choice(parsed)
    action = rng.choice(["mutate", "mutate", "mutate", "drop", "rename", "empty"])
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for i, (info, content) in enumerate(members):
            name = info.filename
            if i == index:
                if action == "drop":
                    continue
                if action == "rename":
                    name = name + "x"
                elif action == "empty":
                    content = b""
                else:
                    mutate = rng.choice(list(BYTE_MUTATIONS.values()))
                    content = mutate(content, rng)
            archive.writestr(name, content)
    return out.getvalue()


def text_tokens(data: bytes, rng: random.Random) -> bytes:
    """Structure-aware edits of TOML and JSON: replace a value, drop or repeat a line."""
    lines = data.decode().splitlines(keepends=True)
    i = rng.randrange(len(lines))
    action = rng.choice(["value", "value", "drop", "repeat", "key"])
    if action == "drop":
        del lines[i]
    elif action == "repeat":
        lines.insert(i, lines[i])
    else:
        values = ["nan", "inf", "-inf", "1e999", "-0", '""', "[]", "{}", '"x"', "true", "null"]
        values += ["-1", "2e-320", "1" * 40, "0x10", "{ max = 1 }", "[1, [2]]", '"\\ud800"']
        text = "".join(lines)
        tokens = [m for m in _number_spans(text)]
        if action == "key" or not tokens:
            return (
                text.replace("max", rng.choice(["min", "maxx", "max_increase", ""]), 1)
            ).encode()
        begin, end = rng.choice(tokens)
        return (text[:begin] + rng.choice(values) + text[end:]).encode()
    return "".join(lines).encode()


def _number_spans(text: str) -> list[tuple[int, int]]:
    import re

    return [
        m.span()
        for m in re.finditer(r"-?\d+(\.\d+)?([eE][-+]?\d+)?|true|false|null|\"[^\"\n]*\"", text)
    ]


# --- structured kinds: deep nesting, huge integers, exotic tensors, FIFOs, side effects ------

_DEPTHS = (99, 100, 101, 1000, 5000, 200_000)
#: integers at and past the edges of int64, of a float, and of Python's int-string limit
_HUGE = (
    str(2**63 - 1),
    str(2**63),
    str(-(2**63)),
    str(-(2**63) - 1),
    str(2**64),
    "1" + "0" * 30,
    "1" + "0" * 308,
    "1" + "0" * 309,
    "1" + "0" * 400,
    "9" * 4300,
    "9" * 4301,
    "-" + "9" * 10_000,
)


def deep_nesting(data: bytes, rng: random.Random) -> bytes:
    """Replace one value of a JSON or TOML document by the same value nested in arrays (or,
    in JSON, objects) from 99 to 200,000 levels deep."""
    text = data.decode()
    tokens = _number_spans(text)
    if not tokens:
        return data
    begin, end = rng.choice(tokens)
    depth = rng.choice(_DEPTHS)
    value = text[begin:end]
    if text.lstrip().startswith("{") and rng.random() < 0.5:  # JSON: objects too
        nested = '{"a": ' * depth + value + "}" * depth
    else:
        nested = "[" * depth + value + "]" * depth
    return (text[:begin] + nested + text[end:]).encode()


def huge_integer(data: bytes, rng: random.Random) -> bytes:
    """Replace one number of a JSON or TOML document by an integer at or past int64, float or
    Python's int-from-string limit."""
    text = data.decode()
    numbers = [(b, e) for b, e in _number_spans(text) if text[b] in "-0123456789"]
    if not numbers:
        return data
    begin, end = rng.choice(numbers)
    return (text[:begin] + rng.choice(_HUGE) + text[end:]).encode()


def _exotic(tensor: torch.Tensor, rng: random.Random) -> torch.Tensor:
    """``tensor`` in a layout, device or dtype curvcal cannot compute with, or with values at
    the edges of its range."""
    kinds = ["sparse", "meta", "complex", "bool", "half", "int-huge", "float-huge", "nan"]
    if tensor.dim() == 2:
        kinds.append("csr")
    kind = rng.choice(kinds)
    if kind == "sparse" and tensor.dim() >= 1:
        return tensor.to_sparse()
    if kind == "csr":
        return tensor.to_sparse_csr()
    if kind == "meta":
        return tensor.to("meta")
    if kind == "complex":
        return tensor.to(torch.complex64)
    if kind == "bool":
        return tensor != 0
    if kind == "half":
        return tensor.to(torch.float16)
    if kind == "int-huge":
        return torch.full(tensor.shape, rng.choice([2**62, 2**63 - 1, -(2**63)]), dtype=torch.int64)
    if kind == "float-huge":
        return torch.full(tensor.shape, rng.choice([1e30, 1e300, -1e308]), dtype=torch.float64)
    return torch.full(tensor.shape, math.nan, dtype=torch.float32)


def _replace_one_tensor(obj: object, rng: random.Random) -> object:
    """``obj`` (a dict, possibly nested) with one of its tensors made exotic."""
    places: list[tuple[dict, str]] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, torch.Tensor):
                    places.append((node, key))
                else:
                    walk(value)

    walk(obj)
    if places:
        node, key = rng.choice(places)
        node[key] = _exotic(node[key], rng)
    return obj


def exotic_tensor_pt(data: bytes, rng: random.Random) -> bytes:
    """Re-save a ``torch.save`` file with one tensor sparse, meta, complex, bool, ... (in the
    container it came in: zip or legacy)."""
    legacy = not data.startswith(b"PK")
    obj = torch.load(io.BytesIO(data), weights_only=True)
    out = io.BytesIO()
    torch.save(_replace_one_tensor(obj, rng), out, _use_new_zipfile_serialization=not legacy)
    return out.getvalue()


def exotic_array_npz(data: bytes, rng: random.Random) -> bytes:
    """Re-save an ``.npz`` with one array complex, uint64 past int64, huge, bool, half or of
    Python objects (a pickle inside)."""
    with np.load(io.BytesIO(data)) as archive:
        arrays = {key: archive[key] for key in archive.files}
    key = rng.choice(sorted(arrays))
    shape = arrays[key].shape
    arrays[key] = rng.choice(
        [
            lambda: arrays[key].astype(np.complex128),
            lambda: np.full(shape, 2**63 + rng.randrange(2**63), dtype=np.uint64),
            lambda: np.full(shape, rng.choice([1e30, 1e300, np.inf]), dtype=np.float64),
            lambda: arrays[key] != 0,
            lambda: arrays[key].astype(np.float16),
            lambda: np.array([object()] * max(1, arrays[key].size), dtype=object),
        ]
    )()
    out = io.BytesIO()
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out.getvalue()


def exotic_tensor_safetensors(data: bytes, rng: random.Random) -> bytes:
    """Re-save a ``.safetensors`` file (its metadata kept) with one tensor complex, bool,
    uint64, half, bfloat16 or float8, or holding values at the edges of its dtype."""
    from safetensors.torch import load, save

    (n,) = struct.unpack("<Q", data[:8])
    metadata = json.loads(data[8 : 8 + n]).get("__metadata__")
    tensors = load(data)
    key = rng.choice(sorted(tensors))
    tensor = tensors[key]
    tensors[key] = rng.choice(
        [
            lambda: tensor.to(torch.complex64),
            lambda: tensor != 0,
            lambda: torch.full(tensor.shape, 2**63 + 5, dtype=torch.uint64),
            lambda: tensor.to(torch.float16),
            lambda: tensor.to(torch.bfloat16),
            lambda: tensor.to(torch.float8_e4m3fn),
            lambda: torch.full(tensor.shape, 2**63 - 1, dtype=torch.int64),
            lambda: torch.full(tensor.shape, 1e300, dtype=torch.float64),
        ]
    )()
    return save(tensors, metadata=metadata)


#: a module whose import leaves a mark: a loader that imports what a file names is caught
SIDE_EFFECT_MODULE = "curvcal_fuzz_side_effect"
SIDE_EFFECT_MARK = "SIDE_EFFECT"
#: globals a pickle may name: each would run code or import a module if called or resolved
_SIDE_EFFECT_GLOBALS = (
    (SIDE_EFFECT_MODULE, "touch"),
    ("os", "system"),
    ("posix", "system"),
    ("builtins", "exec"),
    ("builtins", "eval"),
    ("builtins", "__import__"),
    ("subprocess", "Popen"),
    ("importlib", "import_module"),
    ("shutil", "rmtree"),
    ("torch.serialization", "load"),
)


def _side_effect_pickle(rng: random.Random) -> bytes:
    """A pickle that calls a dangerous global on a command that would write the mark, naming
    the global directly (GLOBAL), on the stack (STACK_GLOBAL) or through the memo (BINGET)."""
    module, name = rng.choice(_SIDE_EFFECT_GLOBALS)
    argument = {
        "exec": f"open({SIDE_EFFECT_MARK!r}, 'w').close()",
        "eval": f"open({SIDE_EFFECT_MARK!r}, 'w').close()",
        "__import__": SIDE_EFFECT_MODULE,
        "import_module": SIDE_EFFECT_MODULE,
        "rmtree": ".",
    }.get(name, f"touch {SIDE_EFFECT_MARK}")

    def text(value: str) -> bytes:
        raw = value.encode()
        return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE

    how = rng.choice(["global", "stack", "memo"])
    if how == "global":
        body = b"c" + module.encode() + b"\n" + name.encode() + b"\n"
    elif how == "stack":
        body = text(module) + text(name) + b"\x93"  # STACK_GLOBAL
    else:  # names memoised first, fetched back with BINGET, then STACK_GLOBAL
        body = text(module) + b"\x94" + text(name) + b"\x94" + b"0" + b"0"
        body += b"h\x00h\x01\x93"
    call = body + text(argument) + b"\x85" + b"R"  # TUPLE1, REDUCE
    wrapped = b"}" + text("model_state_dict") + call + b"s"  # {"model_state_dict": call(...)}
    return b"\x80\x04" + rng.choice([call, wrapped]) + b"."


def side_effect_import(data: bytes, rng: random.Random) -> bytes:
    """Put a side-effect pickle where the file's pickle is: the ``data.pkl`` member of a zip
    checkpoint (the archive rebuilt with valid CRCs), else the whole file."""
    payload = _side_effect_pickle(rng)
    if not data.startswith(b"PK"):
        return payload
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = [(info.filename, archive.read(info)) for info in archive.infolist()]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for filename, content in members:
            pickled = filename.endswith(".pkl") and "constants" not in filename
            archive.writestr(filename, payload if pickled else content)
    return out.getvalue()


def fifo(data: bytes, rng: random.Random) -> bytes:
    """Marker: the case's file is a named pipe (see :func:`test_fuzz`)."""
    return data


_PICKLED = {"ckpt-zip", "ckpt-wrapped", "ckpt-legacy", "ckpt-raw-pickle", "data-pt", "logits-pt"}


def _is_zip(name: str) -> bool:
    return name in {"ckpt-zip", "ckpt-wrapped", "ckpt-torchscript", "ckpt-exported"} or name in {
        "data-pt",
        "data-npz",
        "logits-npz",
        "logits-pt",
    }


def mutations_for(name: str) -> dict[str, Mutation]:
    mutations = dict(BYTE_MUTATIONS)
    if name.endswith("safetensors") or name == "ckpt-safetensors-meta":
        mutations |= {"st-length": safetensors_length, "st-header": safetensors_header}
    if _is_zip(name):
        mutations |= {"zip-crc": zip_member_in_place, "zip-member": zip_member_rewritten}
    if name.endswith(("toml", "json")):
        mutations |= {"tokens": text_tokens, "deep": deep_nesting, "huge-int": huge_integer}
    if name in _PICKLED - {"ckpt-raw-pickle"}:
        mutations |= {"exotic-tensor": exotic_tensor_pt}
    if name.endswith("npz"):
        mutations |= {"exotic-array": exotic_array_npz}
    if name.endswith("safetensors") or name == "ckpt-safetensors-meta":
        mutations |= {"exotic-tensor": exotic_tensor_safetensors}
    if name in _PICKLED:
        mutations |= {"side-effect": side_effect_import}
    if hasattr(os, "mkfifo"):
        mutations |= {"fifo": fifo}
    return mutations


# --- the cases ------------------------------------------------------------------------------


def _plan(seed: int) -> tuple[str, str, int]:
    """The format, mutation and command index of case ``seed`` (chosen without any file)."""
    rng = random.Random(seed)
    name = rng.choice(sorted(COMMANDS))
    mutation = rng.choice(sorted(mutations_for(name)))
    return name, mutation, rng.randrange(len(COMMANDS[name]))


SEEDS = range(BASE_SEED, BASE_SEED + N_CASES)
IDS = [f"{seed}-{_plan(seed)[0]}-{_plan(seed)[1]}" for seed in SEEDS]


def _unblock_readers(path: Path, opened: threading.Event, done: threading.Event) -> None:
    """Until ``done``, open ``path`` (a FIFO) for writing whenever a reader has it open, and
    close it at once: a loader that reads a named pipe gets end-of-file instead of hanging the
    run, and ``opened`` records that it tried."""

    def poll() -> None:
        while not done.is_set():
            try:
                descriptor = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader yet; ENOENT: the case is over
                time.sleep(0.01)
                continue
            opened.set()
            os.close(descriptor)
            time.sleep(0.01)

    threading.Thread(target=poll, daemon=True).start()


def _snapshot(*folders: Path) -> dict[str, str]:
    hashes = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                hashes[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def test_every_good_file_is_read(corpus: Corpus, run_cli, tmp_path: Path, monkeypatch) -> None:
    """The unmutated corpus passes, so the cases start from files the commands really read."""
    monkeypatch.chdir(tmp_path)
    refused = {"ckpt-raw-pickle", "ckpt-torchscript", "ckpt-exported"}  # not weights
    for name, commands in COMMANDS.items():
        for command in commands:
            result = run_cli(*command(corpus, corpus.files[name]))
            if name == "ckpt-raw-pickle" and command is _inspect:
                # inspect names a plain pickle and its globals; nothing loads it
                assert result.code == 0 and "plain_pickle" in result.stdout, result.output
            elif name in refused and command is not _inspect:
                assert result.code == 2, (name, result.output)
            else:
                assert result.code == 0, (name, result.output)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("seed", SEEDS, ids=IDS)
def test_fuzz(seed: int, corpus: Corpus, run_cli, tmp_path: Path, monkeypatch) -> None:
    name, mutation, which = _plan(seed)
    rng = random.Random(seed * 7919)
    good = corpus.files[name]
    mutated = mutations_for(name)[mutation](good.read_bytes(), rng)
    case = tmp_path / "case"
    case.mkdir()
    target = case / good.name
    opened, done = threading.Event(), threading.Event()
    if mutation == "fifo":
        os.mkfifo(target)
        _unblock_readers(target, opened, done)
    else:
        target.write_bytes(mutated)
    monkeypatch.chdir(case)  # anything written to the working directory shows up below
    monkeypatch.syspath_prepend(str(corpus.root / "modules"))  # the side-effect module
    before = _snapshot(tmp_path, corpus.root)

    try:
        result = run_cli(*COMMANDS[name][which](corpus, target))
    finally:
        done.set()

    assert not opened.is_set(), "a FIFO was opened for reading instead of refused"
    assert SIDE_EFFECT_MODULE not in sys.modules, "a module named by a pickle was imported"
    assert not (case / SIDE_EFFECT_MARK).exists(), "a global named by a pickle was called"
    assert result.code in (0, 1, 2, 3), result.output
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("curvcal: error:") <= 1, result.stderr
    if result.code == 2:
        assert result.stderr.count("curvcal: error:") == 1, result.stderr
    assert _snapshot(tmp_path, corpus.root) == before
