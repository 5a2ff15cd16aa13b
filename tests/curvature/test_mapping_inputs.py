"""Batches whose inputs are a mapping of named tensors (token ids and an attention mask), as text
models take them: every product, cache mode, split and the FLSD-53 grouping against a dense
float64 Hessian of the same mean loss."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch
from torch import Tensor, nn

from curvcal.curvature.batches import Batches
from curvcal.curvature.flsd53 import flsd53_groups
from curvcal.curvature.operator import HessianOperator
from curvcal.errors import InputError

from .cases import dense_hessian

VOCAB, WIDTH, CLASSES, N, LENGTH = 7, 3, 3, 11, 5


class MaskedBag(nn.Module):
    """Mean of the token embeddings where the attention mask is 1, then tanh and a linear map."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: Mapping[str, Tensor]) -> Tensor:
        mask = x["attention_mask"].to(self.embed.weight.dtype).unsqueeze(-1)
        pooled = (self.embed(x["input_ids"]) * mask).sum(1) / mask.sum(1)
        return self.head(torch.tanh(pooled))


def _case() -> tuple[nn.Module, dict[str, Tensor], Tensor]:
    torch.manual_seed(0)
    model = MaskedBag().double()
    with torch.no_grad():
        model.embed.weight.mul_(2.0)
        model.head.weight.mul_(3.0)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (N, LENGTH), generator=generator)
    lengths = torch.tensor([5, 1, 3, 4, 2, 5, 1, 2, 3, 4, 5])
    mask = (torch.arange(LENGTH)[None, :] < lengths[:, None]).long()
    y = torch.randint(0, CLASSES, (N,), generator=generator)
    return model, {"input_ids": ids * mask, "attention_mask": mask}, y


def _batches(
    x: dict[str, Tensor], y: Tensor, sizes: list[int]
) -> list[tuple[dict[str, Tensor], Tensor]]:
    out, start = [], 0
    for size in sizes:
        out.append(({k: v[start : start + size] for k, v in x.items()}, y[start : start + size]))
        start += size
    return out


@pytest.mark.parametrize("engine", ["autograd", "func"])
@pytest.mark.parametrize("cache", ["device", "host", "none"])
def test_products_over_mapping_batches_equal_the_dense_hessian(engine: str, cache: str) -> None:
    model, x, y = _case()
    dense = dense_hessian(model, x, y)
    operator = HessianOperator(
        model, _batches(x, y, [4, 5, 2]), hvp=engine, cache=cache, device="cpu"
    )
    assert operator.n_samples == N
    vectors = torch.randn(operator.shape[0], 3, dtype=torch.float64)
    assert torch.allclose(operator.matmat(vectors), dense @ vectors, rtol=0, atol=1e-12)


def test_micro_batching_and_halving_split_every_tensor_of_the_mapping() -> None:
    model, x, y = _case()
    dense = dense_hessian(model, x, y)
    vectors = torch.randn(dense.shape[0], 2, dtype=torch.float64)
    tiny = HessianOperator(model, _batches(x, y, [6, 5]), probe_batch=4, memory_budget="1B")
    assert tiny.micro_batch == 1  # one row per chunk
    assert torch.allclose(tiny.matmat(vectors), dense @ vectors, rtol=0, atol=1e-12)
    batches = Batches(_batches(x, y, [6, 5]), "device", torch.device("cpu"), torch.float64, None)
    assert batches.halve() and batches.batch_size == 3
    chunks = list(batches)
    assert [int(c[1].shape[0]) for c in chunks] == [3, 3, 3, 2]
    for chunk_x, chunk_y in chunks:
        assert set(chunk_x) == {"input_ids", "attention_mask"}
        assert all(t.shape[0] == chunk_y.shape[0] for t in chunk_x.values())
        assert chunk_x["input_ids"].dtype == torch.int64  # ids are never cast to the float dtype
    halved = HessianOperator(model, _batches(x, y, [6, 5]), probe_batch=4)
    halved._batches.halve()
    assert torch.allclose(halved.matmat(vectors), dense @ vectors, rtol=0, atol=1e-12)


def test_flsd53_groups_take_rows_of_every_tensor() -> None:
    model, x, y = _case()
    low, high = flsd53_groups(model, _batches(x, y, [4, 7]))
    with torch.no_grad():
        p_y = torch.softmax(model(x), 1).gather(1, y[:, None])[:, 0]
    expected_low = (p_y < 0.2).nonzero().flatten()
    got = torch.cat([b[0]["input_ids"] for b in low]) if low else torch.empty(0, LENGTH)
    assert torch.equal(got, x["input_ids"][expected_low])
    assert sum(int(b[1].shape[0]) for b in low + high) == N
    assert all(b[0]["attention_mask"].shape[0] == b[1].shape[0] for b in low + high)


def test_bad_mapping_batches_are_refused() -> None:
    model, x, y = _case()
    ragged = {"input_ids": x["input_ids"], "attention_mask": x["attention_mask"][:-1]}
    with pytest.raises(InputError, match="first dimensions differ"):
        HessianOperator(model, [(ragged, y)])
    with pytest.raises(InputError, match="inputs have 11 rows but labels have 10"):
        HessianOperator(model, [(x, y[:-1])])
    with pytest.raises(InputError, match="map names to tensors"):
        HessianOperator(model, [({"input_ids": [1, 2]}, y[:2])])
    with pytest.raises(InputError, match="empty mapping"):
        HessianOperator(model, [({}, y)])


def test_gauss_newton_trace_of_a_block_with_mapping_inputs() -> None:
    from curvcal.curvature.gauss_newton import (
        EngineChoice,
        gauss_newton_problem,
        gauss_newton_sums,
        tensor_traces,
    )
    from curvcal.losses import CrossEntropy

    model, x, y = _case()
    names = ["head.weight", "head.bias"]
    exact = float(dense_hessian(model, x, y, names=names).trace())
    whole = HessianOperator(model, _batches(x, y, [4, 4, 3]))
    assert "not linear in embed.weight" in gauss_newton_problem(whole)  # tanh after the embedding
    head = HessianOperator(model, _batches(x, y, [4, 4, 3]), params=["head.*"])
    assert gauss_newton_problem(head) == ""
    assert tensor_traces(head).total == pytest.approx(exact, rel=1e-12)
    forced = EngineChoice(func_usable=True)
    forced.engine = "func"  # rows of a mapping through torch.func.vmap
    params = (model.head.weight, model.head.bias)
    sums, _, passes = gauss_newton_sums(model, CrossEntropy(), names, params, x, y, forced)
    assert float(sums.sum()) / N == pytest.approx(exact, rel=1e-12) and passes == 2 * N
