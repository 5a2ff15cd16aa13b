"""Strings a file supplies are shown bounded to a person, whole to a program.

A checkpoint's state-dict key, a module's name, a checkpoint's file name are the file's, of any
length: a state dict with a 300,000-character key made ``curvcal inspect`` print 8,682 lines at
120 columns (the key in the top-level keys and again in the tensor table); a per-layer Hessian
table printed a 20,000-character module name over hundreds of lines. Error lines were already
bounded (:func:`curvcal.errors.shorten`). Every string the consoles render (each table cell,
title, caption and line) now goes through one function, :func:`curvcal.errors.bounded`, beside
the escaping of control characters (:func:`curvcal.console.shown_text`): a word longer than
:data:`~curvcal.errors.LONGEST_SHOWN_WORD` is cut in the middle with its length, a string
longer than :data:`~curvcal.errors.LONGEST_SHOWN_TEXT` too. The markdown and HTML reports (read
by people) are bounded the same way; the JSON output keeps every string whole.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from catalogue_inputs import ARCH_META, digit_images, digits_model
from console_text import unwrapped
from safetensors.torch import save_file
from torch import nn

from curvcal.errors import LONGEST_SHOWN_TEXT, LONGEST_SHOWN_WORD, bounded
from curvcal.report.html import html_report
from curvcal.report.tables import Table, render_markdown, render_rich
from curvcal.results import Report

KEY = "k" * 300_000
#: a module name: a Python attribute may be any string without a dot (``add_module``)
MODULE = "m" * 20_000


@pytest.fixture(autouse=True)
def _eighty_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


def _lines(text: str) -> int:
    return len(text.splitlines())


# -- the one function ---------------------------------------------------------------------------


def test_a_long_word_keeps_its_ends_and_says_its_length() -> None:
    """Worked by hand: 140 head characters, an ellipsis, 40 tail characters, the length."""
    word = "a" * 140 + "b" * 100 + "c" * 40
    assert bounded(f"x {word} y") == f"x {'a' * 140}…{'c' * 40} [280 characters] y"


def test_words_at_the_bound_and_white_space_are_kept() -> None:
    at_bound = "w" * LONGEST_SHOWN_WORD
    text = f"{at_bound}\n  {at_bound}\t."
    assert bounded(text) == text  # a value's interval on its second line stays there
    assert bounded("") == ""


def test_many_short_words_are_bounded_as_a_whole() -> None:
    text = "ab " * 100_000
    shown = bounded(text)
    assert len(shown) < LONGEST_SHOWN_TEXT + 40
    assert shown.startswith("ab ab ") and shown.endswith(" [300,000 characters]")


# -- every renderer a person reads: rich, markdown, HTML ---------------------------------------


def _long_table() -> Table:
    return Table(
        title=f"title {KEY}",
        columns=(f"name {KEY}", "value"),
        rows=((KEY, "1.0"), ("fc", " ".join(["word"] * 60_000)), ("b", "2")),
        caption=f"caption {KEY}",
    )


def test_every_part_of_a_terminal_table_is_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: about 15,000 lines at 80 columns (each long string folded whole)."""
    render_rich([_long_table()], explain=True)
    out = capsys.readouterr().out
    assert _lines(out) < 80, _lines(out)
    assert unwrapped(out).count("[300,000 characters]") >= 4  # title, column, cell, caption


def test_markdown_and_html_bound_what_they_show() -> None:
    """A job summary or a page is read by a person (GitHub cuts a summary at 1 MiB): before,
    each held every 300,000-character string whole."""
    markdown = render_markdown([_long_table()], explain=True)
    assert len(markdown) < 20_000 and "[300,000 characters]" in markdown
    page = html_report(Report(command="inspect", results={}), [_long_table()], explain=True)
    assert len(page) < 20_000 and "[300,000 characters]" in html.unescape(page)


# -- the commands ------------------------------------------------------------------------------


def test_inspect_shows_a_long_key_by_its_ends_and_json_keeps_it(
    tmp_path: Path, run_cli: Callable[..., Any]
) -> None:
    """Before: 8,682 lines at 120 columns; now a few dozen. ``--json``, ``-o x.json``: whole."""
    checkpoint = tmp_path / "sd.pt"
    torch.save({KEY: torch.zeros(2), "fc.weight": torch.zeros(3, 4)}, checkpoint)
    shown = run_cli("inspect", checkpoint, "-o", tmp_path / "r.json")
    assert shown.code == 0, shown.output
    assert _lines(shown.stdout) < 60, _lines(shown.stdout)
    assert "[300,000 characters]" in unwrapped(shown.stdout)
    for text in (
        run_cli("inspect", checkpoint, "--json").stdout,
        (tmp_path / "r.json").read_text(),
    ):
        assert KEY in json.loads(text)["results"]["top_level_keys"]
    markdown = run_cli("inspect", checkpoint, "--format", "markdown").stdout
    assert len(markdown) < 10_000 and "[300,000 characters]" in markdown


class LongNamed(nn.Module):
    """A digits classifier whose hidden layer's name is :data:`MODULE`."""

    def __init__(self) -> None:
        super().__init__()
        self.add_module(MODULE, nn.Linear(64, 4))
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(getattr(self, MODULE)(x.flatten(1))))


def test_a_long_module_name_in_the_per_layer_table(
    tmp_path: Path, run_cli: Callable[..., Any]
) -> None:
    """Before: 20,000 characters folded over hundreds of lines of the per-layer table."""
    torch.manual_seed(0)
    checkpoint = tmp_path / "long.safetensors"
    save_file({k: v.contiguous() for k, v in LongNamed().state_dict().items()}, str(checkpoint))
    data = digit_images(tmp_path, 12)
    args = ("hessian", checkpoint, "--data", data, "--arch", f"py:{__name__}:LongNamed")
    args += ("--trust-checkpoint", "--device", "cpu", "--top-k", "1", "--probes", "4")
    shown = run_cli(*args, "--per-layer", "-o", tmp_path / "h.json")
    assert shown.code == 0, shown.output
    assert _lines(shown.stdout) < 80, _lines(shown.stdout)
    assert "[20,000 characters]" in unwrapped(shown.stdout)
    assert MODULE in (tmp_path / "h.json").read_text()


def test_a_long_checkpoint_file_name_in_the_study_table(
    tmp_path: Path, run_cli: Callable[..., Any]
) -> None:
    """A file name of 250 characters (what a file system allows) was shown whole in the study
    table and the header; now by its ends and its length. The JSON names it whole."""
    first = digits_model(tmp_path)
    name = "s" * 238 + ".safetensors"  # 250 characters
    second = tmp_path / name
    save_file(_weights(first), str(second), ARCH_META)
    data = digit_images(tmp_path, 30)
    shown = run_cli(
        "study", first, second, "--data", data, "--device", "cpu", "--probes", "4",
        "--gammas", "0,1", "-o", tmp_path / "s.json",
    )  # fmt: skip
    assert shown.code == 0, shown.output
    assert "[250 characters]" in unwrapped(shown.stdout)
    assert name not in unwrapped(shown.stdout).replace(" ", "")
    assert name in (tmp_path / "s.json").read_text()


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v + 0.01 for k, v in load_file(str(path)).items()}


def test_a_long_data_path_in_a_calibration_report(
    tmp_path: Path, run_cli: Callable[..., Any]
) -> None:
    """Calibration's tables name classes by index (their names are the plots'); what a file
    supplies there is the data's path, in the "what was measured" header: six folders of 200
    characters made it a 1,200-character word, shown whole; now by its ends and its length."""
    checkpoint = digits_model(tmp_path)
    deep = tmp_path.joinpath(*(c * 200 for c in "abcdef"))
    deep.mkdir(parents=True)
    data = digit_images(deep, 30)
    shown = run_cli("calibrate", checkpoint, "--data", data, "--device", "cpu")
    assert shown.code == 0, shown.output
    assert "characters]" in unwrapped(shown.stdout)
    assert "f" * 200 not in unwrapped(shown.stdout).replace(" ", "")


# -- nothing prints around the one place -------------------------------------------------------


def test_a_long_name_in_a_warning_is_bounded_on_stderr_and_whole_in_the_report(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A warning names a file's class or key as it is; stderr shows its ends and length, the
    report's ``warnings`` (the JSON) the whole text."""
    from curvcal.console import Reporter

    reporter = Reporter()
    reporter.warn(f"class {KEY} has no samples")
    err = capsys.readouterr().err
    assert _lines(err) < 10 and "[300,000 characters]" in unwrapped(err)
    assert reporter.warned == [f"class {KEY} has no samples"]


def test_every_console_is_curvcal_consoles() -> None:
    """A rich ``Console`` made anywhere but :mod:`curvcal.console` would print around the bound
    (and the escaping of control characters): only that module makes one."""
    root = Path(__file__).resolve().parents[1] / "curvcal"
    makers = [
        path.relative_to(root).as_posix()
        for path in root.rglob("*.py")
        if "Console(" in path.read_text(encoding="utf-8")
    ]
    assert makers == ["console.py"]
