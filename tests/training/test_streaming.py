"""The streaming calibration metric equals curvcal's batch metrics of the concatenated data
(float64, to 1e-12), over uneven batches, mixed over- and under-confident bins and confidences
of exactly 1.0; and under torch.distributed (2 gloo processes) every rank's compute() equals
the single-process result on the union of the ranks' batches."""

from __future__ import annotations

import itertools
import math
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from curvcal.calibration.metrics import calibration_metrics
from curvcal.errors import InputError
from curvcal.training.streaming import STREAMED, StreamingCalibration


def _data(n: int = 500, k: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    labels = torch.randint(k, (n,), generator=generator)
    logits = torch.randn(n, k, generator=generator, dtype=torch.float64) * 3
    # a third of the rows favour the true label strongly (under-confident bins appear beside
    # over-confident ones), a few rows saturate to confidence exactly 1.0
    logits[: n // 3].scatter_add_(
        1, labels[: n // 3, None], torch.full((n // 3, 1), 4.0, dtype=torch.float64)
    )
    logits[-5:, 0] = 800.0
    return logits, labels


SPLITS = [0, 7, 8, 130, 131, 400, 500]


def _expected(
    logits: torch.Tensor, labels: torch.Tensor, bins: int, edges: str
) -> dict[str, float]:
    m = calibration_metrics(logits, labels, bins=bins, edges=edges)
    assert float(logits.softmax(1).max()) == 1.0  # confidences of exactly 1.0 are in
    signs = {math.copysign(1, b.gap) for b in m.ece_bins if b.count and b.gap}
    assert bins == 1 or signs == {
        1.0,
        -1.0,
    }  # both kinds of bins, or the ECE proves nothing about binning
    return {name: getattr(m, name) for name in STREAMED}


@pytest.mark.parametrize(("bins", "edges"), [(15, "left"), (10, "right"), (1, "left")])
def test_streamed_metrics_equal_the_batch_metrics_of_the_concatenation(
    bins: int, edges: str
) -> None:
    logits, labels = _data()
    metric = StreamingCalibration(bins=bins, edges=edges)
    for start, stop in itertools.pairwise(SPLITS):
        metric.update(logits[start:stop], labels[start:stop])
    got = metric.compute()
    for name, value in _expected(logits, labels, bins, edges).items():
        assert got[name] == pytest.approx(value, abs=1e-12, rel=1e-12), name


def test_probabilities_reset_and_compute_leaves_the_state() -> None:
    logits, labels = _data()
    probs = logits.softmax(1)
    metric = StreamingCalibration(kind="probs")
    metric.update(probs[:5], labels[:5])
    metric.reset()
    assert metric.compute()["n_samples"] == 0 and math.isnan(metric.compute()["ece"])
    metric.update(probs[:200], labels[:200])
    first = metric.compute()
    assert metric.compute() == first
    metric.update(probs[200:], labels[200:])
    expected = calibration_metrics(probs, labels, kind="probs")
    assert metric.compute()["ece"] == pytest.approx(expected.ece, abs=1e-12)
    assert metric.compute()["classwise_ece"] == pytest.approx(expected.classwise_ece, abs=1e-12)


def test_bad_batches_are_refused_by_name() -> None:
    metric = StreamingCalibration()
    metric.update(torch.zeros(2, 3), torch.tensor([0, 1]))
    with pytest.raises(InputError, match="4 classes"):
        metric.update(torch.zeros(2, 4), torch.tensor([0, 1]))
    with pytest.raises(InputError):
        metric.update(torch.tensor([[float("nan"), 0.0]]), torch.tensor([0]))
    with pytest.raises(InputError):
        StreamingCalibration(bins=0)


def _rank(rank: int, world: int, path: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    logits, labels = _data()
    metric = StreamingCalibration()
    # uneven, disjoint shares: rank 0 the rows up to 131, rank 1 the rest, in two batches
    share = [(0, 7), (7, 131)] if rank == 0 else [(131, 400), (400, 500)]
    for start, stop in share:
        metric.update(logits[start:stop], labels[start:stop])
    torch.save(metric.compute(), os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_two_gloo_ranks_give_the_single_process_result() -> None:
    logits, labels = _data()
    single = StreamingCalibration()
    single.update(logits, labels)
    expected = single.compute()
    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(
            _rank,
            args=(2, os.path.join(folder, "store"), folder),
            nprocs=2,
            start_method="spawn",
        )
        for rank in range(2):
            got = torch.load(os.path.join(folder, f"rank{rank}.pt"))
            for name in STREAMED:
                assert got[name] == pytest.approx(expected[name], abs=1e-12), (rank, name)
    batch = calibration_metrics(logits, labels)
    assert expected["ece"] == pytest.approx(batch.ece, abs=1e-12)
