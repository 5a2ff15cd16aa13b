"""No output replaces an input: every writer of every command, every way of naming the same file.

Each case gives ``--force`` (the refusal must hold whatever it says), replaces the loaders by
functions that fail the test if called (the refusal must come before any work), and checks the
exit code, the one error line naming both files, the input's bytes and that nothing was written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from curvcal.commands.clashes import arch_inputs, data_inputs, refuse_clashes
from curvcal.errors import InputError

# ---------------------------------------------------------------------------------------------
# the refusal itself


def test_distinct_files_pass(tmp_path: Path) -> None:
    (tmp_path / "in.npz").write_bytes(b"x")
    refuse_clashes([("-o", tmp_path / "out.json")], [("LOGITS", tmp_path / "in.npz")])


def test_an_output_inside_an_input_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "images" / "cat").mkdir(parents=True)
    with pytest.raises(InputError, match="inside the input folder --data") as refused:
        refuse_clashes(
            [("--plot", tmp_path / "images" / "cat" / "p.png")], [("--data", tmp_path / "images")]
        )
    assert refused.value.what == f"--plot {tmp_path / 'images' / 'cat' / 'p.png'}"


def test_a_sibling_whose_name_starts_like_the_input_folder_passes(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    refuse_clashes([("-o", tmp_path / "images.json")], [("--data", tmp_path / "images")])


def test_a_symlink_loop_is_no_crash(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    refuse_clashes([("-o", tmp_path / "out.json")], [("CHECKPOINT", loop)])


def test_arch_inputs_names_the_model_folder_of_hf_only(tmp_path: Path) -> None:
    folder = tmp_path / "vit"
    folder.mkdir()
    assert arch_inputs("--arch", f"hf:{folder}") == [("--arch", folder)]
    for spec in (None, "hf:", "tv:resnet18", "timm:resnet18", "curvcal:mlp", "py:m:C"):
        assert arch_inputs("--arch", spec) == []
    with pytest.raises(InputError, match="inside the input folder --arch"):
        refuse_clashes([("-o", folder / "r.json")], arch_inputs("--arch", f"hf:{folder}"))


def test_data_inputs_names_files_and_folders_only() -> None:
    assert data_inputs("--data", "d.npz") == [("--data", Path("d.npz"))]
    assert data_inputs("--data", "folder:imgs") == [("--data", Path("imgs"))]
    # torchvision reads its raw files under the dataset root (./data unless --data-root)
    assert data_inputs("--data", "tv:cifar10") == [("--data-root", Path("data"))]
    assert data_inputs("--data", "tv:mnist", Path("raw")) == [("--data-root", Path("raw"))]
    assert data_inputs("--data", "t.jsonl") == [("--data", Path("t.jsonl"))]
    assert data_inputs("--data", "py:m:f") == []
    assert data_inputs("--data", None) == []
    assert data_inputs("--data", 3) == []
    assert data_inputs("--data", "curvcal:digits")[0][1].name == "digits_test.safetensors"


# ---------------------------------------------------------------------------------------------
# every writer through the CLI


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every loader fails the test if called: a refusal must come first."""

    def forbidden(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("work started before the output was refused")

    for target in (
        "curvcal.load.checkpoint.load_model",
        "curvcal.load.checkpoints.inspect.inspect_checkpoint",
        "curvcal.load.data.load_dataset",
        "curvcal.load.scores.logits.load_logits",
        "curvcal.pipeline.calibrator.load_calibrators",
        "curvcal.policy.baseline.load_report",
    ):
        monkeypatch.setattr(target, forbidden)


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Inputs every command can name: data, logits, a policy (checkpoints come per case)."""
    work = tmp_path / "work"
    work.mkdir()
    save_file({"x": torch.zeros(4, 1, 8, 8), "y": torch.arange(4)}, str(work / "data.safetensors"))
    save_file({"x": torch.zeros(4, 1, 8, 8), "y": torch.arange(4)}, str(work / "fit.safetensors"))
    np.savez(work / "logits.npz", logits=np.zeros((4, 3), np.float32), labels=np.arange(4) % 3)
    np.savez(work / "fit.npz", logits=np.zeros((4, 3), np.float32), labels=np.arange(4) % 3)
    (work / "policy.toml").write_text('[settings]\ndata = "data.safetensors"\n\n[ece]\nmax = 1\n')
    (work / "calibrator.json").write_text("{}")
    (work / "baseline.json").write_text("{}")
    (work / "old.json").write_text("{}")
    monkeypatch.chdir(work)
    return work


@dataclass(frozen=True)
class Writer:
    """A command, the option that writes, the name the victim input must have, and the
    arguments that make the command write to ``alias`` while reading ``victim``."""

    command: str
    option: str
    victim_name: str
    args: Callable[[Path, Path], list[str]]


# The arguments that make each command read the victim as its main input.
_READS = {
    "hessian": ["--data", "data.safetensors"],
    "calibrate": ["--data", "data.safetensors"],
    "study": ["--data", "data.safetensors"],
    "check": ["--policy", "policy.toml"],
    "inspect": [],
    "metrics": [],
    "compare": ["old.json", "--policy", "policy.toml"],
}


def _writer(
    command: str, option: str, victim_name: str, extra: Callable[[Path], list[str]]
) -> Writer:
    return Writer(
        command, option, victim_name, lambda v, a: [command, str(v), *_READS[command], *extra(a)]
    )


def _plot_dir(alias: Path) -> list[str]:
    return [str(alias.parent)]


WRITERS = [
    *(
        _writer(c, "-o/--output", "victim.json", lambda a: ["-o", str(a)])
        for c in ("hessian", "calibrate", "study", "check", "inspect", "metrics", "compare")
    ),
    _writer("hessian", "--plot", "victim.png", lambda a: ["--plot", str(a)]),
    _writer(
        "hessian",
        "--plot (per-layer chart)",
        "p-layers.png",
        lambda a: ["--per-layer", "--plot", str(a.parent / "p.png")],
    ),
    _writer("calibrate", "--plot", "victim.png", lambda a: ["--plot", str(a)]),
    _writer(
        "calibrate", "--save-calibrator", "victim.json", lambda a: ["--save-calibrator", str(a)]
    ),
    _writer("calibrate", "--save-logits", "victim.npz", lambda a: ["--save-logits", str(a)]),
    _writer("metrics", "--plot", "victim.png", lambda a: ["--plot", str(a)]),
    _writer(
        "metrics",
        "--save-calibrator",
        "victim.json",
        lambda a: ["--val-split", "0.5", "--save-calibrator", str(a)],
    ),
    _writer("study", "--plot", "trace_vs_ece.png", lambda a: ["--plot", *_plot_dir(a)]),
    Writer("demo", "-o/--output", "victim.json", lambda _v, a: ["demo", "-o", str(a)]),
    Writer(
        "demo", "--plot-dir", "spectrum.png", lambda _v, a: ["demo", "--plot-dir", str(a.parent)]
    ),
]

WAYS = ("same path", "dot-dot path", "symlink", "hard link")


def _alias(victim: Path, way: str, root: Path) -> Path:
    """A path naming ``victim``'s file another way (its file name kept)."""
    if way == "same path":
        return victim
    if way == "dot-dot path":
        (victim.parent / "sub").mkdir(exist_ok=True)
        return victim.parent / "sub" / ".." / victim.name
    links = root / ("symlinked" if way == "symlink" else "linked")
    if way == "symlink":
        links.symlink_to(victim.parent, target_is_directory=True)
        return links / victim.name
    links.mkdir()
    os.link(victim, links / victim.name)
    return links / victim.name


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("writer", WRITERS, ids=[f"{w.command}:{w.option}" for w in WRITERS])
def test_no_writer_replaces_an_input(
    writer: Writer,
    way: str,
    workspace: Path,
    run_cli: Callable[..., object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    victim = workspace / "inputs" / writer.victim_name
    victim.parent.mkdir()
    if writer.command == "metrics":
        shutil.copy(workspace / "logits.npz", victim)
    else:
        victim.write_bytes(b"the checkpoint's bytes")
    if writer.command == "demo":
        monkeypatch.setattr("curvcal.assets.demo_checkpoint", lambda: victim)
    alias = _alias(victim, way, workspace)
    before, listing = _sha256(victim), _listing(workspace)
    _no_work(monkeypatch)

    result = run_cli(*writer.args(victim, alias), "--force")

    assert result.code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("curvcal: error: "), result.stderr
    assert writer.option in lines[0] and str(victim.name) in lines[0]
    assert "would replace the input" in lines[0]
    assert _sha256(victim) == before
    assert _listing(workspace) == listing


# (command line, the input named in the refusal); -o is the writer, the clash is another input
OTHER_INPUTS = [
    (["hessian", "c.pt", "--data", "data.safetensors", "-o", "data.safetensors"], "--data"),
    (["calibrate", "c.pt", "--data", "data.safetensors", "-o", "data.safetensors"], "--data"),
    (
        [
            "calibrate",
            "c.pt",
            "--data",
            "data.safetensors",
            "--fit-data",
            "fit.safetensors",
            "-o",
            "fit.safetensors",
        ],
        "--fit-data",
    ),
    (["metrics", "logits.npz", "--fit", "fit.npz", "-o", "fit.npz"], "--fit"),
    (["metrics", "logits.npz", "--apply", "calibrator.json", "-o", "calibrator.json"], "--apply"),
    (["check", "c.pt", "--policy", "policy.toml", "-o", "policy.toml"], "--policy"),
    (
        [
            "check",
            "c.pt",
            "--policy",
            "policy.toml",
            "--baseline",
            "baseline.json",
            "-o",
            "baseline.json",
        ],
        "--baseline",
    ),
    (["check", "c.pt", "--policy", "policy.toml", "-o", "data.safetensors"], "data"),
    (
        [
            "check",
            "c.pt",
            "--policy",
            "policy.toml",
            "--data",
            "fit.safetensors",
            "-o",
            "fit.safetensors",
        ],
        "data",
    ),
    (["compare", "baseline.json", "old.json", "--policy", "policy.toml", "-o", "old.json"], "OLD"),
    (
        ["compare", "baseline.json", "old.json", "--policy", "policy.toml", "-o", "baseline.json"],
        "NEW",
    ),
    (
        ["compare", "baseline.json", "old.json", "--policy", "policy.toml", "-o", "policy.toml"],
        "--policy",
    ),
    (["study", "c.pt", "d.pt", "--data", "data.safetensors", "-o", "d.pt"], "CKPT"),
    (["study", "c.pt", "--data", "data.safetensors", "-o", "data.safetensors"], "--data"),
    (
        [
            "study",
            "c.pt",
            "--data",
            "data.safetensors",
            "--curvature-data",
            "fit.safetensors",
            "-o",
            "fit.safetensors",
        ],
        "--curvature-data",
    ),
]


@pytest.mark.parametrize(
    ("args", "role"), OTHER_INPUTS, ids=[f"{a[0]}:{r}" for a, r in OTHER_INPUTS]
)
def test_every_input_is_protected(
    args: list[str],
    role: str,
    workspace: Path,
    run_cli: Callable[..., object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("c.pt", "d.pt"):
        (workspace / name).write_bytes(b"checkpoint")
    victim = workspace / args[-1]
    before, listing = _sha256(victim), _listing(workspace)
    _no_work(monkeypatch)

    result = run_cli(*args, "--force")

    assert result.code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert f"would replace the input {role} {args[-1]}" in result.stderr
    assert _sha256(victim) == before
    assert _listing(workspace) == listing


def test_an_output_inside_an_image_folder_is_refused(
    workspace: Path, run_cli: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    (workspace / "images" / "cat").mkdir(parents=True)
    (workspace / "c.pt").write_bytes(b"checkpoint")
    _no_work(monkeypatch)
    result = run_cli(
        "calibrate", "c.pt", "--data", "folder:images", "--plot", "images/cat/r.png", "--force"
    )
    assert result.code == 2
    assert "inside the input folder --data images" in result.stderr
    assert list((workspace / "images" / "cat").iterdir()) == []


@pytest.mark.parametrize(
    "args",
    [
        [
            "metrics",
            "logits.npz",
            "--val-split",
            "0.5",
            "-o",
            "x.json",
            "--save-calibrator",
            "x.json",
        ],
        ["calibrate", "c.pt", "--data", "data.safetensors", "-o", "x.png", "--plot", "./x.png"],
        [
            "hessian",
            "c.pt",
            "--data",
            "data.safetensors",
            "-o",
            "p-layers.png",
            "--plot",
            "p.png",
            "--per-layer",
        ],
    ],
    ids=["metrics", "calibrate", "hessian"],
)
def test_two_outputs_naming_one_file_are_refused(
    args: list[str],
    workspace: Path,
    run_cli: Callable[..., object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (workspace / "c.pt").write_bytes(b"checkpoint")
    listing = _listing(workspace)
    _no_work(monkeypatch)
    result = run_cli(*args, "--force")
    assert result.code == 2, result.output
    assert "names the same file as -o/--output" in result.stderr
    assert _listing(workspace) == listing


def test_the_report_is_still_written_next_to_its_inputs(workspace: Path, run_cli) -> None:
    result = run_cli("metrics", "logits.npz", "-o", "report.json")
    assert result.code == 0, result.output
    assert json.loads((workspace / "report.json").read_text())["command"] == "metrics"


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("option", ["-o", "--plot-dir"])
def test_no_output_is_written_into_the_bundled_files(
    option: str, force: bool, run_cli: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, ``demo -o`` and ``--plot-dir`` wrote new files into the installed package's
    ``assets`` folder: only its four files were inputs, not the folder they are read from."""
    from curvcal.assets import assets_folder

    folder = assets_folder()
    listing = sorted(path.name for path in folder.iterdir())
    target = folder / ("refused.json" if option == "-o" else "refused-plots")
    _no_work(monkeypatch)
    try:
        result = run_cli("demo", option, target, *(["--force"] if force else []))
        assert result.code == 2, result.output
        assert "lies inside the input folder" in result.stderr
        assert "curvcal's bundled files" in result.stderr
        assert sorted(path.name for path in folder.iterdir()) == listing
    finally:  # a regression must not leave files in the package
        if target.is_dir():
            shutil.rmtree(target)
        target.unlink(missing_ok=True)
