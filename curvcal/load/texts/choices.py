"""Multiple-choice data for a causal language model: a prompt, K answers and the right one's index.

A causal LM (``*ForCausalLM``, or a PEFT adapter over one) is a classifier over the K answers of
each row: the score of answer k is the log-likelihood of its tokens after the prompt
(:class:`curvcal.load.models.choice_scorer.ChoiceScorer`). This module reads the rows and tokenizes
them; the scorer computes the scores from the batches it makes.

Rows (``--data``: the tables of :mod:`curvcal.load.texts.text`, JSON Lines, CSV, parquet or a
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
continuation``, one pass over the prompt for all K answers (:meth:`ChoiceDataset.collate`). A
row longer than ``max_length`` loses tokens from the front of its prompt (counted as
truncated): the prompt keeps its last ``max_length`` minus (the longest answer's tokens)
tokens, the same for every answer of the row. Scores (``--choice-score``): ``sum`` (the summed
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

from curvcal.errors import InputError, shorten
from curvcal.load.datasets.loaded_data import LoadedData, loaded_data
from curvcal.load.datasets.preprocessing import reject_image_transforms
from curvcal.settings.data import MAX_ANSWERS, DataSettings, answers_fault

if TYPE_CHECKING:
    from curvcal.load.texts.text import TextModel

#: what each ``--choice-score`` divides the summed log-likelihood by, for the report
SCORE_MEANINGS = {
    "sum": "the summed log-likelihood of its tokens after the prompt (lm-evaluation-harness's acc)",
    "mean-token": "the log-likelihood of its tokens after the prompt per token",
    "mean-char": "the log-likelihood of its tokens after the prompt per character of the "
    "answer (lm-evaluation-harness's acc_norm)",
}
#: A generous bound on the bytes one token covers (text runs at about 4 bytes a token): a
#: prompt or answer of more characters than ``max_length`` times this is refused before it is
#: tokenized (:func:`check_row_sizes`).
MAX_BYTES_PER_TOKEN = 1024
#: The least memory one answer's tokens take once tokenized (a tuple of at least one token id
#: and its divisor, as :class:`ChoiceRow` holds them, in CPython): the bound the total answer
#: count is held to before tokenizing (:func:`check_row_sizes`).
ANSWER_BYTES = 96
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}
_FIELD = re.compile(r"\{([^{}]*)\}")


@dataclass(frozen=True)
class ChoiceRow:
    """One row tokenized: its prompt's tokens (the same for every answer: the prompt and its
    moved whitespace do not depend on the answer), each answer's continuation tokens, and what
    each answer's summed log-likelihood is divided by."""

    prompt: tuple[int, ...]
    answers: tuple[tuple[int, ...], ...]
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
        """``(inputs, labels)`` for B rows of K answers, each row packed into one sequence.

        A row reads ``prompt, answer 1, ..., answer K`` where answer k stands for its tokens but
        the last (whose prediction is never needed): one pass over the prompt serves every
        answer. Answer k's tokens see the prompt and their own earlier tokens only, at the
        positions they would have right after the prompt, so each answer is scored as if it
        followed the prompt alone. Every tensor has B rows (S: the longest packed row, T: the
        most answer tokens in a row):

        - ``input_ids`` (B, S) and ``position_ids`` (B, S), right-padded;
        - ``choice_segments`` (B, S): 0 on the prompt, k + 1 on answer k, -1 on padding (the
          scorer's attention mask is built from it);
        - ``choice_from`` (B, T): the position whose output predicts each answer token (the
          prompt's last for every answer's first token), ``choice_tokens`` (B, T) that token,
          ``choice_of`` (B, T) its answer's index (-1 on padding);
        - ``choice_divisors`` (B, K): what each summed log-likelihood is divided by.
        """
        packed = [_pack(row) for row, _label in items]
        width = max(len(p[0]) for p in packed)
        count = max(len(p[3]) for p in packed)
        n_rows = len(items)
        input_ids = torch.full((n_rows, width), self.pad_token_id, dtype=torch.int64)
        positions = torch.zeros((n_rows, width), dtype=torch.int64)
        segments = torch.full((n_rows, width), -1, dtype=torch.int64)
        sources = torch.zeros((n_rows, count), dtype=torch.int64)
        tokens = torch.zeros((n_rows, count), dtype=torch.int64)
        owners = torch.full((n_rows, count), -1, dtype=torch.int64)
        for b, (ids, place, segment, source, token, owner) in enumerate(packed):
            input_ids[b, : len(ids)] = torch.as_tensor(ids)
            positions[b, : len(ids)] = torch.as_tensor(place)
            segments[b, : len(ids)] = torch.as_tensor(segment)
            sources[b, : len(source)] = torch.as_tensor(source)
            tokens[b, : len(source)] = torch.as_tensor(token)
            owners[b, : len(source)] = torch.as_tensor(owner)
        inputs = {
            "input_ids": input_ids,
            "position_ids": positions,
            "choice_segments": segments,
            "choice_from": sources,
            "choice_tokens": tokens,
            "choice_of": owners,
            "choice_divisors": torch.tensor(
                [row.divisors for row, _ in items], dtype=torch.float64
            ),
        }
        labels = torch.as_tensor([int(label) for _, label in items], dtype=torch.int64)
        return inputs, labels


Packed = tuple[list[int], list[int], list[int], list[int], list[int], list[int]]


def _pack(row: ChoiceRow) -> Packed:
    """One row's packed sequence (ids, positions, segments) and its answer tokens (the position
    predicting each, the token, its answer)."""
    ids = list(row.prompt)
    n_prompt = len(ids)
    positions = list(range(n_prompt))
    segments = [0] * n_prompt
    sources: list[int] = []
    tokens: list[int] = []
    owners: list[int] = []
    for k, answer in enumerate(row.answers):
        start = len(ids)
        fed = answer[:-1]
        ids.extend(fed)
        positions.extend(range(n_prompt, n_prompt + len(fed)))
        segments.extend([k + 1] * len(fed))
        sources.extend([n_prompt - 1, *range(start, start + len(fed))])
        tokens.extend(answer)
        owners.extend([k] * len(answer))
    return ids, positions, segments, sources, tokens, owners


def load_choices(options: DataSettings, model: TextModel | None) -> LoadedData:
    """The multiple-choice rows of the table ``options.spec``, tokenized for the causal LM whose
    tokenizer is ``options.tokenizer`` or ``model``'s (see the module's text)."""
    from curvcal.load.texts import text

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
        f"a label is the index of the row's right answer, 0 to {n_choices - 1}"
        + (f", or its word in --choices {','.join(options.choices)}" if options.choices else ""),
    )
    outside = (labels >= n_choices).nonzero()
    if len(outside):
        row = int(outside[0, 0])
        raise InputError(
            file,
            f"row {row}: label {int(labels[row])} in column '{options.label_key}' is not the "
            f"index of one of its {n_choices} answers (0 to {n_choices - 1})",
        )
    notes: list[str] = []  # what transformers warned about
    tokenizer, source, max_length, length_source = text.tokenizer_and_length(options, model, notes)
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
        transforms=(
            "tokenize prompt + answer as lm-evaluation-harness does",
            f"score of an answer: {SCORE_MEANINGS[options.choice_score]} "
            f"(--choice-score {options.choice_score})",
            "one packed sequence per row: the prompt once, then its answers",
        ),
        text={
            "file": file,
            "columns": columns_used,
            "template": options.template,
            "choices": list(options.choices) if options.choices is not None else None,
            "n_choices": n_choices,
            "choice_score": options.choice_score,
            "choice_delimiter": options.choice_delimiter,
            **text.tokenization_record(
                len(rows), (max_length, length_source), truncated, tokenizer, source
            ),
        },
        warnings=tuple(notes),
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
    and how many rows lost prompt tokens to ``max_length``; errors name ``file``. Rows too
    large to tokenize are refused first (:func:`check_row_sizes`)."""
    from curvcal.load.texts.text import rust_panics_as

    check_row_sizes(prompts, answers, delimiter, _text_limit(tokenizer, max_length), file)
    where = str(getattr(tokenizer, "name_or_path", "") or "--tokenizer")
    rows: list[ChoiceRow] = []
    truncated = 0
    first = 0
    for chunk in _chunks(answers):
        with rust_panics_as(where):
            encoded = _encode_rows(
                tokenizer, prompts[first : first + chunk], answers[first : first + chunk], delimiter
            )
        for r, (row, (prompt_ids, answer_ids)) in enumerate(
            zip(answers[first : first + chunk], encoded, strict=True), start=first
        ):
            if prompt_ids is None:  # an empty prompt: the answers were tokenized alone
                prompt_ids = [_prefix_token(tokenizer, file)]
            made, cut = _choice_row(r, row, prompt_ids, answer_ids, score, max_length, file)
            rows.append(made)
            truncated += cut
        first += chunk
    return rows, truncated


#: Rows are tokenized in chunks of about this many answers (whole rows), so that the
#: tokenizer's encodings of a chunk, not of every row, are held at once.
TOKENIZE_CHUNK = 4096


def _chunks(answers: Sequence[Sequence[str]]) -> list[int]:
    """The number of rows in each chunk: whole rows, about :data:`TOKENIZE_CHUNK` answers."""
    sizes: list[int] = []
    rows = held = 0
    for row in answers:
        if rows and held + len(row) > TOKENIZE_CHUNK:
            sizes.append(rows)
            rows = held = 0
        rows += 1
        held += len(row)
    if rows:
        sizes.append(rows)
    return sizes


def _encode_rows(
    tokenizer: Any, prompts: Sequence[str], answers: Sequence[Sequence[str]], delimiter: str
) -> list[tuple[list[int] | None, list[list[int]]]]:
    """Each row's prompt tokens (``None`` for an empty prompt) and each answer's continuation
    tokens, as the module's text says: the context once per row, ``context + continuation``
    once per answer, and, for an empty prompt, the continuation alone."""
    contexts: list[str] = []
    continuations: list[list[str]] = []
    for prompt, row in zip(prompts, answers, strict=True):
        context, moved = _split(prompt, "")  # the context is the same for every answer
        contexts.append(context)
        continuations.append([moved + delimiter + answer for answer in row])
    spoken = [r for r, context in enumerate(contexts) if context]
    context_ids = _encode(tokenizer, [contexts[r] for r in spoken], True)
    whole_ids = _encode(
        tokenizer, [contexts[r] + text for r in spoken for text in continuations[r]], True
    )
    alone_ids = _encode(
        tokenizer,
        [text for r, context in enumerate(contexts) if not context for text in continuations[r]],
        False,
    )
    encoded: list[tuple[list[int] | None, list[list[int]]]] = []
    whole = iter(whole_ids)
    alone = iter(alone_ids)
    prompts_of = dict(zip(spoken, context_ids, strict=True))
    for r, row in enumerate(continuations):
        if r in prompts_of:
            prompt_ids = prompts_of[r]
            encoded.append((prompt_ids, [next(whole)[len(prompt_ids) :] for _ in row]))
        else:
            encoded.append((None, [next(alone) for _ in row]))
    return encoded


def _choice_row(
    r: int,
    row: Sequence[str],
    prompt_tokens: list[int],
    answer_tokens: list[list[int]],
    score: str,
    max_length: int,
    file: str,
) -> tuple[ChoiceRow, int]:
    """Row ``r`` tokenized, checked (every answer a token or more, the longest shorter than
    ``max_length``) and its prompt cut from the front to fit, with 1 when it was cut."""
    for k, tokens in enumerate(answer_tokens):
        if not tokens:
            raise InputError(
                file,
                f"row {r}: answer {k} ({shorten(repr(row[k]))}) adds no token to its prompt",
                "every answer must be at least one token",
            )
    longest = max(len(tokens) for tokens in answer_tokens)
    if longest >= max_length:
        raise InputError(
            file,
            f"row {r}: an answer is {longest} tokens, which leaves no room for its prompt "
            f"within a max_length of {max_length}",
            "pass a larger --max-length",
        )
    keep = max_length - longest
    cut = len(prompt_tokens) > keep
    if cut:
        prompt_tokens = prompt_tokens[-keep:]
    made = ChoiceRow(
        prompt=tuple(prompt_tokens),
        answers=tuple(tuple(tokens) for tokens in answer_tokens),
        divisors=tuple(
            _divisor(score, len(tokens), answer)
            for tokens, answer in zip(answer_tokens, row, strict=True)
        ),
    )
    return made, int(cut)


def check_row_sizes(
    prompts: Sequence[str],
    answers: Sequence[Sequence[str]],
    delimiter: str,
    limit: int,
    file: str = "--data",
) -> None:
    """Refuse, before the tokenizer runs, rows that are not worth tokenizing, with one
    :class:`InputError` naming ``file`` and the row: a row of more than :data:`MAX_ANSWERS`
    answers (:func:`answers_fault`), a prompt or an answer (its delimiter included) of more
    than ``limit`` characters (the longest sequence times :data:`MAX_BYTES_PER_TOKEN`: an
    answer that long is longer than the sequence, a prompt that long would lose all but a
    sliver of itself), and more answers in all than the memory available holds once tokenized
    (:data:`ANSWER_BYTES` each). Each count is a length, not a pass over the text; the exact
    checks (an answer's tokens against ``max_length``, the packed rows' attention against the
    memory free) come after tokenizing."""
    from curvcal.load.limits import available_memory

    for row, (prompt, words) in enumerate(zip(prompts, answers, strict=True)):
        if len(words) > MAX_ANSWERS:
            raise InputError(file, f"row {row}: {answers_fault(words)}")
        if len(prompt) > limit:
            raise InputError(
                file,
                f"row {row}: its prompt is {len(prompt):,} characters, more than curvcal "
                f"tokenizes ({limit:,}: {limit // MAX_BYTES_PER_TOKEN:,} tokens of at most "
                f"{MAX_BYTES_PER_TOKEN:,} bytes)",
                "shorten the prompts (a model reads the last max_length tokens of one)",
            )
        for k, word in enumerate(words):
            if len(delimiter) + len(word) > limit:
                raise InputError(
                    file,
                    f"row {row}: answer {k} is {len(delimiter) + len(word):,} characters, more "
                    f"than curvcal tokenizes ({limit:,}: {limit // MAX_BYTES_PER_TOKEN:,} "
                    f"tokens of at most {MAX_BYTES_PER_TOKEN:,} bytes)",
                    "every answer must fit within max_length tokens",
                )
    total = sum(len(words) for words in answers)
    free = available_memory()
    if free is not None and total * ANSWER_BYTES > free:
        raise InputError(
            file,
            f"{total:,} answers in {len(answers):,} rows take at least "
            f"{total * ANSWER_BYTES / 2**30:,.1f} GiB once tokenized, more than the "
            f"{free / 2**30:,.1f} GiB available",
            "measure the rows in parts",
        )


def _text_limit(tokenizer: Any, max_length: int) -> int:
    """The most characters a prompt or an answer may have (:func:`check_row_sizes`): the longer
    of ``max_length`` and the tokenizer's ``model_max_length`` (a shorter ``--max-length``
    cuts long prompts, which is no reason to refuse them), times
    :data:`MAX_BYTES_PER_TOKEN`."""
    longest = max_length
    recorded = getattr(tokenizer, "model_max_length", None)
    if isinstance(recorded, int) and not isinstance(recorded, bool) and 0 < recorded < 1_000_000:
        longest = max(longest, recorded)
    return longest * MAX_BYTES_PER_TOKEN


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
    from curvcal.load.texts.text import as_texts, text_column

    if options.template is None and options.prompt_key not in columns:
        present = ", ".join(columns) or "none"
        raise InputError(
            file,
            f"has no column '{options.prompt_key}' (columns: {present}); a causal language "
            "model scores multiple-choice rows: a prompt, its answers and the right one",
            "name the prompt column with --prompt-key, or build prompts from the row with "
            "--template 'Review: {text}\\nAnswer:' and give the answers with --choices a,b",
        )
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
    from curvcal.load.texts.text import text_column

    if options.choices is not None:
        words = tuple(options.choices)
        fault = answers_fault(words)
        if fault is not None:
            raise InputError(
                "choices",
                f"{shorten(repr(list(words)))} are not two or more different, non-empty "
                f"answers: {fault}",
                f"give 2 to {MAX_ANSWERS:,} answers, e.g. --choices positive,negative",
            )
        return [words] * n_rows
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
        fault = answers_fault(answers)
        if fault is not None:
            raise InputError(
                file,
                f"row {row}: {fault}",
                f"give each row 2 to {MAX_ANSWERS:,} different, non-empty answers in "
                f"'{options.choices_key}'",
            )
        rows.append(answers)
    return rows
