"""The one-pass metrics scan: classwise sums binned only above bin 0, one exp per entry."""

from __future__ import annotations

import pytest
import torch

from curvcal.calibration import bins as binning
from curvcal.calibration import metrics as M

F64 = torch.float64


@pytest.mark.parametrize("edges", ["left", "right"])
@pytest.mark.parametrize("bins", [1, 3, 4, 15])
def test_classwise_sums_match_a_dense_binning_with_entries_on_edges(bins: int, edges: str) -> None:
    """The scan bins only entries above bin 0; a dense per-entry binning is the reference."""
    g = torch.Generator().manual_seed(7)
    p = torch.softmax(torch.randn(300, 6, dtype=F64, generator=g) * 2, dim=1)
    p[:40] = torch.tensor([1 / 3, 1 / 3, 1 / 3, 0, 0, 0], dtype=F64)  # on the edge of bin 0
    p[40:60] = torch.tensor([0.25, 0.25, 0.25, 0.25, 0, 0], dtype=F64)
    y = torch.randint(0, 6, (300,), generator=g)
    index = binning.equal_width_index(p, bins, edges)
    expected = []
    for k in range(6):
        sum_p = torch.bincount(index[:, k], weights=p[:, k], minlength=bins)
        sum_y = torch.bincount(index[:, k], weights=(y == k).to(F64), minlength=bins)
        expected.append(float((sum_y - sum_p).abs().sum()) / 300)
    got = M.classwise_calibration_error(p, y, kind="probs", bins=bins, edges=edges)
    assert got == pytest.approx(sum(expected) / 6, abs=1e-14)


def test_logits_path_matches_log_softmax_in_float64() -> None:
    g = torch.Generator().manual_seed(8)
    z = torch.randn(500, 9, generator=g) * 6  # float32 logits, some saturated rows
    y = torch.randint(0, 9, (500,), generator=g)
    logp = torch.log_softmax(z.to(F64), dim=1)
    m = M.calibration_metrics(z, y)
    torch.testing.assert_close(
        torch.tensor(m.nll, dtype=F64), -logp.gather(1, y[:, None]).mean(), rtol=0, atol=1e-14
    )
    assert m.mean_confidence == pytest.approx(float(logp.max(1).values.exp().mean()), abs=1e-15)
    p = logp.exp()
    brier = ((p - torch.nn.functional.one_hot(y, 9)) ** 2).sum(1).mean()
    assert m.brier == pytest.approx(float(brier), abs=1e-14)


def test_nonfinite_logits_name_the_row_in_a_later_chunk() -> None:
    z = torch.zeros(M.SCAN_ELEMENTS // 4 + 10, 4)
    z[-3, 1] = float("nan")
    with pytest.raises(Exception, match=f"row {z.shape[0] - 3}"):
        M.calibration_metrics(z, torch.zeros(z.shape[0], dtype=torch.int64))


def test_class_tables_hold_the_classwise_sums() -> None:
    g = torch.Generator().manual_seed(9)
    z = torch.randn(400, 5, dtype=F64, generator=g) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]
    m = M.calibration_metrics(z, y, bins=6, reliability_classes=3)
    frequency = torch.bincount(y, minlength=5)
    expected = sorted(range(5), key=lambda c: (-int(frequency[c]), c))[:3]
    assert [t.class_index for t in m.class_bins] == expected
    p = torch.softmax(z, 1)
    for table in m.class_bins:
        c = table.class_index
        assert table.n_labels == int(frequency[c])
        assert sum(b.count for b in table.bins) == 400
        index = binning.equal_width_index(p[:, c], 6)
        for b, item in enumerate(table.bins):
            members = index == b
            assert item.count == int(members.sum())
            if item.count:
                assert item.confidence == pytest.approx(float(p[members, c].mean()), abs=1e-14)
                assert item.accuracy == pytest.approx(float((y[members] == c).double().mean()))
    assert M.calibration_metrics(z, y).class_bins == ()
    with pytest.raises(Exception, match="reliability_classes"):
        M.calibration_metrics(z, y, reliability_classes=-1)
