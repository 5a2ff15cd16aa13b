"""`curvcal metrics`: metrics, fits and saved calibrators from a logits file."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

# references.md, golden micro-cases.
EDGE_P = [[.5, .25, .25], [.5, .25, .25], [.75, .125, .125], [.75, .125, .125], [.25, .25, .5]]  # fmt: skip
EDGE_Y = [0, 0, 0, 1, 2]
ONE_P = [[0.9, 0.1, 0.0], [1.0, 0.0, 0.0], [0.0, 0.3, 0.7]]
ONE_Y = [0, 1, 2]


def probs_file(path: Path, probs: list[list[float]], labels: list[int]) -> Path:
    np.savez(path, probs=np.array(probs), labels=np.array(labels))
    return path


def logits_file(path: Path, n: int, k: int, seed: int, sharpen: float = 3.0) -> Path:
    """Over-confident logits: labels drawn from softmax(w), scores sharpen·w."""
    rng = np.random.default_rng(seed)
    w = 1.5 * rng.standard_normal((n, k))
    p = np.exp(w - w.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    labels = np.array([rng.choice(k, p=row) for row in p])
    np.savez(path, logits=sharpen * w, labels=labels)
    return path


def as_json(result) -> dict:
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)


PROBS = ("--input-kind", "probs", "--scores-key", "probs")


@pytest.mark.parametrize(("edges", "ece"), [("left", 0.4), ("right", 0.2)])
def test_golden_edge_case(run_cli, tmp_path: Path, edges: str, ece: float) -> None:
    path = probs_file(tmp_path / "p.npz", EDGE_P, EDGE_Y)
    document = as_json(run_cli("metrics", path, *PROBS, "--bins", "2", "--edges", edges, "--json"))
    uncalibrated = document["results"]["evaluation"]["uncalibrated"]
    assert uncalibrated["ece"] == pytest.approx(ece, abs=1e-12)
    assert document["results"]["evaluation"]["ts"] is None
    assert document["results"]["split"]["method"] == "none"
    assert document["inputs"]["logits"]["n_samples"] == 5


def test_golden_confidence_one_and_table_shows_conventions(run_cli, tmp_path: Path) -> None:
    path = probs_file(tmp_path / "p.npz", ONE_P, ONE_Y)
    document = as_json(run_cli("metrics", path, *PROBS, "--bins", "2", "--json"))
    assert document["results"]["evaluation"]["uncalibrated"]["ece"] == pytest.approx(0.2)
    table = run_cli("metrics", path, *PROBS, "--bins", "2")
    assert table.code == 0
    text = " ".join(table.stdout.split())  # captions wrap
    assert "0.2" in text and "ECE top-label, 2 equal-width bins (a,b]" in text
    assert "reliability" in table.stdout


def test_markdown_has_the_tables_but_no_chart(run_cli, tmp_path: Path) -> None:
    path = logits_file(tmp_path / "z.npz", 60, 3, seed=0)
    result = run_cli(
        "metrics", path, "--val-split", "0.5", "--gammas", "0,1", "--format", "markdown"
    )
    assert result.code == 0, result.stderr
    for title in (
        "### calibration on the evaluation split",
        "### fits",
        "### focal TS γ",
        "### split",
    ):
        assert title in result.stdout
    assert "reliability" not in result.stdout


def test_val_split_fits_on_one_part_and_measures_the_other(run_cli, tmp_path: Path) -> None:
    path = logits_file(tmp_path / "z.npz", 300, 4, seed=1)
    args = ("metrics", path, "--val-split", "0.3", "--seed", "5", "--gammas", "0,1", "--json")
    results = as_json(run_cli(*args))["results"]
    assert results["split"] == {
        "method": "val-split", "n_fit": 90, "n_eval": 210, "fraction": 0.3, "seed": 5,
    }  # fmt: skip
    for stage in ("uncalibrated", "ts", "focal_ts"):
        assert results["evaluation"][stage]["n_samples"] == 210
    assert results["fits"]["ts"]["n_samples"] == 90
    assert results["fits"]["ts"]["temperature"] > 1.5  # scores sharpened three times
    assert results["settings"]["method"] == "both"


def test_fit_file_then_apply_reproduces_the_evaluation(run_cli, tmp_path: Path) -> None:
    fit = logits_file(tmp_path / "fit.npz", 200, 3, seed=2)
    test = logits_file(tmp_path / "test.npz", 150, 3, seed=3)
    calibrator = tmp_path / "cal.json"
    args = ("--gammas", "0,1", "--save-calibrator", calibrator, "--json")
    fitted = as_json(run_cli("metrics", test, "--fit", fit, *args))["results"]
    assert fitted["split"]["method"] == "fit-file"
    assert (fitted["split"]["n_fit"], fitted["split"]["n_eval"]) == (200, 150)
    applied = as_json(run_cli("metrics", test, "--apply", calibrator, "--json"))["results"]
    assert applied["fits"] == {"ts": None, "focal_ts": None}
    assert applied["applied"]["ts"]["temperature"] == fitted["fits"]["ts"]["temperature"]
    for stage in ("uncalibrated", "ts", "focal_ts"):
        for metric in ("ece", "nll", "brier", "adaece"):
            assert applied["evaluation"][stage][metric] == pytest.approx(
                fitted["evaluation"][stage][metric], rel=1e-12
            )


def test_bootstrap_intervals_in_json_and_table(run_cli, tmp_path: Path) -> None:
    path = logits_file(tmp_path / "z.npz", 100, 3, seed=4)
    document = as_json(run_cli("metrics", path, "--bootstrap", "30", "--json"))
    low, high = document["results"]["evaluation"]["uncalibrated"]["intervals"]["ece"]
    assert low <= high
    table = run_cli("metrics", path, "--bootstrap", "30", "--explain")
    assert "95% interval of the population value" in " ".join(table.stdout.split())
    assert "over 30 bootstrap resamples" in " ".join(table.stdout.split())


def one_line_error(result, *needles: str) -> None:
    assert result.code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("curvcal: error:"), result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_probabilities_not_summing_to_one(run_cli, tmp_path: Path) -> None:
    path = probs_file(tmp_path / "bad.npz", [[0.5, 0.4], [0.5, 0.5]], [0, 1])
    one_line_error(run_cli("metrics", path, *PROBS), str(path), "row 0 sums to 0.9")


def test_wrong_input_kind_for_the_file(run_cli, tmp_path: Path) -> None:
    path = probs_file(tmp_path / "p.npz", EDGE_P, EDGE_Y)
    one_line_error(run_cli("metrics", path), str(path), "no tensor named 'logits'", "probs")
    logits = logits_file(tmp_path / "z.npz", 10, 3, seed=5)
    one_line_error(run_cli("metrics", logits, "--input-kind", "probs"), str(logits))


def test_missing_labels_key(run_cli, tmp_path: Path) -> None:
    path = logits_file(tmp_path / "z.npz", 10, 3, seed=6)
    one_line_error(run_cli("metrics", path, "--labels-key", "y"), str(path), "'y'")


def test_garbage_calibrator_file(run_cli, tmp_path: Path) -> None:
    path = logits_file(tmp_path / "z.npz", 10, 3, seed=7)
    garbage = tmp_path / "cal.json"
    garbage.write_text("{ not json")
    one_line_error(run_cli("metrics", path, "--apply", garbage), str(garbage), "not valid JSON")


def test_fit_file_with_other_class_count(run_cli, tmp_path: Path) -> None:
    test = logits_file(tmp_path / "test.npz", 20, 3, seed=8)
    fit = logits_file(tmp_path / "fit.npz", 20, 4, seed=9)
    one_line_error(run_cli("metrics", test, "--fit", fit), str(fit), "4 classes")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--val-split", "0"), "--val-split"),
        (("--val-split", "1.5"), "--val-split"),
        (("--bins", "0"), "--bins"),
        (("--bootstrap", "-1"), "--bootstrap"),
        (("--gammas", "0,-1"), "--gammas"),
        (("--method", "ts"), "needs a fit split"),
        (("--val-split", "0.5", "--method", "none"), "--method none"),
        (("--save-calibrator", "c.json"), "--save-calibrator needs a fit"),
        (("--plot", "p.jpg"), "--plot"),
        (("--method", "none", "--objective", "ece"), "--method none fits no map that --objective"),
        (
            ("--val-split", "0.5", "--method", "ts", "--gammas", "0,1"),
            "--method ts fits no map that --gammas",
        ),
        (
            ("--val-split", "0.5", "--method", "focal-ts", "--objective", "ece"),
            "--method focal-ts fits no map that --objective",
        ),
    ],
)
def test_bad_options(run_cli, tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    path = logits_file(tmp_path / "z.npz", 10, 3, seed=10)
    one_line_error(run_cli("metrics", path, *args), needle)


def test_apply_excludes_fitting(run_cli, tmp_path: Path) -> None:
    path = logits_file(tmp_path / "z.npz", 10, 3, seed=11)
    calibrator = tmp_path / "cal.json"
    calibrator.write_text('{"schema": "1.0", "ts": {"method": "temperature", "temperature": 2}}')
    one_line_error(run_cli("metrics", path, "--apply", calibrator, "--val-split", "0.5"), "--apply")
    one_line_error(run_cli("metrics", path, "--fit", path, "--val-split", "0.5"), "not both")


def test_existing_output_files_are_kept_without_force(run_cli, tmp_path: Path) -> None:
    path = logits_file(tmp_path / "z.npz", 40, 3, seed=12)
    calibrator = tmp_path / "cal.json"
    calibrator.write_text("keep me")
    args = (
        "metrics",
        path,
        "--val-split",
        "0.5",
        "--method",
        "ts",
        "--save-calibrator",
        calibrator,
    )
    one_line_error(run_cli(*args), str(calibrator), "already exists")
    assert calibrator.read_text() == "keep me"
    assert run_cli(*args, "--force").code == 0
    assert json.loads(calibrator.read_text())["ts"]["method"] == "temperature"


def test_force_never_replaces_a_link_or_a_pipe(run_cli, tmp_path: Path) -> None:
    """--force overwrites a regular file; a symbolic link or a named pipe at -o is refused before
    any work, with --force too, and left as it was (replacing it would destroy it)."""
    path = logits_file(tmp_path / "z.npz", 40, 3, seed=12)
    mine = tmp_path / "mine.json"
    mine.write_text("keep me")
    link = tmp_path / "latest.json"
    link.symlink_to(mine)
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    for target, kind in ((link, "symbolic link"), (pipe, "named pipe")):
        one_line_error(run_cli("metrics", path, "-o", target, "--force"), str(target), kind)
    assert link.is_symlink() and mine.read_text() == "keep me"
    assert stat.S_ISFIFO(pipe.lstat().st_mode)


def test_plot_with_dpi_and_classwise_panels(run_cli, tmp_path: Path) -> None:
    import matplotlib.image

    path = logits_file(tmp_path / "l.npz", 300, 4, 0)
    out = tmp_path / "r.png"
    result = run_cli(
        "metrics", path, "--val-split", "0.5", "--method", "ts", "--plot", out,
        "--plot-classes", "2", "--dpi", "50", "--json",
    )  # fmt: skip
    document = as_json(result)
    assert matplotlib.image.imread(out).shape[:2] == (2 * 200, 3 * 180)  # 2 stages × 3 panels
    again = tmp_path / "narrow.png"
    result = run_cli(
        "metrics", path, "--val-split", "0.5", "--method", "ts", "--plot", again,
        "--plot-classes", "2", "--dpi", "50", "--plot-columns", "2",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    # each stage starts a row and wraps at 2: rows (top, class 1), (class 2), per stage
    assert matplotlib.image.imread(again).shape[:2] == (4 * 200, 2 * 180)
    tables = document["results"]["evaluation"]["ts"]["class_bins"]
    assert len(tables) == 2 and sum(b["count"] for b in tables[0]["bins"]) == 150
