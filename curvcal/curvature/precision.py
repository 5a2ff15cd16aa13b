"""The precision a model runs in, the precision curvature arithmetic runs in, and the floor the
first puts under the second.

A model may run in bfloat16 or float16 (``--dtype``): its parameters, activations and the
products H·v it makes are then rounded to 8 or 11 significant bits. Everything built from the
products — the Krylov basis, the Rayleigh–Ritz step, probe sums, trace and density statistics —
runs in float32 or wider (:func:`compute_dtype`): vectors are cast to the model's dtype when
they enter a product and the product is cast back.

The precision floor (:func:`precision_floor`) is the relative accuracy of one product in the
model's dtype, ``FLOOR_UNITS`` × u with u = 2^−p the unit roundoff of a p-bit significand
(bfloat16: p = 8, 8·2^−8 ≈ 3.1e-2; float16: p = 11, ≈ 3.9e-3). Measured on a small CNN and a
small transformer (tests/curvature/test_half_precision.py), whole bf16 Hessians (P products of
unit vectors) differ from the float64 Hessian of the same weights by up to 2.0 % (Frobenius),
fp16 ones by up to 0.3 %; Ritz residuals at convergence are 0.4–2.4 % (bf16) and 0.05–0.3 %
(fp16): below the floor. A stopping tolerance below the floor cannot be met by any number of
steps, so the algorithms judge convergence against max(tol, floor) instead of tol, and the
reports print no more significant digits than the floor gives (:func:`significant_digits`).
float32 and float64 models state no floor (0): their rounding (about 5e-7 relative in float32
products) is below the tolerances the rule is used with, and the rule's own ``precision`` stop
covers a tol set below it.

The floor bounds the rounding of the products for the weights the model holds. Against the
float64 model before rounding, the weights' own rounding adds to it, and where the softmax
saturates (large logits z) rounding δz ≈ u·|z| moves the curvature ∝ e^{−margin} by about
u·|z| relatively: measured 3.3 % on a bf16 linear model with max |z| ≈ 47; the bound
floor × max(1, max |z|) holds there. Normalising layers (LayerNorm, BatchNorm, attention's
softmax) amplify both: the values a report states are stated within :func:`accuracy_bound`
(the floor plus :data:`NORMALISER_UNITS` u per normalising layer, measured on MLPs, CNNs and
transformers), and the digits printed follow it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

#: dtypes a model may run in whose products are widened for the algorithms
HALF_DTYPES = (torch.bfloat16, torch.float16)
#: the floor in units of the unit roundoff: the rounding of a product accumulates over a few
#: layers of operations (measured error up to 5 u on the test models)
FLOOR_UNITS = 8


def compute_dtype(model_dtype: torch.dtype) -> torch.dtype:
    """The dtype vectors, sums and statistics are kept in for a model in ``model_dtype``:
    float32 for bfloat16 and float16, the model's own dtype otherwise."""
    return torch.float32 if model_dtype in HALF_DTYPES else model_dtype


def is_half(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` is a 16-bit floating-point dtype."""
    return dtype in HALF_DTYPES


def precision_floor(model_dtype: torch.dtype) -> float:
    """The relative accuracy of one product made by a model in ``model_dtype`` when it is
    bfloat16 or float16: :data:`FLOOR_UNITS` · 2^−p, p the bits of its significand (the implicit
    one included); 0 (no floor stated) for other dtypes."""
    if not is_half(model_dtype):
        return 0.0
    # machine epsilon is 2^−(p−1), twice the unit roundoff
    return FLOOR_UNITS * torch.finfo(model_dtype).eps / 2


#: the accuracy bound's units of u per normalising layer (a LayerNorm, BatchNorm, GroupNorm or
#: RMSNorm; an attention's softmax): each is rounded in the forward pass, the backward pass and
#: the two passes of a Hessian-vector product, and amplified by its conditioning (a
#: normalisation divides by a standard deviation, a softmax by a sum of exponentials); the
#: rounding of the weights around it moves the curvature too. Measured (float16, briefly
#: trained models, benchmarks/bench_half_accuracy.py): up to 8.2u per normalising layer above
#: the floor (an MLP with two LayerNorms, 24.3u), 7.1u (a two-block transformer, 57.4u); 12
#: leaves a margin of 1.3× or more over every case measured
NORMALISER_UNITS = 12

#: module types counted as normalising layers by :func:`normalisers`
_NORMALISING = (
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    nn.MultiheadAttention,
    nn.Softmax,
)

#: names of the torch functions counted as normalising operations by :func:`normalisers`: the
#: functional normalisations and softmax (``torch``, ``torch.nn.functional`` and ``Tensor``
#: spellings share these names), attention (the fused kernel and a whole multi-head attention,
#: each of whose calls holds one softmax)
NORMALISING_OPS = frozenset(
    {
        "softmax",
        "_softmax",
        "softmin",
        "layer_norm",
        "native_layer_norm",
        "batch_norm",
        "native_batch_norm",
        "instance_norm",
        "group_norm",
        "native_group_norm",
        "rms_norm",
        "_fused_rms_norm",
        "local_response_norm",
        "scaled_dot_product_attention",
        "multi_head_attention_forward",
        "_native_multi_head_attention",
    }
)


def _normalising_module(module: nn.Module) -> bool:
    """Whether ``module`` is a normalising layer by its type: a torch normalisation or attention
    type (:data:`_NORMALISING`, ``nn.RMSNorm`` included), or a module of another library whose
    class name ends in ``Norm``, or in ``Attention`` with no ``Attention`` inside it (the
    innermost attention of a transformers model, so that a block is counted once)."""

    def named(candidate: nn.Module, suffix: str) -> bool:
        return type(candidate).__name__.endswith(suffix)

    if isinstance(module, _NORMALISING) or named(module, "Norm"):
        return True
    inner = list(module.modules())[1:]
    return named(module, "Attention") and not any(named(m, "Attention") for m in inner)


class _NormalisingCount(TorchFunctionMode):
    """Counts the calls of :data:`NORMALISING_OPS` made while it is active. A handler runs with
    the mode off, so a normalising function that calls others (``F.softmax`` calling
    ``Tensor.softmax``, a multi-head attention calling its softmax) counts once."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if getattr(func, "__name__", None) in NORMALISING_OPS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _traced_normalisers(model: nn.Module, sample: Any) -> int:
    """The normalising operations one forward pass of ``model`` on ``sample`` executes, plus the
    normalising modules (:func:`_normalising_module`) that ran without executing one (a norm
    written as mean, rsqrt and product). Runs with gradients off; the caller sets the mode and
    restores any buffer a train-mode pass updates."""
    counter = _NormalisingCount()
    silent = 0
    entered: list[int] = []

    def before(module: nn.Module, inputs: Any) -> None:
        entered.append(counter.count + silent)

    def after(module: nn.Module, inputs: Any, output: Any) -> None:
        nonlocal silent
        if counter.count + silent == entered.pop():
            silent += 1

    handles = []
    for module in model.modules():
        if _normalising_module(module):
            handles.append(module.register_forward_pre_hook(before))
            handles.append(module.register_forward_hook(after))
    try:
        with torch.no_grad(), counter:
            model(sample)
    finally:
        for handle in handles:
            handle.remove()
    return counter.count + silent


def normalisers(model: nn.Module, sample: Any = None) -> int:
    """The normalising layers of ``model``.

    With ``sample`` (inputs the model takes, one sample is enough): the normalising operations
    one forward pass executes — softmax, layer/batch/instance/group/RMS normalisation, scaled
    dot-product and multi-head attention (:data:`NORMALISING_OPS`), whether called by a torch
    module or directly from a model's own code — plus the normalising modules
    (:func:`_normalising_module`) that ran without executing one of them (a norm written out as
    mean, rsqrt and product). A layer run twice counts twice: each run rounds.

    Without ``sample``, or when that pass fails: the modules of the normalising types, which
    miss normalisations a model calls as functions."""
    if sample is not None:
        try:
            return _traced_normalisers(model, sample)
        except Exception:  # any failure of the pass: the module types below
            pass
    return sum(_normalising_module(module) for module in model.modules())


def accuracy_bound(
    model_dtype: torch.dtype, model: nn.Module | None = None, sample: Any = None
) -> float:
    """The relative accuracy of a curvature value of a model in bfloat16 or float16 against the
    same model in float64 (before its weights were rounded): u · (:data:`FLOOR_UNITS` +
    :data:`NORMALISER_UNITS` · n), n its :func:`normalisers` (those a forward pass on ``sample``
    executes, when given), u = 2^−p; 0 for other dtypes.

    A product's own rounding is the precision floor (8u). A normalising layer adds rounding in
    each pass a product makes through it, amplified by its conditioning, and so does the
    rounding of its weights, which moves the curvature itself. Measured λmax against float64
    in float16 (benchmarks/bench_half_accuracy.py, six seeds, two brief trainings): MLP ≤ 3.5u,
    CNN ≤ 5.1u (no normaliser: bound 8u), MLP with two LayerNorms ≤ 24.3u (bound 32u), one-block
    transformer ≤ 23.8u (four: 56u), two-block transformer ≤ 57.4u (seven: 92u), where the
    precision floor alone (8u) did not bound the last three. Printed digits follow this bound
    (:func:`significant_digits`)."""
    if not is_half(model_dtype):
        return 0.0
    units = FLOOR_UNITS + (
        NORMALISER_UNITS * normalisers(model, sample) if model is not None else 0
    )
    return units * torch.finfo(model_dtype).eps / 2


def significant_digits(floor: float, most: int = 6) -> int:
    """Decimal significant digits a number of relative accuracy ``floor`` carries:
    ⌊−log10(floor)⌋ + 1, at least 1 and at most ``most`` (the precision floors: bfloat16 2,
    float16 3; an accuracy bound of a few percent: 1 or 2)."""
    if floor <= 0.0:
        return most
    return max(1, min(most, math.floor(-math.log10(floor)) + 1))


#: a half-precision rounding allowance in precision floors: room for the rounding of two
#: gradients of a few passes each, far below the O(1) change a missed use of a parameter makes
HALF_ALLOWANCE_FLOORS = 4


def rounding_share(dtype: torch.dtype, ulps: float) -> float:
    """The relative rounding allowed between two computations in ``dtype``: ``ulps`` · ε, and
    for bfloat16 and float16 at most :data:`HALF_ALLOWANCE_FLOORS` precision floors (1024 ε is
    800 % in bfloat16: it would allow any difference)."""
    share = ulps * torch.finfo(dtype).eps
    if is_half(dtype):
        share = min(share, HALF_ALLOWANCE_FLOORS * precision_floor(dtype))
    return share


def effective_tol(tol: float, floor: float) -> float:
    """The tolerance a stopping rule can meet with products of relative accuracy ``floor``:
    max(tol, floor)."""
    return max(tol, floor)


def float64_advice(dtype: torch.dtype | str, words: str) -> str:
    """``words`` (advice to run in float64, e.g. ``", or compute in float64"``) where ``dtype``
    (a torch dtype or its name, ``"float32"``) is not float64 already, else ``""``: advice
    never names what is already in use."""
    name = str(dtype).removeprefix("torch.")
    return "" if name == "float64" else words
