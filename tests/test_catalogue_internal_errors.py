"""Inputs that used to end in an internal error (exit 70) or an out-of-memory kill, and now end
in one line naming the file or option, exit 2: JSON nested 200,000 deep, integers beyond what
a float or an int64 holds, sparse / meta / complex / bool tensors, sizes that would exhaust
memory, and a stdout that is full, closed early or cannot encode λ.

Each case runs the real CLI in-process and checks the bad-input contract: the exit code, one
``curvcal: error:`` line naming what is at fault, no traceback, nothing on stdout.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from curvcal import jsontext
from curvcal.errors import InputError
from curvcal.models import DigitsCNN

K = 3
ARCH_META = {
    "curvcal.arch": "curvcal:DigitsCNN",
    "curvcal.arch_kwargs": '{"num_classes": 3, "width": 1}',
}
ARCH = ("--arch", "curvcal:DigitsCNN", "-k", "width=1")
DEEP = "[" * 200_000 + "]" * 200_000
HUGE = "1" + "0" * 400  # 10**400: no float holds it
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Base:
    root: Path
    model: Path
    weights: Path
    data: Path
    logits: Path
    report: Path
    policy: Path


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    from curvcal.cli import main

    root = tmp_path_factory.mktemp("internal")
    torch.manual_seed(0)
    state = {k: v.contiguous() for k, v in DigitsCNN(num_classes=K, width=1).state_dict().items()}
    save_file(state, str(root / "model.safetensors"), ARCH_META)
    torch.save(state, root / "weights.pt")
    generator = torch.Generator().manual_seed(1)
    torch.save(
        {"x": torch.randn(12, 1, 8, 8, generator=generator), "y": torch.arange(12) % K},
        root / "data.pt",
    )
    rng = np.random.default_rng(0)
    np.savez(root / "logits.npz", logits=rng.standard_normal((30, K)), labels=np.arange(30) % K)
    report = root / "report.json"
    assert (
        main(["metrics", str(root / "logits.npz"), "--val-split", "0.5", "-q", "-o", str(report)])
        == 0
    )
    (root / "policy.toml").write_text("[ece]\nmax = 0.9\nmax_increase = 0.5\n")
    return Base(
        root,
        root / "model.safetensors",
        root / "weights.pt",
        root / "data.pt",
        root / "logits.npz",
        report,
        root / "policy.toml",
    )


def _calibrator(t: Path, temperature: str) -> Path:
    path = t / "calibrator.json"
    path.write_text(
        '{"schema": "1.0", "curvcal": "0", "ts": {"method": "temperature", "temperature": '
        f'{temperature}, "gamma": 0.0}}, "focal_ts": null}}'
    )
    return path


def _tensors(t: Path, name: str, **tensors: torch.Tensor) -> Path:
    path = t / name
    torch.save(tensors, path)
    return path


def _weights(t: Path, b: Base, change: Callable[[torch.Tensor], torch.Tensor]) -> Path:
    state = torch.load(b.weights, weights_only=True)
    state["features.0.weight"] = change(state["features.0.weight"])
    path = t / "changed.pt"
    torch.save(state, path)
    return path


def _logits_pt(t: Path, logits: torch.Tensor, labels: torch.Tensor) -> Path:
    return _tensors(t, "scores.pt", logits=logits, labels=labels)


LOGITS = torch.randn(30, K, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
LABELS = torch.arange(30) % K
X = torch.randn(12, 1, 8, 8, generator=torch.Generator().manual_seed(3))
Y = torch.arange(12) % K


def _deep_report(t: Path, b: Base) -> Path:
    path = t / "deep.json"
    path.write_text(DEEP)
    return path


def _huge_metric_report(t: Path, b: Base) -> Path:
    document = json.loads(b.report.read_text())
    text = json.dumps(document).replace('"ece": ', f'"ece": {HUGE}, "was": ', 1)
    path = t / "huge.json"
    path.write_text(text)
    return path


def _folder(t: Path, config: str) -> Path:
    folder = t / "folder"
    folder.mkdir()
    (folder / "config.json").write_text(config)
    save_file({"w": torch.zeros(1)}, str(folder / "model.safetensors"))
    return folder


def _timm_config(**extra: object) -> str:
    config = {"architecture": "test_resnet", "num_classes": K, "pretrained_cfg": {}}
    return json.dumps(config | extra)


def _csv(t: Path, text: str) -> Path:
    path = t / "scores.csv"
    path.write_text(text)
    return path


def _deep_policy(t: Path, b: Base) -> Path:
    path = t / "deep.toml"
    path.write_text("[settings]\nseed = " + "[" * 20_000 + "]" * 20_000 + "\n")
    return path


def _npz_claiming(t: Path) -> Path:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f8", "fortran_order": False, "shape": (10**6, 10**6)}
    )
    labels = io.BytesIO()
    np.save(labels, np.arange(30) % K)
    path = t / "claims.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("logits.npy", header.getvalue() + b"\0" * 64)
        archive.writestr("labels.npy", labels.getvalue())
    return path


Build = Callable[[Path, Base], tuple[list[object], str, str]]

# name -> build(scratch, base) -> (arguments, what the line names, why it gives)
CASES: dict[str, Build] = {
    # --- recursion -----------------------------------------------------------------------
    "deep-json-new-report": lambda t, b: (
        ["compare", _deep_report(t, b), b.report, "--policy", b.policy],
        "deep.json",
        "nested more than 100 levels",
    ),
    "deep-json-baseline": lambda t, b: (
        ["compare", b.report, _deep_report(t, b), "--policy", b.policy],
        "deep.json",
        "nested more than 100 levels",
    ),
    "deep-json-calibrator": lambda t, b: (
        ["metrics", b.logits, "--apply", _calibrator(t, DEEP)],
        "calibrator.json",
        "nested more than 100 levels",
    ),
    "deep-json-hf-config": lambda t, b: (
        ["inspect", _folder(t, DEEP)],
        "config.json",
        "nested more than 100 levels",
    ),
    "deep-json-arch-kwargs": lambda t, b: (
        [
            "calibrate",
            b.weights,
            "--arch",
            "curvcal:DigitsCNN",
            "--arch-kwargs",
            DEEP,
            "--data",
            b.data,
        ],
        "--arch-kwargs",
        "nested more than 100 levels",
    ),
    "deep-toml-policy": lambda t, b: (
        ["compare", b.report, b.report, "--policy", _deep_policy(t, b)],
        "deep.toml",
        "nested too deep",
    ),
    # --- integers too large --------------------------------------------------------------
    "huge-metric-in-report": lambda t, b: (
        ["compare", _huge_metric_report(t, b), b.report, "--policy", b.policy],
        "huge.json",
        "outside the 64-bit range",
    ),
    "huge-temperature": lambda t, b: (
        ["metrics", b.logits, "--apply", _calibrator(t, "1" * 401)],
        "calibrator.json",
        "(401 digits) is outside the 64-bit range",
    ),
    "seed-2**64-metrics": lambda t, b: (
        ["metrics", b.logits, "--val-split", "0.5", "--seed", str(2**64)],
        "--seed",
        "is not in the range",
    ),
    "seed-2**64-hessian": lambda t, b: (
        ["hessian", b.model, "--data", b.data, "--seed", str(2**64)],
        "--seed",
        "is not in the range",
    ),
    "seed-2**64-policy": lambda t, b: (
        ["check", b.model, "--data", b.data, "--policy", _policy_seed(t)],
        "policy.toml:2",
        "seed' must be a whole number >= 0 and <= 2**63-1",
    ),
    "label-10**30-csv": lambda t, b: (
        [
            "metrics",
            _csv(t, f"labels,logits_0,logits_1\n{10**30},0.5,0.2\n"),
            "--scores-key",
            "logits",
        ],
        "scores.csv",
        "outside the 64-bit range",
    ),
    "label-1e30-float": lambda t, b: (
        ["metrics", _logits_pt(t, LOGITS, torch.full((30,), 1e30, dtype=torch.float64))],
        "scores.pt",
        "whole numbers in the 64-bit range",
    ),
    "label-2**63-uint64": lambda t, b: (
        ["metrics", _npz(t, logits=LOGITS.numpy(), labels=np.full(30, 2**63, dtype=np.uint64))],
        "u.npz",
        "'labels' (uint64) holds 9223372036854775808, outside the 64-bit signed range",
    ),
    "policy-bound-10**400": lambda t, b: (
        ["compare", b.report, b.report, "--policy", _policy_text(t, f"[ece]\nmax = {HUGE}\n")],
        "policy.toml:2",
        "bound ece.max must be finite, not an integer of 401 digits",
    ),
    "policy-integer-of-4301-digits": lambda t, b: (
        ["compare", b.report, b.report, "--policy", _policy_text(t, "[ece]\nmax = " + "9" * 4301)],
        "policy.toml",
        "not valid TOML",
    ),
    "temperature-1e-320": lambda t, b: (
        ["metrics", b.logits, "--apply", _calibrator(t, "1e-320")],
        "calibrator.json (ts)",
        "temperature 1e-320 is outside 1.2e-38..8.5e+37",
    ),
    # --- tensor layouts and dtypes -------------------------------------------------------
    "sparse-logits": lambda t, b: (
        ["metrics", _logits_pt(t, LOGITS.to_sparse(), LABELS)],
        "scores.pt",
        "'logits' is a sparse_coo tensor",
    ),
    "sparse-labels": lambda t, b: (
        ["metrics", _logits_pt(t, LOGITS, LABELS.to_sparse())],
        "scores.pt",
        "'labels' is a sparse_coo tensor",
    ),
    "csr-logits": lambda t, b: (
        ["metrics", _logits_pt(t, LOGITS.to_sparse_csr(), LABELS)],
        "scores.pt",
        "'logits' is a sparse_csr tensor",
    ),
    "meta-logits": lambda t, b: (
        ["metrics", _logits_pt(t, LOGITS.to("meta"), LABELS)],
        "scores.pt",
        "'logits' is a meta tensor",
    ),
    "safetensors-header-claims-10**12-in-4-bytes": lambda t, b: (
        ["inspect", _lying_safetensors(t)],
        "liar.safetensors",
        "'w' claims shape [1000000, 1000000] of F32 (4,000,000,000,000 bytes) in 4 bytes",
    ),
    "float8-logits": lambda t, b: (
        ["metrics", _safetensors(t, logits=LOGITS.to(torch.float8_e4m3fn), labels=LABELS)],
        "s.safetensors",
        "'logits' has dtype float8_e4m3fn, which curvcal does not compute with",
    ),
    "uint64-labels-past-int64": lambda t, b: (
        [
            "metrics",
            _safetensors(t, logits=LOGITS, labels=torch.full((30,), 2**63 + 5, dtype=torch.uint64)),
        ],
        "s.safetensors",
        "'labels' (uint64) holds 9223372036854775813, outside the 64-bit signed range",
    ),
    "sparse-data": lambda t, b: (
        [
            "calibrate",
            b.model,
            "--data",
            _tensors(t, "d.pt", x=X.to_sparse(), y=Y),
            "--method",
            "none",
        ],
        "d.pt",
        "'x' is a sparse_coo tensor",
    ),
    "meta-data": lambda t, b: (
        [
            "calibrate",
            b.model,
            "--data",
            _tensors(t, "d.pt", x=X, y=Y.to("meta")),
            "--method",
            "none",
        ],
        "d.pt",
        "'y' is a meta tensor",
    ),
    "complex-weights": lambda t, b: (
        ["calibrate", _weights(t, b, lambda w: w.to(torch.complex64)), *ARCH, "--data", b.data],
        "changed.pt",
        "features.0.weight (dtype complex64 for a real weight)",
    ),
    "sparse-weights": lambda t, b: (
        ["calibrate", _weights(t, b, lambda w: w.to_sparse()), *ARCH, "--data", b.data],
        "changed.pt",
        "features.0.weight (a sparse_coo tensor",
    ),
    "meta-weights": lambda t, b: (
        ["calibrate", _weights(t, b, lambda w: w.to("meta")), *ARCH, "--data", b.data],
        "changed.pt",
        "features.0.weight (a meta tensor",
    ),
    "bool-weights": lambda t, b: (
        ["calibrate", _weights(t, b, lambda w: w > 0), *ARCH, "--data", b.data],
        "changed.pt",
        "features.0.weight (bool for a float32 weight)",
    ),
    # --- memory --------------------------------------------------------------------------
    "bins-10**9": lambda t, b: (
        ["metrics", b.logits, "--bins", str(10**9)],
        "--bins",
        "is not in the range 1<=x<=10000",
    ),
    "study-bins-10**9": lambda t, b: (
        ["study", b.model, "--data", b.data, "--bins", str(10**9)],
        "--bins",
        "is not in the range 1<=x<=10000",
    ),
    "dpi-2400-plot-classes-10": lambda t, b: (
        [
            "metrics",
            b.logits,
            "--val-split",
            "0.5",
            "--plot",
            t / "r.png",
            "--dpi",
            "2400",
            "--plot-classes",
            "10",
        ],
        "--dpi",
        "34,560 x 28,800-pixel image",
    ),
    "csv-column-logits_100000000000": lambda t, b: (
        [
            "metrics",
            _csv(t, "labels,logits_0,logits_100000000000\n1,0.5,0.2\n"),
            "--scores-key",
            "logits",
        ],
        "scores.csv",
        "has no column logits_1 for class 1",
    ),
    "csv-logits_1-and-logits_01": lambda t, b: (
        [
            "metrics",
            _csv(t, "labels,logits_0,logits_1,logits_01\n1,0.5,0.2,0.1\n"),
            "--scores-key",
            "logits",
        ],
        "scores.csv",
        "'logits_1' and 'logits_01' both name class 1",
    ),
    "npy-header-claims-10**12": lambda t, b: (
        ["metrics", _npz_claiming(t)],
        "claims.npz",
        "claims shape (1000000, 1000000)",
    ),
    "num-classes-10**9-option": lambda t, b: (
        ["calibrate", b.weights, *ARCH, "--num-classes", str(10**9), "--data", b.data],
        "--num-classes",
        "is not in the range",
    ),
    "num-classes-10**9-arch-kwargs": lambda t, b: (
        [
            "calibrate",
            b.weights,
            "--arch",
            "curvcal:DigitsCNN",
            "-k",
            f"num_classes={10**9}",
            "--data",
            b.data,
        ],
        "--arch-kwargs",
        "num_classes 1000000000 is not a whole number in 1..1,000,000",
    ),
}


def _npz(t: Path, **arrays: object) -> Path:
    path = t / "u.npz"
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def _lying_safetensors(t: Path) -> Path:
    header = json.dumps({"w": {"dtype": "F32", "shape": [10**6, 10**6], "data_offsets": [0, 4]}})
    path = t / "liar.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header.encode() + b"\0" * 4)
    return path


def _policy_text(t: Path, text: str) -> Path:
    path = t / "policy.toml"
    path.write_text(text)
    return path


def _safetensors(t: Path, **tensors: torch.Tensor) -> Path:
    path = t / "s.safetensors"
    save_file(tensors, str(path))
    return path


def test_wide_unsigned_labels_within_int64_are_read_as_int64(tmp_path: Path, run_cli) -> None:
    """uint64 labels of 0..2 are labels: converted, not refused (the check is on the values)."""
    labels = (torch.arange(30) % K).to(torch.uint64)
    wide = _safetensors(tmp_path, logits=LOGITS, labels=labels)
    (tmp_path / "plain").mkdir()
    plain = _safetensors(tmp_path / "plain", logits=LOGITS, labels=labels.to(torch.int64))
    results = [json.loads(run_cli("metrics", p, "--json").stdout)["results"] for p in (wide, plain)]
    assert results[0] == results[1]


def _policy_seed(t: Path) -> Path:
    path = t / "policy.toml"
    path.write_text(f"[settings]\nseed = {2**64}\n[ece]\nmax = 0.9\n")
    return path


@pytest.mark.parametrize("name", list(CASES))
def test_one_line_and_exit_2(name: str, base: Base, tmp_path: Path, run_cli, monkeypatch) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.chdir(scratch)
    args, what, why = CASES[name](scratch, base)

    result = run_cli(*args, "--device", "cpu") if _takes_device(args) else run_cli(*args)

    assert result.code == 2, result.output
    lines = _without_warnings(result.stderr)
    assert len(lines) == 1 and lines[0].startswith("curvcal: error: "), result.stderr
    assert what in lines[0] and why in lines[0], lines[0]
    assert "internal error" not in lines[0] and "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("temperature", "why"),
    [
        ("0", "temperature 0 is outside 1.2e-38..8.5e+37"),
        ("-1", "temperature -1 is outside 1.2e-38..8.5e+37"),
        ("1e-320", "temperature 1e-320 is outside 1.2e-38..8.5e+37"),
    ],
)
def test_apply_of_an_impossible_temperature_prints_exactly_one_line(
    temperature: str, why: str, base: Base, tmp_path: Path, run_cli
) -> None:
    """Exactly one line on stderr (no warning, no table first) and nothing on stdout, whether
    the scores come from a file or from the model."""
    calibrator = _calibrator(tmp_path, temperature)
    for args in (
        ["metrics", base.logits, "--apply", calibrator],
        ["calibrate", base.model, "--data", base.data, "--device", "cpu", "--apply", calibrator],
    ):
        result = run_cli(*args)
        assert result.code == 2, result.output
        assert result.stdout == ""
        assert len(result.stderr.splitlines()) == 1, result.stderr
        assert result.stderr.startswith(f"curvcal: error: {calibrator} (ts): {why}")


def _without_warnings(stderr: str) -> list[str]:
    """The messages of ``stderr`` other than warnings (a warning the data earns, such as a fit
    stopped at its bracket, may come first; it can wrap onto lines of its own)."""
    messages: list[str] = []
    for line in stderr.strip().splitlines():
        if line.startswith("curvcal: ") or not messages:
            messages.append(line)
        else:
            messages[-1] += " " + line
    return [m for m in messages if not m.startswith("curvcal: warning: ")]


def _takes_device(args: list[object]) -> bool:
    return args[0] in ("calibrate", "hessian", "study", "check")


# --- the JSON reader -------------------------------------------------------------------------


def test_json_within_the_limits_is_read_as_json_reads_it() -> None:
    text = json.dumps({"a": ["[[[{{", {"b": [2**63 - 1, -(2**63 - 1), 1.5, None]}]})
    assert jsontext.loads(text, "f") == json.loads(text)
    nested = "[" * 100 + "]" * 100
    assert jsontext.loads(nested, "f") == json.loads(nested)
    assert jsontext.loads(nested.encode(), "f") == json.loads(nested)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[" * 101 + "]" * 101, "nested more than 100 levels"),
        ('{"a":' * 101 + "1" + "}" * 101, "nested more than 100 levels"),
        (f"[{2**63}]", "outside the 64-bit range"),
        (f"[-{2**63}]", "outside the 64-bit range"),
        ("[" + "9" * 5000 + "]", "(5000 digits)"),  # past Python's int-string limit too
    ],
    ids=["101-arrays", "101-objects", "2**63", "-2**63", "5000-digits"],
)
def test_json_past_the_limits_is_an_input_error_naming_the_file(text: str, why: str) -> None:
    with pytest.raises(InputError) as caught:
        jsontext.loads(text, "where.json")
    assert caught.value.what == "where.json" and why in caught.value.why


def test_json_syntax_errors_stay_json_errors() -> None:
    with pytest.raises(json.JSONDecodeError):
        jsontext.loads("[1, 2", "f")


def test_a_deep_jsonl_line_names_the_file_and_line(tmp_path: Path) -> None:
    from curvcal.load.texts.text import read_table

    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "a", "label": 0}\n{"text": ' + DEEP + ', "label": 1}\n')
    with pytest.raises(InputError) as caught:
        read_table(str(path))
    assert caught.value.what == f"{path}:2" and "nested more than 100" in caught.value.why


def test_a_label_of_10_to_the_30_in_jsonl_names_the_line(tmp_path: Path) -> None:
    from curvcal.load.texts.text import read_table

    path = tmp_path / "rows.jsonl"
    path.write_text(f'{{"text": "a", "label": {10**30}}}\n')
    with pytest.raises(InputError) as caught:
        read_table(str(path))
    assert caught.value.what == f"{path}:1" and "64-bit range" in caught.value.why


# --- models and archives -----------------------------------------------------------------------


def test_timm_num_classes_of_10_to_the_9_names_the_config(tmp_path: Path, run_cli) -> None:
    pytest.importorskip("timm")
    folder = _folder(tmp_path, _timm_config(num_classes=10**9))
    result = run_cli("calibrate", folder, "--data", "x.pt", "--device", "cpu")
    assert result.code == 2, result.output
    assert f"{folder / 'config.json'} (model_args): num_classes 1000000000" in result.stderr


def test_timm_model_args_that_break_the_model_name_the_config(tmp_path: Path, run_cli) -> None:
    pytest.importorskip("timm")
    folder = _folder(tmp_path, _timm_config(model_args={"global_pool": "nope"}))
    result = run_cli("calibrate", folder, "--data", "x.pt", "--device", "cpu")
    assert result.code == 2, result.output
    line = result.stderr.strip()
    assert line.startswith(
        f"curvcal: error: {folder / 'config.json'} (model_args): timm:test_resnet cannot"
    )
    assert "nope" in line and len(line.splitlines()) == 1


def test_a_zip_that_would_inflate_past_memory_is_refused_first(
    base: Base, tmp_path: Path, run_cli, monkeypatch
) -> None:
    """A few kilobytes of deflated zeros that inflate to 64 MiB, against 32 MiB available."""
    import curvcal.load.limits as limits

    path = tmp_path / "bomb.npz"
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f8", "fortran_order": False, "shape": (2**23,)}
    )
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("logits.npy", "w") as member:
            member.write(header.getvalue())
            for _ in range(64):
                member.write(b"\0" * 2**20)
        archive.writestr("labels.npy", b"")
    assert path.stat().st_size < 2**20
    monkeypatch.setattr(limits, "available_memory", lambda: 2**25)
    for args in (["metrics", path], ["calibrate", base.model, "--data", path, "--device", "cpu"]):
        result = run_cli(*args)
        assert result.code == 2, result.output
        assert "bomb.npz: would inflate to 0.1 GiB ('logits.npy' alone 0.1 GiB)" in result.stderr


def _torch_zip_bomb(path: Path, mib: int) -> Path:
    """A ``torch.save``-shaped archive whose ``data.pkl`` is ``mib`` MiB of deflated zeros."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bomb/version", "3\n")
        with archive.open("bomb/data.pkl", "w", force_zip64=True) as member:
            for _ in range(mib):
                member.write(bytes(2**20))
    return path


def test_a_torch_zip_bomb_is_refused_before_its_pickle_is_read(
    base: Base, tmp_path: Path, run_cli
) -> None:
    """128 MiB of zeros in 0.1 MiB, with all the memory there is: the ratio alone refuses it,
    before the pickle scan reads ``data.pkl`` into memory (it read it whole, then called it a
    corrupt pickle; 3 GiB of it ended in a MemoryError, exit 70)."""
    path = _torch_zip_bomb(tmp_path / "bomb.pt", 128)
    assert path.stat().st_size < 2**20
    for args in (
        ["inspect", path],
        ["calibrate", path, "--data", base.data, *ARCH, "--device", "cpu"],
        ["hessian", path, "--data", base.data, *ARCH, "--device", "cpu", "--trust-checkpoint"],
    ):
        result = run_cli(*args)
        assert result.code == 2, result.output
        lines = _without_warnings(result.stderr)
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith(
            "curvcal: error: " + str(path) + ": would inflate to 0.1 GiB ('bomb/data.pkl' alone "
            "0.1 GiB) from 0.1 MiB, more than 100 times its size"
        ), lines[0]


def _declaring(path: Path, member: str, content: bytes, size: int) -> Path:
    """A zip whose one stored ``member`` holds ``content`` but whose headers (local and central)
    declare ``size`` bytes: what a reader allocates for it, read from the archive alone."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(member, content)
    data = bytearray(path.read_bytes())
    local, central = data.index(b"PK\x03\x04"), data.index(b"PK\x01\x02")
    data[local + 22 : local + 26] = size.to_bytes(4, "little")
    data[central + 24 : central + 28] = size.to_bytes(4, "little")
    path.write_bytes(bytes(data))
    return path


def test_a_zip_declaring_3_gib_is_refused_from_its_directory_alone(tmp_path: Path, run_cli) -> None:
    """The finding's 3 GiB ``data.pkl``, declared by a 200-byte file: refused without reading
    (or allocating for) any member."""
    from curvcal.load.limits import MAX_INFLATION, SMALL_INFLATED, inflation_limit, open_zip

    path = _declaring(tmp_path / "declared.pt", "declared/data.pkl", b"\x80\x02}q\x00.", 3 * 2**30)
    with zipfile.ZipFile(path) as archive:  # the directory alone says 3 GiB
        assert archive.getinfo("declared/data.pkl").file_size == 3 * 2**30
    with pytest.raises(InputError, match=r"would inflate to 3\.0 GiB"):
        open_zip(path)
    result = run_cli("inspect", path)
    assert result.code == 2, result.output
    assert "declared.pt: would inflate to 3.0 GiB ('declared/data.pkl' alone 3.0 GiB)" in (
        result.stderr
    )
    # the bound: MAX_INFLATION times the file, at least SMALL_INFLATED, never past the memory
    assert inflation_limit(1000, None) == SMALL_INFLATED
    assert inflation_limit(2**30, None) == MAX_INFLATION * 2**30
    assert inflation_limit(2**30, 2**31) == 2**31
    # a real checkpoint is stored, not deflated: 1x, read as before
    torch.save({"w": torch.zeros(4)}, tmp_path / "plain.pt")
    open_zip(tmp_path / "plain.pt").close()


# --- stdout ----------------------------------------------------------------------------------


def _curvcal(*args: object) -> list[str]:
    return [sys.executable, "-m", "curvcal", *map(str, args)]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra}


def test_a_closed_stdout_pipe_ends_quietly_with_141(base: Base) -> None:
    # the reader closes its end before curvcal has started: the first write finds no reader
    process = subprocess.Popen(
        _curvcal("metrics", base.logits, "--val-split", "0.5"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(COLUMNS="400"),
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # as `| head -c0` does
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141, stderr
    assert _without_warnings(stderr) == []


def _close_stdout() -> None:
    os.close(1)  # as `curvcal ... >&-` starts it


def test_a_closed_stdout_is_one_line_and_exit_2_and_leaves_no_output(
    base: Base, tmp_path: Path
) -> None:
    """`>&-`: Python leaves sys.stdout None; the run ended in a traceback and exit 1 ("a check
    failed"). Now the first write says so, the report written before it is removed."""
    report = tmp_path / "report.json"
    done = subprocess.run(
        _curvcal("metrics", base.logits, "--val-split", "0.5", "-o", report),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=_env(),
        timeout=120,
        preexec_fn=_close_stdout,
    )
    stderr = done.stderr.decode()
    assert done.returncode == 2, stderr
    assert _without_warnings(stderr) == [
        "curvcal: error: stdout: is closed (started with >&-), so the output cannot be written "
        "(redirect it to a file or to /dev/null, or leave it open)"
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_full_stdout_is_one_line_and_exit_2(base: Base) -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            _curvcal("metrics", base.logits, "--json"),
            stdout=full,
            stderr=subprocess.PIPE,
            env=_env(),
            timeout=120,
        )
    stderr = done.stderr.decode()
    assert done.returncode == 2, stderr
    assert stderr.strip() == (
        "curvcal: error: stdout: cannot be written: No space left on device "
        "(free some space or redirect it)"
    )


def test_an_ascii_stdout_gets_ascii_replacements(base: Base) -> None:
    done = subprocess.run(
        _curvcal("metrics", base.logits, "--val-split", "0.5"),
        capture_output=True,
        env=_env(PYTHONIOENCODING="ascii"),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()
    table = done.stdout.decode("ascii")  # raises if anything else got through
    assert "#" in table and "gap = accuracy - confidence" in table


# --- a tokenizer that makes the Rust library panic -------------------------------------------


def test_a_backtracking_tokenizer_regex_is_one_input_error(tmp_path: Path, capfd) -> None:
    """Oniguruma gives up on (a|a)+$ over 40 a's and a b; the tokenizers library panics, which
    pyo3 raises as a BaseException after Rust printed its own report on descriptor 2."""
    pytest.importorskip("transformers")
    from tokenizers import Regex, Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Split
    from transformers import PreTrainedTokenizerFast

    from curvcal.load.texts.text import tokenize

    backend = Tokenizer(WordLevel({"a": 0, "[UNK]": 1, "[PAD]": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = Split(Regex("(a|a)+$"), behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]"
    )
    tokenizer.save_pretrained(tmp_path / "tok")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tmp_path / "tok")
    assert tokenize(tokenizer, ["a a"], None, 8)[0][0]["input_ids"]  # a good text encodes
    capfd.readouterr()

    with pytest.raises(InputError) as caught:
        tokenize(tokenizer, ["a" * 40 + "b"], None, 8)

    assert caught.value.what == str(tmp_path / "tok")
    assert "the tokenizer failed: " in caught.value.why and "retry-limit" in caught.value.why
    assert "panicked" not in capfd.readouterr().err  # Rust's own report was held back


# --- found by the long fuzz run ----------------------------------------------------------------


def test_a_legacy_storage_whose_type_is_a_dict_is_corrupt(
    base: Base, tmp_path: Path, run_cli
) -> None:
    """A bit flip in a legacy torch.save file turned a storage's type into a dict; torch's
    weights-only loader then raised AttributeError (exit 70). Rebuilt here by hand."""
    import pickle

    import torch.serialization as serialization

    path = tmp_path / "legacy.pt"
    with path.open("wb") as handle:
        pickle.dump(serialization.MAGIC_NUMBER, handle, protocol=2)
        pickle.dump(serialization.PROTOCOL_VERSION, handle, protocol=2)
        sizes = {"short": 2, "int": 4, "long": 4}
        info = {"protocol_version": 1001, "little_endian": True, "type_sizes": sizes}
        pickle.dump(info, handle, protocol=2)

        class Storage(pickle.Pickler):
            def persistent_id(self, obj: object) -> object:
                return ("storage", {}, "0", "cpu", 2, None) if obj == "STORAGE" else None

        Storage(handle, protocol=2).dump({"w": "STORAGE"})
    for args in (["inspect", path], ["calibrate", path, *ARCH, "--data", base.data]):
        result = run_cli(*args, "--device", "cpu") if args[0] == "calibrate" else run_cli(*args)
        assert result.code == 2, result.output
        assert "legacy.pt: cannot be read (truncated or corrupt?)" in result.stderr
