"""The Python API with any loss, every trace method, a shared operator and scipy: each figure
against the dense float64 Hessian of the mean per-sample loss (torch.func.hessian)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import numpy as np
import pytest
import scipy.sparse.linalg
import torch
from torch import Tensor, nn

import curvcal
from curvcal.curvature.results import TraceMethodWarning
from curvcal.errors import InputError
from curvcal.losses import CrossEntropy, UserLoss, as_loss
from curvcal.settings.hessian import TRACE_METHODS

from .cases import BATCH, dense_hessian, make_data, make_mlp, split


def _relu_mlp() -> nn.Module:
    """5 → 6 → 3 with ReLU (57 parameters): linear in each tensor, so tr(H) = tr(G)."""
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3)).double()


def _smoothed(z: Tensor, t: Tensor) -> Tensor:
    return nn.functional.cross_entropy(z, t, label_smoothing=0.1)


def _squared_error(logits: Tensor, labels: Tensor) -> Tensor:
    """A user's loss: the mean over the batch of ‖softmax(z) − onehot(y)‖²."""
    target = nn.functional.one_hot(labels, logits.shape[1]).to(logits.dtype)
    return ((torch.softmax(logits, dim=1) - target) ** 2).sum(dim=1).mean()


WEIGHTS = torch.tensor([0.5, 2.0, 1.0], dtype=torch.float64)

#: loss as the API takes it -> the mean over the dataset of the per-sample loss (dense truth)
LOSSES = {
    "CrossEntropyLoss()": (nn.CrossEntropyLoss(), lambda z, t: nn.functional.cross_entropy(z, t)),
    "CrossEntropyLoss(reduction='sum')": (
        nn.CrossEntropyLoss(reduction="sum"),
        lambda z, t: nn.functional.cross_entropy(z, t),
    ),
    "CrossEntropyLoss(label_smoothing=0.1)": (
        nn.CrossEntropyLoss(label_smoothing=0.1),
        _smoothed,
    ),
    "CrossEntropyLoss(weight, reduction='sum')": (
        nn.CrossEntropyLoss(weight=WEIGHTS, reduction="sum"),
        lambda z, t: nn.functional.cross_entropy(z, t, weight=WEIGHTS, reduction="sum") / len(t),
    ),
    "callable": (_squared_error, _squared_error),
    "focal name": ("focal", lambda z, t: curvcal.focal_loss(z, t, 2.0)),
}


@pytest.fixture(scope="module")
def tanh_case() -> tuple[nn.Module, Tensor, Tensor]:
    model = make_mlp()
    x, y = make_data("mlp")
    return model, x, y


@pytest.mark.parametrize("key", list(LOSSES))
def test_any_loss_gives_the_hessian_of_the_mean_per_sample_loss(
    key: str, tanh_case: tuple[nn.Module, Tensor, Tensor]
) -> None:
    """Uneven batches (7 × 7 + 1): a batch mean weighted by its size / N, a sum divided by N."""
    model, x, y = tanh_case
    loss, truth = LOSSES[key]
    gamma = 2.0 if loss == "focal" else None
    dense = dense_hessian(model, x, y, truth)
    operator = curvcal.hessian_operator(model, split(x, y, BATCH), loss, gamma=gamma)
    block = torch.randn(dense.shape[0], 3, dtype=torch.float64, generator=torch.Generator())
    assert torch.allclose(operator @ block, dense @ block, rtol=1e-10, atol=1e-12)
    exact = torch.linalg.eigvalsh(dense)
    spectrum = curvcal.hessian_eigenvalues(operator, k=2, tol=1e-10)
    assert spectrum.eigenvalues == pytest.approx((float(exact[-1]), float(exact[-2])), rel=1e-8)
    products = dense.shape[0] * 3  # 3P products: Hutch++'s sketch spans the space
    trace = curvcal.hessian_trace(operator, probes=products, trace_method="hutchpp")
    assert trace.estimate == pytest.approx(float(torch.trace(dense)), rel=1e-8)


def test_a_plain_cross_entropy_module_is_curvcals_cross_entropy() -> None:
    """Known in closed form, so the Gauss–Newton trace can be taken of it."""
    assert as_loss(nn.CrossEntropyLoss()) == CrossEntropy()
    assert as_loss(nn.CrossEntropyLoss(reduction="sum")) == CrossEntropy()
    for other in (
        nn.CrossEntropyLoss(label_smoothing=0.1),
        nn.CrossEntropyLoss(weight=WEIGHTS),
        nn.CrossEntropyLoss(ignore_index=0),
    ):
        assert isinstance(as_loss(other), UserLoss)


def test_every_trace_method_of_the_command_line_against_the_dense_trace() -> None:
    """On a ReLU network (tr(H) = tr(G)) every method the CLI has, auto the default."""
    model = _relu_mlp()
    x, y = make_data("mlp")
    batches = split(x, y, BATCH)
    dense = dense_hessian(model, x, y)
    exact = float(torch.trace(dense))
    operator = curvcal.hessian_operator(model, batches)
    products = 3 * dense.shape[0]
    for method in TRACE_METHODS:
        n_probes = 40 if method == "hutchinson" else products
        result = curvcal.hessian_trace(operator, probes=n_probes, trace_method=method)
        if method in ("auto", "gauss-newton", "hutchpp", "xtrace") or method.startswith("gauss"):
            assert result.estimate == pytest.approx(exact, rel=1e-8), method
        assert result.ci95[0] - 1e-9 <= exact <= result.ci95[1] + 1e-9, method
    default = curvcal.hessian_trace(model, batches)
    assert default.method == "gauss-newton"  # auto chose the exact trace
    assert default.estimate == pytest.approx(exact, rel=1e-10)


def test_auto_falls_back_to_hutchpp_for_a_users_loss_and_says_why(
    tanh_case: tuple[nn.Module, Tensor, Tensor],
) -> None:
    model, x, y = tanh_case
    smoothed = nn.CrossEntropyLoss(label_smoothing=0.1)
    dense = dense_hessian(model, x, y, _smoothed)
    with pytest.warns(TraceMethodWarning, match="CrossEntropyLoss .* not know in closed form"):
        result = curvcal.hessian_trace(model, split(x, y, BATCH), 225, loss=smoothed)
    assert result.method == "hutchpp"
    assert result.estimate == pytest.approx(float(torch.trace(dense)), rel=1e-8)
    # ce by name on the same tanh network: the split trace, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceMethodWarning)
        assert curvcal.hessian_trace(model, (x, y)).method == "gauss-newton+hutchpp"


@pytest.mark.parametrize("method", ["gauss-newton", "gauss-newton+hutchpp"])
def test_an_explicit_gauss_newton_trace_of_a_users_loss_is_refused(method: str) -> None:
    model = _relu_mlp()
    x, y = make_data("mlp")
    with pytest.raises(InputError, match=r"^trace_method: .*_squared_error .*closed form"):
        curvcal.hessian_trace(model, (x, y), trace_method=method, loss=_squared_error)


def test_bad_losses_are_refused_with_one_clear_line(
    tanh_case: tuple[nn.Module, Tensor, Tensor],
) -> None:
    model, x, y = tanh_case
    with pytest.raises(InputError, match=r"^loss: CrossEntropyLoss has reduction='none'"):
        curvcal.hessian_eigenvalues(model, (x, y), loss=nn.CrossEntropyLoss(reduction="none"))
    with pytest.raises(
        InputError, match=r"^loss: .* returned a tensor of shape \(\d+,\) for a batch"
    ):
        curvcal.hessian_eigenvalues(
            model, (x, y), loss=lambda z, t: nn.functional.cross_entropy(z, t, reduction="none")
        )
    with pytest.raises(InputError, match=r"^loss: .* returned a float"):
        curvcal.hessian_eigenvalues(model, (x, y), loss=lambda z, t: 1.0)
    with pytest.raises(InputError, match=r"^loss: expected a loss name"):
        curvcal.hessian_eigenvalues(model, (x, y), loss=3)
    with pytest.raises(InputError, match=r"^gamma: goes with a loss name"):
        curvcal.hessian_eigenvalues(model, (x, y), loss=nn.CrossEntropyLoss(), gamma=2.0)
    with pytest.raises(InputError, match=r"^trace_method: unknown trace method 'exact'"):
        curvcal.hessian_trace(model, (x, y), trace_method="exact")
    with pytest.raises(InputError, match=r"^trace_rtol: "):
        curvcal.hessian_trace(model, (x, y), trace_rtol=0.1)
    with pytest.raises(InputError, match=r"^probes: trace_method 'auto' needs at least 4"):
        curvcal.hessian_trace(model, (x, y), 3)


def test_one_sample_is_a_dataset() -> None:
    """The border case N = 1: one (x, y) pair of one row, its mean loss that row's loss."""
    model = _relu_mlp()
    x, y = make_data("mlp", n=1)
    dense = dense_hessian(model, x, y, _smoothed)
    spectrum = curvcal.hessian_eigenvalues(model, (x, y), loss=_smoothed, tol=1e-10)
    assert spectrum.eigenvalues[0] == pytest.approx(float(torch.linalg.eigvalsh(dense)[-1]))
    trace = curvcal.hessian_trace(model, (x, y), loss="ce")
    assert trace.method == "gauss-newton"
    assert trace.estimate == pytest.approx(float(torch.trace(dense_hessian(model, x, y))))


def test_scipy_eigsh_on_the_operator_matches_the_dense_top_eigenvalues(
    tanh_case: tuple[nn.Module, Tensor, Tensor],
) -> None:
    model, x, y = tanh_case
    dense = dense_hessian(model, x, y)
    operator = curvcal.hessian_operator(model, split(x, y, BATCH))
    linear = curvcal.scipy_operator(operator)
    assert isinstance(linear, scipy.sparse.linalg.LinearOperator)
    assert linear.shape == (75, 75) and linear.dtype == np.float64
    values = np.sort(scipy.sparse.linalg.eigsh(linear, k=2, which="LA", tol=1e-12)[0])
    exact = torch.linalg.eigvalsh(dense)[-2:].numpy()
    assert values == pytest.approx(exact, rel=1e-9)
    block = np.random.default_rng(0).standard_normal((75, 4))
    assert (linear @ block).dtype == np.float64
    assert linear.matmat(block) == pytest.approx((dense.numpy() @ block), rel=1e-9, abs=1e-12)
    assert linear.rmatvec(block[:, 0]) == pytest.approx(dense.numpy() @ block[:, 0], abs=1e-12)


class CountingLoader:
    """A re-iterable of batches that counts how often it is read."""

    def __init__(self, batches: list[tuple[Tensor, Tensor]]) -> None:
        self.batches = batches
        self.reads = 0

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        self.reads += 1
        return iter(self.batches)


def test_lambda_max_and_trace_share_one_operator_and_its_cached_batches(
    tanh_case: tuple[nn.Module, Tensor, Tensor],
) -> None:
    model, x, y = tanh_case
    dense = dense_hessian(model, x, y)
    loader = CountingLoader(split(x, y, BATCH))
    operator = curvcal.hessian_operator(model, loader, cache="device")
    reads = loader.reads
    top = curvcal.hessian_eigenvalues(operator, tol=1e-10)
    trace = curvcal.hessian_trace(operator, probes=225, trace_method="hutchpp")
    analysis = curvcal.analyse_hessian(operator, top_k=2, trace=False)
    assert loader.reads == reads  # no pass over the source after the operator was built
    assert operator.total_matvecs == (
        top.values[0].matvecs + trace.matvecs + analysis.spectrum.values[0].matvecs
    )
    assert top.eigenvalues[0] == pytest.approx(float(torch.linalg.eigvalsh(dense)[-1]), rel=1e-8)
    assert analysis.lambda_max == pytest.approx(top.eigenvalues[0], rel=1e-8)
    assert trace.estimate == pytest.approx(float(torch.trace(dense)), rel=1e-8)
    with pytest.raises(InputError, match=r"^loss: the operator already holds"):
        curvcal.hessian_trace(operator, loss="ce")
    with pytest.raises(InputError, match=r"^data: the operator already holds"):
        curvcal.hessian_eigenvalues(operator, loader)
    with pytest.raises(InputError, match=r"^hvp: the operator already holds"):
        curvcal.analyse_hessian(operator, hvp="func")


def test_analyse_hessian_with_defaults_and_keyword_overrides() -> None:
    """A DataLoader, a list of batches and one (x, y) pair give the same analysis."""
    model = _relu_mlp()
    x, y = make_data("mlp")
    dense = dense_hessian(model, x, y)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)
    exact = torch.linalg.eigvalsh(dense)
    for data in (loader, split(x, y, BATCH), (x, y)):
        analysis = curvcal.analyse_hessian(model, data, top_k=3, tol=1e-10)
        assert analysis.spectrum.eigenvalues == pytest.approx(
            tuple(float(v) for v in exact.flip(0)[:3]), rel=1e-8
        )
        assert analysis.trace is not None and analysis.trace.method == "gauss-newton"
        assert analysis.trace.estimate == pytest.approx(float(torch.trace(dense)), rel=1e-10)
        assert analysis.operator["n_samples"] == 50
    settings = curvcal.HessianSettings(top_k=2)
    assert curvcal.analyse_hessian(model, (x, y), settings).spectrum.eigenvalues == pytest.approx(
        tuple(float(v) for v in exact.flip(0)[:2]), rel=1e-6
    )
    smoothed = curvcal.analyse_hessian(
        model, (x, y), loss=nn.CrossEntropyLoss(label_smoothing=0.1), trace_method="hutchpp"
    )
    assert smoothed.operator["loss"] == "CrossEntropyLoss"
    assert smoothed.lambda_max == pytest.approx(
        float(torch.linalg.eigvalsh(dense_hessian(model, x, y, _smoothed))[-1]), rel=1e-6
    )
    with pytest.raises(TypeError, match="top_kk"):
        curvcal.analyse_hessian(model, (x, y), top_kk=3)
    with pytest.raises(InputError, match=r"^top_k:"):
        curvcal.analyse_hessian(model, (x, y), top_k=0)


def test_predict_runs_the_model_in_eval_mode_and_restores_it() -> None:
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 3))
    model.train()
    model[1].eval()  # a mixed mode, to be restored as it was
    flags = [m.training for m in model.modules()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = make_data("mlp")
    x = x.float()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)
    logits, labels = curvcal.predict(model, loader)
    assert [m.training for m in model.modules()] == flags
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    model.eval()
    with torch.no_grad():
        expected = model(x)
    assert torch.allclose(logits, expected, atol=1e-6) and torch.equal(labels, y)
    metrics = curvcal.calibration_metrics(logits, labels)
    again = curvcal.calibration_metrics(*curvcal.predict(model, (x, y)))
    assert metrics.ece == pytest.approx(again.ece)
    with pytest.raises(InputError, match=r"^data: holds no batch"):
        curvcal.predict(model, [])
    with pytest.raises(InputError, match=r"^data: batch 0: each batch must be a pair"):
        curvcal.predict(model, [x])
