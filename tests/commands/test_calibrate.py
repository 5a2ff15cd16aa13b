"""`curvcal calibrate` on the bundled digits checkpoint and data."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from curvcal.assets import demo_checkpoint, demo_data

CKPT = str(demo_checkpoint())
DATA = ("--data", "curvcal:digits")
FAST = ("--gammas", "0,1")  # two γ values keep focal TS quick on 398 samples


def as_json(result) -> dict:
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)


def one_line_error(result, *needles: str) -> None:
    assert result.code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("curvcal: error:"), result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_calibrate_demo_writes_logits_calibrator_and_plot(run_cli, tmp_path: Path) -> None:
    logits, calibrator, plot = tmp_path / "z.npz", tmp_path / "cal.json", tmp_path / "rel.png"
    document = as_json(
        run_cli(
            "calibrate",
            CKPT,
            *DATA,
            *FAST,
            "--save-logits",
            logits,
            "--save-calibrator",
            calibrator,
            "--plot",
            plot,
            "--json",
        )
    )
    assert document["command"] == "calibrate" and document["status"] == "ok"
    results = document["results"]
    assert results["split"] == {
        "method": "val-split", "n_fit": 398, "n_eval": 399, "fraction": 0.5, "seed": 0,
    }  # fmt: skip
    for stage in ("uncalibrated", "ts", "focal_ts"):
        assert results["evaluation"][stage]["n_samples"] == 399
        assert 0 <= results["evaluation"][stage]["ece"] <= 1
    assert results["fits"]["ts"]["temperature"] > 1  # the demo model is over-confident
    assert results["fits"]["focal_ts"]["gamma"] in (0.0, 1.0)
    assert document["inputs"]["checkpoint"]["sha256"]
    assert document["inputs"]["checkpoint"]["num_classes"] == 10  # K, as hessian records it
    assert document["inputs"]["data"]["files"][0]["sha256"]
    calibration = document["settings"]["calibration"]
    assert calibration["val_split"] == 0.5 and calibration["method"] == "both"
    assert set(document["timings"]) >= {"inference", "calibration"}
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads(calibrator.read_text())
    assert saved["ts"]["temperature"] == results["fits"]["ts"]["temperature"]

    # The saved logits round-trip through `metrics`: same split, same fit, same numbers.
    again = as_json(run_cli("metrics", logits, "--val-split", "0.5", *FAST, "--json"))["results"]
    assert again["fits"]["ts"]["temperature"] == results["fits"]["ts"]["temperature"]
    for stage in ("uncalibrated", "ts", "focal_ts"):
        assert again["evaluation"][stage]["ece"] == pytest.approx(
            results["evaluation"][stage]["ece"], rel=1e-12
        )
    whole = as_json(run_cli("metrics", logits, "--json"))["results"]
    assert whole["evaluation"]["uncalibrated"]["n_samples"] == 797


def test_fit_data_then_apply_reproduces_the_ts_ece(run_cli, tmp_path: Path) -> None:
    tensors = load_file(str(demo_data()))
    x, y = tensors["x"], tensors["y"]
    torch.save({"x": x[::2].clone(), "y": y[::2].clone()}, tmp_path / "fit.pt")
    torch.save({"x": x[1::2].clone(), "y": y[1::2].clone()}, tmp_path / "test.pt")
    logits, calibrator = tmp_path / "test_logits.safetensors", tmp_path / "cal.json"
    document = as_json(
        run_cli(
            "calibrate",
            CKPT,
            "--data",
            tmp_path / "test.pt",
            "--fit-data",
            tmp_path / "fit.pt",
            "--method",
            "ts",
            "--save-logits",
            logits,
            "--save-calibrator",
            calibrator,
            "--json",
        )
    )
    results = document["results"]
    assert results["split"]["method"] == "fit-data"
    assert (results["split"]["n_fit"], results["split"]["n_eval"]) == (399, 398)
    assert results["evaluation"]["focal_ts"] is None
    assert document["inputs"]["fit_data"]["files"][0]["sha256"]
    applied = as_json(run_cli("metrics", logits, "--apply", calibrator, "--json"))["results"]
    assert applied["evaluation"]["ts"]["ece"] == pytest.approx(
        results["evaluation"]["ts"]["ece"], rel=1e-12
    )
    assert json.loads(calibrator.read_text())["focal_ts"] is None


def test_method_none_measures_all_samples(run_cli) -> None:
    results = as_json(run_cli("calibrate", CKPT, *DATA, "--method", "none", "--json"))["results"]
    assert results["split"]["method"] == "none" and results["split"]["n_eval"] == 797
    assert results["fits"] == {"ts": None, "focal_ts": None}
    assert results["evaluation"]["ts"] is None


def test_table_output(run_cli) -> None:
    result = run_cli("calibrate", CKPT, *DATA, "--method", "ts")
    assert result.code == 0, result.stderr
    text = " ".join(result.stdout.split())
    for needle in ("calibration on the evaluation split (399 samples)", "reliability", "fits",
                   "dNLL/d ln T", "split", "ECE top-label, 15 equal-width bins (a,b]"):  # fmt: skip
        assert needle in text


def test_plot_without_matplotlib_is_an_input_error(run_cli, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = run_cli("calibrate", CKPT, *DATA, "--method", "ts", "--plot", tmp_path / "r.png")
    one_line_error(result, "--plot", "matplotlib is not installed")


def test_existing_logits_file_is_kept_without_force(run_cli, tmp_path: Path) -> None:
    logits = tmp_path / "z.npz"
    logits.write_bytes(b"keep")
    one_line_error(
        run_cli("calibrate", CKPT, *DATA, "--method", "none", "--save-logits", logits),
        str(logits), "already exists",
    )  # fmt: skip
    assert logits.read_bytes() == b"keep"
    result = run_cli(
        "calibrate", CKPT, *DATA, "--method", "none", "--save-logits", logits, "--force"
    )
    assert result.code == 0, result.stderr
    assert set(load_file_any(logits)) == {"logits", "labels"}


def load_file_any(path: Path) -> list[str]:
    import numpy as np

    with np.load(path) as archive:
        return list(archive.files)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--val-split", "0"), "--val-split"),
        (("--val-split", "1.5"), "--val-split"),
        (("--bins", "0"), "--bins"),
        (("--method", "none", "--val-split", "0.5"), "--method none"),
        (("--val-split", "0.5", "--fit-data", "curvcal:digits"), "not both"),
        (("--method", "none", "--save-calibrator", "c.json"), "--save-calibrator"),
        (("--save-logits", "z.csv"), "--save-logits"),
        (("--fit-data", "nowhere.pt"), "nowhere.pt"),
    ],
)
def test_bad_options(run_cli, args: tuple[str, ...], needle: str) -> None:
    one_line_error(run_cli("calibrate", CKPT, *DATA, *args), needle)


def test_dtype_choices_match_the_loader() -> None:
    """--dtype choices are spelled out (so --help needs no torch); they must match the loader."""
    from curvcal.load.checkpoints.device import DTYPES
    from curvcal.settings.checkpoint import DTYPES as DTYPE_NAMES

    assert tuple(DTYPES) == DTYPE_NAMES
