"""One-process behaviour of the distributed helpers (multi-process runs: tests/scale)."""

from __future__ import annotations

import pytest
import torch

from curvcal.distributed import DistContext, all_reduce_sum, current, shard_indices


@pytest.mark.parametrize(("n", "world"), [(7, 2), (10, 3), (2, 4), (0, 2), (1, 1)])
def test_shards_are_disjoint_cover_everything_and_are_not_padded(n: int, world: int) -> None:
    shards = [shard_indices(n, rank, world) for rank in range(world)]
    flat = sorted(i for shard in shards for i in shard)
    assert flat == list(range(n))
    assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1


def test_bad_rank_is_refused() -> None:
    with pytest.raises(ValueError, match="outside a world"):
        shard_indices(5, 2, 2)


def test_single_process_defaults() -> None:
    assert current() == DistContext()
    assert DistContext().is_main and not DistContext().active
    original = torch.tensor([1.0, 2.0])
    total = all_reduce_sum(original)
    assert torch.equal(total, original) and total is not original
