"""A library's JSON metadata in a folder (a model's config.json, a saved dataset's
dataset_dict.json or state.json) is read by one reader, so a broken file reads the same
everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from curvcal.errors import InputError
from curvcal.load.models.hf import read_folder
from curvcal.load.texts.text import read_table


def _why(call: object) -> str:
    with pytest.raises(InputError) as caught:
        call()  # type: ignore[operator]
    return caught.value.why


def test_a_broken_json_file_reads_the_same_in_a_dataset_folder_and_a_model_folder(
    tmp_path: Path,
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{not json", encoding="utf-8")
    data = tmp_path / "data"
    data.mkdir()
    (data / "dataset_dict.json").write_text("{not json", encoding="utf-8")
    state = tmp_path / "state"
    state.mkdir()
    (state / "state.json").write_text("{not json", encoding="utf-8")

    model_why = _why(lambda: read_folder(model))
    assert model_why.startswith("is not valid JSON")
    assert _why(lambda: read_table(str(data))) == model_why
    assert _why(lambda: read_table(str(state))) == model_why
