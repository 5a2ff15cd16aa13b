"""Inputs as rows: one tensor or a mapping of tensors counted, moved, sliced and split alike."""

from __future__ import annotations

import torch

from curvcal import rows


def _mapping() -> dict[str, torch.Tensor]:
    ids = torch.arange(14).reshape(7, 2)
    return {"input_ids": ids, "attention_mask": torch.ones(7, 2, dtype=torch.int64)}


def test_mapping_rows_split_take_and_move_like_a_tensor() -> None:
    x = _mapping()
    assert rows.n_rows(x) == 7 and rows.n_rows(torch.zeros(3, 4)) == 3
    assert rows.nbytes(x) == 2 * 14 * 8
    parts = rows.split_rows(x, 3)
    assert [rows.n_rows(p) for p in parts] == [3, 3, 1]
    assert torch.equal(torch.cat([p["input_ids"] for p in parts]), x["input_ids"])
    assert [t.shape[0] for t in rows.split_rows(torch.zeros(7, 2), 3)] == [3, 3, 1]
    mask = torch.tensor([True, False, True, False, False, False, True])
    taken = rows.take_rows(x, mask)
    assert torch.equal(taken["input_ids"], x["input_ids"][[0, 2, 6]])
    assert torch.equal(rows.take_rows(x, slice(1, 3))["attention_mask"], x["attention_mask"][1:3])
    moved = rows.to_device(x, "cpu", torch.float64)
    assert all(t.dtype == torch.int64 for t in moved.values())  # ids keep their integer dtype
    assert rows.to_device(torch.zeros(2, dtype=torch.float32), "cpu", torch.float64).dtype == (
        torch.float64
    )
    assert list(moved) == ["input_ids", "attention_mask"]


def test_problems_are_named_and_sound_inputs_have_none() -> None:
    assert rows.input_problem(_mapping()) is None
    assert rows.input_problem(torch.zeros(2, 3)) is None
    assert "0-d" in str(rows.input_problem(torch.tensor(1.0)))
    assert "empty mapping" in str(rows.input_problem({}))
    assert "differ" in str(rows.input_problem({"a": torch.zeros(2), "b": torch.zeros(3)}))
    assert "mapping of tensors" in str(rows.input_problem([1, 2]))
    assert rows.describe_shape(_mapping()) == "input_ids (7, 2), attention_mask (7, 2)"


def test_one_row_becomes_a_batch_of_one_and_inputs_report_their_device() -> None:
    row = torch.arange(6.0).reshape(2, 3)
    assert rows.as_batch_of_one(row).shape == (1, 2, 3)
    mapping = {"input_ids": torch.tensor([4, 5]), "attention_mask": torch.tensor([1, 0])}
    batched = rows.as_batch_of_one(mapping)
    assert isinstance(batched, dict)
    assert {k: tuple(v.shape) for k, v in batched.items()} == {
        "input_ids": (1, 2),
        "attention_mask": (1, 2),
    }
    assert torch.equal(batched["input_ids"][0], mapping["input_ids"])
    assert rows.device_of(row) == torch.device("cpu") == rows.device_of(mapping)
