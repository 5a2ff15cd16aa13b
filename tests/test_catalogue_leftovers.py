"""Holes a hardening round noticed and left, each fixed where every part goes through it:

- plots: names were drawn as written in titles, legends and annotations, but a tick label was
  still read as mathtext: a per-layer chart whose module is named ``m$\\frac{$`` was a
  ``ValueError`` (exit 70), and one named ``$x$`` was drawn as math. Now every figure is made
  by :func:`curvcal.report.style.drawing`, whose figures draw every text as written on each
  draw (:func:`~curvcal.report.style.text_as_written`), tick labels included; only the numbers
  matplotlib's own formatters write keep mathtext. A scatter plot's axis label holding such a
  name failed the same way (the plot is drawn for its layout before it is saved); a module
  name of 150 characters squeezed the per-layer bars to nothing;
- progress: ``hessian --warm-start``'s stage was labelled, but its count stood still (its
  products are on its sample's own operator), tested in ``tests/test_progress_stages.py``;
- multiple-choice rows: a row of 10^6 answers was refused only by the attention check, after
  99 s and 6 GB of tokenizing. Now what is cheap to count is bounded before the tokenizer runs
  (:func:`curvcal.load.texts.choices.check_row_sizes`): answers per row (at most
  :data:`~curvcal.settings.data.MAX_ANSWERS`, the rule every row and ``--choices`` follow,
  :func:`~curvcal.settings.data.answers_fault`), the characters of a prompt or an answer
  against the longest sequence, and the answers in all against the memory available. A
  ``--choices`` of many words also printed all of them in its error line. Each prompt was
  tokenized once per answer, every row at once; the memory check after tokenizing counted
  the attention but not the head's logits over the answers' tokens.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from console_text import said, shown
from matplotlib.figure import Figure
from matplotlib.text import Text

from curvcal.report.landscape import landscape_plot
from curvcal.report.plots import (
    ReliabilityBin,
    ReliabilityPanel,
    per_layer_plot,
    reliability_diagram,
    scatter_plot,
    spectrum_plot,
)

# ---------------------------------------------------------------------------------------------
# plots draw every name as written: ticks, annotations, titles, legends, suptitles

#: names mathtext would fail on (two ``$`` around a bad command), set as math (``$x$``), or
#: read as a lone delimiter
NAMES = ("m$\\frac{$", "$x$", "a$b", "$\\alpha$ b$")
BINS = [
    ReliabilityBin(0.0, 0.5, 12, 0.3, 0.25),
    ReliabilityBin(0.5, 1.0, 40, 0.8, 0.75),
]


def _texts(figure: Figure) -> list[Text]:
    return [text for text in figure.findobj(Text) if text.get_visible() and text.get_text()]


def _drawn_as_written(figure: Figure, names: tuple[str, ...]) -> list[str]:
    """Each text of ``figure`` that holds one of ``names``, checked to be drawn as written
    (no mathtext), and the texts that equal a name."""
    texts = _texts(figure)
    for name in names:
        holding = [text for text in texts if name in text.get_text()]
        assert holding, f"{name!r} is not drawn"
        for text in holding:
            assert not text.get_parse_math(), f"{text.get_text()!r} is read as mathtext"
    return [text.get_text() for text in texts if text.get_text() in names]


def test_names_in_every_slot_of_a_reliability_diagram(tmp_path: Path) -> None:
    panels = [
        ReliabilityPanel(NAMES[0], BINS, 0.05, xlabel=NAMES[1], detail=NAMES[2]),
        ReliabilityPanel(NAMES[3], BINS, 0.05),
    ]
    path = tmp_path / "r.png"
    figure = reliability_diagram(panels, path, caption=NAMES[0] + " on " + NAMES[3])
    assert path.stat().st_size > 0
    _drawn_as_written(figure, NAMES)


def test_names_in_every_slot_of_a_spectrum(tmp_path: Path) -> None:
    path = tmp_path / "s.svg"
    figure = spectrum_plot([3.0, 1.0, -0.5], path, [0.0, 1.0, 2.0], [0.1, 1.0, 0.2],
                           trace=(4.0, 3.5, 4.5), caption=" ".join(NAMES))  # fmt: skip
    assert path.stat().st_size > 0
    _drawn_as_written(figure, NAMES)


def test_module_names_on_the_per_layer_ticks_are_drawn_as_written(tmp_path: Path) -> None:
    """Before: ``ValueError: ParseSyntaxException`` for ``m$\\frac{$`` (exit 70 from
    ``hessian --per-layer --plot``), and ``$x$`` drawn as an italic x."""
    path = tmp_path / "l.png"
    values = [1.0, 20.0, 300.0, 4000.0]
    figure = per_layer_plot(list(NAMES), values, values, path, caption=NAMES[0])
    assert path.stat().st_size > 0
    ticks = [label.get_text() for label in figure.axes[0].get_yticklabels()]
    assert ticks == list(NAMES)  # the drawn text is the name
    assert sorted(_drawn_as_written(figure, NAMES)) == sorted([*NAMES, NAMES[0]])
    # the numbers matplotlib writes on the log axis stay mathtext (10^2, not "$\mathdefault")
    numbers = [label for label in figure.axes[0].get_xticklabels() if label.get_text()]
    assert numbers and all("mathdefault" in label.get_text() for label in numbers)
    assert all(label.get_parse_math() for label in numbers)


def test_names_in_every_slot_of_a_scatter_plot(tmp_path: Path) -> None:
    path = tmp_path / "p.pdf"
    figure = scatter_plot([1.0, 2.0, 3.0, 4.0], [0.1, 0.2, 0.15, 0.3], list(NAMES), NAMES[0],
                          NAMES[1], path, title=NAMES[2], note=NAMES[3], caption=NAMES[0])  # fmt: skip
    assert path.stat().st_size > 0
    _drawn_as_written(figure, NAMES)


def test_names_in_a_landscape_plot(tmp_path: Path) -> None:
    grids = {"loss": [[1.0, 0.5, 1.2]], "accuracy": [[0.5, 0.9, 0.4]], "ece": [[0.2, 0.1, 0.3]]}
    landscape = SimpleNamespace(
        betas=(), alphas=(-1.0, 0.0, 1.0), directions="random", grid=lambda key: grids[key]
    )
    analysis: Any = SimpleNamespace(landscape=landscape, loss=NAMES[1])
    path = tmp_path / "g.png"
    figure = landscape_plot(analysis, path, caption=NAMES[0])
    assert path.stat().st_size > 0
    _drawn_as_written(figure, NAMES[:2])


def test_a_new_plot_cannot_forget_names_on_its_ticks(tmp_path: Path) -> None:
    """The rule lives in the figure every plot is drawn on, not in each plot: ticks set by
    hand, an annotation and a table cell, drawn for layout before the file is saved."""
    from curvcal.report.style import drawing, save

    with drawing() as new_figure:
        figure = new_figure(4.0, 3.0)
        ax = figure.add_subplot()
        ax.bar(range(4), [1.0, 2.0, 3.0, 4.0])
        ax.set_xticks(range(4), list(NAMES))
        ax.annotate(NAMES[0], (1.0, 1.0))
        ax.table(cellText=[[NAMES[1], NAMES[2]]], loc="top")
        ax.set_yscale("log")
        figure.draw_without_rendering()  # a layout pass, as plots that thin their ticks make
        save(figure, tmp_path / "n.png", "png")
    assert (tmp_path / "n.png").stat().st_size > 0
    assert [label.get_text() for label in ax.get_xticklabels()] == list(NAMES)
    _drawn_as_written(figure, NAMES)
    assert math.isfinite(ax.get_ylim()[1])


# ---------------------------------------------------------------------------------------------
# multiple-choice rows too large to tokenize are refused before the tokenizer runs


@pytest.fixture(scope="module")
def causal_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent / "load"))
    from choice_builders import save_causal_lm

    return save_causal_lm(tmp_path_factory.mktemp("lm") / "m", "llama")


def _rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    import json

    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


QUESTION = {"prompt": "the film was great. Sentiment:", "choices": ["positive", "negative"],
            "label": 0}  # fmt: skip


def test_a_row_of_a_million_answers_is_refused_before_tokenizing(
    run_cli, causal_lm: Path, tmp_path: Path
) -> None:
    """Before: refused by the attention check after 99 s and 6 GB of tokenizing (the time
    is not asserted; the message says which check refused it)."""
    answers = [f"a{i}" for i in range(10**6)]
    data = _rows(tmp_path / "q.jsonl", [{**QUESTION, "choices": answers}])
    result = run_cli("calibrate", causal_lm, "--data", data, "--method", "none", "-q")
    assert result.code == 2, result.output
    assert said(f"curvcal: error: {shown(data, ':')} row 0: 1,000,000 answers, more than "
                "curvcal scores in one row (10,000", result.stderr), result.stderr  # fmt: skip
    assert len(result.stderr.strip().splitlines()) == 1
    words = ",".join(answers)  # the same through --choices: one short line
    listed = run_cli("calibrate", causal_lm, "--data", _rows(tmp_path / "w.jsonl", [QUESTION]),
                     "--choices", words, "--method", "none", "-q")  # fmt: skip
    assert listed.code == 2, listed.output
    assert said("1,000,000 answers, more than curvcal scores in one row", listed.stderr)
    assert len(listed.stderr) < 1000, listed.stderr[:300]


def _untouchable_tokenizer() -> Any:
    """A tokenizer that fails the test when it is run (the refusals come first)."""

    class Untouchable:
        model_max_length = 48
        name_or_path = "tok"

        def __call__(self, *args: object, **kwargs: object) -> None:
            raise AssertionError("the tokenizer ran")

    return Untouchable()


@pytest.mark.parametrize(
    ("prompt", "answers", "words"),
    [
        ("p", ["yes", "no"] * 5001, "row 1: 10,002 answers, more than curvcal scores"),
        ("p" * (48 * 1024 + 1), ["yes", "no"], "row 1: its prompt is 49,153 characters, more "
         "than curvcal tokenizes (49,152: 48 tokens of at most 1,024 bytes)"),
        ("p", ["yes", "n" * (48 * 1024)], "row 1: answer 1 is 49,153 characters, more than "
         "curvcal tokenizes (49,152"),
    ],
    ids=["answers", "prompt", "answer"],
)  # fmt: skip
def test_rows_too_large_are_refused_before_the_tokenizer_runs(
    prompt: str, answers: list[str], words: str
) -> None:
    from curvcal.errors import InputError
    from curvcal.load.texts.choices import tokenize_choices

    with pytest.raises(InputError) as refused:
        tokenize_choices(_untouchable_tokenizer(), ["q", prompt], [["yes", "no"], answers], " ",
                         "sum", 16, "q.jsonl")  # fmt: skip
    assert said(f"q.jsonl: {words}", str(refused.value)), str(refused.value)


def test_a_longer_model_max_length_than_max_length_keeps_long_prompts() -> None:
    """A --max-length shorter than the tokenizer's limit cuts prompts; the character bound is
    the longer one's, so a prompt of 40,000 characters is tokenized (and cut)."""
    from curvcal.load.texts.choices import check_row_sizes

    check_row_sizes(["p" * 40_000], [["yes", "no"]], " ", 48 * 1024, "q.jsonl")  # no error


def test_more_answers_than_memory_holds_are_refused_before_tokenizing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from curvcal.errors import InputError
    from curvcal.load.texts.choices import ANSWER_BYTES, tokenize_choices

    monkeypatch.setattr("curvcal.load.limits.available_memory", lambda: 10 * ANSWER_BYTES)
    with pytest.raises(InputError) as refused:
        tokenize_choices(_untouchable_tokenizer(), ["a", "b", "c"], [["yes", "no", "maybe", "x"]] * 3,
                         " ", "sum", 16, "q.jsonl")  # fmt: skip
    assert said("q.jsonl: 12 answers in 3 rows take at least", str(refused.value))
    assert said("measure the rows in parts", str(refused.value))


def test_rows_are_tokenized_in_chunks_and_each_prompt_once() -> None:
    """Before: every row's prompt was tokenized once per answer and all rows at once (three
    encodings per answer held together: 10^5 answers took 9.6 s and 817 MB at the peak; now
    4.7 s and 72 MB). The rows are those each row gives tokenized on its own."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent / "load"))
    pytest.importorskip("transformers")
    from hf_decoder_builders import train_tokenizer

    from curvcal.load.texts.choices import TOKENIZE_CHUNK, tokenize_choices

    tokenizer = train_tokenizer()
    calls: list[int] = []

    class Counted:
        model_max_length = tokenizer.model_max_length
        name_or_path = "tok"
        bos_token_id = tokenizer.bos_token_id

        def __call__(self, texts: list[str], **kwargs: Any) -> Any:
            calls.append(len(texts))
            return tokenizer(texts, **kwargs)

    n_rows = 2 * TOKENIZE_CHUNK // 3 + 5  # two chunks of 3-answer rows and a rest
    prompts = ["the film was great. Sentiment: ", ""] * (n_rows // 2) + ["I loved it"]
    answers = [("positive", "negative", f"fine {r}") for r in range(len(prompts))]
    rows, truncated = tokenize_choices(Counted(), prompts, answers, " ", "sum", 16)
    assert max(calls) <= TOKENIZE_CHUNK
    # a context per row with a prompt, a whole sequence per answer of those, the
    # continuation alone per answer of an empty prompt
    spoken = sum(1 for p in prompts if p)
    assert sum(calls) == spoken + 3 * len(prompts)
    one_by_one = [
        tokenize_choices(tokenizer, [p], [a], " ", "sum", 16)[0][0]
        for p, a in zip(prompts, answers, strict=True)
    ]
    assert rows == one_by_one
    assert truncated == sum(
        len(tokenizer(p.rstrip())["input_ids"]) > 16 - max(len(x) for x in row.answers)
        for p, row in zip(prompts, rows, strict=True)
        if p
    )


def test_the_answer_logits_count_in_the_memory_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row of many one-token answers packs into few tokens (a one-token answer feeds none),
    but the head's logits over its answer tokens hold answers x vocabulary values: before, the
    check counted the attention only, and 1,000 answers over a 32,000-word vocabulary (256 MB
    of logits and log-softmax in float32) passed a memory of 1 MB."""
    import torch

    from curvcal.errors import InputError
    from curvcal.load.models.choice_scorer import (
        answer_logits_bytes,
        attention_bytes,
        check_attention_memory,
    )

    assert answer_logits_bytes(1, 1000, 32_000, torch.float32) == 2 * 1000 * 32_000 * 4
    segments = torch.zeros(1, 10, dtype=torch.int64)
    config = SimpleNamespace(num_attention_heads=4)
    need = attention_bytes(1, 10, torch.float32, 4) + answer_logits_bytes(
        1, 1000, 32_000, torch.float32
    )
    monkeypatch.setattr("curvcal.load.models.choice_scorer.available_memory", lambda: need - 1)
    with pytest.raises(InputError) as refused:
        check_attention_memory(segments, torch.float32, config, 1000, 32_000)
    assert said("for their attention (it grows as the square of the tokens) and answer logits",
                str(refused.value))  # fmt: skip
    monkeypatch.setattr("curvcal.load.models.choice_scorer.available_memory", lambda: need)
    check_attention_memory(segments, torch.float32, config, 1000, 32_000)  # fits exactly


def test_long_module_names_leave_the_per_layer_bars_their_room(tmp_path: Path) -> None:
    """Before: names of 150 characters squeezed the bars to nothing (matplotlib warned that
    the layout collapsed and drew the axes where they fell). Now the figure widens with the
    longest name, and a name past 100 characters is cut in the middle."""
    import warnings

    from curvcal.report.plots import LONGEST_NAME

    exact = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default".ljust(
        LONGEST_NAME, "_"
    )
    names = [exact, "m$" + "x" * 20_000 + "$end"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a collapsed layout warns
        figure = per_layer_plot(names, [1.0, 2.0], [3.0, 4.0], tmp_path / "l.png")
    ticks = [label.get_text() for label in figure.axes[0].get_yticklabels()]
    assert ticks[0] == exact  # drawn as written up to the limit
    assert (
        len(ticks[1]) == LONGEST_NAME and ticks[1].startswith("m$x") and ticks[1].endswith("x$end")
    )
    assert all(ax.get_position().width > 0.2 for ax in figure.axes)  # of the figure's width
