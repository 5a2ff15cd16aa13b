"""Two CPU processes (gloo) on a dataset of odd size give the one-process Hessian figures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from curvcal.distributed import shard_indices

from .dist_worker import N_SAMPLES, measure, operator_on
from .launch import worker_results

WORKER = Path(__file__).with_name("dist_worker.py")


@pytest.mark.slow  # three Python processes start torch: about 20 s on two busy cores
def test_two_gloo_ranks_equal_one_process(tmp_path: Path) -> None:
    ranks = worker_results(WORKER, tmp_path, 2, timeout=120)
    single = measure(list(range(N_SAMPLES)), None)
    assert [int(r["n_local"]) for r in ranks] == [26, 25]  # unpadded, disjoint shards
    for figures in ranks:  # every rank holds the all-reduced, identical answer
        assert int(figures["n_samples"]) == N_SAMPLES
        assert torch.allclose(figures["product"], single["product"], rtol=0, atol=1e-6)
        assert float(figures["lambda_max"]) == pytest.approx(float(single["lambda_max"]), abs=1e-6)
        assert float(figures["trace"]) == pytest.approx(float(single["trace"]), abs=1e-6)
    # the figures are not trivial: the product and the eigenvalue are away from zero
    assert float(single["product"].norm()) > 1e-3 and float(single["lambda_max"]) > 1e-3


def test_padded_shards_would_be_wrong() -> None:
    """DistributedSampler pads the shorter shard by repeating samples: the all-reduced product
    would then weight a repeated sample twice and divide by 52, not 51."""
    shards = [shard_indices(N_SAMPLES, r, 2) for r in (0, 1)]
    padded = [shards[0], [*shards[1], shards[0][0]]]  # what padding to equal length does
    vector = torch.randn(114, generator=torch.Generator().manual_seed(5), dtype=torch.float64)

    def summed(indices: list[int]) -> torch.Tensor:  # the rank's share before the all-reduce
        return operator_on(indices, None).matvec(vector) * len(indices)

    exact = operator_on(list(range(N_SAMPLES)), None).matvec(vector)
    wrong = (summed(padded[0]) + summed(padded[1])) / sum(len(s) for s in padded)
    assert not torch.allclose(wrong, exact, rtol=0, atol=1e-6)
    right = (summed(shards[0]) + summed(shards[1])) / N_SAMPLES
    assert torch.allclose(right, exact, rtol=0, atol=1e-12)
