"""HessianOperator against dense float64 Hessians of small models (torch.func.hessian)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from curvcal.curvature.engines import engine_for
from curvcal.curvature.operator import HessianOperator
from curvcal.errors import InputError
from curvcal.settings.hessian import HessianSettings

from .cases import BATCH, dense_hessian, make_data, make_mlp, split


def _vectors(n: int, m: int, seed: int = 3) -> Tensor:
    return torch.randn(n, m, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("engine", ["func", "autograd"])
@pytest.mark.parametrize("case", ["mlp_case", "cnn_case"])
def test_products_equal_dense_hessian(
    case: str, engine: str, request: pytest.FixtureRequest
) -> None:
    model, x, y, hessian = request.getfixturevalue(case)
    # graphs rebuilt for every pass: the engines themselves (test_kept.py keeps them)
    operator = HessianOperator(
        model, split(x, y, BATCH), hvp=engine, probe_batch=3, keep_graphs="never"
    )
    vectors = _vectors(hessian.shape[0], 5)
    assert operator.shape == tuple(hessian.shape)
    assert operator.n_samples == 50
    assert torch.allclose(operator.matmat(vectors), hessian @ vectors, rtol=0, atol=1e-10)
    assert torch.allclose(
        operator.matvec(vectors[:, 0]), hessian @ vectors[:, 0], rtol=0, atol=1e-10
    )
    assert operator.engine == engine
    assert (operator.n_matvecs, operator.n_data_passes) == (
        6,
        3,
    )  # 5 columns in blocks of 3, then 1


def test_engines_agree(cnn_case: tuple[nn.Module, Tensor, Tensor, Tensor]) -> None:
    model, x, y, hessian = cnn_case
    vectors = _vectors(hessian.shape[0], 4)
    by_func = HessianOperator(model, split(x, y, BATCH), hvp="func").matmat(vectors)
    by_autograd = HessianOperator(model, split(x, y, BATCH), hvp="autograd").matmat(vectors)
    assert torch.allclose(by_func, by_autograd, rtol=0, atol=1e-12)


@pytest.mark.parametrize("size", [1, 13, 50])
def test_batch_size_does_not_change_products(
    size: int, mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor]
) -> None:
    model, x, y, _ = mlp_case
    vectors = _vectors(75, 3)
    reference = HessianOperator(model, split(x, y, BATCH)).matmat(vectors)
    assert torch.allclose(
        HessianOperator(model, split(x, y, size)).matmat(vectors), reference, rtol=0, atol=1e-10
    )


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_torchscript_runs_through_double_backward(
    mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor],
) -> None:
    _, x, y, hessian = mlp_case
    scripted = torch.jit.script(make_mlp())
    operator = HessianOperator(scripted, split(x, y, BATCH))
    assert operator.engine == "autograd"
    vectors = _vectors(75, 2)
    assert torch.allclose(operator.matmat(vectors), hessian @ vectors, rtol=0, atol=1e-10)
    with pytest.raises(InputError, match="TorchScript"):
        HessianOperator(scripted, split(x, y, BATCH), hvp="func")


class _Square(torch.autograd.Function):
    """An old-style autograd.Function (no setup_context): torch.func refuses it."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def, override]
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class _SquareNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(5, 3)

    def forward(self, x: Tensor) -> Tensor:
        return _Square.apply(self.linear(x))


def test_auto_falls_back_to_double_backward_where_torch_func_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # auto tries torch.func for blocks on CUDA only: give the CPU that rule here
    cuda = torch.device("cuda")
    monkeypatch.setattr(
        "curvcal.curvature.operator.engine_for",
        lambda requested, usable, width, _device: engine_for(requested, usable, width, cuda),
    )
    torch.manual_seed(0)
    model = _SquareNet().double()
    x, y = make_data("mlp")
    operator = HessianOperator(model, split(x, y, BATCH), keep_graphs="never")
    vectors = _vectors(18, 2)
    params = tuple(p.detach() for p in model.parameters())

    def mean_loss(weight: Tensor, bias: Tensor) -> Tensor:  # double backward, not torch.func
        logits = _Square.apply(nn.functional.linear(x, weight, bias))
        return nn.functional.cross_entropy(logits, y)

    blocks = torch.autograd.functional.hessian(mean_loss, params)
    hessian = torch.cat(
        [
            torch.cat([blocks[i][j].reshape(params[i].numel(), -1) for j in range(2)], 1)
            for i in range(2)
        ]
    )
    assert torch.allclose(operator.matmat(vectors), hessian @ vectors, rtol=0, atol=1e-10)
    assert operator.engine == "autograd"  # a block of 2 tried torch.func first, which failed
    assert operator.engine_fallback is not None and "setup_context" in operator.engine_fallback
    with pytest.raises(RuntimeError, match="setup_context"):
        HessianOperator(model, split(x, y, BATCH), hvp="func").matmat(vectors)


def test_caller_model_mode_buffers_and_grads_untouched(
    cnn_case: tuple[nn.Module, Tensor, Tensor, Tensor],
) -> None:
    model, x, y, hessian = cnn_case
    flags = [m.training for m in model.modules()]
    buffers = [b.clone() for b in model.buffers()]
    params = [p.clone() for p in model.parameters()]
    assert model.training  # handed over in train mode: the operator must still use eval mode
    for engine, mode in [("func", "eval"), ("autograd", "eval"), ("autograd", "train")]:
        operator = HessianOperator(model, split(x, y, BATCH), hvp=engine, mode=mode)
        result = operator.matmat(_vectors(hessian.shape[0], 2))
        if mode == "eval":
            assert torch.allclose(
                result, hessian @ _vectors(hessian.shape[0], 2), rtol=0, atol=1e-10
            )
        assert [m.training for m in model.modules()] == flags
        assert all(torch.equal(a, b) for a, b in zip(model.buffers(), buffers, strict=True))
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), params, strict=True))
        assert all(p.grad is None for p in model.parameters())


def test_train_mode_uses_batch_statistics(
    cnn_case: tuple[nn.Module, Tensor, Tensor, Tensor],
) -> None:
    model, x, y, hessian = cnn_case
    vectors = _vectors(hessian.shape[0], 1)
    train = HessianOperator(model, [(x, y)], mode="train", hvp="autograd").matmat(vectors)
    assert not torch.allclose(train, hessian @ vectors, atol=1e-6)


def test_train_mode_with_dropout_is_refused_and_eval_mode_ignores_dropout() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Dropout(0.5), nn.Tanh(), nn.Linear(4, 3)).double()
    x, y = make_data("mlp")
    with pytest.raises(InputError, match="dropout"):
        HessianOperator(model, split(x, y, BATCH), mode="train")
    hessian = dense_hessian(model, x, y)
    vectors = _vectors(hessian.shape[0], 2)
    assert torch.allclose(
        HessianOperator(model, split(x, y, BATCH)).matmat(vectors),
        hessian @ vectors,
        atol=1e-10,
        rtol=0,
    )


def test_focal_criterion_matches_dense_focal_hessian(
    mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor],
) -> None:
    model, x, y, _ = mlp_case
    gamma = 2.0

    def focal_mean(logits: Tensor, labels: Tensor) -> Tensor:
        p = torch.softmax(logits, dim=1)[torch.arange(labels.numel()), labels]
        return (-((1 - p) ** gamma) * torch.log(p)).mean()

    hessian = dense_hessian(model, x, y, loss=focal_mean)
    vectors = _vectors(75, 3)
    operator = HessianOperator(model, split(x, y, BATCH), loss="focal", gamma=gamma)
    assert torch.allclose(operator.matmat(vectors), hessian @ vectors, rtol=0, atol=1e-10)


def test_parameter_selection_by_glob_is_the_diagonal_block(
    mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor],
) -> None:
    model, x, y, hessian = mlp_case
    operator = HessianOperator(model, split(x, y, BATCH), params=["2.*"])
    assert operator.param_names == ("2.weight", "2.bias")
    block = hessian[48:, 48:]  # 5·8 + 8 = 48 parameters of layer 0 come first
    vectors = _vectors(27, 2)
    assert torch.allclose(operator.matmat(vectors), block @ vectors, rtol=0, atol=1e-10)
    restricted = HessianOperator(model, split(x, y, BATCH)).restrict(["0.bias"])
    assert torch.allclose(
        restricted.matvec(vectors[:8, 0]),
        hessian[40:48, 40:48] @ vectors[:8, 0],
        atol=1e-10,
        rtol=0,
    )


@pytest.mark.parametrize("cache", ["device", "host", "none"])
def test_cache_modes_and_callable_source_agree(
    cache: str, mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor]
) -> None:
    model, x, y, hessian = mlp_case
    batches = split(x, y, BATCH)
    operator = HessianOperator(model, lambda: iter(batches), cache=cache)
    assert operator.cache_mode == cache
    vectors = _vectors(75, 2)
    assert torch.allclose(operator.matmat(vectors), hessian @ vectors, rtol=0, atol=1e-10)


def test_all_reduce_hook_sums_count_and_products(
    mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor],
) -> None:
    """Two identical ranks (the hook doubles every sum) must give the same Hessian."""
    model, x, y, hessian = mlp_case
    calls: list[tuple[int, ...]] = []

    def twice(tensor: Tensor) -> Tensor:
        calls.append(tuple(tensor.shape))
        return 2 * tensor

    operator = HessianOperator(model, split(x, y, BATCH), all_reduce=twice)
    assert operator.n_samples == 100
    vectors = _vectors(75, 2)
    assert torch.allclose(operator.matmat(vectors), hessian @ vectors, rtol=0, atol=1e-10)
    assert calls == [(1,), (2, 75)]


def test_one_sample_dataset() -> None:
    model = make_mlp()
    x, y = make_data("mlp", n=1)
    hessian = dense_hessian(model, x, y)
    vectors = _vectors(75, 2)
    assert torch.allclose(
        HessianOperator(model, [(x, y)]).matmat(vectors), hessian @ vectors, rtol=0, atol=1e-10
    )


class _Temperature(nn.Module):
    """One parameter: logits = x / t. Plus an unused parameter (a zero Hessian block)."""

    def __init__(self) -> None:
        super().__init__()
        self.t = nn.Parameter(torch.tensor(1.5, dtype=torch.float64))
        self.unused = nn.Parameter(torch.ones(2, dtype=torch.float64))

    def forward(self, x: Tensor) -> Tensor:
        return x / self.t


@pytest.mark.parametrize("engine", ["func", "autograd"])
def test_one_parameter_and_zero_block(engine: str) -> None:
    model = _Temperature()
    x = torch.randn(9, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2])
    hessian = dense_hessian(model, x, y)
    one = HessianOperator(model, split(x, y, 4), params=["t"], hvp=engine)
    assert one.shape == (1, 1)
    assert torch.allclose(
        one.matvec(torch.ones(1, dtype=torch.float64)), hessian[:1, 0], rtol=0, atol=1e-12
    )
    zero = HessianOperator(model, split(x, y, 4), params=["unused"], hvp=engine)
    assert torch.equal(
        zero.matmat(torch.ones(2, 3, dtype=torch.float64)), torch.zeros(2, 3, dtype=torch.float64)
    )


@pytest.mark.parametrize(
    ("options", "what"),
    [
        ({"hvp": "jax"}, "hvp"),
        ({"loss": "mse"}, "loss"),
        ({"loss": "focal", "gamma": -1.0}, "gamma"),
        ({"loss": "focal"}, "loss focal"),
        ({"gamma": 2.0}, "gamma"),
        ({"mode": "test"}, "mode"),
        ({"cache": "disk"}, "cache"),
        ({"params": ["fc.*"]}, "params"),
        ({"probe_batch": 0}, "probe_batch"),
        ({"device": "meta"}, "device"),
    ],
)
def test_bad_options_are_refused(options: dict[str, object], what: str) -> None:
    model = make_mlp()
    x, y = make_data("mlp")
    with pytest.raises(InputError) as error:
        HessianOperator(model, split(x, y, BATCH), **options)  # type: ignore[arg-type]
    assert error.value.what == what


def test_the_operator_keeps_the_settings_it_was_built_with() -> None:
    """The operator is built from the settings object itself: keywords go on top of it, and
    what it reads is what :attr:`settings` holds."""
    model = make_mlp()
    x, y = make_data("mlp")
    given = HessianSettings(hvp="autograd", probe_batch=3, keep_graphs="never", top_k=2)
    operator = HessianOperator(model, split(x, y, BATCH), settings=given, cache="none")
    assert operator.settings == given.replace(cache="none")
    assert (operator.requested_engine, operator.probe_batch) == ("autograd", 3)
    assert operator.keep_graphs == "never" and operator.loss.name == "ce"


@pytest.mark.parametrize(("former", "field"), [("engine", "hvp"), ("criterion", "loss")])
def test_former_keyword_names_still_work_with_a_deprecation_warning(
    former: str, field: str
) -> None:
    """``engine`` is now ``hvp`` and ``criterion`` ``loss``, as the command line and the JSON
    record name them; the old keywords give the same operator, with a warning naming the new."""
    model = make_mlp()
    x, y = make_data("mlp")
    value = {"hvp": "autograd", "loss": "flsd53"}[field]
    with pytest.warns(DeprecationWarning, match=f"'{former}' is now called '{field}'"):
        old = HessianOperator(model, split(x, y, BATCH), **{former: value})  # type: ignore[arg-type]
    new = HessianOperator(model, split(x, y, BATCH), **{field: value})  # type: ignore[arg-type]
    assert old.settings == new.settings
    v = torch.randn(old.shape[0], 2, dtype=torch.float64)
    assert torch.equal(old.matmat(v), new.matmat(v))
    with pytest.raises(InputError, match="given twice"):
        HessianOperator(model, split(x, y, BATCH), **{former: value, field: value})  # type: ignore[arg-type]
    if former == "criterion":  # the attribute of that name too: the loss object says its name
        with pytest.warns(DeprecationWarning, match="use operator.loss.name"):
            assert new.criterion == new.loss.name == "flsd53"


def test_bad_data_is_refused() -> None:
    model = make_mlp()
    x, y = make_data("mlp")
    with pytest.raises(InputError, match="read only once"):
        HessianOperator(model, iter(split(x, y, BATCH)))
    with pytest.raises(InputError, match="empty"):
        HessianOperator(model, [])
    with pytest.raises(InputError, match="integer"):
        HessianOperator(model, [(x, y.double())])
    with pytest.raises(InputError, match="rows"):
        HessianOperator(model, [(x[:3], y[:4])])
    operator = HessianOperator(model, [(x, y)])
    with pytest.raises(InputError, match="shape"):
        operator.matmat(torch.ones(74, 1, dtype=torch.float64))


def test_auto_uses_double_backward_for_one_vector_and_blocks_on_the_cpu() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    x, y = make_data("mlp")
    operator = HessianOperator(model, split(x, y, BATCH))
    reference = HessianOperator(model, split(x, y, BATCH), hvp="func")
    vectors = _vectors(operator.shape[0], 3)
    assert operator.engine == "autograd"  # what a single vector would use
    single = operator.matvec(vectors[:, 0])
    block = operator.matmat(vectors)
    assert operator.engine == "autograd" and operator.engine_products == {"autograd": 4}
    assert torch.allclose(single, reference.matvec(vectors[:, 0]), rtol=0, atol=1e-12)
    assert torch.allclose(block, reference.matmat(vectors), rtol=0, atol=1e-12)


def test_auto_engine_rule() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert engine_for("auto", True, 8, cpu) == "autograd"
    assert engine_for("auto", True, 1, cuda) == "autograd"
    assert engine_for("auto", True, 8, cuda) == "func"
    assert engine_for("auto", False, 8, cuda) == "autograd"
    assert engine_for("func", True, 1, cpu) == "func"
    assert engine_for("autograd", True, 8, cuda) == "autograd"


@pytest.mark.parametrize("keep", ["always", "never"])
def test_matvec_into_writes_the_dense_product_in_place(
    keep: str, cnn_case: tuple[nn.Module, Tensor, Tensor, Tensor]
) -> None:
    """H·v in a given vector, through kept graphs and rebuilt ones; the vector is not touched,
    whatever ``out`` held before is gone, and the product counts once."""
    model, x, y, hessian = cnn_case
    operator = HessianOperator(model, split(x, y, BATCH), keep_graphs=keep)
    vector = _vectors(hessian.shape[0], 1)[:, 0]
    kept = vector.clone()
    out = torch.full_like(vector, float("nan"))
    for _ in range(2):  # the second through the kept graph the first one built (or rebuilt)
        assert operator.matvec_into(vector, out) is out
        assert torch.allclose(out, hessian @ vector, rtol=0, atol=1e-10)
    assert torch.equal(vector, kept)
    assert operator.graphs_kept == (keep == "always")
    assert operator.n_matvecs == 2


@pytest.mark.parametrize("keep", ["always", "never"])
def test_matvec_into_a_wider_vector_sums_there(
    keep: str, mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor]
) -> None:
    """A float32 operator writing into float64: the products agree with float32 ones to float32
    rounding and with the float64 Hessian to float32 accuracy."""
    model64, x, y, hessian = mlp_case
    model = make_mlp().float()
    model.load_state_dict(model64.state_dict())
    operator = HessianOperator(model, split(x.float(), y, BATCH), keep_graphs=keep)
    assert operator.dtype == torch.float32
    vector = _vectors(75, 1)[:, 0]
    out = torch.empty(75, dtype=torch.float64)
    operator.matvec_into(vector, out)
    narrow = operator.matvec(vector)
    assert narrow.dtype == torch.float32
    assert torch.allclose(out, narrow.double(), rtol=1e-5, atol=1e-6)
    assert torch.allclose(out, hessian @ vector, rtol=1e-4, atol=1e-5)


def test_matvec_into_sums_across_processes_in_place(
    mlp_case: tuple[nn.Module, Tensor, Tensor, Tensor],
) -> None:
    model, x, y, hessian = mlp_case
    operator = HessianOperator(model, split(x, y, BATCH), all_reduce=lambda t: 2 * t)
    vector = _vectors(75, 1)[:, 0]
    out = torch.zeros(75, dtype=torch.float64)
    operator.matvec_into(vector, out)
    assert torch.allclose(out, hessian @ vector, rtol=0, atol=1e-10)


def test_matvec_into_one_parameter_and_a_zero_block() -> None:
    model = _Temperature()
    x = torch.randn(9, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2])
    hessian = dense_hessian(model, x, y)
    for keep in ("always", "never"):
        one = HessianOperator(model, split(x, y, 4), params=["t"], keep_graphs=keep)
        out = torch.full((1,), float("nan"), dtype=torch.float64)
        one.matvec_into(torch.ones(1, dtype=torch.float64), out)
        assert torch.allclose(out, hessian[:1, 0], rtol=0, atol=1e-12)
        zero = HessianOperator(model, split(x, y, 4), params=["unused"], keep_graphs=keep)
        out = torch.full((2,), float("nan"), dtype=torch.float64)
        zero.matvec_into(torch.ones(2, dtype=torch.float64), out)
        assert torch.equal(out, torch.zeros(2, dtype=torch.float64))


@pytest.mark.parametrize(
    ("vector", "out", "what"),
    [
        (torch.ones(74, dtype=torch.float64), torch.empty(75, dtype=torch.float64), "vector"),
        (torch.ones(75, 1, dtype=torch.float64), torch.empty(75, dtype=torch.float64), "vector"),
        (torch.ones(75, dtype=torch.float64), torch.empty(76, dtype=torch.float64), "out"),
        (torch.ones(75, dtype=torch.float64), torch.empty(75, dtype=torch.int64), "out"),
        (torch.ones(75, dtype=torch.float64), torch.empty(75, 2, dtype=torch.float64)[:, 0], "out"),
        (torch.ones(75, dtype=torch.float64), torch.empty(75, device="meta"), "out"),
    ],
)
def test_matvec_into_refuses_bad_vectors(vector: Tensor, out: Tensor, what: str) -> None:
    model = make_mlp()
    x, y = make_data("mlp")
    operator = HessianOperator(model, split(x, y, BATCH))
    with pytest.raises(InputError) as refused:
        operator.matvec_into(vector, out)
    assert refused.value.what == what
    assert operator.n_matvecs == 0
