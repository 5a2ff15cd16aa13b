"""Multiple-choice data for a causal language model: a prompt, K answers and the right one's index.

A causal LM (``*ForCausalLM``, or a PEFT adapter over one) is a classifier over the K answers of
each row: the score of answer k is the log-likelihood of its tokens after the prompt
(:class:`curvcal.load.choice_scorer.ChoiceScorer`). This module reads the rows and tokenizes
them; the scorer computes the scores from the batches it makes.

Rows (``--data``: the tables of :mod:`curvcal.load.text`, JSON Lines, CSV, parquet or a
``save_to_disk`` folder):

- the prompt: the ``prompt`` column (``--prompt-key``), or ``--template`` filled from the
  row's columns (``'Review: {text}\\nSentiment:'``; ``\\n``, ``\\t`` and ``\\\\`` typed in the
  template are read as a newline, a tab and a backslash);
- the answers: the ``choices`` column (``--choices-key``), a list of K strings in every row (a
  JSON array in a CSV cell), or ``--choices a,b,c`` once for every row (label words);
- the label: the ``label`` column (``--label-key``), the index of the right answer in
  ``[0, K)``; with ``--choices`` also the answer itself (``positive``).

Every row has the same K >= 2; a row with another K, or a label outside ``[0, K)``, is one
error naming the file and the row.

Tokenization is lm-evaluation-harness's (``loglikelihood`` with ``_encode_pair``): the
continuation of answer k is ``--choice-delimiter`` (one space by default, the harness's
``target_delimiter``) followed by the answer, and whitespace at the end of the prompt is moved
to the front of the continuation. Then::

    context      = tok(prompt)
    continuation = tok(prompt + continuation)[len(context):]

with the tokenizer's own special tokens (a BOS where the tokenizer adds one), so a merge of
tokens across the boundary is counted in the answer. An empty prompt is the tokenizer's BOS
token (else its EOS), the answer then tokenized alone. The model reads ``context +
continuation``; a sequence longer than ``max_length`` loses tokens from the front of its
prompt (counted as truncated). Scores (``--choice-score``): ``sum`` (the summed
log-likelihood, the harness's ``acc``), ``mean-token`` (divided by the continuation's token
count) or ``mean-char`` (divided by the answer's length in characters, delimiter excluded, the
harness's ``acc_norm``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset

from curvcal.errors import InputError
from curvcal.load.loaded_data import LoadedData, loaded_data
from curvcal.load.preprocessing import reject_image_transforms
from curvcal.settings.data import DataSettings

if TYPE_CHECKING:
    from curvcal.load.text import TextModel

#: what each ``--choice-score`` divides the summed log-likelihood by, for the report
SCORE_MEANINGS = {
    "sum": "the summed log-likelihood of its tokens after the prompt (lm-evaluation-harness's acc)",
    "mean-token": "the log-likelihood of its tokens after the prompt per token",
    "mean-char": "the log-likelihood of its tokens after the prompt per character of the "
    "answer (lm-evaluation-harness's acc_norm)",
}
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}
_FIELD = re.compile(r"\{([^{}]*)\}")


@dataclass(frozen=True)
class ChoiceRow:
    """One row tokenized: for each answer the token ids the model reads (prompt then answer),
    the number of prompt tokens among them, and what its summed log-likelihood is divided by."""

    sequences: tuple[tuple[int, ...], ...]
    n_context: tuple[int, ...]
    divisors: tuple[float, ...]


class ChoiceDataset(Dataset[tuple[ChoiceRow, int]]):
    """Tokenized multiple-choice rows and their labels; :meth:`collate` makes a batch."""

    def __init__(self, rows: list[ChoiceRow], labels: torch.Tensor, pad_token_id: int) -> None:
        self.rows = rows
        self.labels = labels
        self.pad_token_id = pad_token_id

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[ChoiceRow, int]:
        return self.rows[index], int(self.labels[index])

    def collate(
        self, items: Sequence[tuple[ChoiceRow, int]]
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``(inputs, labels)`` for B rows of K answers, L the longest sequence of the batch:

        - ``input_ids`` (B, K, L) int64, right-padded (the padding follows every real token, so
          a causal model's outputs at real positions never see it);
        - ``attention_mask`` (B, K, L) int64, 1 on real tokens;
        - ``choice_targets`` (B, K, L) int64: at position t, the answer token the model predicts
          there (the token at t + 1), else -1;
        - ``choice_divisors`` (B, K): what the summed log-likelihood is divided by.
        """
        n_rows, n_choices = len(items), len(items[0][0].sequences)
        width = max(len(s) for row, _ in items for s in row.sequences)
        shape = (n_rows, n_choices, width)
        input_ids = torch.full(shape, self.pad_token_id, dtype=torch.int64)
        attention_mask = torch.zeros(shape, dtype=torch.int64)
        targets = torch.full(shape, -1, dtype=torch.int64)
        for b, (row, _label) in enumerate(items):
            for k, (sequence, n_context) in enumerate(
                zip(row.sequences, row.n_context, strict=True)
            ):
                tokens = torch.as_tensor(sequence, dtype=torch.int64)
                input_ids[b, k, : len(sequence)] = tokens
                attention_mask[b, k, : len(sequence)] = 1
                targets[b, k, n_context - 1 : len(sequence) - 1] = tokens[n_context:]
        divisors = torch.tensor([row.divisors for row, _ in items], dtype=torch.float64)
        inputs = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "choice_targets": targets,
            "choice_divisors": divisors,
        }
        labels = torch.as_tensor([int(label) for _, label in items], dtype=torch.int64)
        return inputs, labels


def load_choices(options: DataSettings, model: TextModel | None) -> LoadedData:
    """The multiple-choice rows of the table ``options.spec``, tokenized for the causal LM whose
    tokenizer is ``options.tokenizer`` or ``model``'s (see the module's text)."""
    from curvcal.load import text

    reject_image_transforms(options, "multiple-choice data")
    if options.mean is not None or options.std is not None:
        raise InputError("--mean/--std", "do not apply to text data")
    if options.text_pair_key is not None:
        raise InputError(
            "--text-pair-key",
            "does not apply to multiple-choice data",
            "build the prompt from several columns with --template",
        )
    columns, files, file = text.read_table(options.spec)
    prompts = _prompts(columns, options, file)
    answers = _answers(columns, options, file, len(prompts))
    n_choices = len(answers[0])
    label2id = {word: i for i, word in enumerate(options.choices or ())}
    labels = text.text_labels(
        text.text_column(columns, options.label_key, file, "--label-key"),
        label2id,
        file,
        options.label_key,
    )
    outside = (labels >= n_choices).nonzero()
    if len(outside):
        row = int(outside[0, 0])
        raise InputError(
            file,
            f"row {row}: label {int(labels[row])} in column '{options.label_key}' is not the "
            f"index of one of its {n_choices} answers (0 to {n_choices - 1})",
        )
    tokenizer, source = text.load_tokenizer(options.tokenizer, model, options.trust_checkpoint)
    if options.max_length is not None:
        max_length, length_source = options.max_length, "--max-length"
    else:
        max_length, length_source = text.default_max_length(tokenizer, model)
    rows, truncated = tokenize_choices(
        tokenizer,
        prompts,
        answers,
        options.choice_delimiter,
        options.choice_score,
        max_length,
        file,
    )
    pad = _pad_id(tokenizer)
    columns_used = {
        "prompt": None if options.template is not None else options.prompt_key,
        "choices": None if options.choices is not None else options.choices_key,
        "label": options.label_key,
    }
    return loaded_data(
        ChoiceDataset(rows, labels, pad),
        options.spec,
        labels,
        files,
        classes=range(n_choices),
        transforms=("tokenize prompt + answer", "pad per batch"),
        text={
            "file": file,
            "columns": columns_used,
            "template": options.template,
            "choices": list(options.choices) if options.choices is not None else None,
            "n_choices": n_choices,
            "choice_score": options.choice_score,
            "choice_delimiter": options.choice_delimiter,
            "n_texts": len(rows),
            "max_length": max_length,
            "max_length_source": length_source,
            "truncated": truncated,
            "tokenizer": source,
            "tokenizer_class": type(tokenizer).__name__,
        },
        chosen=(
            f"the score of each of the {n_choices} answers: "
            f"{SCORE_MEANINGS[options.choice_score]} (--choice-score {options.choice_score}), "
            "tokenized as lm-evaluation-harness does",
        ),
    )


def tokenize_choices(
    tokenizer: Any,
    prompts: Sequence[str],
    answers: Sequence[Sequence[str]],
    delimiter: str,
    score: str,
    max_length: int,
    file: str = "--data",
) -> tuple[list[ChoiceRow], int]:
    """Each row's sequences as lm-evaluation-harness tokenizes them (see the module's text),
    and how many rows lost prompt tokens to ``max_length``; errors name ``file``."""
    from curvcal.load.text import rust_panics_as

    contexts: list[str] = []
    continuations: list[str] = []
    for prompt, row in zip(prompts, answers, strict=True):
        for answer in row:
            context, continuation = _split(prompt, delimiter + answer)
            contexts.append(context)
            continuations.append(continuation)
    where = str(getattr(tokenizer, "name_or_path", "") or "--tokenizer")
    with rust_panics_as(where):
        context_ids = _encode(tokenizer, contexts, True)
        whole_ids = _encode(
            tokenizer, [c + t for c, t in zip(contexts, continuations, strict=True)], True
        )
        alone_ids = _encode(tokenizer, continuations, False)
    rows: list[ChoiceRow] = []
    truncated = 0
    n_choices = len(answers[0]) if answers else 0
    for r, row in enumerate(answers):
        sequences: list[tuple[int, ...]] = []
        n_context: list[int] = []
        divisors: list[float] = []
        cut = False
        for k, answer in enumerate(row):
            i = r * n_choices + k
            if contexts[i] == "":
                prompt_tokens, answer_tokens = [_prefix_token(tokenizer, file)], alone_ids[i]
            else:
                prompt_tokens = context_ids[i]
                answer_tokens = whole_ids[i][len(prompt_tokens) :]
            if not answer_tokens:
                raise InputError(
                    file,
                    f"row {r}: answer {k} ({answer!r}) adds no token to its prompt",
                    "every answer must be at least one token",
                )
            if len(answer_tokens) >= max_length:
                raise InputError(
                    file,
                    f"row {r}: answer {k} is {len(answer_tokens)} tokens, which leaves no room "
                    f"for its prompt within a max_length of {max_length}",
                    "pass a larger --max-length",
                )
            keep = max_length - len(answer_tokens)
            if len(prompt_tokens) > keep:
                prompt_tokens, cut = prompt_tokens[-keep:], True
            sequences.append((*prompt_tokens, *answer_tokens))
            n_context.append(len(prompt_tokens))
            divisors.append(_divisor(score, len(answer_tokens), answer))
        truncated += cut
        rows.append(ChoiceRow(tuple(sequences), tuple(n_context), tuple(divisors)))
    return rows, truncated


# --- helpers ---------------------------------------------------------------------------------


def _split(context: str, continuation: str) -> tuple[str, str]:
    """The harness's ``_encode_pair``: whitespace at the end of the context moved to the front
    of the continuation."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        return context[:-n_spaces], context[-n_spaces:] + continuation
    return context, continuation


def _encode(tokenizer: Any, texts: list[str], special: bool) -> list[list[int]]:
    if not texts:
        return []
    kwargs: dict[str, Any] = {} if special else {"add_special_tokens": False}
    return [list(ids) for ids in tokenizer(texts, **kwargs)["input_ids"]]


def _prefix_token(tokenizer: Any, file: str) -> int:
    """The token standing for an empty prompt: BOS, else EOS (the harness's
    ``prefix_token_id``)."""
    for name in ("bos_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    raise InputError(
        file,
        "a prompt is empty and the tokenizer has neither a BOS nor an EOS token to stand for it",
        "give every row a prompt",
    )


def _pad_id(tokenizer: Any) -> int:
    """Any token id will do as padding (it is masked and follows every real token)."""
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return 0


def _divisor(score: str, n_tokens: int, answer: str) -> float:
    if score == "mean-token":
        return float(n_tokens)
    if score == "mean-char":
        return float(max(len(answer), 1))
    return 1.0


def _unescape(template: str) -> str:
    """``\\n``, ``\\t`` and ``\\\\`` typed in a template as a newline, a tab and a backslash."""
    return re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m.group(1)], template)


def _prompts(columns: Mapping[str, list[Any]], options: DataSettings, file: str) -> list[str]:
    """The prompt of each row: ``--template`` filled from its columns, or ``--prompt-key``."""
    from curvcal.load.text import as_texts, text_column

    if options.template is None:
        return as_texts(
            text_column(columns, options.prompt_key, file, "--prompt-key"),
            file,
            options.prompt_key,
        )
    template = _unescape(options.template)
    names = _FIELD.findall(template)
    if not names:
        raise InputError(
            "--template", f"{options.template!r} names no column", "write {COLUMN} in it"
        )
    for name in names:
        if name not in columns:
            present = ", ".join(columns) or "none"
            raise InputError(
                file,
                f"has no column '{name}', which --template names (columns: {present})",
            )
    n_rows = len(next(iter(columns.values()))) if columns else 0
    prompts = []
    for row in range(n_rows):
        values = {}
        for name in names:
            value = columns[name][row]
            if not isinstance(value, str | int | float) or isinstance(value, bool):
                raise InputError(
                    file, f"row {row}: column '{name}' holds {value!r}, not a text or a number"
                )
            values[name] = str(value)
        prompts.append(_FIELD.sub(lambda m, v=values: v[m.group(1)], template))  # type: ignore[misc]
    return prompts


def _answers(
    columns: Mapping[str, list[Any]], options: DataSettings, file: str, n_rows: int
) -> list[tuple[str, ...]]:
    """The answers of each row: ``--choices`` for every row, or the ``--choices-key`` column;
    the same K >= 2 for every row."""
    from curvcal.load.text import text_column

    if options.choices is not None:
        return [tuple(options.choices)] * n_rows
    cells = text_column(columns, options.choices_key, file, "--choices-key")
    rows: list[tuple[str, ...]] = []
    for row, cell in enumerate(cells):
        if isinstance(cell, str):  # a CSV cell: a JSON array
            try:
                cell = json.loads(cell)
            except json.JSONDecodeError:
                cell = None
        if not isinstance(cell, list | tuple) or not all(isinstance(a, str) for a in cell):
            raise InputError(
                file,
                f"row {row}: column '{options.choices_key}' is not a list of answers (texts)",
                "write each row's answers as a list, or give them once with --choices a,b,c",
            )
        answers = tuple(cell)
        if rows and len(answers) != len(rows[0]):
            raise InputError(
                file,
                f"row {row} has {len(answers)} answers, row 0 has {len(rows[0])}; every row "
                "needs the same number K",
            )
        rows.append(answers)
    if rows and len(rows[0]) < 2:
        raise InputError(file, f"row 0 has {len(rows[0])} answer; a choice needs at least two")
    return rows
