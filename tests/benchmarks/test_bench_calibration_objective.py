"""The per-map benchmark's fixed rows timed to the peer's objective: the objective each final
map reaches, and the CPU seconds curvcal's solver took to first reach a peer's."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from curvcal.calibration.linear import fit_linear


@pytest.fixture(scope="module")
def bench(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("bench_calibration")


def _map_of(fit) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.tensor(fit.calibrator.weights, dtype=torch.float64),
        torch.tensor(fit.calibrator.bias, dtype=torch.float64),
    )


@pytest.mark.parametrize(("method", "strength"), [("matrix", 0.0), ("dirichlet", 1e-2)])
def test_objective_is_curvcal_objective_at_its_fitted_map(
    bench: ModuleType, method: str, strength: float
) -> None:
    """At curvcal's fitted map the harness's objective is the one the solver reports (two
    independent evaluations of mean NLL + ODIR)."""
    logits, labels = bench.synthetic_logits(500, 4, seed=1)
    fit = fit_linear(logits, labels, method, l2_off_diagonal=strength, l2_bias=strength)
    value = bench.full_map_objective(method, strength, logits, labels, *_map_of(fit))
    assert value == pytest.approx(fit.objective_after, rel=1e-12)


def test_objective_by_hand(bench: ModuleType) -> None:
    """Two rows, K = 2: s = W z + b with W = [[2, 1], [0, 1]], b = (1, −1), λ = 0.5."""
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    y = torch.tensor([0, 1])
    w = torch.tensor([[2.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    b = torch.tensor([1.0, -1.0], dtype=torch.float64)
    # scores (3, −1) and (3, 1): NLLs log(1 + e^{−4}) and log(1 + e^{2})
    nll = (np.log1p(np.exp(-4.0)) + np.log1p(np.exp(2.0))) / 2
    penalty = 0.5 * 1.0 / 2 + 0.5 * 2.0 / 2  # W_01² / (K(K−1)), Σ b² / K
    assert bench.full_map_objective("matrix", 0.5, z, y, w, b) == pytest.approx(
        nll + penalty, rel=1e-14
    )


def test_seconds_to_objective_is_the_first_time_at_or_below(bench: ModuleType) -> None:
    paths = [[(0.1, 3.0), (0.5, 2.0), (0.9, 1.5)], [(0.2, 3.0), (0.4, 1.9), (0.8, 1.4)]]
    assert bench.seconds_to_objective(paths, 2.0) == 0.4
    assert bench.seconds_to_objective(paths, 1.45) == 0.8
    assert bench.seconds_to_objective(paths, 1.0) is None


def test_fixed_row_reports_the_peer_objective_and_curvcal_time_to_it(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Stand-in peers of the unregularised matrix row: the identity map (an objective
    curvcal's path starts at) and a map from a fit stopped early (one it reaches later)."""

    def identity_peer(logits, labels, probs, y):
        k = logits.shape[1]
        eye = torch.eye(k, dtype=torch.float64)
        zeros = torch.zeros(k, dtype=torch.float64)
        return bench.FullMapFit(torch.softmax(logits.double(), 1), eye, zeros)

    def early_peer(logits, labels, probs, y):
        fit = fit_linear(
            logits, labels, "matrix", l2_off_diagonal=0.0, l2_bias=0.0, gradient_tol=1e-3
        )
        probabilities = fit.calibrator.probabilities(logits, "logits", "logits")
        return bench.FullMapFit(probabilities, *_map_of(fit))

    like, label, fit, _peers = bench.FIXED_MAPS["matrix_unregularised"]
    peers = (("identity", "stand_in", identity_peer), ("early", "stand_in", early_peer))
    monkeypatch.setitem(bench.FIXED_MAPS, "matrix_unregularised", (like, label, fit, peers))
    out, markdown = tmp_path / "maps.json", tmp_path / "maps.md"
    code = bench.main(
        [
            "--only-maps",
            "--map-sizes",
            "400x4",
            "--map-names",
            "matrix_unregularised",
            "--repeats",
            "1",
            "--no-peers",
            "--json",
            str(out),
            "--markdown",
            str(markdown),
        ]
    )
    assert code == 0
    # the stand-in library is not in MAP_PEERS: hand it in as installed
    size = bench.bench_maps(
        400, 4, 2, {"stand_in": object()}, names=("matrix_unregularised",), seed=0
    )
    rows = {row["task"]: row for row in size["rows"]}
    ours, identity, early = rows[label], rows["identity"], rows["early"]
    logits, labels = bench.synthetic_logits(400, 4, seed=0)
    start = bench.full_map_objective(
        "matrix", 0.0, logits, labels, torch.eye(4, dtype=torch.float64), torch.zeros(4)
    )
    assert identity["objective"] == pytest.approx(start, rel=1e-12)
    final = fit_linear(logits, labels, "matrix", l2_off_diagonal=0.0, l2_bias=0.0).objective_after
    assert ours["objective"] == pytest.approx(final, rel=1e-14)
    assert final <= early["objective"] < start
    assert early["max_abs_diff_probs"] is not None
    # Each path reaches the identity's objective at its first point, the early stop's later.
    assert identity["curvcal_cpu_seconds_to_objective"] >= 0.0
    assert early["curvcal_cpu_seconds_to_objective"] >= identity["curvcal_cpu_seconds_to_objective"]
    assert ours["curvcal_cpu_seconds_to_objective"] is None
    assert early["cpu_ratio_at_objective"] > 0
    # The run through main wrote the row and its table (no stand-in library there: curvcal
    # alone, its objective given).
    written = json.loads(out.read_text())["maps"][0]["rows"]
    assert [row["task"] for row in written] == [label]
    assert written[0]["objective"] == pytest.approx(final, rel=1e-14)
    assert "To the peer's objective" in markdown.read_text()


@pytest.mark.parametrize(
    ("library", "build"),
    [
        (
            "torch_uncertainty",
            lambda bench: bench.torch_uncertainty_map(
                "MatrixScaler", classes=True, parameters=True
            ),
        ),
        (
            "probmetrics",
            lambda bench: bench.probmetrics_map(
                "logistic", "MatrixScalingCalibrator", parameters=True
            ),
        ),
    ],
)
def test_peer_parameters_are_the_map_they_applied(
    bench: ModuleType, library: str, build: Callable[[ModuleType], object]
) -> None:
    """The W and b read from each peer give its own probabilities as softmax(W z + b)."""
    pytest.importorskip(library)
    logits, labels = bench.synthetic_logits(300, 4, seed=2)
    fitted = build(bench)(logits, labels, None, labels.numpy())
    expected = torch.softmax(logits.double() @ fitted.weights.T + fitted.bias, dim=1)
    assert not torch.allclose(fitted.weights, torch.eye(4, dtype=torch.float64), atol=1e-3)
    torch.testing.assert_close(
        torch.as_tensor(fitted.probabilities, dtype=torch.float64), expected, rtol=0, atol=1e-5
    )


@pytest.mark.parametrize(("cap", "stopped"), [(0.0, True), (1e9, False)])
def test_fixed_cap_stops_curvcal_fit_and_keeps_its_path(
    bench: ModuleType, tmp_path: Path, cap: float, stopped: bool
) -> None:
    """``--fixed-cap``: a fit past the cap is stopped at its next evaluation; the row says so
    and drops its whole-fit ratios (a stopped fit's time is not a whole fit's), while the path up
    to there still times curvcal to the peer's objective. A cap never reached changes nothing."""
    out = tmp_path / "maps.json"
    argv = ["--only-maps", "--map-sizes", "300x4", "--map-names", "dirichlet_fixed"]
    bench.main([*argv, "--repeats", "1", "--fixed-cap", str(cap), "--json", str(out)])
    (size,) = json.loads(out.read_text())["maps"]
    ours, *peers = size["rows"]
    assert ours["library"] == "curvcal" and ours["stopped_at_cap"] is stopped
    assert ours["objective"] is not None
    for row in peers:
        assert row["objective"] is not None
        assert (row["cpu_ratio_to_curvcal"] is None) is stopped
        assert (row["max_abs_diff_probs"] is None) is stopped
    if stopped:  # one evaluation (the start), above any fitted map's objective
        assert ours["objective"] > max(row["objective"] for row in peers)
        assert all(row["curvcal_cpu_seconds_to_objective"] is None for row in peers)
