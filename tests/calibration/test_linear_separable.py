"""Unregularised matrix and Dirichlet scaling (λ = 0) on classes that a linear map of the scores
separates: the NLL has no minimiser (it falls towards 0 as the map is scaled up), so the fit
is refused in one line instead of chasing ever larger weights; any λ > 0 still fits."""

from __future__ import annotations

import math

import pytest
import torch

from curvcal.calibration.linear import fit_linear
from curvcal.errors import InputError
from tests.calibration.test_linear_maps import synthetic


def separable(n: int, k: int, rotate: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores whose labels are the argmax of the scores themselves, or (``rotate``) of a
    random linear map of them: a map (I, or R) separates the classes exactly."""
    z_np, _ = synthetic(n, k, 3.0, 2)
    z = torch.tensor(z_np)
    if rotate:
        r = torch.randn(k, k, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        return z, (z @ r).argmax(1)
    return z, z.argmax(1)


@pytest.mark.parametrize(
    ("method", "rotate"), [("matrix", False), ("matrix", True), ("dirichlet", False)]
)
def test_separated_classes_are_refused_with_no_regulariser(method: str, rotate: bool) -> None:
    z, y = separable(400, 10, rotate)
    with pytest.raises(InputError) as caught:
        fit_linear(z, y, method, l2_off_diagonal=0.0, l2_bias=0.0)
    message = caught.value.message
    assert "\n" not in message and "λ = 0" in message
    assert "classifies all 400 fit rows correctly" in message and "no minimum" in message


def test_any_positive_strength_fits_the_same_separated_classes() -> None:
    z, y = separable(400, 10, rotate=True)
    fit = fit_linear(z, y, "matrix", l2_off_diagonal=1e-2, l2_bias=1e-2)
    assert fit.converged and math.isfinite(fit.nll_after) and fit.nll_after > 0


def test_classes_that_overlap_still_fit_with_no_regulariser() -> None:
    """One wrongly classified row under every map keeps the minimum finite: the fit converges
    (its gradient check, not the refusal, decides)."""
    z_np, y_np = synthetic(2000, 10, 3.0, 2)
    fit = fit_linear(
        torch.tensor(z_np), torch.tensor(y_np), "matrix", l2_off_diagonal=0.0, l2_bias=0.0
    )
    assert fit.converged and fit.nll_after > 0.5
