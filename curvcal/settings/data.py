"""The settings that say which samples are read and how they are preprocessed: every command
that reads a dataset takes them (``--data`` and friends, ``--batch-size``), declared once."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from curvcal.errors import SettingsError, setting_name, shorten
from curvcal.settings.fields import Settings, comma_numbers, folder_setting, setting

#: ``resize``/``crop`` value of an explicit ``none``: no resize or crop, and no model config's.
NO_RESIZE = 0


def _float_list(ctx: Any, param: Any, value: str | None) -> tuple[float, ...] | None:
    """``--mean``/``--std``: comma-separated finite numbers (``--std`` > 0)."""
    import click

    if value is None:
        return None
    name = param.opts[0] if param.opts else str(param.name)
    numbers = comma_numbers(
        ctx,
        param,
        value,
        f"{name} takes comma-separated numbers, e.g. 0.5,0.5,0.5; got '{value}'",
        f"{name} needs at least one number",
    )
    if any(not math.isfinite(n) for n in numbers):
        raise click.BadParameter(f"{name} values must be finite; got '{value}'", ctx, param)
    if param.name == "std" and any(n <= 0 for n in numbers):
        raise click.BadParameter(f"{name} values must be > 0; got '{value}'", ctx, param)
    return numbers


def _word_list(ctx: Any, param: Any, value: str | None) -> tuple[str, ...] | None:
    """``--choices``: comma-separated answers, each kept as typed (spaces included), held to
    the rule of every row's answers (:func:`answers_fault`)."""
    import click

    if value is None:
        return None
    words = tuple(value.split(","))
    fault = answers_fault(words)
    if fault is not None:
        raise click.BadParameter(
            f"--choices takes two or more non-empty answers, comma-separated, no two alike; "
            f"got {shorten(repr(value))}: {fault}",
            ctx,
            param,
        )
    return words


#: The most answers one row may hold, counted before anything is tokenized. The K answers of
#: a row are packed into one sequence after its prompt
#: (:meth:`curvcal.load.texts.choices.ChoiceDataset.collate`), whose attention grows as the
#: square of its tokens: 20,000 answers of a few tokens (89,000 tokens) asked for 110 GiB, and
#: 10^6 answers took 99 s and 6 GB of tokenizing before the attention check refused them.
#: Multiple-choice benchmarks have 2 to 10 answers a row.
MAX_ANSWERS = 10_000


def answers_fault(answers: Sequence[str]) -> str | None:
    """What makes ``answers`` no set of K classes (``None`` when nothing does): fewer than
    two, more than :data:`MAX_ANSWERS` (counted first, before any answer is read), one empty
    or only white space (scored as the delimiter alone), or one given twice (two classes no
    score can tell apart). The one rule for ``--choices`` and for every row of a
    ``--choices-key`` column."""
    if len(answers) < 2:
        return (
            f"{len(answers)} answer{'' if len(answers) == 1 else 's'}; a choice needs at least two"
        )
    if len(answers) > MAX_ANSWERS:
        return (
            f"{len(answers):,} answers, more than curvcal scores in one row ({MAX_ANSWERS:,}: "
            "every answer of a row is packed into one sequence, whose attention grows as the "
            "square of its tokens)"
        )
    for k, answer in enumerate(answers):
        if not answer.strip():
            return f"answer {k} ({shorten(repr(answer))}) is empty"
    seen: dict[str, int] = {}
    for k, answer in enumerate(answers):
        if answer in seen:
            return f"answers {seen[answer]} and {k} are the same text {shorten(repr(answer))}"
        seen[answer] = k
    return None


def _size(ctx: Any, param: Any, value: str | None) -> int | None:
    """A positive size, or ``none`` (kept as :data:`NO_RESIZE`)."""
    import click

    if value is None:
        return None
    if value.strip().lower() == "none":
        return NO_RESIZE
    name = param.opts[0] if param.opts else str(param.name)
    try:
        size = int(value)
    except ValueError:
        size = 0
    if size < 1:
        raise click.BadParameter(f"{name} takes a size >= 1 or 'none'; got '{value}'", ctx, param)
    return size


#: ``--choice-score``: how the K answers of a causal language model are scored
#: (:mod:`curvcal.load.texts.choices`)
CHOICE_SCORES = ("sum", "mean-token", "mean-char")
#: the fields of multiple-choice data, read for a causal language model
CHOICE_FIELDS = (
    "prompt_key", "choices_key", "choices", "template", "choice_delimiter", "choice_score",
)  # fmt: skip

#: the text-data fields (also taken by ``check``, whose dataset a policy names)
TEXT_FIELDS = (
    "text_key", "label_key", "text_pair_key", "tokenizer", "max_length",
    *CHOICE_FIELDS,
)  # fmt: skip


@dataclass(frozen=True)
class DataSettings(Settings):
    """Which samples are read, how they are preprocessed, and in batches of what size.

    ``resize``/``crop``: ``None`` when not given (a model config's transform may then apply),
    :data:`NO_RESIZE` for an explicit "none". ``trust_checkpoint`` allows ``py:`` factories
    (they run code); it is no option of its own: the command sets it from the checkpoint's
    ``--trust-checkpoint``.
    """

    GROUP: ClassVar[str] = "data"

    data: str | None = setting(
        None,
        "Dataset: tv:NAME[:train|test], folder:PATH, PATH.pt|.npz|.safetensors, texts in "
        "PATH.jsonl|.csv|.parquet or a saved datasets folder DIR[:split], py:module:function, or "
        "curvcal:digits.",
        metavar="SPEC",
        policy=("data", "fit_data"),
    )
    data_root: Path | None = folder_setting(
        "Folder of torchvision datasets (default ./data).",
        metavar=None,
        policy=True,
    )
    download: bool = setting(
        False, "Download a torchvision dataset if missing.", flag=True, policy=False
    )
    mean: tuple[float, ...] | None = setting(
        None,
        "Per-channel mean to normalise with (overrides the preset).",
        parse=_float_list,
        metavar="M1,M2,...",
        policy=True,
    )
    std: tuple[float, ...] | None = setting(
        None,
        "Per-channel std to normalise with (overrides the preset).",
        parse=_float_list,
        metavar="S1,S2,...",
        policy=True,
    )
    resize: int | None = setting(
        None,
        "Resize images (shorter side); 'none' keeps them as they are, without a model config's "
        "resize and crop.",
        parse=_size,
        metavar="N|none",
        policy=True,
    )
    crop: int | None = setting(
        None,
        "Center-crop images; 'none': no crop.",
        parse=_size,
        metavar="N|none",
        policy=True,
    )
    max_samples: int | None = setting(
        None,
        "Use a random subset of this many samples (kept in dataset order).",
        low=1,
        policy=True,
    )
    subset_seed: int = setting(0, "Seed of the --max-samples subset.", policy=False)
    x_key: str = setting("x", "Inputs' name in a tensor file.", policy=True)
    y_key: str = setting("y", "Labels' name in a tensor file.", policy=True)
    text_key: str = setting("text", "Text column of text data.", policy=True)
    label_key: str = setting("label", "Label column of text data.", policy=True)
    text_pair_key: str | None = setting(
        None, "Second text column, for sentence pairs.", policy=True
    )
    prompt_key: str = setting(
        "prompt", "Prompt column of multiple-choice data (causal LMs).", policy=True
    )
    choices_key: str = setting(
        "choices",
        "Column of multiple-choice data holding each row's list of K answers.",
        policy=True,
    )
    choices: tuple[str, ...] | None = setting(
        None,
        "The K answers of every row (label words), comma-separated; in place of --choices-key.",
        parse=_word_list,
        metavar="A,B,...",
        policy=True,
    )
    template: str | None = setting(
        None,
        "Build each prompt from the row's columns, e.g. 'Review: {text}\\nSentiment:' "
        "(\\n, \\t and \\\\ are read as escapes); in place of --prompt-key.",
        metavar="TEXT",
        policy=True,
    )
    choice_delimiter: str = setting(
        " ",
        "Text put between the prompt and each answer (lm-evaluation-harness's target_delimiter).",
        metavar="TEXT",
        default_text="' ' (one space)",
        policy=True,
    )
    choice_score: str = setting(
        "sum",
        "Score of an answer: the summed log-likelihood of its tokens after the prompt (sum, "
        "lm-eval's acc), per token (mean-token) or per character (mean-char, lm-eval's "
        "acc_norm).",
        choices=CHOICE_SCORES,
        policy=True,
    )
    tokenizer: Path | None = folder_setting(
        "Tokenizer folder (save_pretrained).",
        metavar=None,
        default_text="the model folder's",
        policy=True,
    )
    max_length: int | None = setting(
        None,
        "Tokens per text; longer ones are cut.",
        low=1,
        default_text="the tokenizer's model_max_length, capped by the config's "
        "max_position_embeddings",
        policy=True,
    )
    batch_size: int = setting(256, "Samples per batch.", low=1, policy=True)
    trust_checkpoint: bool = setting(False, "", cli=False, record=False, policy=False)

    @property
    def spec(self) -> str:
        """The dataset spec of ``--data``, which a loader cannot do without."""
        if self.data is None:
            raise SettingsError(
                "data", "no dataset given", f"name one with {setting_name('data')} SPEC"
            )
        return self.data
