"""Scores and labels from a table: ``.parquet`` (the ``tables`` extra, pyarrow) or ``.csv``.

Layouts, for scores named ``S`` (``--scores-key``, default ``logits``) and labels ``L``
(``--labels-key``, default ``labels``):

- a list column ``S`` holding the K scores of each row (parquet ``list<float>``; in a CSV, a
  JSON list such as ``"[1.5, -0.2, 0.1]"``);
- one column per class, ``S_0``, ``S_1``, ... ``S_{K-1}`` (indices from 0 with none missing,
  in any column order);
- a column ``S`` of one number per row: a binary problem's score of class 1 (read as
  :func:`curvcal.load.scores.logits.load_logits` says);

and an integer column ``L``. Other columns are ignored. An empty score cell reads as NaN (so
``--nan-policy`` decides); an empty or non-integer label is refused with its row.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from curvcal import jsontext
from curvcal.errors import InputError
from curvcal.load.extras import require
from curvcal.paths import readable_file

TABLE_SUFFIXES = (".parquet", ".csv")


def is_table(path: Path) -> bool:
    """Whether ``path`` names a table by its suffix."""
    return path.suffix.lower() in TABLE_SUFFIXES


def read_table(path: Path, scores_key: str, labels_key: str) -> dict[str, torch.Tensor]:
    """``{scores_key: float64 (N, K), labels_key: int64 (N,)}`` read from the table at
    ``path``; :class:`InputError` naming the file for a missing column or a bad cell."""
    readable_file(path)
    columns = _read_parquet(path) if path.suffix.lower() == ".parquet" else _read_csv(path)
    names = list(columns)
    if labels_key not in columns:
        raise InputError(
            str(path),
            f"has no column '{labels_key}' (it has: {_list(names)})",
            "name the label column with --labels-key",
        )
    scores = _scores(path, columns, scores_key)
    labels = _labels(path, columns[labels_key], labels_key)
    return {scores_key: scores, labels_key: labels}


def _scores(path: Path, columns: dict[str, Any], key: str) -> torch.Tensor:
    if key in columns:
        rows = columns[key]
        if isinstance(rows, np.ndarray) and rows.ndim == 2:  # parquet fast path
            return torch.from_numpy(rows.astype(np.float64))
        if isinstance(rows, np.ndarray) and rows.ndim == 1 and rows.dtype.kind in "iuf":
            return torch.from_numpy(rows.astype(np.float64))  # one score per row
        if not any(isinstance(row, list | tuple | np.ndarray) for row in rows):
            # one score per row (a binary problem's logit of class 1, as load_logits reads it)
            return torch.tensor(
                [_float(path, key, i, v) for i, v in enumerate(rows)], dtype=torch.float64
            )
        widths = {len(row) if isinstance(row, Sequence) else -1 for row in rows}
        if -1 in widths:
            row = next(i for i, r in enumerate(rows) if not isinstance(r, Sequence))
            raise InputError(str(path), f"column '{key}' row {row} is not a list of scores")
        if len(widths) > 1:
            raise InputError(
                str(path), f"column '{key}' has lists of different lengths ({sorted(widths)})"
            )
        values = [[_float(path, key, i, v) for v in row] for i, row in enumerate(rows)]
        width = widths.pop() if widths else 0
        return torch.tensor(values, dtype=torch.float64).reshape(len(rows), width)
    pattern = re.compile(re.escape(key) + r"_(\d+)")
    per_class: dict[int, str] = {}
    for name in columns:
        if (m := pattern.fullmatch(name)) is None:
            continue
        index = int(m.group(1))
        if index in per_class:
            raise InputError(
                str(path),
                f"columns '{per_class[index]}' and '{name}' both name class {index}",
                f"keep one; classes are numbered {key}_0, {key}_1, ...",
            )
        per_class[index] = name
    if not per_class:
        raise InputError(
            str(path),
            f"has neither a list column '{key}' nor columns {key}_0, {key}_1, ... "
            f"(it has: {_list(list(columns))})",
            "name the scores with --scores-key",
        )
    # the first number missing from 0, 1, ... (never a range up to the largest: a column
    # logits_100000000000 must not allocate a hundred billion entries)
    first_missing = next(k for k in range(len(per_class) + 1) if k not in per_class)
    if first_missing < len(per_class):
        raise InputError(
            str(path), f"has no column {key}_{first_missing} for class {first_missing}"
        )
    ordered = [per_class[k] for k in range(len(per_class))]
    arrays = [columns[name] for name in ordered]
    if all(isinstance(a, np.ndarray) and a.ndim == 1 for a in arrays):  # parquet fast path
        return torch.from_numpy(np.stack(arrays, axis=1).astype(np.float64))
    values = [[_float(path, name, i, v) for i, v in enumerate(columns[name])] for name in ordered]
    return torch.tensor(values, dtype=torch.float64).T.contiguous()


def _labels(path: Path, cells: Any, key: str) -> torch.Tensor:
    if isinstance(cells, np.ndarray) and np.issubdtype(cells.dtype, np.integer):
        return torch.from_numpy(cells.astype(np.int64))
    labels = []
    for row, cell in enumerate(cells):
        value = cell
        if isinstance(cell, str):
            try:
                value = int(cell.strip())
            except ValueError:
                value = None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int | np.integer) or isinstance(value, bool):
            raise InputError(str(path), f"label {cell!r} in row {row} of '{key}' is not an integer")
        if not -(2**63) <= int(value) < 2**63:
            raise InputError(
                str(path), f"label {cell!r} in row {row} of '{key}' is outside the 64-bit range"
            )
        labels.append(int(value))
    return torch.tensor(labels, dtype=torch.int64)


def _float(path: Path, column: str, row: int, cell: Any) -> float:
    if isinstance(cell, bool | np.bool_):  # a parquet boolean column: float(True) would be 1.0
        raise InputError(
            str(path), f"cell {cell!r} in row {row} of '{column}' is a boolean, not a score"
        )
    if cell is None or cell == "":
        return float("nan")
    try:
        return float(cell)
    except (TypeError, ValueError):
        raise InputError(
            str(path), f"cell {cell!r} in row {row} of '{column}' is not a number"
        ) from None


def _read_csv(path: Path) -> dict[str, list[Any]]:
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None:
                raise InputError(str(path), "is empty (no header row)")
            columns: dict[str, list[Any]] = {name: [] for name in header}
            if len(columns) != len(header):
                raise InputError(str(path), "has two columns with the same name")
            for number, row in enumerate(reader):
                if len(row) != len(header):
                    raise InputError(
                        str(path), f"row {number} has {len(row)} cells, the header {len(header)}"
                    )
                for name, cell in zip(header, row, strict=True):
                    columns[name].append(_list_cell(path, cell))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise InputError(str(path), f"is not a readable CSV file ({exc})") from None
    return columns


def _list_cell(path: Path, cell: str) -> Any:
    text = cell.strip()
    if text.startswith("["):
        try:
            return jsontext.loads(text, str(path))
        except json.JSONDecodeError:
            return cell
    return cell


def _read_parquet(path: Path) -> dict[str, list[Any]]:
    require("tables", "pyarrow", str(path))
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(str(path))
    except Exception as exc:  # pyarrow raises its own error types
        raise InputError(str(path), f"is not a readable parquet file ({exc})") from None
    return {name: _parquet_column(table.column(name)) for name in table.column_names}


def _parquet_column(column: Any) -> Any:
    """A numeric column without nulls as a 1-D array, a list column of equal-length numeric
    lists without nulls as a 2-D array (no Python object per cell), anything else as a list
    of Python values, read cell by cell."""
    import pyarrow as pa

    array = column.combine_chunks()
    kind = array.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        if array.null_count == 0:
            return array.to_numpy(zero_copy_only=False)
    elif (
        pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    ) and array.null_count == 0:
        values = array.flatten()
        numeric = pa.types.is_integer(values.type) or pa.types.is_floating(values.type)
        if numeric and values.null_count == 0 and len(array) > 0:
            lengths = np.asarray(pa.compute.list_value_length(array).to_numpy(zero_copy_only=False))
            if np.all(lengths == lengths[0]):
                flat = values.to_numpy(zero_copy_only=False)
                return flat.reshape(len(array), int(lengths[0]))
    return array.to_pylist()


def _list(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return (shown + ", ...") if len(names) > limit else (shown or "none")
