"""`--format markdown` renders a pipe table for every command (ready for a CI job summary)."""

from __future__ import annotations

import re
from pathlib import Path

from curvcal.assets import demo_checkpoint
from curvcal.commands import COMMANDS

DATA = ("--data", "curvcal:digits", "--max-samples", "60", "--device", "cpu")


def assert_pipe_tables(markdown: str) -> None:
    """Every heading is followed by a pipe table with a header of column names and a rule
    that aligns each column (text left, numbers right), or, for a table without column names,
    by a list of ``- **name**: value`` lines (never a pipe table under an empty header)."""
    lines = markdown.splitlines()
    headings = [i for i, line in enumerate(lines) if line.startswith("### ")]
    assert headings, markdown
    for i in headings:
        header = lines[i + 2]
        if header.startswith("- **"):
            continue
        rule = lines[i + 3]
        assert header.startswith("| ") and header.endswith(" |")
        assert re.sub(r"\|\s*\|", "", header) == header, f"an empty column name: {header}"
        assert re.fullmatch(r"\|:---(\|(:---|---:))*\|", rule), rule
        assert rule.count("|") == header.count("|") - header.count("\\|")


def test_every_command_renders_markdown(run_cli, tmp_path: Path) -> None:
    policy = tmp_path / "gate.toml"
    policy.write_text('[settings]\ndata = "curvcal:digits"\ndevice = "cpu"\n[ece]\nmax = 1\n')
    logits = tmp_path / "logits.npz"
    runs = {
        "version": ["version"],
        "inspect": ["inspect", demo_checkpoint()],
        "calibrate": ["calibrate", demo_checkpoint(), *DATA, "--gammas", "0,1",
                      "--save-logits", logits, "-o", tmp_path / "cal.json"],
        "metrics": ["metrics", logits],
        "hessian": ["hessian", demo_checkpoint(), *DATA, "--tol", "1e-2", "--no-trace"],
        "check": ["check", demo_checkpoint(), "--policy", policy, "--max-samples", "60"],
        "compare": ["compare", tmp_path / "cal.json", tmp_path / "cal.json", "--policy", policy],
    }  # fmt: skip
    # the demo's markdown is tested in test_demo.py; a command added later joins this list
    assert set(runs) | {"demo"} <= set(COMMANDS)
    for name, args in runs.items():
        result = run_cli(*args, "--format", "markdown", "--quiet")
        assert result.code == 0, f"{name}: {result.output}"
        assert_pipe_tables(result.stdout)


def test_markdown_escapes_pipes_in_cells() -> None:
    from curvcal.report.tables import Table, render_markdown

    text = render_markdown([Table("t", ("a", "b"), (("x|y", "1"),))])
    assert "| x\\|y | 1 |" in text


def test_markdown_aligns_text_left_and_numbers_right_and_lists_unnamed_columns() -> None:
    from curvcal.report.tables import Table, render_markdown

    table = Table("t", ("metric", "value", "bound", "result"), (("ece", "0.03 [0.01, 0.05]",
                  "<= 0.05", "pass"), ("nll", "-", ">= 1", "FAIL")))  # fmt: skip
    assert "|:---|---:|:---|:---|" in render_markdown([table])
    listed = render_markdown([Table("measured", ("", ""), (("checkpoint", "m.pt"), ("N", "3")))])
    assert "- **checkpoint**: m.pt\n- **N**: 3\n" in listed and "|" not in listed
