"""GGN, Fisher and empirical Fisher operators against dense float64 matrices built independently.

The truths: G = (1/N) Σ_n J_nᵀ Λ_n J_n from full Jacobians of the logits in the flattened
parameters (``torch.autograd.functional.jacobian``) and each row's loss Hessian in the logits by
``torch.autograd.functional.hessian`` of a loss written here; the Fisher from its definition,
(1/N) Σ_n Σ_k p_{n,k} ∇_θℓ(x_n, k) ∇_θℓ(x_n, k)ᵀ, and the empirical Fisher
(1/N) Σ_n ∇_θℓ_n ∇_θℓ_nᵀ, each gradient taken one sample at a time by plain autograd. Three
architectures: a tanh MLP, a CNN with eval-mode BatchNorm, and a network using one Linear twice
(a shared weight). Batches are uneven (the last holds fewer samples).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from curvcal.curvature.analysis import analyse_batches
from curvcal.curvature.operator import HessianOperator
from curvcal.errors import InputError
from curvcal.losses import CrossEntropy, Focal, UserLoss, logit_hessian_product
from curvcal.settings.hessian import HessianSettings
from tests.curvature.cases import TinyCNN

N = 23
BATCH = 5  # 23 = 4·5 + 3: uneven batches
KINDS = ("ggn", "fisher", "empirical-fisher")


class SharedLinear(nn.Module):
    """x → tanh(A x) → tanh(A ·) → head: the weight A is used twice (shared)."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(5, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.shared(torch.tanh(self.shared(x)))))


def _model(kind: str) -> nn.Module:
    torch.manual_seed(3)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    if kind == "cnn":
        model = TinyCNN().double()
        with torch.no_grad():
            model.norm.running_mean.uniform_(-0.5, 0.5)
            model.norm.running_var.uniform_(0.5, 2.0)
        return model.eval()
    return SharedLinear().double()


def _data(kind: str) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(4)
    shape = (N, 1, 4, 4) if kind == "cnn" else (N, 5)
    x = 2.0 * torch.randn(shape, generator=generator, dtype=torch.float64)
    return x, torch.randint(0, 3, (N,), generator=generator)


def _batches(x: Tensor, y: Tensor) -> list[tuple[Tensor, Tensor]]:
    return [(x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, x.shape[0], BATCH)]


def _row_loss(gamma: float) -> Callable[[Tensor, int], Tensor]:
    """ℓ(z, y) for one row: −log p_y, or the focal −(1 − p_y)^γ log p_y."""

    def loss(z: Tensor, label: int) -> Tensor:
        logp = z - torch.logsumexp(z, dim=0)
        return -((1 - logp[label].exp()) ** gamma) * logp[label]

    return loss


def _flat_logits(model: nn.Module, x: Tensor) -> tuple[Callable[[Tensor], Tensor], Tensor]:
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def logits(theta: Tensor) -> Tensor:
        pieces = theta.split([s.numel() for s in shapes])
        values = {n: piece.reshape(s) for n, piece, s in zip(names, pieces, shapes, strict=True)}
        return torch.func.functional_call(model, values, (x,))

    return logits, flat


def dense_ggn(model: nn.Module, x: Tensor, y: Tensor, gamma: float) -> Tensor:
    logits_of, flat = _flat_logits(model, x)
    jacobian = torch.autograd.functional.jacobian(logits_of, flat)  # (N, K, P)
    z = logits_of(flat).detach()
    loss = _row_loss(gamma)
    total = torch.zeros(flat.numel(), flat.numel(), dtype=torch.float64)
    for n in range(x.shape[0]):
        lam = torch.autograd.functional.hessian(lambda row, n=n: loss(row, int(y[n])), z[n])
        total += jacobian[n].T @ lam @ jacobian[n]
    return total / x.shape[0]


def _sample_gradient(model: nn.Module, x: Tensor, label: int, gamma: float) -> Tensor:
    model.zero_grad()
    value = _row_loss(gamma)(model(x.unsqueeze(0))[0], label)
    grads = torch.autograd.grad(value, list(model.parameters()))
    return torch.cat([g.reshape(-1) for g in grads])


def dense_fisher(model: nn.Module, x: Tensor, gamma: float) -> Tensor:
    rows = []
    with torch.no_grad():
        probs = torch.softmax(model(x), dim=1)
    for n in range(x.shape[0]):
        for k in range(probs.shape[1]):
            g = _sample_gradient(model, x[n], k, gamma)
            rows.append(probs[n, k].sqrt() * g)
    stacked = torch.stack(rows)
    return stacked.T @ stacked / x.shape[0]


def dense_empirical_fisher(model: nn.Module, x: Tensor, y: Tensor, gamma: float) -> Tensor:
    grads = torch.stack([_sample_gradient(model, x[n], int(y[n]), gamma) for n in range(len(y))])
    return grads.T @ grads / x.shape[0]


def _truth(kind: str, model: nn.Module, x: Tensor, y: Tensor, gamma: float) -> Tensor:
    if kind == "ggn":
        return dense_ggn(model, x, y, gamma)
    if kind == "fisher":
        return dense_fisher(model, x, gamma)
    return dense_empirical_fisher(model, x, y, gamma)


def _operator(model: nn.Module, x: Tensor, y: Tensor, kind: str, gamma: float) -> HessianOperator:
    loss = Focal(gamma) if gamma else CrossEntropy()
    return HessianOperator(model, _batches(x, y), loss, keep_graphs="never", curvature=kind)


def relative_error(found: Tensor, truth: Tensor) -> float:
    return float((found - truth).abs().max() / truth.abs().max())


@pytest.mark.parametrize("gamma", [0.0, 2.0])
@pytest.mark.parametrize("arch", ["mlp", "cnn", "shared"])
@pytest.mark.parametrize("kind", KINDS)
def test_products_equal_dense_truth(kind: str, arch: str, gamma: float) -> None:
    model = _model(arch)
    x, y = _data(arch)
    truth = _truth(kind, model, x, y, gamma)
    operator = _operator(model, x, y, kind, gamma)
    found = operator.matmat(torch.eye(operator.shape[0], dtype=torch.float64))
    assert truth.abs().max() > 0
    assert relative_error(found, truth) < 1e-10
    if kind != "ggn" or gamma == 0.0:  # the focal GGN may be indefinite; the others are PSD
        assert torch.linalg.eigvalsh(truth).min() > -1e-10 * truth.abs().max()


def test_fisher_of_cross_entropy_is_its_ggn() -> None:
    model = _model("mlp")
    x, y = _data("mlp")
    ggn = _operator(model, x, y, "ggn", 0.0).matmat(torch.eye(57, dtype=torch.float64))
    fisher = _operator(model, x, y, "fisher", 0.0).matmat(torch.eye(57, dtype=torch.float64))
    assert relative_error(fisher, ggn) < 1e-12


def test_focal_fisher_differs_from_focal_ggn() -> None:
    """The Fisher of the focal loss is its own matrix, not the GGN (the docs say which)."""
    model = _model("mlp")
    x, y = _data("mlp")
    eye = torch.eye(57, dtype=torch.float64)
    ggn = _operator(model, x, y, "ggn", 2.0).matmat(eye)
    fisher = _operator(model, x, y, "fisher", 2.0).matmat(eye)
    assert relative_error(fisher, ggn) > 1e-2


@pytest.mark.parametrize("gamma", [0.5, 1.0, 2.0, 3.0])
def test_focal_logit_hessian_product_matches_autograd(gamma: float) -> None:
    """Λ w in closed form against autograd's Hessian of the focal loss, saturated rows too."""
    logits = torch.tensor(
        [[2.0, -1.0, 0.5], [30.0, 0.0, -3.0], [0.0, 0.0, 0.0]], dtype=torch.float64
    )
    labels = torch.tensor([0, 0, 2])
    w = torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    found = logit_hessian_product(Focal(gamma), logits, labels, w)
    for n in range(3):
        lam = torch.autograd.functional.hessian(
            lambda row, n=n: _row_loss(gamma)(row, int(labels[n])), logits[n]
        )
        assert torch.allclose(found[n], lam @ w[n], rtol=1e-9, atol=1e-12)


def _settings(kind: str, **changes: object) -> HessianSettings:
    return HessianSettings(curvature=kind, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", KINDS)
def test_analysis_eigenvalues_trace_density_layers(kind: str) -> None:
    model = _model("shared")
    x, y = _data("shared")
    truth = _truth(kind, model, x, y, 0.0)
    eigenvalues = torch.linalg.eigvalsh(truth)
    settings = _settings(
        kind, top_k=3, smallest=True, tol=1e-6, density=True, density_runs=2, per_layer=True
    )
    analysis = analyse_batches(model, _batches(x, y), settings)
    assert analysis.operator["curvature"] == kind
    top = torch.tensor([v.value for v in analysis.spectrum.values], dtype=torch.float64)
    assert torch.allclose(top, eigenvalues.flip(0)[:3], rtol=1e-6)
    assert analysis.lambda_min is not None
    assert abs(analysis.lambda_min - float(eigenvalues[0])) < 1e-6 * float(eigenvalues[-1])
    assert analysis.trace is not None
    exact = kind != "empirical-fisher"  # auto: the Gauss–Newton trace for the GGN and CE's Fisher
    assert analysis.trace.method == ("gauss-newton" if exact else "hutchpp")
    low, high = analysis.trace.ci95
    rounding = 1e-12 * float(truth.trace())  # 100 probes ≥ 2P: Hutch++'s sketch spans the space
    assert low - rounding <= float(truth.trace()) <= high + rounding
    if exact:
        assert analysis.trace.estimate == pytest.approx(float(truth.trace()), rel=1e-10)
    assert analysis.density is not None
    assert analysis.layers is not None
    sizes = {"shared": 30, "head": 18}
    start = 0
    for layer in analysis.layers:
        size = sizes[layer.module]
        block = truth[start : start + size, start : start + size]
        assert layer.n_params == size
        assert layer.lambda_max.value == pytest.approx(
            float(torch.linalg.eigvalsh(block)[-1]), rel=1e-4
        )
        low, high = layer.trace.ci95  # a small block's trace is exact (zero width)
        slack = 1e-12 * float(block.trace())
        assert low - slack <= float(block.trace()) <= high + slack
        start += size


@pytest.mark.parametrize("method", ["hutchpp", "hutchinson", "xtrace"])
def test_estimated_traces_cover_the_truth(method: str) -> None:
    model = _model("cnn")
    x, y = _data("cnn")
    truth = float(dense_empirical_fisher(model, x, y, 2.0).trace())
    # the empirical Fisher of 23 samples has rank ≤ 23: 20 probes leave a true estimate
    settings = _settings(
        "empirical-fisher", loss="focal", gamma=2.0, trace_method=method, probes=20
    )
    analysis = analyse_batches(model, _batches(x, y), settings)
    assert analysis.trace is not None
    low, high = analysis.trace.ci95
    assert high - low > 1e-6 * truth
    assert low <= truth <= high


def test_one_sample() -> None:
    model = _model("mlp")
    x, y = _data("mlp")
    x, y = x[:1], y[:1]
    for kind in KINDS:
        truth = _truth(kind, model, x, y, 0.0)
        found = _operator(model, x, y, kind, 0.0).matmat(torch.eye(57, dtype=torch.float64))
        assert relative_error(found, truth) < 1e-10


def test_unknown_kind_is_refused() -> None:
    model = _model("mlp")
    x, y = _data("mlp")
    with pytest.raises(InputError, match=r"^curvature: unknown value 'gauss'"):
        HessianOperator(model, _batches(x, y), curvature="gauss")


@pytest.mark.parametrize("kind", KINDS)
def test_a_loss_without_closed_form_is_refused(kind: str) -> None:
    model = _model("mlp")
    x, y = _data("mlp")
    user = UserLoss(torch.nn.functional.cross_entropy, name="my_loss")
    with pytest.raises(InputError, match=f"{kind} cannot be taken of this loss.*my_loss"):
        HessianOperator(model, _batches(x, y), user, curvature=kind)


def test_train_mode_and_func_are_refused() -> None:
    model = _model("mlp")
    x, y = _data("mlp")
    with pytest.raises(InputError, match="mode eval"):
        HessianOperator(model, _batches(x, y), mode="train", curvature="ggn")
    with pytest.raises(InputError, match="hvp"):
        HessianOperator(model, _batches(x, y), hvp="func", curvature="fisher")


@pytest.mark.parametrize(
    ("kind", "method", "loss", "gamma", "message"),
    [
        ("ggn", "gauss-newton+hutchpp", "ce", None, "no meaning for curvature ggn"),
        ("empirical-fisher", "gauss-newton", "ce", None, "not of the empirical-fisher of the ce"),
        ("fisher", "gauss-newton", "focal", 2.0, "not of the fisher of the focal loss"),
    ],
)
def test_trace_methods_a_kind_cannot_take_are_refused(
    kind: str, method: str, loss: str, gamma: float | None, message: str
) -> None:
    model = _model("mlp")
    x, y = _data("mlp")
    settings = _settings(kind, trace_method=method, loss=loss, gamma=gamma)
    with pytest.raises(InputError, match=message):
        analyse_batches(model, _batches(x, y), settings)


def test_every_kind_the_settings_offer_has_its_kernel() -> None:
    """The kinds are declared once, by the settings; each but the Hessian is a matrix of the
    loss in the logits that the operator multiplies through J_n."""
    from curvcal.curvature.operator import _LOGIT_PRODUCTS
    from curvcal.settings.hessian import CURVATURES

    assert set(CURVATURES) - {"hessian"} == set(_LOGIT_PRODUCTS)


def test_python_api_takes_the_kind() -> None:
    from curvcal.curvature.api import hessian_eigenvalues, hessian_trace

    model = _model("cnn")
    x, y = _data("cnn")
    truth = dense_ggn(model, x, y, 0.0)
    spectrum = hessian_eigenvalues(model, _batches(x, y), 2, tol=1e-8, curvature="ggn")
    found = [value.value for value in spectrum.values]
    assert found == pytest.approx(torch.linalg.eigvalsh(truth).flip(0)[:2].tolist(), rel=1e-6)
    trace = hessian_trace(model, _batches(x, y), trace_method="gauss-newton", curvature="ggn")
    assert trace.estimate == pytest.approx(float(truth.trace()), rel=1e-10)
    assert "Gauss–Newton matrix itself" in trace.interval
    with pytest.raises(
        InputError,
        match="method: gauss-newton is the trace of the GGN, not of the empirical-fisher",
    ):
        hessian_trace(
            model, _batches(x, y), trace_method="gauss-newton", curvature="empirical-fisher"
        )


def test_the_gauss_newton_trace_refuses_a_kind_it_is_not_the_trace_of() -> None:
    """Called directly on an operator, not only through the trace-method choice."""
    from curvcal.curvature.gauss_newton import gauss_newton_trace

    model = _model("mlp")
    x, y = _data("mlp")
    operator = _operator(model, x, y, "empirical-fisher", 0.0)
    with pytest.raises(InputError, match="trace of the GGN, not of the empirical-fisher"):
        gauss_newton_trace(operator)
    # the GGN's own trace needs no linearity (the MLP has tanh); the focal Λ_n are indefinite
    for gamma in (0.0, 2.0):
        ggn = _operator(model, x, y, "ggn", gamma)
        assert gauss_newton_trace(ggn).estimate == pytest.approx(
            float(dense_ggn(model, x, y, gamma).trace()), rel=1e-10
        )


@pytest.mark.parametrize("loss", [CrossEntropy(), Focal(2.0)])
def test_many_classes_without_a_matrix_per_row(loss: CrossEntropy | Focal) -> None:
    """K = 400: the O(B·K) products equal Λ_n w_n with Λ_n from autograd (K × K per row)."""
    from curvcal.losses import logit_fisher_product

    generator = torch.Generator().manual_seed(5)
    logits = 3.0 * torch.randn(3, 400, dtype=torch.float64, generator=generator)
    labels = torch.tensor([0, 17, 399])
    w = torch.randn(3, 400, dtype=torch.float64, generator=generator)
    gamma = 0.0 if isinstance(loss, CrossEntropy) else 2.0
    found = logit_hessian_product(loss, logits, labels, w)
    fisher = logit_fisher_product(loss, logits, labels, w)
    for n in range(3):
        row = logits[n]
        lam = torch.autograd.functional.hessian(
            lambda z, n=n: _row_loss(gamma)(z, int(labels[n])), row
        )
        assert torch.allclose(found[n], lam @ w[n], rtol=1e-9, atol=1e-14)
        grads = torch.stack(
            [
                torch.autograd.functional.jacobian(lambda z, k=k: _row_loss(gamma)(z, k), row)
                for k in range(400)
            ]
        )
        p = torch.softmax(row, dim=0)
        expected = grads.T @ (p * (grads @ w[n]))
        assert torch.allclose(fisher[n], expected, rtol=1e-9, atol=1e-14)
