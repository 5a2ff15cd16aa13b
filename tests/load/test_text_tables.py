"""Reading the table of a text data set (``.jsonl``, ``.csv``): what a spreadsheet or an editor
saves, and the files that are not such tables, each one line naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from curvcal.errors import InputError
from curvcal.load.scores.tables import read_table as read_scores
from curvcal.load.texts.text import read_table


def test_a_spreadsheet_csv_with_a_byte_order_mark_reads_its_first_column(tmp_path: Path) -> None:
    path = tmp_path / "texts.csv"
    path.write_bytes("\ufefftext,label\nsehr gut,1\nmauvais,0\n".encode())
    columns, files, _ = read_table(str(path))
    assert columns == {"text": ["sehr gut", "mauvais"], "label": ["1", "0"]}
    assert files == (path,)


def test_a_byte_order_mark_in_a_scores_csv(tmp_path: Path) -> None:
    path = tmp_path / "scores.csv"
    path.write_bytes("\ufefflabels,logits_0,logits_1\n0,0.5,-0.5\n1,2.0,1.0\n".encode())
    columns = read_scores(path, "logits", "labels")
    assert columns["labels"].tolist() == [0, 1]
    assert columns["logits"].tolist() == [[0.5, -0.5], [2.0, 1.0]]


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_text_that_is_not_utf8_names_the_file_and_the_byte(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"latin1{suffix}"
    body = "text,label\ncaf\xe9,1\n" if suffix == ".csv" else '{"text": "caf\xe9", "label": 1}\n'
    path.write_bytes(body.encode("latin-1"))
    with pytest.raises(InputError, match=r"is not UTF-8 text \(byte 0xe9 at offset") as info:
        read_table(str(path))
    assert str(info.value).startswith(str(path))


def test_an_empty_csv_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    path.write_bytes(b"")
    with pytest.raises(InputError, match="is empty: no header row"):
        read_table(str(path))
    header_only = tmp_path / "header.csv"
    header_only.write_text("text,label\n")
    assert read_table(str(header_only))[0] == {"text": [], "label": []}


@pytest.mark.parametrize("name", ["folder.jsonl", "folder.csv"])
def test_a_folder_named_like_a_table_is_called_a_folder(tmp_path: Path, name: str) -> None:
    (tmp_path / name).mkdir()
    with pytest.raises(InputError, match="is a folder, not a") as info:
        read_table(str(tmp_path / name))
    assert "no such file" not in str(info.value)
    with pytest.raises(InputError, match="no such file"):
        read_table(str(tmp_path / "absent.jsonl"))
