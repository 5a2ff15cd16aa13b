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

import torch
from torch import nn

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


def normalisers(model: nn.Module) -> int:
    """The normalising layers of ``model``: modules of the torch normalisation and attention
    types (:data:`_NORMALISING`, ``nn.RMSNorm`` included), and modules of other libraries whose
    class name ends in ``Norm`` or in ``Attention`` without an ``Attention`` inside them (the
    innermost attention of a transformers model, so that a block is counted once)."""

    def named(module: nn.Module, suffix: str) -> bool:
        return type(module).__name__.endswith(suffix)

    def innermost_attention(module: nn.Module) -> bool:
        inner = list(module.modules())[1:]
        return named(module, "Attention") and not any(named(m, "Attention") for m in inner)

    return sum(
        isinstance(module, _NORMALISING) or named(module, "Norm") or innermost_attention(module)
        for module in model.modules()
    )


def accuracy_bound(model_dtype: torch.dtype, model: nn.Module | None = None) -> float:
    """The relative accuracy of a curvature value of a model in bfloat16 or float16 against the
    same model in float64 (before its weights were rounded): u · (:data:`FLOOR_UNITS` +
    :data:`NORMALISER_UNITS` · n), n its :func:`normalisers`, u = 2^−p; 0 for other dtypes.

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
    units = FLOOR_UNITS + (NORMALISER_UNITS * normalisers(model) if model is not None else 0)
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
