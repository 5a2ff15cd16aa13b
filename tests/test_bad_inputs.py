"""The bad-input catalogue: every command, every loader, every impossible option.

Each case builds its bad input, runs the real CLI in-process and checks the contract: exit 2 (or 3
for a numerical failure), one line on stderr that starts ``curvcal: error:`` and names the file or
option at fault and the problem, no traceback, nothing on stdout, no output file, and every file
that was there before — inputs and any output that already existed — byte for byte unchanged.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from curvcal.models import DigitsCNN

ARCH_META = {
    "curvcal.arch": "curvcal:DigitsCNN",
    "curvcal.arch_kwargs": '{"num_classes": 3, "width": 1}',
}
K = 3


@dataclass(frozen=True)
class Base:
    """Good inputs the cases start from (made once, read-only for every case)."""

    root: Path
    model: Path  # safetensors with its architecture in the metadata (1,185 parameters)
    weights: Path  # plain state dict .pt (needs --arch)
    nan_model: Path  # weights whose logits overflow: the loss is NaN
    data: Path  # x (20, 1, 8, 8), y in [0, 3)
    logits: Path  # logits (30, 3), labels
    probs: Path
    calibrator: Path
    report: Path
    policy: Path


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    root = tmp_path_factory.mktemp("base")
    torch.manual_seed(0)
    model = DigitsCNN(num_classes=K, width=1)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(root / "model.safetensors"), ARCH_META)
    torch.save(state, root / "weights.pt")
    # finite weights whose logits overflow for every sample (a NaN weight is refused at load):
    # the hidden layer is 1 everywhere and the head's weights 3e38, so every logit is +inf
    broken = dict(state)
    broken["classifier.1.weight"] = torch.zeros_like(broken["classifier.1.weight"])
    broken["classifier.1.bias"] = torch.ones_like(broken["classifier.1.bias"])
    broken["classifier.3.weight"] = torch.full_like(broken["classifier.3.weight"], 3e38)
    save_file(broken, str(root / "nan.safetensors"), ARCH_META)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(20, 1, 8, 8, generator=generator)
    y = torch.randint(0, K, (20,), generator=generator)
    torch.save({"x": x, "y": y}, root / "data.pt")
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((30, K)) * 2
    labels = rng.integers(0, K, 30)
    np.savez(root / "logits.npz", logits=logits, labels=labels)
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    np.savez(root / "probs.npz", probs=p, labels=labels)
    (root / "calibrator.json").write_text(
        json.dumps(
            {
                "schema": "1.0",
                "curvcal": "0",
                "ts": {"method": "temperature", "temperature": 1.5, "gamma": 0.0},
                "focal_ts": None,
            }
        )
    )
    from curvcal.cli import main

    assert main(["metrics", str(root / "logits.npz"), "-q", "-o", str(root / "report.json")]) == 0
    (root / "policy.toml").write_text("[ece]\nmax = 0.9\n")
    return Base(
        root=root,
        model=root / "model.safetensors",
        weights=root / "weights.pt",
        nan_model=root / "nan.safetensors",
        data=root / "data.pt",
        logits=root / "logits.npz",
        probs=root / "probs.npz",
        calibrator=root / "calibrator.json",
        report=root / "report.json",
        policy=root / "policy.toml",
    )


Build = Callable[[Base, Path], tuple[list[object], str]]
"""(good inputs, scratch folder) -> (CLI arguments, the file or option the message must name)."""


@dataclass(frozen=True)
class Case:
    build: Build
    why: str  # a piece of the problem's description
    code: int = 2


def _write(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def _npz(path: Path, **arrays: object) -> Path:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def _pt(path: Path, content: object) -> Path:
    torch.save(content, path)
    return path


def _hessian(ckpt: object, data: object, *extra: object) -> list[object]:
    return ["hessian", ckpt, "--data", data, "--device", "cpu", "--probes", "4", *extra]


def _calibrate(ckpt: object, data: object, *extra: object) -> list[object]:
    return ["calibrate", ckpt, "--data", data, "--device", "cpu", *extra]


def _check(ckpt: object, policy: object, *extra: object) -> list[object]:
    return ["check", ckpt, "--policy", policy, "--device", "cpu", *extra]


def _policy(t: Path, text: str) -> Path:
    return _write(t / "gate.toml", text.encode())


def _study(*ckpts: object, data: object, extra: tuple[object, ...] = ()) -> list[object]:
    return ["study", *ckpts, "--data", data, "--device", "cpu", "--probes", "4", *extra]


def _half(path: Path) -> bytes:
    content = path.read_bytes()
    return content[: len(content) // 2]


def _noise(n: int = 3000) -> bytes:
    return np.random.default_rng(7).integers(0, 256, n, dtype=np.uint8).tobytes()


def _logits(t: Path, logits: object, labels: object, name: str = "l.npz") -> Path:
    return _npz(t / name, logits=np.asarray(logits, dtype=np.float64), labels=np.asarray(labels))


GOOD = np.array([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0], [0.5, 0.5, 3.0]])

CASES: dict[str, Case] = {
    # --- checkpoint files -------------------------------------------------------------------
    "ckpt-missing": Case(
        lambda b, t: (_hessian(t / "absent.pt", b.data), str(t / "absent.pt")), "no such file"
    ),
    "ckpt-empty": Case(
        lambda b, t: (_hessian(_write(t / "e.pt", b""), b.data), str(t / "e.pt")), "empty"
    ),
    "ckpt-truncated-safetensors": Case(
        lambda b, t: (
            _hessian(_write(t / "c.safetensors", _half(b.model)), b.data),
            str(t / "c.safetensors"),
        ),
        "safetensors",
    ),
    "ckpt-truncated-zip": Case(
        lambda b, t: (_hessian(_write(t / "c.pt", _half(b.weights)), b.data), str(t / "c.pt")),
        "corrupt",
    ),
    "ckpt-random-bytes": Case(
        lambda b, t: (_hessian(_write(t / "r.pth", _noise()), b.data), str(t / "r.pth")),
        "not a checkpoint",
    ),
    "ckpt-directory": Case(
        lambda b, t: ((t / "d.pt").mkdir() or _hessian(t / "d.pt", b.data), str(t / "d.pt")),
        "directory",
    ),
    "ckpt-unknown-extension": Case(
        lambda b, t: (_hessian(_write(t / "m.onnx", b"\x08\x07" * 50), b.data), str(t / "m.onnx")),
        ".onnx",
    ),
    "ckpt-is-a-logits-file": Case(
        lambda b, t: (_hessian(b.logits, b.data), str(b.logits)), "not a torch checkpoint"
    ),
    "ckpt-weights-without-arch": Case(
        lambda b, t: (_hessian(b.weights, b.data), str(b.weights)), "--arch"
    ),
    "ckpt-no-state-dict": Case(
        lambda b, t: (
            _calibrate(_pt(t / "n.pt", {"epoch": 3}), b.data, "--arch", "curvcal:DigitsCNN"),
            str(t / "n.pt"),
        ),
        "no state dict",
    ),
    "inspect-random-bytes": Case(
        lambda b, t: (["inspect", _write(t / "r.pt", _noise())], str(t / "r.pt")),
        "not a checkpoint",
    ),
    # --- architectures and their arguments ----------------------------------------------------
    "arch-unknown-bundled": Case(
        lambda b, t: (_hessian(b.weights, b.data, "--arch", "curvcal:NoSuchNet"), "--arch"),
        "NoSuchNet",
    ),
    "arch-unknown-torchvision": Case(
        lambda b, t: (_hessian(b.weights, b.data, "--arch", "tv:nosuchnet"), "--arch"),
        "nosuchnet",
    ),
    "arch-unknown-scheme": Case(
        lambda b, t: (_hessian(b.weights, b.data, "--arch", "keras:Net"), "--arch"), "keras:Net"
    ),
    "arch-py-without-trust": Case(
        lambda b, t: (_hessian(b.weights, b.data, "--arch", "py:os.path:join"), "--arch"),
        "--trust-checkpoint",
    ),
    "arch-kwarg-unknown-keyword": Case(
        lambda b, t: (_hessian(b.model, b.data, "-k", "colour=1"), "colour"),
        "colour",
    ),
    "arch-kwargs-do-not-fit-the-weights": Case(
        lambda b, t: (_hessian(b.model, b.data, "-k", "width=4"), str(b.model)),
        "do not fit",
    ),
    "arch-kwargs-not-json": Case(
        lambda b, t: (_hessian(b.model, b.data, "--arch-kwargs", "{width: 4"), "--arch-kwargs"),
        "not valid JSON",
    ),
    "num-classes-mismatch": Case(
        lambda b, t: (
            _hessian(
                b.weights,
                b.data,
                "--arch",
                "curvcal:DigitsCNN",
                "--num-classes",
                "5",
                "-k",
                "width=1",
            ),
            str(b.weights),
        ),
        "do not fit",
    ),
    "state-dict-key-absent": Case(
        lambda b, t: (
            _hessian(
                _pt(t / "w.pt", {"model": torch.load(b.weights)}),
                b.data,
                "--arch",
                "curvcal:DigitsCNN",
                "--state-dict-key",
                "ema",
            ),
            "--state-dict-key",
        ),
        "'ema' is not a key",
    ),
    "device-unknown": Case(
        lambda b, t: (_hessian(b.model, b.data, "--device", "tpu:0"), "--device"), "tpu:0"
    ),
    "allow-global-not-importable": Case(
        lambda b, t: (
            _hessian(b.model, b.data, "--allow-global", "no.such.Thing"),
            "--allow-global",
        ),
        "no.such.Thing",
    ),
    # --- datasets -----------------------------------------------------------------------------
    "data-missing": Case(
        lambda b, t: (_hessian(b.model, t / "absent.pt"), str(t / "absent.pt")), "no such file"
    ),
    "data-random-bytes": Case(
        lambda b, t: (_hessian(b.model, _write(t / "d.pt", _noise())), str(t / "d.pt")),
        "cannot be read",
    ),
    "data-truncated-npz": Case(
        lambda b, t: (
            _hessian(
                b.model,
                _write(
                    t / "d.npz",
                    _half(_npz(t / "full.npz", x=np.zeros((9, 1, 8, 8)), y=np.zeros(9, int))),
                ),
            ),
            str(t / "d.npz"),
        ),
        "cannot be read",
    ),
    "data-empty": Case(
        lambda b, t: (
            _hessian(
                b.model,
                _pt(
                    t / "d.pt",
                    {"x": torch.zeros(0, 1, 8, 8), "y": torch.zeros(0, dtype=torch.long)},
                ),
            ),
            str(t / "d.pt"),
        ),
        "no samples",
    ),
    "data-no-labels": Case(
        lambda b, t: (_hessian(b.model, _pt(t / "d.pt", {"x": torch.zeros(4, 1, 8, 8)})), "y"),
        "'y'",
    ),
    "data-length-mismatch": Case(
        lambda b, t: (
            _hessian(
                b.model,
                _pt(
                    t / "d.pt",
                    {"x": torch.zeros(4, 1, 8, 8), "y": torch.zeros(3, dtype=torch.long)},
                ),
            ),
            str(t / "d.pt"),
        ),
        "4",
    ),
    "data-fractional-labels": Case(
        lambda b, t: (
            _hessian(
                b.model,
                _pt(t / "d.pt", {"x": torch.zeros(2, 1, 8, 8), "y": torch.tensor([0.0, 1.5])}),
            ),
            str(t / "d.pt"),
        ),
        "whole numbers",
    ),
    "data-label-out-of-range-for-the-model": Case(
        lambda b, t: (
            _calibrate(
                b.model,
                _pt(t / "d.pt", {"x": torch.zeros(4, 1, 8, 8), "y": torch.tensor([0, 1, 7, 2])}),
            ),
            str(t / "d.pt"),
        ),
        "7",
    ),
    "data-wrong-input-shape": Case(
        lambda b, t: (
            _hessian(
                b.model,
                _pt(
                    t / "d.pt",
                    {"x": torch.zeros(4, 3, 5, 5), "y": torch.zeros(4, dtype=torch.long)},
                ),
            ),
            str(t / "d.pt"),
        ),
        "shape",
    ),
    "data-unknown-spec": Case(
        lambda b, t: (_hessian(b.model, "hf:mnist"), "--data hf:mnist"), "not a dataset spec"
    ),
    "data-torchvision-not-downloaded": Case(
        lambda b, t: (
            _hessian(b.model, "tv:cifar10", "--data-root", t),
            "--data tv:cifar10",
        ),
        "--download",
    ),
    "data-py-factory-without-trust": Case(
        lambda b, t: (_hessian(b.model, "py:os.path:join"), "py:os.path:join"),
        "--trust-checkpoint",
    ),
    "data-std-zero": Case(lambda b, t: (_hessian(b.model, b.data, "--std", "0"), "--std"), "> 0"),
    # --- impossible options -------------------------------------------------------------------
    "hessian-probes-0": Case(
        lambda b, t: (_hessian(b.model, b.data, "--probes", "0"), "--probes"), "0"
    ),
    "hessian-negative-tol": Case(
        lambda b, t: (_hessian(b.model, b.data, "--tol", "-1e-3"), "--tol"), "-0.001"
    ),
    "hessian-top-k-above-parameter-count": Case(
        lambda b, t: (_hessian(b.model, b.data, "--top-k", "2000"), "--top-k"), "1185 parameters"
    ),
    "hessian-params-match-nothing": Case(
        lambda b, t: (_hessian(b.model, b.data, "--params", "head.*"), "--params"), "head.*"
    ),
    "hessian-focal-without-gamma": Case(
        lambda b, t: (_hessian(b.model, b.data, "--loss", "focal"), "--loss focal"), "--gamma"
    ),
    "hessian-own-loss-not-recorded": Case(
        lambda b, t: (_hessian(b.model, b.data, "--loss", "own"), str(b.model)),
        "records no training loss",
    ),
    "hessian-hutchpp-adaptive": Case(
        lambda b, t: (
            _hessian(b.model, b.data, "--trace-method", "hutchpp", "--trace-rtol", "0.1"),
            "--trace-rtol",
        ),
        "hutchinson",
    ),
    "hessian-gauss-newton-in-train-mode": Case(
        lambda b, t: (
            _hessian(b.model, b.data, "--trace-method", "gauss-newton", "--mode", "train"),
            "--trace-method",
        ),
        "train mode couples the samples",
    ),
    "hessian-density-steps-0": Case(
        lambda b, t: (
            _hessian(b.model, b.data, "--density", "--density-steps", "0"),
            "--density-steps",
        ),
        "0",
    ),
    "metrics-bins-0": Case(lambda b, t: (["metrics", b.logits, "--bins", "0"], "--bins"), "0"),
    "metrics-val-split-above-1": Case(
        lambda b, t: (["metrics", b.logits, "--val-split", "1.5"], "--val-split"), "1.5"
    ),
    "calibrate-negative-gamma-grid": Case(
        lambda b, t: (_calibrate(b.model, b.data, "--gammas", "0,-1"), "--gammas"), ">= 0"
    ),
    "calibrate-val-split-and-fit-data": Case(
        lambda b, t: (
            _calibrate(b.model, b.data, "--val-split", "0.5", "--fit-data", b.data),
            "--fit-data",
        ),
        "not both",
    ),
    "metrics-method-without-a-fit-split": Case(
        lambda b, t: (["metrics", b.logits, "--method", "ts"], "--method ts"), "fit split"
    ),
    # --- logits files -------------------------------------------------------------------------
    "logits-missing": Case(
        lambda b, t: (["metrics", t / "absent.npz"], str(t / "absent.npz")), "no such file"
    ),
    "logits-empty-file": Case(
        lambda b, t: (["metrics", _write(t / "e.npz", b"")], str(t / "e.npz")), "cannot be read"
    ),
    "logits-truncated": Case(
        lambda b, t: (["metrics", _write(t / "c.npz", _half(b.logits))], str(t / "c.npz")),
        "cannot be read",
    ),
    "logits-random-bytes": Case(
        lambda b, t: (["metrics", _write(t / "r.safetensors", _noise())], str(t / "r.safetensors")),
        "cannot be read",
    ),
    "logits-unknown-format": Case(
        lambda b, t: (["metrics", _write(t / "l.csv", b"1,2,3\n")], str(t / "l.csv")), ".csv"
    ),
    "logits-checkpoint-given-as-logits": Case(
        lambda b, t: (["metrics", b.model], str(b.model)), "no tensor named 'logits'"
    ),
    "logits-nan": Case(
        lambda b, t: (
            ["metrics", _logits(t, [[0.0, math.nan, 1.0], *GOOD], [0, 1, 2, 0])],
            str(t / "l.npz"),
        ),
        "row 0",
    ),
    "logits-inf": Case(
        lambda b, t: (
            ["metrics", _logits(t, [*GOOD, [math.inf, 0.0, 1.0]], [0, 1, 2, 0])],
            str(t / "l.npz"),
        ),
        "row 3",
    ),
    "logits-one-dimensional": Case(
        lambda b, t: (["metrics", _logits(t, [1.0, 2.0, 3.0], [0, 1, 2])], str(t / "l.npz")), "2-D"
    ),
    "logits-no-rows": Case(
        lambda b, t: (
            ["metrics", _logits(t, np.zeros((0, 3)), np.zeros(0, int))],
            str(t / "l.npz"),
        ),
        "no samples",
    ),
    "logits-label-count-mismatch": Case(
        lambda b, t: (["metrics", _logits(t, GOOD, [0, 1])], str(t / "l.npz")), "3 rows"
    ),
    "logits-label-out-of-range": Case(
        lambda b, t: (["metrics", _logits(t, GOOD, [0, 3, 1])], str(t / "l.npz")), "out of range"
    ),
    "logits-negative-label": Case(
        lambda b, t: (["metrics", _logits(t, GOOD, [0, -1, 1])], str(t / "l.npz")), ">= 0"
    ),
    "logits-no-labels": Case(
        lambda b, t: (["metrics", _npz(t / "l.npz", logits=GOOD)], str(t / "l.npz")), "'labels'"
    ),
    "probs-not-summing-to-1": Case(
        lambda b, t: (
            [
                "metrics",
                _npz(t / "p.npz", probs=np.array([[0.5, 0.3, 0.1]]), labels=np.array([0])),
                "--input-kind",
                "probs",
                "--scores-key",
                "probs",
            ],
            str(t / "p.npz"),
        ),
        "sums to 0.9",
    ),
    "probs-negative": Case(
        lambda b, t: (
            [
                "metrics",
                _npz(t / "p.npz", probs=np.array([[1.2, -0.2, 0.0]]), labels=np.array([0])),
                "--input-kind",
                "probs",
                "--scores-key",
                "probs",
            ],
            str(t / "p.npz"),
        ),
        "negative probability",
    ),
    "probs-read-as-logits-kind-mismatch": Case(
        lambda b, t: (
            ["metrics", b.probs, "--input-kind", "logprobs", "--scores-key", "probs"],
            str(b.probs),
        ),
        "log-probability above 0",
    ),
    "fit-file-with-another-class-count": Case(
        lambda b, t: (
            [
                "metrics",
                b.logits,
                "--fit",
                _npz(t / "f.npz", logits=np.zeros((4, 5)), labels=np.arange(4)),
            ],
            str(t / "f.npz"),
        ),
        "5",
    ),
    # --- calibrator files ---------------------------------------------------------------------
    "calibrator-not-json": Case(
        lambda b, t: (
            ["metrics", b.logits, "--apply", _write(t / "c.json", b"{ts:")],
            str(t / "c.json"),
        ),
        "not valid JSON",
    ),
    "calibrator-negative-temperature": Case(
        lambda b, t: (
            [
                "metrics",
                b.logits,
                "--apply",
                _write(
                    t / "c.json",
                    json.dumps(
                        {
                            "schema": "1.0",
                            "ts": {"method": "temperature", "temperature": -1.0, "gamma": 0.0},
                        }
                    ).encode(),
                ),
            ],
            str(t / "c.json"),
        ),
        "temperature",
    ),
    # --- policies and reports -----------------------------------------------------------------
    "policy-missing": Case(
        lambda b, t: (["compare", b.report, b.report, "--policy", t / "p.toml"], str(t / "p.toml")),
        "no such policy file",
    ),
    "policy-invalid-toml": Case(
        lambda b, t: (
            ["compare", b.report, b.report, "--policy", _write(t / "p.toml", b"[ece\nmax=1")],
            str(t / "p.toml"),
        ),
        "TOML",
    ),
    "policy-unknown-metric": Case(
        lambda b, t: (
            [
                "compare",
                b.report,
                b.report,
                "--policy",
                _write(t / "p.toml", b"[sharpness]\nmax = 1\n"),
            ],
            str(t / "p.toml"),
        ),
        "sharpness",
    ),
    "policy-bound-not-a-number": Case(
        lambda b, t: (
            [
                "compare",
                b.report,
                b.report,
                "--policy",
                _write(t / "p.toml", b'[ece]\nmax = "low"\n'),
            ],
            str(t / "p.toml"),
        ),
        "max",
    ),
    "report-random-bytes": Case(
        lambda b, t: (
            ["compare", _write(t / "r.json", _noise()), b.report, "--policy", b.policy],
            str(t / "r.json"),
        ),
        "report",
    ),
    # --- curvcal check ------------------------------------------------------------------------
    "check-policy-missing": Case(
        lambda b, t: (_check(b.model, t / "p.toml"), str(t / "p.toml")), "no such policy file"
    ),
    "check-policy-invalid-toml": Case(
        lambda b, t: (
            _check(b.model, _policy(t, f'[settings]\ndata = "{b.data}"\n[ece\nmax = 1\n')),
            f"{t / 'gate.toml'}:3",
        ),
        "not valid TOML",
    ),
    "check-policy-unknown-metric": Case(
        lambda b, t: (
            _check(b.model, _policy(t, f'[settings]\ndata = "{b.data}"\n[sharpness]\nmax = 1\n')),
            str(t / "gate.toml"),
        ),
        "sharpness",
    ),
    "check-policy-unknown-setting-choice": Case(
        lambda b, t: (
            _check(
                b.model,
                _policy(t, f'[settings]\ndata = "{b.data}"\nloss = "mse"\n[ece]\nmax = 1\n'),
            ),
            f"{t / 'gate.toml'}:3",
        ),
        "'mse'",
    ),
    "check-policy-without-data": Case(
        lambda b, t: (_check(b.model, _policy(t, "[ece]\nmax = 1\n")), str(t / "gate.toml")),
        "no data",
    ),
    "check-baseline-missing": Case(
        lambda b, t: (
            _check(b.model, b.policy, "--data", b.data, "--baseline", t / "old.json"),
            str(t / "old.json"),
        ),
        "no such report file",
    ),
    "check-baseline-not-json": Case(
        lambda b, t: (
            _check(
                b.model, b.policy, "--data", b.data, "--baseline", _write(t / "old.json", b"{x")
            ),
            f"{t / 'old.json'}:1",
        ),
        "not valid JSON",
    ),
    "check-baseline-not-a-report": Case(
        lambda b, t: (
            _check(b.model, b.policy, "--data", b.data, "--baseline", b.calibrator),
            str(b.calibrator),
        ),
        "not a curvcal report",
    ),
    "check-checkpoint-missing": Case(
        lambda b, t: (_check(t / "absent.pt", b.policy, "--data", b.data), str(t / "absent.pt")),
        "no such file",
    ),
    "check-data-missing": Case(
        lambda b, t: (_check(b.model, b.policy, "--data", t / "d.pt"), str(t / "d.pt")),
        "no such file",
    ),
    "check-nan-weights": Case(
        lambda b, t: (_check(b.nan_model, b.policy, "--data", b.data), str(b.nan_model)),
        "are NaN or Inf",
        code=3,
    ),
    # --- curvcal study ------------------------------------------------------------------------
    "study-glob-matches-nothing": Case(
        lambda b, t: (_study(str(t / "*.safetensors"), data=b.data), str(t / "*.safetensors")),
        "no such checkpoint file",
    ),
    "study-checkpoint-missing": Case(
        lambda b, t: (_study(b.model, t / "absent.pt", data=b.data), str(t / "absent.pt")),
        "no such checkpoint file",
    ),
    "study-checkpoint-named-twice": Case(
        lambda b, t: (_study(b.model, b.model, data=b.data), str(b.model)), "named twice"
    ),
    "study-data-missing": Case(
        lambda b, t: (_study(b.model, data=t / "d.pt"), str(t / "d.pt")), "no such file"
    ),
    "study-curvature-data-missing": Case(
        lambda b, t: (
            _study(b.model, data=b.data, extra=("--curvature-data", t / "d.pt")),
            str(t / "d.pt"),
        ),
        "no such file",
    ),
    "study-own-loss-not-recorded": Case(
        lambda b, t: (_study(b.model, data=b.data, extra=("--loss", "own")), str(b.model)),
        "records no training loss",
    ),
    "study-focal-without-gamma": Case(
        lambda b, t: (_study(b.model, data=b.data, extra=("--loss", "focal")), "--loss focal"),
        "--gamma",
    ),
    "study-gamma-without-focal": Case(
        lambda b, t: (_study(b.model, data=b.data, extra=("--gamma", "2")), "--gamma"),
        "--loss focal",
    ),
    "study-gammas-not-numbers": Case(
        lambda b, t: (_study(b.model, data=b.data, extra=("--gammas", "0,a")), "--gammas"),
        "'0,a'",
    ),
    "study-plot-dir-is-a-file": Case(
        lambda b, t: (
            _study(b.model, data=b.data, extra=("--plot", _write(t / "plots", b"x"))),
            "--plot",
        ),
        "is a file",
    ),
    "study-label-out-of-range-for-the-model": Case(
        lambda b, t: (
            _study(
                b.model,
                data=_pt(
                    t / "d.pt", {"x": torch.zeros(4, 1, 8, 8), "y": torch.tensor([0, 1, 7, 2])}
                ),
            ),
            str(t / "d.pt"),
        ),
        "7",
    ),
    "study-nan-weights": Case(
        lambda b, t: (_study(b.nan_model, data=b.data), str(b.nan_model)),
        "loss over the 20 samples is nan",
        code=3,
    ),
    "study-error-names-which-checkpoint": Case(
        lambda b, t: (_study(b.model, b.nan_model, data=b.data), str(b.nan_model)),
        "is nan",
        code=3,
    ),
    # --- outputs ------------------------------------------------------------------------------
    "output-exists": Case(
        lambda b, t: (
            ["metrics", b.logits, "-o", _write(t / "out.json", b"keep me")],
            str(t / "out.json"),
        ),
        "--force",
    ),
    "output-is-a-directory": Case(
        lambda b, t: (["metrics", b.logits, "-o", t], str(t)), "directory"
    ),
    "output-folder-missing": Case(
        lambda b, t: (
            ["metrics", b.logits, "-o", t / "no" / "out.json"],
            str(t / "no" / "out.json"),
        ),
        "does not exist",
    ),
    "output-unwritable": Case(
        lambda b, t: (["metrics", b.logits, "-o", _unwritable(t) / "out.json"], "out.json"),
        "not writable",
    ),
    "save-logits-exists": Case(
        lambda b, t: (
            _calibrate(b.model, b.data, "--save-logits", _write(t / "l.npz", b"keep")),
            str(t / "l.npz"),
        ),
        "--force",
    ),
    "save-logits-unknown-format": Case(
        lambda b, t: (_calibrate(b.model, b.data, "--save-logits", t / "l.csv"), "--save-logits"),
        ".csv",
    ),
    "save-calibrator-exists": Case(
        lambda b, t: (
            [
                "metrics",
                b.logits,
                "--val-split",
                "0.5",
                "--save-calibrator",
                _write(t / "c.json", b"{}"),
            ],
            str(t / "c.json"),
        ),
        "--force",
    ),
    "plot-exists": Case(
        lambda b, t: (
            ["metrics", b.logits, "--plot", _write(t / "r.png", b"png")],
            str(t / "r.png"),
        ),
        "--force",
    ),
    "plot-unknown-format": Case(
        lambda b, t: (["metrics", b.logits, "--plot", t / "r.gif"], "--plot"), ".gif"
    ),
    # --- numerical failures (exit 3) ----------------------------------------------------------
    "hessian-nan-weights": Case(
        lambda b, t: (_hessian(b.nan_model, b.data, "--batch-size", "8"), "loss"),
        "non-finite in 3 of 3 batches, the first being batch 0 (samples 0..7)",
        code=3,
    ),
    "calibrate-nan-logits": Case(
        lambda b, t: (_calibrate(b.nan_model, b.data, "--method", "none"), f"--data {b.data}"),
        "NaN or Inf for 20 of 20 samples, the first being sample 0",
        code=3,
    ),
}


def _unwritable(t: Path) -> Path:
    """A folder no file can be created in (as root, permissions do not stop us: use /proc)."""
    if os.geteuid() == 0:
        return Path("/proc")
    folder = t / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


def _snapshot(*folders: Path) -> dict[str, str]:
    """Path -> SHA-256 of every file under ``folders`` (hidden temporary files included)."""
    hashes = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                hashes[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def test_the_catalogue_is_large_enough() -> None:
    assert len(CASES) >= 40


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name: str, base: Base, tmp_path: Path, run_cli) -> None:
    case = CASES[name]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    args, what = case.build(base, scratch)
    out = tmp_path / "report.json"
    if "-o" not in args:
        args = [*args, "-o", out]
    before = _snapshot(base.root, tmp_path)

    result = run_cli(*args)

    assert result.code == case.code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("curvcal: error: "), line
    assert "Traceback" not in result.stderr
    assert what in line and case.why in line, line
    assert result.stdout == ""
    assert not out.exists()
    assert _snapshot(base.root, tmp_path) == before
