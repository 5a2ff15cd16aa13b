"""Results that stand alone: every table output begins with what was measured, fits 80 columns
without cutting a cell, and keeps captions to two lines unless --explain."""

from __future__ import annotations

from pathlib import Path

import pytest

from curvcal.report.header import measured_table
from curvcal.report.tables import CAPTION_CHARACTERS, Table, render_markdown, short_caption
from curvcal.results import Report

SHA = "95f6f3da28ae607d89e52d3b07b393bd58812041fc7eed640fe07bb9c16318d0"


def _report() -> Report:
    return Report(
        command="hessian",
        results={},
        inputs={
            "checkpoint": {"path": "/runs/model.safetensors", "sha256": SHA, "dtype": "float32"},
            "data": {
                "spec": "images:/data/val",
                "n_samples": 200,
                "normalisation": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
                "transforms": ["resize 256", "centre crop 224"],
                "subset": {"max_samples": 200, "subset_seed": 0, "of": 1000},
            },
        },
        settings={
            "checkpoint": {"dtype": "float64", "device": "cpu"},
            "hessian": {"loss": "focal", "gamma": 3.0, "mode": "train", "curvature": "ggn"},
        },
        environment={"device": "cuda:0"},
    )


def test_the_header_names_checkpoint_data_preprocessing_loss_mode_dtype_device() -> None:
    table = measured_table(_report())
    assert table is not None
    rows = dict(table.rows)
    assert rows["checkpoint"] == "model.safetensors (sha256 95f6f3da28ae)"
    assert rows["data"] == "images:/data/val, N = 200 (of 1000, seed 0)"
    assert rows["data preprocessing"] == (
        "mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225); resize 256; centre crop 224"
    )
    assert rows["loss"] == "focal (γ 3); curvature ggn"
    assert rows["mode"] == "train"
    assert rows["dtype"] == "float64"
    assert rows["device"] == "cuda:0"
    assert table.title == "curvcal hessian: what was measured"


def test_several_checkpoints_and_a_logits_file() -> None:
    report = Report(
        command="study",
        results={},
        inputs={
            "checkpoints": [{"path": "a.pt", "sha256": SHA}, {"path": "b.pt", "sha256": "0" * 64}],
        },
    )
    rows = dict(measured_table(report).rows)  # type: ignore[union-attr]
    assert rows == {
        "checkpoint 1": "a.pt (sha256 95f6f3da28ae)",
        "checkpoint 2": "b.pt (sha256 000000000000)",
    }
    logits = Report(
        command="metrics",
        results={},
        inputs={"logits": {"path": "val.npz", "sha256": SHA, "n_samples": 500}},
    )
    assert dict(measured_table(logits).rows)["logits"] == (  # type: ignore[union-attr]
        "val.npz (sha256 95f6f3da28ae), N = 500"
    )
    assert measured_table(Report(command="metrics", results={})) is None


def test_captions_keep_their_first_clauses_within_two_lines() -> None:
    clauses = [f"clause {i} " + "word " * 8 for i in range(10)]
    caption = "; ".join(clause.strip() for clause in clauses)
    short = short_caption(caption)
    assert short is not None and len(short) <= CAPTION_CHARACTERS
    assert short.startswith("clause 0 word") and short.endswith("(more: --explain)")
    assert short_caption(caption, explain=True) == caption
    assert short_caption("brief") == "brief"
    markdown = render_markdown([Table("t", ("a", "b"), (("1", "2"),), caption)])
    assert "(more: --explain)" in markdown
    assert caption in render_markdown([Table("t", ("a", "b"), (("1", "2"),), caption)], True)


WIDE = Table(
    title="per checkpoint",
    columns=("checkpoint", "trained with", "λmax", "tr(H) ± s.e.", "accuracy", "ECE", "AdaECE",
             "NLL", "T", "FTS γ, T", "ECE after TS", "ECE after FTS"),
    rows=(
        ("resnet18_focal_gamma3.safetensors", "focal_ts", "52.75", "149.9 ± 59.5", "0.9774",
         "0.02218", "0.01907", "0.2311", "1.479", "1, 1.02", "0.01712", "0.02265"),
        ("resnet18_ce.safetensors", "ce", "21.14", "98.72 ± 0.01", "0.9661", "0.03492",
         "0.02188", "0.2315", "1.2", "0.5, 1.1", "0.0002741", "0.0002668"),
    ),
)  # fmt: skip


@pytest.mark.parametrize("rows", [2, 9])
def test_a_wide_table_at_80_columns_is_turned_not_cut(
    rows: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from curvcal.report.tables import render_rich

    monkeypatch.setenv("COLUMNS", "80")
    table = Table(WIDE.title, WIDE.columns, tuple(WIDE.rows[i % 2] for i in range(rows)))
    render_rich([table])
    out = capsys.readouterr().out
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 80
    words = {word for row in table.rows for cell in row for word in cell.split()}
    printed = set(out.split())
    assert words <= printed, words - printed  # every word whole, none folded


def test_hessian_and_calibrate_markdown_begin_with_what_was_measured(
    run_cli, digits_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib

    checkpoint, data = digits_files
    digest = hashlib.sha256(checkpoint.read_bytes()).hexdigest()[:12]
    common = ("--data", str(data), "--device", "cpu", "--format", "markdown")
    hessian = run_cli("hessian", checkpoint, *common, "--probes", "4", "--loss", "ce")
    assert hessian.code == 0, hessian.stderr
    assert hessian.stdout.startswith("### curvcal hessian: what was measured")
    # a table without column names is a list in markdown, not a pipe table with an empty header
    for row in (f"- **checkpoint**: model.safetensors (sha256 {digest})\n", "- **data**: ",
                "N = 30", "- **loss**: ce\n", "- **mode**: eval\n", "- **dtype**: float32\n",
                "- **device**: cpu\n"):  # fmt: skip
        assert row in hessian.stdout, row
    calibrate = run_cli("calibrate", checkpoint, *common, "--method", "ts")
    assert calibrate.code == 0, calibrate.stderr
    assert calibrate.stdout.startswith("### curvcal calibrate: what was measured")
    assert f"model.safetensors (sha256 {digest})" in calibrate.stdout
    monkeypatch.setenv("COLUMNS", "80")
    table = run_cli("hessian", checkpoint, "--data", str(data), "--device", "cpu",
                    "--probes", "4", "--trace-method", "hutchinson")  # fmt: skip
    explained = run_cli("hessian", checkpoint, "--data", str(data), "--device", "cpu",
                        "--probes", "4", "--trace-method", "hutchinson", "--explain")  # fmt: skip
    assert table.code == explained.code == 0
    assert "what was measured" in table.stdout.splitlines()[0]
    assert "…" not in table.stdout
    assert len(explained.stdout) >= len(table.stdout)
