"""The loss landscape kernel (curvcal.curvature.landscape) against direct evaluation of a model
perturbed by hand, and the curvature along the top eigenvector of a dense float64 Hessian
against its λmax."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from curvcal.calibration.metrics import expected_calibration_error
from curvcal.curvature.landscape import (
    filter_normalised_direction,
    loss_landscape,
    second_difference,
)
from curvcal.errors import InputError


def _problem(seed: int = 0) -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    generator = torch.Generator().manual_seed(seed)
    model = nn.Linear(4, 3).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=generator, dtype=torch.float64))
    x = torch.randn(23, 4, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (23,), generator=generator)
    # uneven batches
    return model, [(x[:10], y[:10]), (x[10:17], y[10:17]), (x[17:], y[17:])]


def _ece(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return expected_calibration_error(logits, labels, "logits", 5)


def _ce_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels, reduction="sum")


def _squared_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """½ Σ ‖z − onehot(y)‖²: exactly quadratic in the weights of a linear model."""
    return 0.5 * ((logits - F.one_hot(labels, logits.shape[1]).to(logits.dtype)) ** 2).sum()


def _dense_hessian(model: nn.Module, batches: list, loss_sum) -> tuple[torch.Tensor, list]:
    """The Hessian of the mean loss in the flattened parameters (weight, then bias), built with
    torch.autograd.functional.hessian on a functional copy of the model."""
    names = [name for name, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for _, p in model.named_parameters()])
    n = sum(int(y.shape[0]) for _, y in batches)

    def mean_loss(theta: torch.Tensor) -> torch.Tensor:
        pieces, start = {}, 0
        for name, shape in zip(names, shapes, strict=True):
            size = int(torch.Size(shape).numel())
            pieces[name] = theta[start : start + size].reshape(shape)
            start += size
        total = sum(
            loss_sum(torch.func.functional_call(model, pieces, (x,)), y) for x, y in batches
        )
        return total / n

    return torch.autograd.functional.hessian(mean_loss, flat), list(zip(names, shapes, strict=True))


def _as_direction(vector: torch.Tensor, layout: list) -> dict[str, torch.Tensor]:
    out, start = {}, 0
    for name, shape in layout:
        size = int(torch.Size(shape).numel())
        out[name] = vector[start : start + size].reshape(shape).clone()
        start += size
    return out


@pytest.mark.parametrize(
    ("loss_sum", "step", "rtol"), [(_squared_sum, 0.5, 1e-9), (_ce_sum, 1e-2, 1e-3)]
)
def test_curvature_along_the_top_eigenvector_is_lambda_max(
    loss_sum, step: float, rtol: float
) -> None:
    """Exact for the quadratic loss at any step; for cross-entropy the central second difference
    errs by h²/12 · ℓ'''' (h = 0.01: about 1e-5 relative), so 1e-3 holds with margin."""
    model, batches = _problem()
    hessian, layout = _dense_hessian(model, batches, loss_sum)
    values, vectors = torch.linalg.eigh(hessian)
    top = _as_direction(vectors[:, -1], layout)
    line = loss_landscape(
        model, lambda: iter(batches), loss_sum, [top], [-step, 0.0, step], ece=_ece
    )
    (curvature,) = second_difference([point.loss for point in line.points], step)
    assert curvature == pytest.approx(float(values[-1]), rel=rtol)


def test_every_point_equals_the_model_perturbed_by_hand() -> None:
    model, batches = _problem(1)
    generator = torch.Generator().manual_seed(5)
    first = filter_normalised_direction(model, generator)
    second = filter_normalised_direction(model, generator)
    alphas, betas = [-0.5, 0.0, 0.25], [-1.0, 0.75]
    grid = loss_landscape(
        model, lambda: iter(batches), _ce_sum, [first, second], alphas, betas, ece=_ece
    )
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    assert [(p.alpha, p.beta) for p in grid.points] == [(a, b) for b in betas for a in alphas]
    for point in grid.points:
        moved = copy.deepcopy(model)
        with torch.no_grad():
            moved.weight += point.alpha * first["weight"] + point.beta * second["weight"]
            moved.bias += point.alpha * first["bias"] + point.beta * second["bias"]
            logits = moved(x)
        assert point.loss == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-12)
        accuracy = float((logits.argmax(1) == y).double().mean())
        assert point.accuracy == accuracy
        assert point.ece == pytest.approx(expected_calibration_error(logits, y, "logits", 5))
    assert grid.grid("loss")[1][2] == grid.points[5].loss and grid.n_samples == 23


def test_the_model_is_left_as_it_was_even_on_error() -> None:
    model, batches = _problem(2)
    model.train()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    direction = filter_normalised_direction(model, torch.Generator().manual_seed(0))
    loss_landscape(model, lambda: iter(batches), _ce_sum, [direction], [1.0, 2.0], ece=_ece)
    assert model.training
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name])

    def failing(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        loss_landscape(model, lambda: iter(batches), failing, [direction], [3.0], ece=_ece)
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name])


def test_filter_normalisation() -> None:
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.Flatten(), nn.Linear(3, 2))
    direction = filter_normalised_direction(model, torch.Generator().manual_seed(0))
    for name, p in model.named_parameters():
        d = direction[name]
        if p.ndim == 1:
            assert torch.equal(d, torch.zeros_like(p))
            continue
        norms = d.reshape(p.shape[0], -1).norm(dim=1)
        assert torch.allclose(norms, p.detach().reshape(p.shape[0], -1).norm(dim=1), rtol=1e-5)
    again = filter_normalised_direction(model, torch.Generator().manual_seed(0))
    assert all(torch.equal(direction[k], again[k]) for k in direction)


def test_a_direction_of_the_wrong_shape_is_refused() -> None:
    model, batches = _problem()
    bad = {"weight": torch.zeros(3, 4, dtype=torch.float64), "bias": torch.zeros(2)}
    with pytest.raises(InputError, match="bias has shape"):
        loss_landscape(model, lambda: iter(batches), _ce_sum, [bad], [0.0], ece=_ece)
    with pytest.raises(InputError, match="not parameters of the model"):
        loss_landscape(
            model, lambda: iter(batches), _ce_sum, [{"w": bad["weight"]}], [0.0], ece=_ece
        )
    # a direction over some parameters moves those alone
    only = {"weight": torch.ones(3, 4, dtype=torch.float64)}
    line = loss_landscape(model, lambda: iter(batches), _ce_sum, [only], [1.0], ece=_ece)
    moved = copy.deepcopy(model)
    with torch.no_grad():
        moved.weight += 1.0
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    with torch.no_grad():
        direct = float(F.cross_entropy(moved(x), y))
    assert line.points[0].loss == pytest.approx(direct, rel=1e-12)
    with pytest.raises(InputError, match="same trainable parameters"):
        loss_landscape(model, lambda: iter(batches), _ce_sum, [only, bad], [0.0], [0.0], ece=_ece)


@pytest.mark.parametrize("method", ["power", "lanczos"])
def test_eigenvalues_hand_over_their_unit_eigenvectors(method: str) -> None:
    """``on_vectors`` gets the eigenvectors of the values returned, in their order (against
    ``torch.linalg.eigh`` of a dense symmetric matrix with a clear gap)."""
    from curvcal.curvature.eigen import eigenvalues

    generator = torch.Generator().manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(12, 12, generator=generator, dtype=torch.float64))
    spectrum = torch.tensor([9.0, 5.0, 2.0] + [0.1 * i for i in range(9)], dtype=torch.float64)
    matrix = basis @ torch.diag(spectrum) @ basis.T
    seen: list[torch.Tensor] = []
    found = eigenvalues(matrix, 2, method=method, tol=1e-10, on_vectors=seen.append)
    (vectors,) = seen
    assert found.eigenvalues == pytest.approx((9.0, 5.0), rel=1e-8)
    assert vectors.shape == (12, 2)
    for column in range(2):
        assert float(vectors[:, column].norm()) == pytest.approx(1.0, abs=1e-12)
        assert abs(float(vectors[:, column] @ basis[:, column])) == pytest.approx(1.0, abs=1e-6)
