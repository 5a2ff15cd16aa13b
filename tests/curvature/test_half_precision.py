"""A model in bfloat16 or float16: products against dense float64 Hessians built independently
(torch.autograd.functional.hessian of a functional_call), the stopping rule at the precision
floor, and the border of a saturated softmax."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from curvcal.assets import demo_checkpoint
from curvcal.curvature.api import hessian_operator
from curvcal.curvature.eigen import eigenvalues
from curvcal.curvature.precision import (
    FLOOR_UNITS,
    NORMALISER_UNITS,
    accuracy_bound,
    normalisers,
    precision_floor,
    significant_digits,
)
from curvcal.curvature.results import ConvergenceWarning
from curvcal.load.checkpoint import load_model
from curvcal.settings.checkpoint import CheckpointSettings

HALVES = (torch.bfloat16, torch.float16)


class TinyTransformer(nn.Module):
    """Embedding, one encoder layer (self-attention, LayerNorm, GELU), mean pool, head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 4)
        layer = nn.TransformerEncoderLayer(
            4, 2, 8, dropout=0.0, activation="gelu", batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)).mean(1))


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(2, 4, 3),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, stride=2),
        nn.Tanh(),
        nn.Flatten(),
        nn.Linear(16, 3),
    )


def _case(name: str) -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A float64 model and uneven batches of its data."""
    torch.manual_seed(0)
    if name == "cnn":
        model: nn.Module = _cnn()
        x = torch.randn(37, 2, 7, 7)
    else:
        model = TinyTransformer()
        x = torch.randn(37, 4, 3)
    y = torch.randint(0, 3, (37,))
    return model.double().eval(), [(x[:20], y[:20]), (x[20:], y[20:])]


def dense_hessian(
    model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """∇²_θ of the mean cross-entropy over all batches, float64, from a flat-parameter function."""
    model = copy.deepcopy(model).double()
    named = list(model.named_parameters())
    x = torch.cat([b[0] for b in batches]).double()
    y = torch.cat([b[1] for b in batches])

    def loss(flat: torch.Tensor) -> torch.Tensor:
        pieces = flat.split([p.numel() for _, p in named])
        values = {n: piece.view_as(p) for (n, p), piece in zip(named, pieces, strict=True)}
        logits = torch.func.functional_call(model, values, (x,))
        return nn.functional.cross_entropy(logits, y)

    flat = torch.cat([p.detach().flatten() for _, p in named])
    # the fused attention kernels have no second derivative
    with sdpa_kernel([SDPBackend.MATH]):
        return torch.autograd.functional.hessian(loss, flat)


@pytest.fixture(scope="module", params=["cnn", "transformer"])
def case(request: pytest.FixtureRequest) -> tuple[nn.Module, list, torch.Tensor]:
    model, batches = _case(request.param)
    return model, batches, dense_hessian(model, batches)


@pytest.mark.parametrize("dtype", HALVES, ids=["bfloat16", "float16"])
def test_products_are_float32_and_within_the_floor(case, dtype: torch.dtype) -> None:
    model, batches, _ = case
    half = copy.deepcopy(model).to(dtype)
    op = hessian_operator(half, batches, probe_batch=64)
    assert op.model_dtype == dtype and op.dtype == torch.float32
    assert all(p.dtype == dtype for p in half.parameters())  # the model is not widened
    n_params = op.shape[0]
    columns = op.matmat(torch.eye(n_params, dtype=torch.float32))
    assert columns.dtype == torch.float32
    # the truth for the products: the same (rounded) weights in float64
    truth = dense_hessian(half, batches)
    error = float((columns.double() - truth).norm() / truth.norm())
    assert error <= op.precision_floor, error
    assert op.precision_floor == precision_floor(dtype)


@pytest.mark.parametrize(
    ("dtype", "lambda_rtol", "top3_rtol", "trace_rtol"),
    [(torch.bfloat16, 0.02, 0.05, 0.03), (torch.float16, 0.005, 0.01, 0.005)],
    ids=["bfloat16", "float16"],
)
def test_eigenvalues_and_trace_move_little_from_float64(
    case, dtype: torch.dtype, lambda_rtol: float, top3_rtol: float, trace_rtol: float
) -> None:
    """The issue's target: bf16 λmax within 2 % of float64 (the unrounded model's dense
    Hessian); top-3 and the trace within the tolerances measured plus a margin."""
    model, batches, dense = case
    exact = torch.linalg.eigvalsh(dense).flip(0)[:3]
    op = hessian_operator(copy.deepcopy(model).to(dtype), batches, probe_batch=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        spectrum = eigenvalues(op, 3, tol=1e-4, seed=1)
    assert spectrum.converged and spectrum.stopped_by == "tol"
    assert spectrum.precision_floor == op.precision_floor
    values = torch.tensor(spectrum.eigenvalues, dtype=torch.float64)
    assert abs(values[0] - exact[0]) <= lambda_rtol * abs(exact[0])
    assert torch.all((values - exact).abs() <= top3_rtol * exact.abs())
    trace = float(op.matmat(torch.eye(op.shape[0])).diagonal().double().sum())
    assert abs(trace - float(dense.trace())) <= trace_rtol * abs(float(dense.trace()))


def test_no_not_converged_below_the_floor() -> None:
    """A tol far below the bf16 floor is met at the floor, without a warning; the tol asked for
    is kept in the record beside the floor."""
    model, batches = _case("cnn")
    op = hessian_operator(model.to(torch.bfloat16), batches)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        spectrum = eigenvalues(op, 1, tol=1e-8, seed=0)
        power = eigenvalues(op, 1, method="power", tol=1e-8, seed=0, max_iter=400)
    for result in (spectrum, power):
        assert result.converged and result.tol == 1e-8
        assert result.tol_met == precision_floor(torch.bfloat16)
        assert 1e-8 < result.values[0].residual <= result.tol_met


def test_float32_and_float64_keep_their_tolerance() -> None:
    """float32 and float64 state no floor: the rule is unchanged."""
    model, batches = _case("cnn")
    for dtype in (torch.float32, torch.float64):
        op = hessian_operator(copy.deepcopy(model).to(dtype), batches)
        assert op.dtype == dtype == op.model_dtype
        spectrum = eigenvalues(op, 1, tol=1e-5, seed=0)
        assert spectrum.tol_met == 1e-5
        assert spectrum.values[0].residual <= 1e-5


@pytest.mark.parametrize("dtype", HALVES, ids=["bfloat16", "float16"])
def test_saturated_softmax(dtype: torch.dtype) -> None:
    """Border: every sample right with a margin of tens of logits, so 1 − p_y is below the
    half-precision resolution (a softmax in bf16 would round p_y to 1 and the Hessian to 0). The
    logits are widened before the loss, so λmax is found; its error then grows with the logit
    scale (rounding δz ≈ u·|z| moves e^{−margin}), within floor × max |z|, the documented bound."""
    torch.manual_seed(3)
    model = nn.Linear(6, 3).double()
    x = torch.randn(80, 6, dtype=torch.float64)
    with torch.no_grad():
        model.weight.mul_(30.0)
        logits = model(x)
        top = logits.topk(2, dim=1).values
        keep = (top[:, 0] - top[:, 1]) > 10.0
    x = x[keep]
    y = model(x).argmax(1).detach()
    batches = [(x[:17], y[:17]), (x[17:], y[17:])]
    half = copy.deepcopy(model).to(dtype)
    with torch.no_grad():
        probabilities = torch.softmax(half(x.to(dtype)), dim=1)
        scale = float(half(x.to(dtype)).abs().max().float())
    assert bool((probabilities.max(1).values == 1).any())  # a 16-bit softmax saturates
    exact = float(torch.linalg.eigvalsh(dense_hessian(model, batches))[-1])
    op = hessian_operator(half, batches)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        spectrum = eigenvalues(op, 1, seed=0)
    value = spectrum.values[0].value
    assert exact > 0.0 and value > 0.0
    assert abs(value - exact) <= op.precision_floor * scale * exact


def test_digits_shown() -> None:
    assert significant_digits(precision_floor(torch.bfloat16)) == 2
    assert significant_digits(precision_floor(torch.float16)) == 3
    assert precision_floor(torch.float32) == precision_floor(torch.float64) == 0.0
    assert significant_digits(0.0) == 6


# -- the command line: loading, a bad input, the JSON record -----------------------------------

DIGITS_ARCH = "curvcal:DigitsCNN"


def _bf16_checkpoint(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """The bundled digits CNN's weights saved in bfloat16."""
    from safetensors.torch import load_file, save_file

    weights = {
        name: value.to(torch.bfloat16) for name, value in load_file(str(demo_checkpoint())).items()
    }
    path = tmp_path / "digits_bf16.safetensors"
    save_file(weights, str(path))
    return path, weights


def test_a_bf16_checkpoint_loads_in_bf16_or_widened(tmp_path: Path) -> None:
    path, weights = _bf16_checkpoint(tmp_path)
    for dtype, name in ((torch.bfloat16, "bfloat16"), (torch.float32, "float32")):
        loaded = load_model(path, CheckpointSettings(arch=DIGITS_ARCH, device="cpu", dtype=name))
        state = loaded.module.state_dict()
        assert loaded.dtype == dtype
        for key, value in weights.items():
            assert state[key].dtype == dtype
            assert torch.equal(state[key], value.to(dtype))  # the file's values, unrounded


def test_an_operation_without_a_half_kernel_is_a_dtype_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli
) -> None:
    """torch's CPU cdist has no float16 or bfloat16 kernel: one line naming --dtype, exit 2."""
    from safetensors.torch import save_file

    (tmp_path / "half_prototypes.py").write_text(
        "import torch\nfrom torch import nn\n\n\n"
        "class Prototypes(nn.Module):\n"
        "    def __init__(self, num_classes: int = 3) -> None:\n"
        "        super().__init__()\n"
        "        self.centres = nn.Parameter(torch.zeros(num_classes, 4))\n\n"
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        "        return -torch.cdist(x.flatten(1), self.centres)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    save_file({"centres": torch.randn(3, 4)}, str(tmp_path / "p.safetensors"))
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).normal(size=(9, 4)), y=np.arange(9) % 3)
    for dtype in ("float16", "bfloat16"):
        result = run_cli(
            "hessian",
            tmp_path / "p.safetensors",
            "--arch",
            "py:half_prototypes:Prototypes",
            "--trust-checkpoint",
            "--data",
            tmp_path / "d.npz",
            "--dtype",
            dtype,
        )
        assert result.code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "--dtype" in lines[0] and dtype in lines[0]
        assert "cdist" in lines[0] and "Traceback" not in result.output


def test_hessian_json_states_the_floor(tmp_path: Path, run_cli) -> None:
    """``curvcal hessian --dtype bfloat16`` on a bf16 checkpoint: converged, the floor and the
    digits in the record, λmax within 2 % and the trace within 3 % of the float64 run."""
    path, _ = _bf16_checkpoint(tmp_path)
    runs = {}
    for dtype in ("float64", "bfloat16"):
        result = run_cli(
            "hessian", path, "--arch", DIGITS_ARCH, "--data", "curvcal:digits",
            "--max-samples", "120", "--top-k", "2", "--trace-method", "hutchinson",
            "--probes", "8", "--seed", "2", "--dtype", dtype, "--json",
        )  # fmt: skip
        assert result.code == 0, result.output
        runs[dtype] = json.loads(result.stdout)["results"]
    half, wide = runs["bfloat16"], runs["float64"]
    assert half["operator"]["model_dtype"] == "bfloat16"
    assert half["operator"]["precision_floor"] == precision_floor(torch.bfloat16)
    assert half["operator"]["significant_digits"] == 2
    assert wide["operator"]["precision_floor"] is None
    assert half["converged"] and half["spectrum"]["stopped_by"] == "tol"
    assert abs(half["lambda_max"] - wide["lambda_max"]) <= 0.02 * abs(wide["lambda_max"])
    estimate, reference = half["trace"]["estimate"], wide["trace"]["estimate"]
    assert abs(estimate - reference) <= 0.03 * abs(reference)


def test_tables_show_only_the_digits_the_floor_gives() -> None:
    from curvcal.report.hessian import _value
    from curvcal.report.tables import fmt_float

    assert _value(131.35, 2) == "130"
    assert _value(43.066, 2) == "43"
    assert _value(0.0123456, 3) == "0.0123"
    assert _value(-2.7182, 3) == "-2.72"
    assert _value(1.5e7, 2) == "1.5e+07"
    assert _value(3.14159265, 6) == fmt_float(3.14159265, 6)


# -- the accuracy bound against float64 on attention and normalisation layers ------------------


class TwoBlockTransformer(nn.Module):
    """Linear embedding, two post-norm encoder blocks (self-attention, LayerNorm, GELU), a final
    LayerNorm, mean pool, head: seven normalising layers (two attentions, five LayerNorms)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 16)
        self.blocks = nn.Sequential(
            *[
                nn.TransformerEncoderLayer(
                    16, 2, 32, dropout=0.0, activation="gelu", batch_first=True
                )
                for _ in range(2)
            ]
        )
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.embed(x))).mean(1))


def _trained_transformer(seed: int) -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The transformer trained 30 Adam steps (lr 0.03) in float64 on memorised random labels:
    large logits and sharp normalisations, as a trained network has."""
    torch.manual_seed(seed)
    model = TwoBlockTransformer().double()
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 8, 6, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 5, (64,), generator=generator)
    optimiser = torch.optim.Adam(model.parameters(), lr=0.03)
    for _ in range(30):
        optimiser.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimiser.step()
    return model.eval(), [(x[:32], y[:32]), (x[32:], y[32:])]


def test_normalisers_are_counted() -> None:
    assert normalisers(TwoBlockTransformer()) == 7
    assert normalisers(TinyTransformer()) == 3
    assert normalisers(_cnn()) == 0
    assert accuracy_bound(torch.float32, TwoBlockTransformer()) == 0.0
    u = 2.0**-11
    assert accuracy_bound(torch.float16, TwoBlockTransformer()) == pytest.approx(
        (FLOOR_UNITS + 7 * NORMALISER_UNITS) * u
    )


@pytest.mark.parametrize("seed", [0, 4])
def test_float16_lambda_max_of_a_transformer_is_within_the_stated_bound(seed: int) -> None:
    """λmax of the two-block transformer in float16 against the same model in float64: the
    error (seed 4: 2.8e-2, 57u; seed 0: 9.2e-3, 19u) exceeds the precision floor (8u = 3.9e-3),
    as on the model where it was first seen, and lies within the bound stated for the model,
    whose digits the tables print."""
    model, batches = _trained_transformer(seed)
    wide = eigenvalues(hessian_operator(model, batches, probe_batch=16), 1, tol=1e-8, seed=1)
    half = copy.deepcopy(model).to(torch.float16)
    op = hessian_operator(half, batches, probe_batch=16)
    narrow = eigenvalues(op, 1, tol=1e-4, seed=1)
    exact = wide.eigenvalues[0]
    error = abs(narrow.eigenvalues[0] - exact) / abs(exact)
    assert error > op.precision_floor  # the floor alone did not bound it
    assert error <= op.accuracy_bound
    digits = significant_digits(op.accuracy_bound)
    assert digits <= 2


class FunctionalBlock(nn.Module):
    """A post-norm encoder block written with ``F.scaled_dot_product_attention`` and
    ``F.layer_norm`` in a module of no normalising type or name: three normalising operations
    that no module declares."""

    def __init__(self, width: int = 16, heads: int = 2, hidden: int = 32) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)
        self.scale1 = nn.Parameter(torch.ones(width))
        self.shift1 = nn.Parameter(torch.zeros(width))
        self.scale2 = nn.Parameter(torch.ones(width))
        self.shift2 = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        attended = nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.out(attended.transpose(1, 2).reshape(b, t, w))
        x = nn.functional.layer_norm(x, (w,), self.scale1, self.shift1)
        x = x + self.down(nn.functional.gelu(self.up(x)))
        return nn.functional.layer_norm(x, (w,), self.scale2, self.shift2)


class FunctionalTransformer(nn.Module):
    """:class:`TwoBlockTransformer` written with functional attention and normalisation."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 16)
        self.blocks = nn.Sequential(FunctionalBlock(), FunctionalBlock())
        self.scale = nn.Parameter(torch.ones(16))
        self.shift = nn.Parameter(torch.zeros(16))
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = nn.functional.layer_norm(self.blocks(self.embed(x)), (16,), self.scale, self.shift)
        return self.head(pooled.mean(1))


def _functional_twin(model: TwoBlockTransformer) -> FunctionalTransformer:
    """A :class:`FunctionalTransformer` holding ``model``'s weights: the same function."""
    twin = FunctionalTransformer().to(next(model.parameters()).dtype)
    with torch.no_grad():
        twin.embed.load_state_dict(model.embed.state_dict())
        twin.head.load_state_dict(model.head.state_dict())
        twin.scale.copy_(model.norm.weight)
        twin.shift.copy_(model.norm.bias)
        for block, layer in zip(twin.blocks, model.blocks, strict=True):
            block.qkv.weight.copy_(layer.self_attn.in_proj_weight)
            block.qkv.bias.copy_(layer.self_attn.in_proj_bias)
            block.out.load_state_dict(layer.self_attn.out_proj.state_dict())
            block.up.load_state_dict(layer.linear1.state_dict())
            block.down.load_state_dict(layer.linear2.state_dict())
            block.scale1.copy_(layer.norm1.weight)
            block.shift1.copy_(layer.norm1.bias)
            block.scale2.copy_(layer.norm2.weight)
            block.shift2.copy_(layer.norm2.bias)
    return twin.eval()


class HandWrittenRMSNorm(nn.Module):
    """An RMS norm written as mean, rsqrt and product: no normalising operation, a ``Norm``
    name."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def test_normalising_operations_are_counted_whoever_calls_them() -> None:
    """A model's normalisers are the normalising operations its forward pass executes: the
    functional twin of the two-block transformer counts the seven of its module-built twin,
    which the module types alone (0) missed; a norm written out by hand still counts by its
    module; a layer run twice counts twice; a pass that fails falls back to the module types."""
    x = torch.randn(1, 8, 6)
    model = TwoBlockTransformer()
    twin = _functional_twin(model.double())
    assert normalisers(twin) == 0  # by module types alone
    assert normalisers(twin, x.double()) == normalisers(model, x.double()) == 7
    assert normalisers(nn.Sequential(nn.Linear(6, 6), HandWrittenRMSNorm()), x) == 1
    shared = nn.LayerNorm(6)
    assert normalisers(nn.Sequential(shared, nn.Softmax(-1), shared), x) == 3
    assert normalisers(nn.Sequential(nn.LayerNorm(6)), torch.randn(1, 8, 7)) == 1  # fails: types
    u = 2.0**-11
    assert accuracy_bound(torch.float16, twin, x.double()) == pytest.approx(
        (FLOOR_UNITS + 7 * NORMALISER_UNITS) * u
    )


def test_float16_lambda_max_of_a_functional_transformer_is_within_the_stated_bound() -> None:
    """The functional twin of the trained two-block transformer (seed 4), in float16 against
    float64: the operator counts its normalising operations, so its error (57u, as its
    module-built twin's) lies within the bound it states (92u), not the 8u its modules gave."""
    model, batches = _trained_transformer(4)
    twin = _functional_twin(model)
    x = batches[0][0]
    torch.testing.assert_close(twin(x), model(x), rtol=1e-10, atol=1e-10)
    wide = eigenvalues(hessian_operator(twin, batches, probe_batch=16), 1, tol=1e-8, seed=1)
    op = hessian_operator(copy.deepcopy(twin).to(torch.float16), batches, probe_batch=16)
    narrow = eigenvalues(op, 1, tol=1e-4, seed=1)
    exact = wide.eigenvalues[0]
    error = abs(narrow.eigenvalues[0] - exact) / abs(exact)
    u = 2.0**-11
    assert error > FLOOR_UNITS * u  # more than the module count's bound
    assert op.accuracy_bound == pytest.approx((FLOOR_UNITS + 7 * NORMALISER_UNITS) * u)
    assert error <= op.accuracy_bound


def test_hessian_json_states_the_bound_of_a_functional_transformer(tmp_path: Path, run_cli) -> None:
    """``curvcal hessian --dtype float16`` on the functional transformer: the record states the
    bound of its seven normalising operations (92u), not the precision floor alone (8u)."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = FunctionalTransformer().eval()
    checkpoint = tmp_path / "functional.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(checkpoint))
    generator = torch.Generator().manual_seed(1)
    data = tmp_path / "data.pt"
    torch.save(
        {"x": torch.randn(16, 8, 6, generator=generator), "y": torch.randint(0, 5, (16,))}, data
    )
    result = run_cli(
        "hessian", checkpoint, "--arch", f"py:{__name__}:FunctionalTransformer",
        "--trust-checkpoint", "--device", "cpu", "--data", data, "--dtype", "float16",
        "--top-k", "1", "--no-trace", "--json",
    )  # fmt: skip
    assert result.code == 0, result.output
    operator = json.loads(result.stdout)["results"]["operator"]
    u = 2.0**-11
    assert operator["accuracy_bound"] == pytest.approx((FLOOR_UNITS + 7 * NORMALISER_UNITS) * u)
