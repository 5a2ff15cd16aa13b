"""Out-of-memory retry with halved batches, probe_batch='auto', streaming and TF32 flags."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

# tests/ is on sys.path: its sub-folders are packages named from there
from curvature.cases import dense_hessian, make_data, make_mlp, split
from torch import Tensor

from curvcal.curvature import eigenvalues, hutchinson_trace
from curvcal.curvature.batches import is_out_of_memory
from curvcal.curvature.operator import HessianOperator
from curvcal.errors import InputError


def _fail_first(operator: HessianOperator, times: int, error: Callable[[], Exception]) -> list[int]:
    """Make the operator's per-batch product raise ``error()`` on its first ``times`` calls;
    return the batch sizes it was called with."""
    product = operator._batch_hvp_autograd
    seen: list[int] = []

    def flaky(x: Tensor, y: Tensor, tangents: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        seen.append(int(y.shape[0]))
        if len(seen) <= times:
            raise error()
        return product(x, y, tangents)

    operator._batch_hvp_autograd = flaky  # type: ignore[method-assign]
    return seen


def _oom() -> Exception:
    return torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.parametrize("cache", ["device", "none"])
def test_out_of_memory_retries_with_half_batches_and_same_numbers(cache: str) -> None:
    model = make_mlp()
    x, y = make_data("mlp", n=53)
    hessian = dense_hessian(model, x, y)
    batches = split(x, y, 20)  # 20, 20, 13
    # the retry of passes that rebuild their graphs (test_kept.py: kept graphs drop on OOM)
    plain = HessianOperator(model, lambda: iter(batches), cache=cache, keep_graphs="never")
    flaky = HessianOperator(model, lambda: iter(batches), cache=cache, keep_graphs="never")
    seen = _fail_first(flaky, 1, _oom)
    vector = torch.randn(75, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    product = flaky.matvec(vector)
    assert seen == [20, 10, 10, 10, 10, 10, 3]  # the failed try, then every batch halved
    assert (flaky.oom_retries, flaky.batch_size_final, plain.batch_size_final) == (1, 10, 20)
    assert torch.allclose(product, hessian @ vector, rtol=0, atol=1e-12)
    assert torch.allclose(product, plain.matvec(vector), rtol=0, atol=1e-12)
    assert eigenvalues(flaky, 1, tol=1e-10).eigenvalues == pytest.approx(
        eigenvalues(plain, 1, tol=1e-10).eigenvalues, abs=1e-12
    )
    assert hutchinson_trace(flaky, 16).estimate == pytest.approx(
        hutchinson_trace(plain, 16).estimate, abs=1e-12
    )


def test_repeated_out_of_memory_halves_down_to_one_sample_then_gives_up() -> None:
    model = make_mlp()
    x, y = make_data("mlp", n=5)
    operator = HessianOperator(model, [(x, y)], keep_graphs="never")
    seen = _fail_first(operator, 3, _oom)  # 5 → 3 → 2 → 1 rows
    vector = torch.ones(75, dtype=torch.float64)
    assert torch.allclose(
        operator.matvec(vector), dense_hessian(model, x, y) @ vector, rtol=0, atol=1e-12
    )
    assert seen[:4] == [5, 3, 2, 1] and operator.batch_size_final == 1
    assert operator.oom_retries == 3

    hopeless = HessianOperator(model, [(x, y)], keep_graphs="never")
    _fail_first(hopeless, 10**6, _oom)
    with pytest.raises(InputError, match="one sample per batch") as error:
        hopeless.matvec(vector)
    assert error.value.what == "batches"


def test_other_errors_are_not_retried() -> None:
    model = make_mlp()
    x, y = make_data("mlp", n=6)
    operator = HessianOperator(model, [(x, y)], keep_graphs="never")
    seen = _fail_first(
        operator, 1, lambda: RuntimeError("CUDA error: an illegal memory access was encountered")
    )
    with pytest.raises(RuntimeError, match="illegal memory access"):
        operator.matvec(torch.ones(75, dtype=torch.float64))
    assert seen == [6] and operator.oom_retries == 0


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (torch.cuda.OutOfMemoryError("CUDA out of memory"), True),
        (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"), True),
        (RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate: out of memory"), True),
        (
            RuntimeError("CUDA error: an illegal memory access was encountered (out of memory?)"),
            False,
        ),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
        (ValueError("out of memory"), False),
    ],
)
def test_out_of_memory_is_recognised(error: Exception, expected: bool) -> None:
    assert is_out_of_memory(error) is expected


def test_probe_batch_auto_on_cpu_is_recorded() -> None:
    model = make_mlp()
    x, y = make_data("mlp", n=9)
    operator = HessianOperator(model, [(x, y)], probe_batch="auto", keep_graphs="never")
    assert operator.probe_batch == 8 and operator.probe_batch_requested == "auto"
    vectors = torch.randn(75, 11, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert torch.allclose(
        operator.matmat(vectors), dense_hessian(model, x, y) @ vectors, rtol=0, atol=1e-12
    )
    assert operator.n_data_passes == 2  # 8 + 3 vectors
    with pytest.raises(InputError, match="'auto'"):
        HessianOperator(model, [(x, y)], probe_batch="many")


def test_tf32_flags_are_off_during_products_and_restored() -> None:
    model = make_mlp()
    x, y = make_data("mlp", n=4)
    seen: list[tuple[bool, bool]] = []
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        for allow in (False, True):
            operator = HessianOperator(model, [(x, y)], allow_tf32=allow, keep_graphs="never")
            product = operator._batch_hvp_autograd

            def spy(
                x: Tensor,
                y: Tensor,
                t: tuple[Tensor, ...],
                product: Callable[..., tuple[Tensor, ...]] = product,
            ) -> tuple[Tensor, ...]:
                seen.append(
                    (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
                )
                return product(x, y, t)

            operator._batch_hvp_autograd = spy  # type: ignore[method-assign]
            operator.matvec(torch.ones(75, dtype=torch.float64))
            assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    assert seen == [(False, False), (True, True)]


class _Attention(torch.nn.Module):
    """Self-attention over 3 tokens, then a linear head (scaled_dot_product_attention inside)."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(4, 2, batch_first=True)
        self.head = torch.nn.Linear(12, 3)

    def forward(self, x: Tensor) -> Tensor:
        mixed, _ = self.attention(x, x, x, need_weights=False)
        return self.head(mixed.flatten(1))


@pytest.mark.parametrize(
    ("engine", "keep"), [("func", "auto"), ("autograd", "never"), ("autograd", "always")]
)
def test_attention_models_have_exact_products(engine: str, keep: str) -> None:
    """Fused attention kernels cannot be differentiated twice; products must still be exact."""
    torch.manual_seed(0)
    model = _Attention().double().eval()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(10, 3, 4, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (10,), generator=generator)
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        hessian = dense_hessian(model, x, y)
    operator = HessianOperator(model, split(x, y, 4), hvp=engine, keep_graphs=keep)
    assert operator.graphs_kept is (keep == "always")
    vectors = torch.randn(hessian.shape[0], 3, generator=generator, dtype=torch.float64)
    assert torch.allclose(operator.matmat(vectors), hessian @ vectors, rtol=0, atol=1e-10)
