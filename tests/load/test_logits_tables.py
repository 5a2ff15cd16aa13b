"""Logits tables (.parquet, .csv): the same numbers as the same logits saved as .npz, in every
layout (a column per class, a list column), with configurable names; bad tables refused."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from curvcal.errors import InputError
from curvcal.load.scores.logits import load_logits

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

N, K = 61, 4


@pytest.fixture(scope="module")
def scores() -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(5)
    logits = generator.normal(scale=3.0, size=(N, K))
    labels = generator.integers(0, K, size=N)
    return logits, labels


def _npz(path: Path, logits: np.ndarray, labels: np.ndarray) -> Path:
    np.savez(path, logits=logits, labels=labels)
    return path


def _csv_columns(path: Path, logits: np.ndarray, labels: np.ndarray, prefix: str = "logits",
                 label: str = "labels") -> Path:  # fmt: skip
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        # columns out of order and an extra column: both must not matter
        writer.writerow(["id", label, *[f"{prefix}_{k}" for k in reversed(range(K))]])
        for i in range(N):
            writer.writerow([f"s{i}", int(labels[i]), *[repr(float(v)) for v in logits[i, ::-1]]])
    return path


def _csv_list(path: Path, logits: np.ndarray, labels: np.ndarray) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["logits", "labels"])
        for i in range(N):
            writer.writerow([json.dumps([float(v) for v in logits[i]]), int(labels[i])])
    return path


def _parquet_list(path: Path, logits: np.ndarray, labels: np.ndarray, name: str = "logits",
                  label: str = "labels") -> Path:  # fmt: skip
    table = pa.table({name: [list(row) for row in logits], label: labels.astype(np.int64)})
    pq.write_table(table, path)
    return path


def _parquet_columns(path: Path, logits: np.ndarray, labels: np.ndarray) -> Path:
    columns = {f"logits_{k}": logits[:, k] for k in range(K)}
    pq.write_table(pa.table({**columns, "labels": labels.astype(np.int32)}), path)
    return path


@pytest.mark.parametrize(
    "write", [_csv_columns, _csv_list, _parquet_list, _parquet_columns],
    ids=["csv-columns", "csv-list", "parquet-list", "parquet-columns"],
)  # fmt: skip
def test_tables_give_the_metrics_of_the_same_npz(run_cli, scores, tmp_path: Path, write) -> None:
    logits, labels = scores
    suffix = ".csv" if "csv" in write.__name__ else ".parquet"
    table = write(tmp_path / f"scores{suffix}", logits, labels)
    reference = _npz(tmp_path / "scores.npz", logits, labels)
    loaded = load_logits(table)
    assert torch.equal(loaded.scores, torch.from_numpy(logits))
    assert torch.equal(loaded.labels, torch.from_numpy(labels).long())
    results = []
    for path in (table, reference):
        result = run_cli("metrics", path, "--val-split", "0.4", "--json")
        assert result.code == 0, result.stderr
        results.append(json.loads(result.stdout)["results"])
    assert results[0] == results[1]


def test_names_are_configurable(run_cli, scores, tmp_path: Path) -> None:
    logits, labels = scores
    probs = torch.softmax(torch.from_numpy(logits), dim=1).numpy()
    path = _parquet_list(tmp_path / "p.parquet", probs, labels, name="probabilities", label="y")
    reference = tmp_path / "p.npz"
    np.savez(reference, probabilities=probs, y=labels)
    args = ["--input-kind", "probs", "--scores-key", "probabilities", "--labels-key", "y", "--json"]
    table = run_cli("metrics", path, *args)
    saved = run_cli("metrics", reference, *args)
    assert table.code == 0 and saved.code == 0, table.stderr + saved.stderr
    assert json.loads(table.stdout)["results"] == json.loads(saved.stdout)["results"]
    columns = _csv_columns(tmp_path / "c.csv", logits, labels, prefix="z", label="target")
    assert torch.equal(load_logits(columns, scores_key="z", labels_key="target").scores,
                       torch.from_numpy(logits))  # fmt: skip


def test_an_empty_score_cell_is_nan_and_the_nan_policy_decides(scores, tmp_path: Path) -> None:
    logits, labels = scores
    path = _csv_columns(tmp_path / "gap.csv", logits, labels)
    lines = path.read_text().splitlines()
    cells = lines[3].split(",")
    cells[2] = ""
    lines[3] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match="row 2 has a NaN"):
        load_logits(path)
    dropped = load_logits(path, nan_policy="drop")
    assert dropped.dropped_rows == 1 and dropped.scores.shape == (N - 1, K)


def test_bad_tables_are_refused_naming_the_file(scores, tmp_path: Path) -> None:
    logits, labels = scores
    path = _csv_columns(tmp_path / "t.csv", logits, labels)
    with pytest.raises(InputError, match="no column 'label'"):
        load_logits(path, labels_key="label")
    with pytest.raises(InputError, match="neither a list column 'probs'"):
        load_logits(path, scores_key="probs")
    text = path.read_text().replace("logits_2", "other")
    gap = tmp_path / "gap.csv"
    gap.write_text(text)
    with pytest.raises(InputError, match="no column logits_2 for class 2"):
        load_logits(gap)
    bad_label = tmp_path / "label.csv"
    bad_label.write_text("logits_0,logits_1,labels\n0.5,0.1,1\n0.2,0.3,cat\n")
    with pytest.raises(InputError, match=r"label 'cat' in row 1"):
        load_logits(bad_label)
    ragged = tmp_path / "ragged.parquet"
    pq.write_table(pa.table({"logits": [[0.1, 0.2], [0.3]], "labels": [0, 1]}), ragged)
    with pytest.raises(InputError, match="different lengths"):
        load_logits(ragged)
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(InputError, match="no header row"):
        load_logits(tmp_path / "empty.csv")
    (tmp_path / "junk.parquet").write_bytes(b"not a parquet file")
    with pytest.raises(InputError, match="not a readable parquet file"):
        load_logits(tmp_path / "junk.parquet")


def test_missing_pyarrow_names_the_extra(run_cli, scores, tmp_path: Path, monkeypatch) -> None:
    logits, labels = scores
    path = _parquet_list(tmp_path / "s.parquet", logits, labels)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    result = run_cli("metrics", path)
    assert result.code == 2
    line = result.stderr.strip().splitlines()[-1]
    assert str(path) in line and "pip install 'curvcal[tables]'" in line


def test_parquet_nulls_are_nan_scores_and_refused_labels(tmp_path: Path) -> None:
    scores = tmp_path / "null_score.parquet"
    pq.write_table(pa.table({"logits": [[0.1, None], [0.3, 0.2]], "labels": [0, 1]}), scores)
    with pytest.raises(InputError, match="row 0 has a NaN"):
        load_logits(scores)
    assert load_logits(scores, nan_policy="drop").dropped_rows == 1
    columns = tmp_path / "null_column.parquet"
    pq.write_table(pa.table({"logits_0": [0.1, None], "logits_1": [0.2, 0.3], "labels": [0, 1]}),
                   columns)  # fmt: skip
    assert load_logits(columns, nan_policy="drop").scores.tolist() == [[0.1, 0.2]]
    labels = tmp_path / "null_label.parquet"
    pq.write_table(pa.table({"logits": [[0.1, 0.2], [0.3, 0.2]], "labels": [0, None]}), labels)
    with pytest.raises(InputError, match="label None in row 1"):
        load_logits(labels)
