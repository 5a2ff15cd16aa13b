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
  what is wrong. ``fit_map("ts", ..., val_split=0.5)`` fitted on every row, and any setting
  the map's fit never reads (``bootstrap``, ``save_calibrator``, ``device`` for a CPU map)
  was ignored; the fit's reads are now recorded and an unread setting is refused;
- names shown on the terminal: a path holding ``[/]`` (a folder ``a[``) was read by rich as a
  closing tag in a table cell or a warning, ``MarkupError``, exit 70, ``[bold]`` in a name
  was drawn bold and ``:thumbs_up:`` as an emoji; a control character in a name (ESC, BEL)
  reached the terminal raw, so a checkpoint named ``e<ESC>[2J.safetensors`` cleared it. Now
  curvcal's consoles read no markup or emoji code unless a call asks, and every string they
  render, and the error line, goes through one function that shows a control character as
  its ``\\xNN`` escape (a bidirectional override as its ``\\uNNNN``);
- plots: a checkpoint named ``m$\\frac{$.safetensors`` made ``--plot`` (and an ``-o x.html``
  page's figures) a mathtext ``ValueError``, exit 70, and ``$x$`` in a name was set as math:
  the one function every figure is saved through now draws every title, legend and
  annotation as written (tick labels keep the mathtext matplotlib's formatters write);
- the markdown summary (``--format markdown``, ``-o x.md``): a checkpoint whose name holds a
  line break split the verdict's heading and put the rest of its name on lines of their own (a
  list item, a heading of the job summary); only the table cells were kept on one line. Now
  every name the summary quotes goes through the cells' one function; a data or policy name
  holding a backtick ended its code span early (``odd/d`**x**`.pt`` showed a bold x): the
  span's fence is now longer than any run of backticks in it;
- saved reports read by ``compare`` and ``check --baseline``: a verdict row's value given as a
  string, a boolean or NaN was judged "not finite" (exit 1, a check that failed) and an
  interval of NaN was dropped; an ECE of -5 or 1e308, an accuracy of 2, an interval whose low
  end is above its high end, rows of one metric that disagree, ``rows`` given as a string:
  each was judged, exit 0 or 1. Now the one reader of reports checks every value it hands
  the judge, exit 2 naming the file and the value's path in it;
- multiple-choice rows (a language model as a classifier): ``--choices a,a`` and an empty
  ``--choices`` word were refused, but a row's own ``choices`` list holding an answer twice
  (two classes no score tells apart), an empty answer or one of white space only (scored as
  the delimiter alone) was measured, exit 0; now one rule (``answers_fault``) reads both. A
  label of -1, None or NaN in such a row pointed at "the model's label2id ()", which a
  language model has none of; it now says a label is the index of the row's right answer. A
  row of many answers packs into a sequence whose attention grows as its square: 10⁶ answers
  (5.9 million tokens) ended after 99 s and 6 GB with a failed allocation, 20,000 answers
  (89,000 tokens) asked for 110 GiB, which the kernel answers by killing the run; the scorer
  now compares a lower bound of that memory with what is free first, exit 2 naming --data;
- a Laplace calibrator fitted with ``--dtype float32`` and applied to the same checkpoint read
  with ``--dtype bfloat16`` or ``float16`` (or fitted in bfloat16, applied in float32) was
  refused as another model's ("its weight differs ... refit it", where refitting could not
  help): the saved head is now compared with the model's at the coarser of the two
  precisions, still exactly, so a head changed by more than that rounding is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from console_text import said, shown

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


@pytest.mark.parametrize(
    ("stage", "setting"),
    [("ts", {"val_split": 0.5}), ("ts", {"bootstrap": 100}), ("vector", {"device": "cpu"}),
     ("isotonic", {"seed": 3}), ("dirichlet", {"save_calibrator": "d.json"})],
)  # fmt: skip
def test_fit_map_refuses_a_setting_its_fit_never_reads(stage: str, setting: dict) -> None:
    """Before: each was accepted and ignored (val_split=0.5 fitted on every row)."""
    logits, labels = _scores(3)
    with pytest.raises(InputError) as caught:
        curvcal.fit_map(stage, logits, labels, **setting)
    assert caught.value.what == "fit_map"
    assert f"the {stage} map's fit reads no {next(iter(setting))}" in caught.value.why
    # what the fit reads is taken
    read = {"ts": {"objective": "ece", "device": "cpu"}, "vector": {}, "isotonic": {},
            "dirichlet": {}}[stage]  # fmt: skip
    assert curvcal.fit_map(stage, logits, labels, **read).stage == stage


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


def shutil_copy(source: Path, target: Path) -> None:
    import shutil

    shutil.copyfile(source, target)


def test_a_path_that_reads_as_markup_is_shown_as_it_is(run_cli, odd_folder: Path) -> None:
    """Before: rich read ``[/]`` in a table cell or a warning as a closing tag: MarkupError,
    exit 70."""
    model = odd_folder / "]m.safetensors"  # the path a[/]m.safetensors
    inspected = run_cli("inspect", model)
    assert inspected.code == 0, inspected.output
    # the table folds a long path over lines at any console width: compared without white space
    assert "".join(str(model).split()) in "".join(inspected.stdout.split())
    emoji = odd_folder / "x:thumbs_up:y.safetensors"  # was drawn as x👍y.safetensors
    shutil_copy(odd_folder / "]m.safetensors", emoji)
    named = run_cli("inspect", emoji)
    assert named.code == 0 and "x:thumbs_up:y.safetensors" in named.stdout, named.output
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
    # a right-to-left override would show "a<RLO>gnp.pt" as "atp.png"
    reordered = run_cli("inspect", tmp_path / "a\u202egnp.pt")
    assert reordered.code == 2 and "\u202e" not in reordered.stderr
    assert said("a\\u202egnp.pt: no such file", reordered.stderr)


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


# ---------------------------------------------------------------------------------------------
# saved reports: every value compare and check --baseline judge is checked as it is read

_REPORT_ROWS = [
    {"metric": "accuracy", "bound": "min", "limit": 0.5, "value": 0.9, "interval": None},
    {"metric": "ece", "bound": "max", "limit": 0.1, "value": 0.03, "interval": [0.01, 0.05]},
    {"metric": "ece", "bound": "max_increase", "limit": 0.5, "value": 0.03,
     "interval": [0.01, 0.05]},
    {"metric": "lambda_max", "bound": "max", "limit": 1e3, "value": 70.0, "interval": None},
]  # fmt: skip


def _check_report(rows: object) -> dict[str, object]:
    from curvcal.results import SCHEMA_VERSION

    return {"schema": SCHEMA_VERSION, "curvcal": curvcal.__version__, "command": "check",
            "status": "pass", "results": {"passed": True, "rows": rows}}  # fmt: skip


def _edited(row: int, **changes: object) -> list[dict[str, object]]:
    rows = [dict(r) for r in _REPORT_ROWS]
    rows[row].update(changes)
    return rows


#: (rows of the NEW report, what the error says): each was judged before, exit 0 or 1
TAMPERED_REPORTS = {
    "string value": (_edited(1, value="0.1"), "results.rows[1].value: must be a number or null"),
    "bool value": (_edited(0, value=True), "results.rows[0].value: must be a number or null"),
    "NaN value": (_edited(1, value=float("nan")), "results.rows[1].value: nan is no value"),
    "ECE below 0": (_edited(1, value=-5.0), "-5 is outside the range of ece, [0, 1]"),
    "ECE of 1e308": (_edited(1, value=1e308), "1e+308 is outside the range of ece"),
    "accuracy of 2": (_edited(0, value=2.0), "2 is outside the range of accuracy, [0, 1]"),
    "interval reversed": (
        _edited(1, interval=[0.05, 0.01]),
        "results.rows[1].interval: its low end 0.05 is above its high end 0.01",
    ),
    "NaN interval": (_edited(1, interval=[float("nan"), 0.05]), "results.rows[1].interval[0]"),
    "interval of three": (_edited(1, interval=[0, 0.01, 0.05]), "a list of two numbers or null"),
    "rows that disagree": (
        _edited(2, value=0.5),
        "results.rows[2]: gives ece another value than an earlier row",
    ),
    "rows a string": ("x", "results.rows: must be a list of verdict rows, not str"),
    "row without a metric": (_edited(3, metric=5), "results.rows[3]: must be an object naming"),
}

_GATE = "[ece]\nmax_increase = 0.5\n[accuracy]\nmax_decrease = 0.1\n"


@pytest.mark.parametrize("case", list(TAMPERED_REPORTS))
def test_compare_refuses_a_report_value_no_run_writes(run_cli, tmp_path: Path, case: str) -> None:
    import json

    rows, why = TAMPERED_REPORTS[case]
    old, new, gate = tmp_path / "old.json", tmp_path / "new.json", tmp_path / "g.toml"
    old.write_text(json.dumps(_check_report(_REPORT_ROWS)))
    new.write_text(json.dumps(_check_report(rows)))
    gate.write_text(_GATE)
    assert run_cli("compare", old, old, "--policy", gate, "-q").code == 0  # the good report
    for first, second in ((new, old), (old, new)):  # read as NEW and as OLD, the same
        result = run_cli("compare", first, second, "--policy", gate, "-q")
        assert result.code == 2, (case, result.output)
        assert said(f"curvcal: error: {shown(new, ':')}", result.stderr), result.stderr
        assert said(why, result.stderr), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# multiple-choice rows: each row's answers read by the one rule --choices is read by


@pytest.fixture(scope="module")
def causal_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent / "load"))
    from choice_builders import save_causal_lm

    return save_causal_lm(tmp_path_factory.mktemp("lm") / "m", "llama")


_QUESTIONS = [
    {"prompt": "the film was great. Sentiment:", "choices": ["positive", "negative"], "label": 0},
    {"prompt": "a dull movie. Sentiment:", "choices": ["positive", "negative"], "label": 1},
]

#: (row 1 changed to, what the error says): each was measured before, exit 0 (or, for the
#: label, a hint about the model's label2id)
CHOICE_ROWS = {
    "an answer twice": ({"choices": ["good", "good"]}, "row 1: answers 0 and 1 are the same"),
    "an empty answer": ({"choices": ["", "negative"]}, "row 1: answer 0 ('') is empty"),
    "a blank answer": ({"choices": ["positive", "  "]}, "row 1: answer 1 ('  ') is empty"),
    "label -1": ({"label": -1}, "row 1: label -1 in column 'label' (a label is the index of"),
    "label None": (
        {"label": None},
        "row 1: label None in column 'label' (a label is the index of the row's right answer, 0 to 1)",
    ),
}


@pytest.mark.parametrize("case", list(CHOICE_ROWS))
def test_a_row_of_answers_no_classifier_has_is_refused(
    run_cli, causal_lm: Path, tmp_path: Path, case: str
) -> None:
    import json

    change, why = CHOICE_ROWS[case]
    rows = [_QUESTIONS[0], {**_QUESTIONS[1], **change}]
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = run_cli("calibrate", causal_lm, "--data", data, "--method", "none", "-q")
    assert result.code == 2, result.output
    assert said(f"curvcal: error: {shown(data, ':')} {why}", result.stderr), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# a Laplace calibrator applies to its checkpoint read at any --dtype


def _calibrate(run_cli, files: tuple[Path, Path], *extra: object) -> object:
    checkpoint, data = files
    return run_cli("calibrate", checkpoint, "--data", data, "--device", "cpu", "-q", *extra)


@pytest.mark.parametrize(("fitted", "applied"), [("float32", "bfloat16"), ("float32", "float16"),
                                                 ("bfloat16", "float32"), ("float16", "float64")])  # fmt: skip
def test_a_laplace_calibrator_applies_to_its_checkpoint_at_another_dtype(
    run_cli, digits_files: tuple[Path, Path], tmp_path: Path, fitted: str, applied: str
) -> None:
    import json

    saved = tmp_path / "lap.json"
    fit = _calibrate(run_cli, digits_files, "--method", "laplace", "--laplace-structure", "full",
                     "--val-split", "0.5", "--dtype", fitted, "--save-calibrator", saved)  # fmt: skip
    assert fit.code == 0, fit.output
    result = _calibrate(run_cli, digits_files, "--apply", saved, "--dtype", applied, "--json")
    assert result.code == 0, result.output
    assert "laplace" in json.loads(result.stdout)["results"]["evaluation"]
    # a head changed by more than the coarser precision's rounding is still another head
    document = json.loads(saved.read_text())
    document["laplace"]["weight"][0][0] += 0.05 * (abs(document["laplace"]["weight"][0][0]) + 1)
    tampered = tmp_path / "t.json"
    tampered.write_text(json.dumps(document))
    refused = _calibrate(run_cli, digits_files, "--apply", tampered, "--dtype", applied)
    assert refused.code == 2
    assert said("its Laplace calibrator's weight differs from the weight", refused.stderr)


# ---------------------------------------------------------------------------------------------
# plots draw names as written: "$" is no mathtext delimiter


def test_a_dollar_in_a_name_is_drawn_as_written(
    run_cli, digits_files: tuple[Path, Path], tmp_path: Path
) -> None:
    """Before: exit 70, ValueError: ParseSyntaxException (matplotlib read the name as
    mathtext)."""
    pytest.importorskip("matplotlib")
    import shutil

    checkpoint, data = digits_files
    model = tmp_path / "m$\\frac{$.safetensors"
    shutil.copyfile(checkpoint, model)
    plot = tmp_path / "r.svg"
    result = run_cli("calibrate", model, "--data", data, "--device", "cpu", "-q", "--plot", plot,
                     "-o", tmp_path / "r.html")  # fmt: skip
    assert result.code == 0, result.output
    assert plot.stat().st_size > 0 and (tmp_path / "r.html").stat().st_size > 0
    spectrum = tmp_path / "s.png"
    drawn = run_cli("hessian", model, "--data", data, "--device", "cpu", "-q", "--no-trace",
                    "--density", "--plot", spectrum)  # fmt: skip
    assert drawn.code == 0 and spectrum.stat().st_size > 0, drawn.output


def test_rows_whose_attention_cannot_fit_are_refused_before_it_is_built(
    run_cli, causal_lm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound is checked against the memory free: here made 1,000 bytes, which the packed
    rows' attention (mask and one layer's scores, eager attention) exceeds; with the machine's
    real memory the same run measures them."""
    import json

    import torch

    from curvcal.load.models.choice_scorer import attention_bytes

    # rows x width^2 x (dtype bytes x (1 + heads)) + 3 boolean width^2 tensors
    assert attention_bytes(2, 10, torch.float32, 4) == 2 * 100 * 4 * 5 + 300
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in _QUESTIONS * 3))
    args = ("calibrate", causal_lm, "--data", data, "--method", "none", "-q")
    assert run_cli(*args).code == 0
    monkeypatch.setattr("curvcal.load.models.choice_scorer.available_memory", lambda: 1000)
    refused = run_cli(*args, "--batch-size", "6")
    assert refused.code == 2, refused.output
    assert said("curvcal: error: --data: 1 multiple-choice row packed into", refused.stderr)
    assert said("GiB free on cpu (give fewer or shorter answers per row, or a smaller "
                "--batch-size)", refused.stderr), refused.stderr  # fmt: skip
