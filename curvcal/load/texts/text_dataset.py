"""Text classification data as a dataset: texts and labels read from a table
(:func:`curvcal.load.texts.text.read_table`), tokenized once, padded per batch by the dataset's
``collate``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from curvcal.errors import InputError
from curvcal.load.datasets.loaded_data import LoadedData, loaded_data
from curvcal.load.datasets.preprocessing import reject_image_transforms
from curvcal.settings.data import DataSettings

if TYPE_CHECKING:
    from curvcal.load.texts.text import TextModel


def load_text(options: DataSettings, model: TextModel | None) -> LoadedData:
    """The texts (and text pairs) of the table ``options.spec``, tokenized with
    ``options.tokenizer`` or ``model``'s, their label names mapped through its ``label2id``."""
    from curvcal.load.texts import text

    reject_image_transforms(options, "text data")
    for name in ("choices", "template"):
        if getattr(options, name) is not None:
            raise InputError(
                f"--{name}",
                "applies to multiple-choice data, which a causal language model (*ForCausalLM, "
                "or a CAUSAL_LM adapter over one) scores",
                f"drop --{name} for a sequence classifier",
            )
    if options.mean is not None or options.std is not None:
        raise InputError("--mean/--std", "do not apply to text data")
    columns, files, file = text.read_table(options.spec)
    texts = text.as_texts(
        text.text_column(columns, options.text_key, file, "--text-key"), file, options.text_key
    )
    pairs = None
    if options.text_pair_key is not None:
        pairs = text.as_texts(
            text.text_column(columns, options.text_pair_key, file, "--text-pair-key"),
            file,
            options.text_pair_key,
        )
    raw_labels = text.text_column(columns, options.label_key, file, "--label-key")
    labels = text.text_labels(raw_labels, model.label2id if model else {}, file, options.label_key)
    notes: list[str] = []  # what transformers warned about
    tokenizer, source, max_length, length_source = text.tokenizer_and_length(options, model, notes)
    padding = text.padding_token(tokenizer, model, options.batch_size > 1 and len(texts) > 1)
    encodings, truncated = text.tokenize(tokenizer, texts, pairs, max_length)
    return loaded_data(
        text.TextDataset(encodings, labels, tokenizer),
        options.spec,
        labels,
        files,
        transforms=("tokenize", "pad per batch"),
        text={
            "file": file,
            "columns": {
                "text": options.text_key,
                "text_pair": options.text_pair_key,
                "label": options.label_key,
            },
            **text.tokenization_record(
                len(encodings), (max_length, length_source), truncated, tokenizer, source
            ),
            **padding,
        },
        warnings=tuple(notes),
    )
