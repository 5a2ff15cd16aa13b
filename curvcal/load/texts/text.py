"""Text classification data: a table of texts and labels, tokenized once, padded per batch.

Sources (``--data``):

- ``FILE.jsonl``: one JSON object per line; ``FILE.csv``: a header row then one row per text
  (both read with the standard library; CSV cells are strings);
- ``FILE.parquet`` (pyarrow, the ``tables`` extra);
- a folder written by the ``datasets`` library's ``save_to_disk`` (``state.json`` and its
  ``.arrow`` files, read with pyarrow's IPC stream reader); a split folder (``DatasetDict``,
  ``dataset_dict.json``) takes ``DIR:split``.

Columns: ``text`` and ``label`` by default (``--text-key``, ``--label-key``), and a second text
of a pair with ``--text-pair-key``. A label is an integer class index, a string of one
(CSV), or a class name mapped through the model's ``label2id``.

Tokenization happens once, when the data is loaded, with the tokenizer saved beside the model
(``--tokenizer DIR`` otherwise): each item is ``(token id lists, label)``. Texts longer than
``max_length`` tokens are truncated (the tokenizer's ``longest_first`` strategy for pairs) and
counted. ``max_length`` defaults to the tokenizer's ``model_max_length`` capped by the model
config's ``max_position_embeddings`` (a tokenizer that records no limit reports a huge
``model_max_length``; the cap is then what applies). A batch is padded to its longest text by
``tokenizer.pad`` in :meth:`TextDataset.collate`, giving int64 ``input_ids``,
``attention_mask`` (and ``token_type_ids`` when the tokenizer makes them).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset

from curvcal import interrupt, jsontext
from curvcal.errors import InputError
from curvcal.load.extras import require
from curvcal.load.models.hf import read_json
from curvcal.paths import readable_file, readable_folder

if TYPE_CHECKING:
    from curvcal.load.checkpoints.loaded_model import LoadedModel
    from curvcal.load.models.hf import FolderModel
    from curvcal.settings.data import DataSettings

TEXT_SUFFIXES = (".jsonl", ".csv", ".parquet")
#: files of which a saved tokenizer has at least one
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
)
_DATASET_STATE = "state.json"
_DATASET_DICT = "dataset_dict.json"


@dataclass(frozen=True)
class TextModel:
    """What the text model says about its inputs: the folder its tokenizer may be saved in,
    its ``label2id`` and its ``max_position_embeddings`` (``None`` when not recorded); for a
    decoder classifier (``pools_last_token``: logits read at each text's last non-padding
    token), its ``architecture`` and ``config.json``'s ``pad_token_id`` and ``eos_token_id``;
    ``scores_choices`` for a causal language model, whose data is multiple-choice rows
    (:mod:`curvcal.load.texts.choices`)."""

    folder: Path | None
    label2id: Mapping[str, int] = field(default_factory=dict)
    max_positions: int | None = None
    pools_last_token: bool = False
    architecture: str = ""
    pad_token_id: int | None = None
    eos_token_id: int | None = None
    scores_choices: bool = False


@dataclass(frozen=True)
class TextColumns:
    """Column names: the text, the label, and the second text of a pair (optional)."""

    text: str = "text"
    label: str = "label"
    pair: str | None = None


def is_text_spec(spec: str) -> bool:
    """A ``.jsonl``/``.csv``/``.parquet`` file, or a ``save_to_disk`` folder (``DIR[:split]``)."""
    path = Path(spec).expanduser()
    if path.suffix.lower() in TEXT_SUFFIXES:
        return True
    folder, _split = split_spec(spec)
    return (folder / _DATASET_STATE).is_file() or (folder / _DATASET_DICT).is_file()


def split_spec(spec: str) -> tuple[Path, str | None]:
    """A saved-dataset spec's folder and split (``DIR:split``; ``None`` when it names none)."""
    path = Path(spec).expanduser()
    if path.exists() or ":" not in spec:
        return path, None
    head, _, split = spec.rpartition(":")
    return Path(head).expanduser(), split


# --- reading tables ---------------------------------------------------------------------------


def read_table(spec: str) -> tuple[dict[str, list[Any]], tuple[Path, ...], str]:
    """The columns of the table named by ``spec``, the files read, and the file to name in
    errors."""
    path = Path(spec).expanduser()
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        if path.is_dir():
            raise InputError(f"--data {spec}", f"is a folder, not a {suffix[1:]} file")
        try:  # a named pipe or device would block the reader: refused, not read
            readable_file(path)
        except InputError as exc:
            raise InputError(f"--data {spec}", exc.why) from None
        reader = {".jsonl": _read_jsonl, ".csv": _read_csv, ".parquet": _read_parquet}[suffix]
        try:
            return reader(path), (path,), str(path)
        except UnicodeDecodeError as exc:
            raise InputError(
                str(path),
                f"is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})",
                "save it as UTF-8",
            ) from exc
        except OSError as exc:
            raise InputError(str(path), f"cannot be read: {exc.strerror or exc}") from exc
    folder, split = split_spec(spec)
    if (folder / _DATASET_DICT).is_file():
        splits = _dataset_dict_splits(folder)
        if split is None:
            raise InputError(
                f"--data {spec}",
                f"is a folder of splits ({', '.join(splits)})",
                f"name one: --data {folder}:{splits[0] if splits else 'SPLIT'}",
            )
        if split not in splits:
            raise InputError(
                f"--data {spec}", f"has no split {split!r}", f"splits: {', '.join(splits)}"
            )
        folder = folder / split
    elif split is not None:
        raise InputError(f"--data {spec}", f"{folder} holds no splits (no {_DATASET_DICT})")
    columns, files = _read_saved_dataset(folder)
    return columns, files, str(folder)


def _read_jsonl(path: Path) -> dict[str, list[Any]]:
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = jsontext.loads(line, f"{path}:{number}")
            except json.JSONDecodeError as exc:
                raise InputError(str(path), f"line {number} is not JSON ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise InputError(str(path), f"line {number} is not a JSON object")
            records.append(record)
    return _columns(records)


def _read_csv(path: Path) -> dict[str, list[Any]]:
    # utf-8-sig: a spreadsheet's byte-order mark is not part of the first column's name
    with open(path, encoding="utf-8-sig", newline="") as handle:
        reader = csv.DictReader(handle)
        try:
            records = list(reader)
            fieldnames = reader.fieldnames or ()
        except csv.Error as exc:
            raise InputError(str(path), f"is not a CSV file ({exc})") from exc
    if not fieldnames:
        raise InputError(str(path), "is empty: no header row")
    columns: dict[str, list[Any]] = {name: [] for name in fieldnames}
    columns.update(_columns(records))
    return columns


def _columns(records: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    names: dict[str, None] = {}
    for record in records:
        names.update(dict.fromkeys(record))
    return {name: [record.get(name) for record in records] for name in names}


def _read_parquet(path: Path) -> dict[str, list[Any]]:
    require("tables", "pyarrow", str(path))
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises its own error types
        raise InputError(str(path), f"is not a parquet file ({_one_line(exc)})") from exc
    return {name: table.column(name).to_pylist() for name in table.column_names}


def _dataset_dict_splits(folder: Path) -> list[str]:
    info = read_json(folder / _DATASET_DICT)
    splits = info.get("splits") if isinstance(info, dict) else None
    if not isinstance(splits, list):
        raise InputError(str(folder / _DATASET_DICT), "has no 'splits' list")
    return [str(s) for s in splits]


def _read_saved_dataset(folder: Path) -> tuple[dict[str, list[Any]], tuple[Path, ...]]:
    state_path = folder / _DATASET_STATE
    if not state_path.is_file():
        raise InputError(str(folder), f"is not a saved dataset (no {_DATASET_STATE})")
    readable_folder(folder, "saved dataset folder")
    state = read_json(state_path)
    entries = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(entries, list) or not entries:
        raise InputError(str(state_path), "lists no data files ('_data_files')")
    require("tables", "pyarrow", str(folder))
    import pyarrow as pa

    files = []
    tables = []
    for entry in entries:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or Path(name).name != name:
            raise InputError(str(state_path), f"names a data file {name!r} outside the folder")
        file = folder / name
        readable_file(file, "data file")  # a named pipe would block the memory map for ever
        try:
            with pa.memory_map(str(file)) as source:
                tables.append(pa.ipc.open_stream(source).read_all())
        except (OSError, pa.ArrowInvalid) as exc:
            raise InputError(str(file), f"cannot be read as Arrow ({_one_line(exc)})") from exc
        files.append(file)
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    return {n: table.column(n).to_pylist() for n in table.column_names}, (state_path, *files)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


# --- tokenizing -------------------------------------------------------------------------------


def load_tokenizer(
    tokenizer: Path | None, model: TextModel | None, trust: bool, notes: list[str]
) -> tuple[Any, str]:
    """The tokenizer of ``--tokenizer`` or of the model's folder, and where it came from; what
    transformers warns about while loading it is added to ``notes``, ``"<folder>: ..."``
    (:func:`~curvcal.load.models.library_limits.library_warnings`).

    A folder whose ``config.json`` or ``tokenizer_config.json`` carries ``auto_map`` names
    tokenizer code that transformers would import and run: refused unless ``trust``
    (``--trust-checkpoint``). transformers is called with ``trust_remote_code=trust`` and an
    empty standard input, so it never asks on the terminal whether to run that code."""
    folder = tokenizer or (model.folder if model is not None else None)
    if folder is None:
        raise InputError(
            "--data",
            "text data needs a tokenizer",
            "pass --tokenizer DIR (a save_pretrained folder)",
        )
    transformers = require("hf", "transformers", str(folder))
    where = "--tokenizer" if tokenizer is not None else "the model folder"
    if not folder.is_dir():
        raise InputError(str(folder), f"{where} is not a folder")
    readable_folder(folder, "tokenizer folder")  # transformers reads its files itself
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        # transformers would build a tokenizer with an empty vocabulary from config.json alone
        hint = (
            "pass --tokenizer DIR naming the tokenizer's save_pretrained folder"
            if tokenizer is None
            else "save one into the --tokenizer folder with tokenizer.save_pretrained"
        )
        raise InputError(
            str(folder), f"{where} holds no tokenizer ({', '.join(TOKENIZER_FILES[:2])}...)", hint
        )
    from curvcal.load.models.hf import no_prompt
    from curvcal.load.models.library_limits import library_failures, library_warnings

    _check_tokenizer_configs(folder, where, trust)
    said: list[str] = []
    try:
        with no_prompt(), rust_panics_as(str(folder)), library_warnings("transformers", said):
            loaded = transformers.AutoTokenizer.from_pretrained(
                str(folder), local_files_only=True, trust_remote_code=trust
            )
    except library_failures() as exc:
        hint = (
            "pass --tokenizer DIR naming the tokenizer's save_pretrained folder"
            if tokenizer is None
            else "save one into the --tokenizer folder with tokenizer.save_pretrained"
        )
        raise InputError(
            str(folder), f"{where} holds no tokenizer ({_one_line(exc)})", hint
        ) from exc
    notes += [f"{folder}: {note}" for note in said if f"{folder}: {note}" not in notes]
    return loaded, str(folder)


def _check_tokenizer_configs(folder: Path, where: str, trust: bool) -> None:
    """Read the tokenizer folder's ``tokenizer_config.json`` and ``config.json`` before
    transformers does, through :func:`read_json`, whose bounds refuse a setting the library
    would fail on (with or without ``trust``); then :class:`TrustError` when either names
    custom code (``auto_map``) and ``trust`` is not given."""
    from curvcal.errors import TrustError
    from curvcal.load.models.hf import custom_code_entries

    for name in ("tokenizer_config.json", "config.json"):
        path = folder / name
        if not path.is_file():
            continue
        config = read_json(path)
        if trust:
            continue
        entries = custom_code_entries(config) if isinstance(config, dict) else ()
        if entries:
            raise TrustError(
                str(path),
                f"{where} asks for custom code ({', '.join(entries)}), which loading the "
                "tokenizer would import and run",
                "pass --trust-checkpoint only if you trust the folder's source",
            )


@contextlib.contextmanager
def rust_panics_as(what: str) -> Iterator[None]:
    """Turn a panic of the Rust ``tokenizers`` library into an :class:`InputError` on ``what``.

    A tokenizer file can make it panic (a pre-tokenizer regex that backtracks past Oniguruma's
    retry limit); pyo3 raises that as ``PanicException``, a BaseException that no ``except
    Exception`` sees, after Rust's panic hook has written its own report, backtrace included,
    straight to file descriptor 2. That descriptor is held in a temporary file meanwhile: its
    content is written out unchanged when nothing panicked, and dropped for the one-line error.
    """
    with tempfile.TemporaryFile() as held:
        try:
            saved: int | None = os.dup(2)
            os.dup2(held.fileno(), 2)
        except OSError:  # no descriptor 2 to hold: only the exception is translated
            saved = None
        panicked = False
        try:
            with interrupt.stderr_moved(saved):  # Ctrl-C's one line must not be held too
                yield
        except BaseException as exc:
            if type(exc).__name__ != "PanicException":
                raise
            panicked = True
            reason = (str(exc).strip().splitlines() or ["a panic"])[0]
            raise InputError(
                what,
                f"the tokenizer failed: {reason[:200]}",
                "check the tokenizer's pre-tokenizer and normalizer patterns",
            ) from None
        finally:
            if saved is not None:
                os.dup2(saved, 2)
                os.close(saved)
                if not panicked:
                    held.seek(0)
                    with contextlib.suppress(OSError):
                        os.write(2, held.read())


def tokenizer_and_length(
    options: DataSettings, model: TextModel | None, notes: list[str]
) -> tuple[Any, str, int, str]:
    """The tokenizer of the data ``options`` (:func:`load_tokenizer`; what transformers warns
    about added to ``notes``), where it came from, the longest sequence kept (``--max-length``
    or :func:`default_max_length`) and where that came from."""
    tokenizer, source = load_tokenizer(options.tokenizer, model, options.trust_checkpoint, notes)
    if options.max_length is not None:
        return tokenizer, source, options.max_length, "--max-length"
    return tokenizer, source, *default_max_length(tokenizer, model)


def tokenization_record(
    n_texts: int, length: tuple[int, str], truncated: int, tokenizer: Any, source: str
) -> dict[str, Any]:
    """What a text loader's summary says of its tokenization: the rows, the longest sequence
    kept and where that came from (``length``), how many rows were cut, and the tokenizer."""
    return {
        "n_texts": n_texts,
        "max_length": length[0],
        "max_length_source": length[1],
        "truncated": truncated,
        "tokenizer": source,
        "tokenizer_class": type(tokenizer).__name__,
    }


def default_max_length(tokenizer: Any, model: TextModel | None) -> tuple[int, str]:
    """min(tokenizer.model_max_length, config.max_position_embeddings) and which one applied."""
    candidates: list[tuple[int, str]] = []
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < 1_000_000:
        candidates.append((limit, "tokenizer model_max_length"))
    if model is not None and model.max_positions:
        candidates.append((model.max_positions, "config max_position_embeddings"))
    if not candidates:
        raise InputError(
            "--max-length", "neither the tokenizer nor the model config records a limit", "pass it"
        )
    return min(candidates)


class TextDataset(Dataset[tuple[dict[str, list[int]], int]]):
    """Tokenized texts (token id lists per key) and integer labels; :meth:`collate` pads a
    batch of items to its longest text with the tokenizer's padding."""

    def __init__(
        self, encodings: list[dict[str, list[int]]], labels: torch.Tensor, tokenizer: Any
    ) -> None:
        self.encodings = encodings
        self.labels = labels
        self.tokenizer = tokenizer

    def __len__(self) -> int:
        return len(self.encodings)

    def __getitem__(self, index: int) -> tuple[dict[str, list[int]], int]:
        return self.encodings[index], int(self.labels[index])

    def collate(
        self, items: Sequence[tuple[dict[str, list[int]], int]]
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``(inputs, labels)``: int64 tensors padded to the batch's longest text (one text
        is not padded: a tokenizer with no pad token serves ``--batch-size 1``)."""
        if len(items) == 1:
            padded = {key: [value] for key, value in items[0][0].items()}
        else:
            padded = self.tokenizer.pad([dict(item[0]) for item in items], return_tensors="pt")
        inputs = {key: torch.as_tensor(value, dtype=torch.int64) for key, value in padded.items()}
        labels = torch.as_tensor([int(item[1]) for item in items], dtype=torch.int64)
        return inputs, labels


def tokenize(
    tokenizer: Any, texts: Sequence[str], pairs: Sequence[str] | None, max_length: int
) -> tuple[list[dict[str, list[int]]], int]:
    """Token ids of every text (pair), truncated to ``max_length``; and how many were cut."""
    kwargs: dict[str, Any] = {"text": list(texts)}
    if pairs is not None:
        kwargs["text_pair"] = list(pairs)
    transformers = require("hf", "transformers", "tokenizer")
    logging = transformers.utils.logging
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # lengths over model_max_length are what we count below
    where = str(getattr(tokenizer, "name_or_path", "") or "--tokenizer")
    try:
        with rust_panics_as(where):
            full = tokenizer(**kwargs, truncation=False)
    finally:
        logging.set_verbosity(verbosity)
    keys = list(full.keys())
    encodings = [{key: list(full[key][i]) for key in keys} for i in range(len(texts))]
    long = [i for i, e in enumerate(encodings) if len(e["input_ids"]) > max_length]
    if long:
        cut_kwargs: dict[str, Any] = {"text": [texts[i] for i in long]}
        if pairs is not None:
            cut_kwargs["text_pair"] = [pairs[i] for i in long]
        with rust_panics_as(where):
            cut = tokenizer(**cut_kwargs, truncation=True, max_length=max_length)
        for j, i in enumerate(long):
            encodings[i] = {key: list(cut[key][j]) for key in keys}
    return encodings, len(long)


def text_labels(
    values: Sequence[Any],
    label2id: Mapping[str, int],
    file: str,
    column: str,
    hint: str | None = None,
) -> torch.Tensor:
    """Integer labels: ints, strings of ints, or class names mapped through ``label2id``;
    ``hint``: what an error about a label says a label is (default: an index or a name of the
    model's ``label2id``)."""
    out = []
    for row, value in enumerate(values):
        if isinstance(value, bool) or value is None:
            label = None
        elif isinstance(value, int):
            label = value
        elif isinstance(value, float) and value.is_integer():
            label = int(value)
        elif isinstance(value, str) and value in label2id:
            label = int(label2id[value])
        elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
            label = int(value)
        else:
            label = None
        if label is None or label < 0:
            known = ", ".join(list(label2id)[:8])
            said = hint or f"labels are class indices or names from the model's label2id ({known})"
            raise InputError(file, f"row {row}: label {value!r} in column '{column}'", said)
        out.append(label)
    return torch.tensor(out, dtype=torch.int64)


def text_column(columns: Mapping[str, list[Any]], name: str, file: str, option: str) -> list[Any]:
    """The column ``name``, or an error naming the file, the column and the columns present."""
    if name not in columns:
        present = ", ".join(columns) or "none"
        raise InputError(
            file, f"has no column '{name}' (columns: {present})", f"name it with {option}"
        )
    return columns[name]


def as_texts(values: Sequence[Any], file: str, column: str) -> list[str]:
    """Strings of a text column; a missing or non-string cell is an error naming its row."""
    for row, value in enumerate(values):
        if not isinstance(value, str):
            raise InputError(file, f"row {row}: column '{column}' holds {value!r}, not a text")
    return list(values)


def text_model_of(loaded: LoadedModel) -> TextModel | None:
    """The :class:`TextModel` facts of a loaded transformers text classifier (``None`` for any
    other model)."""
    if loaded.modality != "text":
        return None
    if loaded.form == "peft_adapter":  # the base's config; the adapter folder's own tokenizer
        base = Path(loaded.metadata["base_model"])
        built = loaded.metadata.get("sequence_classifier")
        if built:  # a classifier built from a causal LM: its config as the model holds it
            pad = loaded.module.__dict__["library_model"].config.pad_token_id
            facts = _facts(_built_classifier(base, built, pad))
        else:
            facts = text_model_at(base, None)
        own = any((loaded.path / name).is_file() for name in TOKENIZER_FILES)
        if facts is not None and own:
            return dataclasses.replace(facts, folder=loaded.path)
        return facts
    return text_model_at(loaded.path, loaded.arch)


def text_model_at(path: Path, arch: str | None) -> TextModel | None:
    """The :class:`TextModel` facts of the model folder at ``path`` (or named by ``--arch
    hf:FOLDER``), read from its ``config.json`` alone: the folder, ``label2id`` and
    ``max_position_embeddings``. ``None`` when there is no text classifier folder."""
    from curvcal.load.models.hf import is_model_folder, read_folder

    folder = path if is_model_folder(path) else None
    if folder is None and arch and arch.startswith("hf:"):
        folder = Path(arch[3:]).expanduser()
    if folder is None or not is_model_folder(folder):
        return None
    return _facts(read_folder(folder, need_weights=False))


def _built_classifier(base: Path, classifier: str, pad_token_id: int | None) -> FolderModel:
    """The causal-LM folder ``base`` described as the ``classifier`` curvcal built from it
    (:mod:`curvcal.load.models.causal_base`) with ``pad_token_id``, from its ``config.json``."""
    from curvcal.load.models.hf import CONFIG_NAME, FolderModel, custom_code_entries

    config = read_json(base / CONFIG_NAME)
    return FolderModel(
        path=base,
        config={**config, "architectures": [classifier], "pad_token_id": pad_token_id},
        library="transformers",
        architecture=classifier,
        modality="text",
        labels=(),
        weights=(),
        custom_code=custom_code_entries(config),
        preprocessing=None,
    )


def _facts(described: FolderModel) -> TextModel | None:
    """The :class:`TextModel` facts of a described model folder (None: not a text model)."""
    if described.modality != "text":
        return None
    from curvcal.load.models.hf import is_causal_lm, pools_last_token

    config = described.config
    label2id = config.get("label2id")
    positions = config.get("max_position_embeddings")
    return TextModel(
        folder=described.path,
        label2id={str(k): int(v) for k, v in label2id.items()}
        if isinstance(label2id, dict)
        else {},
        max_positions=positions if isinstance(positions, int) else None,
        pools_last_token=pools_last_token(described),
        architecture=described.architecture,
        pad_token_id=_token_id(config.get("pad_token_id")),
        eos_token_id=_token_id(config.get("eos_token_id")),
        scores_choices=is_causal_lm(described.architecture),
    )


def _token_id(value: Any) -> int | None:
    """A config's token id: an integer, the first of a list (``eos_token_id`` may list
    several), else None."""
    if isinstance(value, list) and value:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def padding_token(tokenizer: Any, model: TextModel | None, padded: bool) -> dict[str, Any]:
    """Make ``tokenizer`` pad with the id the model reads as padding, and say which one.

    A decoder classifier (``model.pools_last_token``) reads each text's logits at the last
    position whose token differs from ``config.json``'s ``pad_token_id``, so the id decides
    which token is classified: it is never guessed (not even as the eos token, which would
    move the read position one token left of where the model was fine-tuned to read it).
    When the batches are ``padded`` (more than one text per batch):

    - no ``pad_token_id`` in the config: :class:`InputError` naming the folder and the fix;
    - a tokenizer with no pad token pads with the config's id (the tokenizer object in memory
      is changed, no file is);
    - a tokenizer whose pad id differs from the config's: :class:`InputError` (the padding
      would be read as text).

    Any other model: a tokenizer with no pad token takes the config's ``pad_token_id`` when
    it has one. Returns ``{"pad_token_id", "pad_token_source"}`` for the data's report.
    """
    own = getattr(tokenizer, "pad_token_id", None)
    config_id = model.pad_token_id if model is not None else None
    where = str(model.folder) if model is not None and model.folder else "the model"
    if model is not None and model.pools_last_token and padded:
        if config_id is None:
            eos = f", often eos_token_id {model.eos_token_id}" if model.eos_token_id else ""
            raise InputError(
                where,
                f"{model.architecture} reads each text at its last non-padding token, but "
                "config.json sets no pad_token_id, so padded batches cannot be read",
                f"set pad_token_id in config.json to the id the model was fine-tuned with{eos}; "
                "or pass --batch-size 1",
            )
        if own is not None and own != config_id:
            raise InputError(
                where,
                f"the tokenizer pads with token id {own} but config.json's pad_token_id is "
                f"{config_id}; {model.architecture} would read the padding as text",
                "make the tokenizer's pad token and config.json's pad_token_id the same",
            )
    if own is None and config_id is not None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(config_id)
        return {"pad_token_id": config_id, "pad_token_source": "config.json pad_token_id"}
    if own is None and padded:
        raise InputError(
            where,
            "the tokenizer has no pad token and config.json no pad_token_id, so texts of "
            "different lengths cannot share a batch",
            "set pad_token_id in config.json, or pass --batch-size 1",
        )
    return {"pad_token_id": own, "pad_token_source": "tokenizer"}
