"""Holes a second adversarial pass found on the newest surfaces, each fixed where every part
goes through it:

- the Python API of the maps (``curvcal.fit_map``, ``curvcal.load_map``, ``FittedMap``): a
  temperature-scaling or ETS map fitted on 3 classes gave probabilities for 2-class scores, and
  a map read by ``load_map`` was never compared with the scores' class count, where ``--apply``
  refuses both; ``fit_map("laplace", logits, labels)`` was an ``AttributeError`` from inside
  the fit; ``fit_map("ts", ..., method="dirichlet")`` fitted temperature scaling and said
  nothing. Now :class:`~curvcal.pipeline.fitted_map.FittedMap` checks the class count of every
  map it applies (fitted or read), and ``fit_map`` refuses scores of the wrong kind for a map
  and a ``method`` that is not its name: each an :class:`~curvcal.errors.InputError` naming
  what is wrong;
- names shown on the terminal: a path holding ``[/]`` (a folder ``a[``) was read by rich as a
  closing tag in a table cell or a warning, ``MarkupError``, exit 70, and ``[bold]`` in a name
  was drawn bold; a control character in a name (ESC, BEL) reached the terminal raw, so a
  checkpoint named ``e<ESC>[2J.safetensors`` cleared it. Now curvcal's consoles read no markup
  unless a call asks, and every string they render, and the error line, goes through one
  function that shows a control character as its ``\\xNN`` escape;
- the markdown summary (``--format markdown``, ``-o x.md``): a checkpoint whose name holds a
  line break split the verdict's heading and put the rest of its name on lines of their own (a
  list item, a heading of the job summary); only the table cells were kept on one line. Now
  every name the summary quotes goes through the cells' one function.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from console_text import said

import curvcal
from curvcal.calibration.registry import MAPS
from curvcal.errors import InputError


def _scores(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(60) % k
    logits = torch.randn(60, k, generator=generator, dtype=torch.float64)
    logits[torch.arange(60), labels] += 1.5
    return logits, labels


# ---------------------------------------------------------------------------------------------
# the maps from Python: each applied to scores of the class count it was fitted on only


@pytest.mark.parametrize("stage", ["ts", "ets", "focal_ts"])
def test_a_map_of_any_class_count_refuses_scores_of_another(stage: str, tmp_path: Path) -> None:
    """Temperature scaling's and ETS's parameters do not depend on K: before, the map fitted on
    3 classes gave probabilities for 2-class scores, fitted or read back by load_map."""
    logits, labels = _scores(3)
    fitted = curvcal.fit_map(stage, logits, labels)
    path = tmp_path / "m.json"
    fitted.save(path)
    for applied in (fitted, curvcal.load_map(path)):
        assert applied.probabilities(logits).shape == (60, 3)
        for apply in (applied.probabilities, applied.log_probabilities):
            with pytest.raises(InputError) as caught:
                apply(logits[:, :2])
            assert caught.value.what == "scores"
            assert "have 2 classes, but this" in caught.value.why
            assert "fitted on 3" in caught.value.why and caught.value.exit_code == 2


def test_every_map_read_back_knows_its_class_count(tmp_path: Path) -> None:
    for stage, entry in MAPS.items():
        if entry.input == "features":
            continue
        k = 2 if entry.skip_reason(3, False) else 3
        logits, labels = _scores(k)
        path = tmp_path / f"{stage}.json"
        curvcal.fit_map(stage, logits, labels).save(path)
        assert curvcal.load_map(path).n_classes == k, stage


def test_fit_map_refuses_logits_for_a_map_of_the_model_features() -> None:
    """Before: AttributeError: 'Tensor' object has no attribute 'features'."""
    logits, labels = _scores(3)
    with pytest.raises(InputError) as caught:
        curvcal.fit_map("laplace", logits, labels)
    assert caught.value.what == "scores" and "HeadFeatures" in caught.value.why
    assert "not on Tensor" in caught.value.why


def test_fit_map_refuses_a_method_setting_that_is_not_its_name() -> None:
    """Before: fit_map("ts", ..., method="dirichlet") fitted temperature scaling, silently."""
    logits, labels = _scores(3)
    with pytest.raises(InputError) as caught:
        curvcal.fit_map("ts", logits, labels, method="dirichlet")
    assert caught.value.what == "fit_map"
    assert "method='dirichlet' contradicts the map named 'ts'" in caught.value.why
    # the name's own spelling, either way, is no contradiction
    for same in ("ts", "focal-ts"):
        name = "focal_ts" if same == "focal-ts" else same
        assert curvcal.fit_map(name, logits, labels, method=same).stage == name


# ---------------------------------------------------------------------------------------------
# names with odd characters: shown as they are, never read as markup or sent as control codes


@pytest.fixture(scope="module")
def odd_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder named ``a[`` (so that ``a[/]x`` is a path), with a checkpoint and a one-class
    logits file in it."""
    import shutil

    from curvcal.assets import demo_checkpoint

    folder = tmp_path_factory.mktemp("odd") / "a["
    folder.mkdir()
    shutil.copyfile(demo_checkpoint(), folder / "]m.safetensors")
    (folder / "]k.csv").write_text("logits_0,labels\n0.5,0\n0.1,0\n")
    return folder


def test_a_path_that_reads_as_markup_is_shown_as_it_is(run_cli, odd_folder: Path) -> None:
    """Before: rich read ``[/]`` in a table cell or a warning as a closing tag: MarkupError,
    exit 70."""
    model = odd_folder / "]m.safetensors"  # the path a[/]m.safetensors
    inspected = run_cli("inspect", model)
    assert inspected.code == 0, inspected.output
    assert str(model) in inspected.stdout.replace("\n", "")
    measured = run_cli("metrics", odd_folder / "]k.csv")
    assert measured.code == 0, measured.output
    assert said(f"{odd_folder}/]k.csv: one class (K = 1)", measured.stderr)


def test_control_characters_in_a_name_are_shown_as_escapes(run_cli, tmp_path: Path) -> None:
    """Before: a checkpoint named ``e<ESC>[2J.safetensors`` cleared the terminal when its table
    was drawn, and a BEL in a missing file's name rang in the error line."""
    import shutil

    from curvcal.assets import demo_checkpoint

    model = tmp_path / "e\x1b[2J.safetensors"
    shutil.copyfile(demo_checkpoint(), model)
    inspected = run_cli("inspect", model)
    assert inspected.code == 0, inspected.output
    assert "\x1b" not in inspected.stdout and "e\\x1b[2J.safetensors" in inspected.stdout
    missing = run_cli("inspect", tmp_path / "no\x07pe.pt")
    assert missing.code == 2 and "\x07" not in missing.stderr
    assert said("no\\x07pe.pt: no such file", missing.stderr)


def test_a_line_break_in_a_name_stays_inside_the_markdown_summary(run_cli, tmp_path: Path) -> None:
    import shutil

    from curvcal.assets import demo_checkpoint

    model = tmp_path / "x\n- evil\n### heading.safetensors"
    shutil.copyfile(demo_checkpoint(), model)
    gate = tmp_path / "gate.toml"
    gate.write_text(
        '[settings]\ndata = "curvcal:digits"\ndevice = "cpu"\nmax_samples = 60\n'
        "gammas = [0]\ntrace = false\n[accuracy]\nmin = 0.5\n"
    )
    result = run_cli("check", model, "--policy", gate, "-q", "--format", "markdown",
                     "-o", tmp_path / "r.md")  # fmt: skip
    assert result.code == 0, result.output
    lines = result.stdout.splitlines()
    assert (tmp_path / "r.md").read_text().splitlines() == lines
    assert not [line for line in lines if line.startswith(("- evil", "### heading"))]
    assert any(
        line.startswith("curvcal check: **x - evil ### heading.safetensors") for line in lines
    )
