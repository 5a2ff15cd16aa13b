"""The chunks a pass hands out after the ones kept graphs answer for."""

from __future__ import annotations

import pytest
import torch

from curvcal.curvature.batches import Batches


def _source() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        (
            torch.randn(rows, 3, generator=generator),
            torch.randint(0, 2, (rows,), generator=generator),
        )
        for rows in (5, 5, 2, 5)
    ]


@pytest.mark.parametrize("cache", ["device", "host", "none"])
@pytest.mark.parametrize("limit", [None, 2, 3])
def test_chunks_after_skip_are_the_tail_of_a_whole_pass(cache: str, limit: int | None) -> None:
    source = _source()
    batches = Batches(lambda: iter(source), cache, torch.device("cpu"), torch.float32, None)
    batches.limit = limit
    whole = list(batches)
    assert sum(int(y.shape[0]) for _, y in whole) == 17
    for skip in range(len(whole) + 2):
        tail = list(batches.chunks_after(skip))
        assert len(tail) == max(len(whole) - skip, 0)
        for (x, y), (x_ref, y_ref) in zip(tail, whole[skip:], strict=True):
            assert torch.equal(x, x_ref) and torch.equal(y, y_ref)


def test_batches_wholly_skipped_are_not_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    source = _source()
    batches = Batches(lambda: iter(source), "none", torch.device("cpu"), torch.float32, None)
    batches.limit = 3  # chunks: 3+2, 3+2, 2, 3+2
    moved: list[int] = []
    original = batches._move

    def counted(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        moved.append(int(y.shape[0]))
        return original(x, y)

    monkeypatch.setattr(batches, "_move", counted)
    tail = list(batches.chunks_after(3))  # the second half of batch 2, then batches 3 and 4
    assert [int(y.shape[0]) for _, y in tail] == [2, 2, 3, 2]
    assert moved == [5, 2, 5]  # batch 1 was passed over
