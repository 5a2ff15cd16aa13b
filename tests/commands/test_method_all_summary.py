"""`--method all` on a terminal: one ranked table (a row per map, uncalibrated first, then the
maps in rank order; NLL, ECE, AdaECE, Brier and accuracy with their intervals) within 60 lines
of a 100-column terminal; the per-metric tables only with `--verbose`; the JSON the same either
way; the reliability plot a grid of at most `--plot-columns` panels to a row."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.image
import pytest

from curvcal.report.calibration import interval_text, stage_title
from tests.commands.test_metrics import as_json, logits_file
from tests.console_text import said

ARGS = ("--val-split", "0.5", "--method", "all", "--gammas", "0,1")


def _rows(table: str) -> list[list[str]]:
    """The first line of each row of the summary table: its cells split at column gaps."""
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("rank   map"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        if line[:6].strip():  # a row's first line carries its rank
            rows.append([cell.strip() for cell in line.strip().split("  ") if cell.strip()])
    return rows


@pytest.mark.parametrize(("k", "bootstrap"), [(4, "30"), (2, "0")])
def test_one_ranked_table_fits_60_lines_of_100_columns(
    run_cli, tmp_path: Path, monkeypatch, k: int, bootstrap: str
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    test = logits_file(tmp_path / "t.npz", 400, k, seed=5)
    args = (*ARGS, "--bootstrap", bootstrap)
    document = as_json(run_cli("metrics", test, *args, "--json"))
    table = run_cli("metrics", test, *args)
    assert table.code == 0, table.stderr
    lines = table.stdout.splitlines()
    assert len(lines) <= 60, table.stdout
    assert max(len(line) for line in lines) <= 100
    evaluation = document["results"]["evaluation"]
    ranking = document["results"]["ranking"]
    assert said(f"{len(ranking['stages']) - 1} maps ranked by NLL", table.stdout)
    rows = _rows(table.stdout)
    shown = [row[1] for row in rows]
    # uncalibrated first, then the maps by their NLL on the evaluation split, finite ones first
    maps = [s for s in evaluation if s != "uncalibrated" and evaluation[s] is not None]
    by_nll = sorted(
        maps, key=lambda s: math.inf if evaluation[s]["nll"] is None else evaluation[s]["nll"]
    )
    assert shown == ["uncalibrated", *(stage_title(s) for s in by_nll)]
    assert rows[1][0] == "1"
    for row in rows:  # rank, map, NLL, ECE, AdaECE, Brier, accuracy
        assert len(row) == 7, row
    # ≈: the paired interval of the NLL difference from the best holds 0
    stages = {item["stage"]: item for item in ranking["stages"]}
    keys = ["uncalibrated", *by_nll]
    for row, stage in zip(rows, keys, strict=True):
        told_apart = stages[stage]["vs_best"]["nll"]["distinguishable"]
        assert row[0].endswith(" ≈") == (told_apart is False and row[0] != "1"), row
    uncalibrated = evaluation["uncalibrated"]
    assert rows[0][2:] == [
        f"{uncalibrated[key]:.4g}" for key in ("nll", "ece", "adaece", "brier", "accuracy")
    ]
    if bootstrap != "0":  # the intervals on the line under each value
        row = next(i for i, line in enumerate(lines) if line.split()[1:2] == ["uncalibrated"])
        below = lines[row + 1].split()
        spans = [interval_text(*uncalibrated["intervals"][key]) for key in ("nll", "ece", "adaece")]
        assert " ".join(below) == " ".join(spans)
    else:
        assert said("no intervals: pass --bootstrap N", table.stdout)
    # what the summary stands for is shown only with --verbose
    assert "reliability (non-empty" not in table.stdout and "linear maps" not in table.stdout
    verbose = run_cli("metrics", test, *args, "--verbose")
    assert "reliability (non-empty" in verbose.stdout and said("linear maps", verbose.stdout)
    assert said("ranked by ECE", verbose.stdout)


def test_verbose_changes_no_json_and_markdown_follows_the_terminal(run_cli, tmp_path: Path) -> None:
    test = logits_file(tmp_path / "t.npz", 300, 3, seed=2)
    plain = as_json(run_cli("metrics", test, *ARGS, "--json"))
    verbose = as_json(run_cli("metrics", test, *ARGS, "--json", "--verbose"))
    assert plain["results"] == verbose["results"]
    markdown = run_cli("metrics", test, *ARGS, "--format", "markdown")
    assert markdown.code == 0
    headings = [line for line in markdown.stdout.splitlines() if line.startswith("### ")]
    assert headings[2:] == ["### maps not fitted"]
    assert headings[1].startswith("### ") and "maps ranked by NLL" in headings[1]
    more = run_cli("metrics", test, *ARGS, "--format", "markdown", "--verbose").stdout
    assert "### which map to trust: ranked by ECE on the evaluation split" in more


def test_rank_by_ece_orders_by_ece(run_cli, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    test = logits_file(tmp_path / "t.npz", 300, 3, seed=2)
    document = as_json(run_cli("metrics", test, *ARGS, "--rank-by", "ece", "--json"))
    evaluation = document["results"]["evaluation"]
    table = run_cli("metrics", test, *ARGS, "--rank-by", "ece")
    rows = _rows(table.stdout)
    assert said("maps ranked by ECE", table.stdout)
    ece = [evaluation[s]["ece"] for s in evaluation if evaluation[s] is not None]
    shown = [float(row[3]) for row in rows[1:]]
    assert shown == sorted(shown)
    assert shown[0] == pytest.approx(min(ece), rel=1e-3)
    ranks = [int(row[0].split()[0]) for row in rows]
    assert sorted(ranks) == list(range(1, len(rows) + 1)) and ranks[1:] == sorted(ranks[1:])
    refused = run_cli("metrics", test, "--val-split", "0.5", "--method", "ts", "--rank-by", "ece")
    assert refused.code == 2 and said("--rank-by", refused.stderr)


def test_intervals_keep_two_significant_digits_of_their_width() -> None:
    assert interval_text(0.8231, 0.9512) == "[0.82, 0.95]"  # width 0.128: 2 places
    assert interval_text(2.2512, 2.2634) == "[2.251, 2.263]"  # width 0.0122: 3 places
    assert interval_text(0.0, 0.1106) == "[0.00, 0.11]"
    assert interval_text(12.0, 48.0) == "[12, 48]"  # width 36: no places
    assert interval_text(0.871, math.inf) == "[0.871, inf]"
    assert interval_text(0.5, 0.5) == "[0.5, 0.5]"  # zero width: 3 significant digits
    assert interval_text(1e-9, 3e-9) == "[0.000000, 0.000000]"  # at most 6 places


@pytest.mark.parametrize(("columns", "shape"), [(None, (1600, 4 * 360)), ("3", (2000, 3 * 360))])
def test_plot_is_a_grid_of_panels_readable_at_full_size(
    run_cli, tmp_path: Path, columns: str | None, shape: tuple[int, int]
) -> None:
    test = logits_file(tmp_path / "t.npz", 300, 3, seed=2)
    plot = tmp_path / "r.png"
    more = () if columns is None else ("--plot-columns", columns)
    result = run_cli("metrics", test, *ARGS, "--plot", plot, *more, "--json")
    stages = [s for s, m in as_json(result)["results"]["evaluation"].items() if m is not None]
    assert len(stages) == 14  # K = 3: uncalibrated, every map but Platt, beta and Laplace
    assert matplotlib.image.imread(plot).shape[:2] == shape
    assert json.loads(result.stdout)["settings"]["calibration"]["plot_columns"] == int(columns or 4)


def test_plot_columns_out_of_range_is_refused_before_any_work(run_cli, tmp_path: Path) -> None:
    test = logits_file(tmp_path / "t.npz", 100, 3, seed=2)
    for bad in ("0", "65", "two"):
        plot = tmp_path / "r.png"
        result = run_cli("metrics", test, "--plot", plot, "--plot-columns", bad)
        assert result.code == 2 and said("--plot-columns", result.stderr), result.stderr
        assert "Traceback" not in result.stderr and not plot.exists()
