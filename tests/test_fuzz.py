"""Fuzzing the loaders: byte-level mutations of every file format curvcal reads.

Each case takes one good file (a checkpoint in every container curvcal accepts, a tensor-data
file, a logits file, a policy, a report, a calibrator), mutates its bytes with a seeded generator
and runs the cheapest command that reads it, in-process. The contract is the bad-input one, with
the outcome left open: exit 0, 1, 2 or 3 (never 70, "internal error"), no traceback, at most one
``curvcal: error:`` line, no file written anywhere (no output option is given) and the mutated
input byte for byte unchanged.

CI runs :data:`DEFAULT_CASES` cases from :data:`DEFAULT_SEED`. A long run::

    CURVCAL_FUZZ_CASES=5000 CURVCAL_FUZZ_SEED=1234 python -m pytest -m fuzz tests/test_fuzz.py

(``make fuzz`` picks and prints a fresh seed). A failing case is named ``test_fuzz[SEED-FORMAT-
MUTATION]``; rerun it alone with ``CURVCAL_FUZZ_SEED=SEED CURVCAL_FUZZ_CASES=1``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import random
import struct
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
    return ["metrics", str(c.files["logits-npz"]), "--bins", "5", "--apply", str(f)]


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
        mutations |= {"tokens": text_tokens}
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
    target.write_bytes(mutated)
    monkeypatch.chdir(case)  # anything written to the working directory shows up below
    before = _snapshot(tmp_path, corpus.root)

    result = run_cli(*COMMANDS[name][which](corpus, target))

    assert result.code in (0, 1, 2, 3), result.output
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("curvcal: error:") <= 1, result.stderr
    if result.code == 2:
        assert result.stderr.count("curvcal: error:") == 1, result.stderr
    assert _snapshot(tmp_path, corpus.root) == before
