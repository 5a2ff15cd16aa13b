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
floor × max(1, max |z|) holds there.
"""

from __future__ import annotations

import math

import torch

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


def significant_digits(floor: float, most: int = 6) -> int:
    """Decimal significant digits a number of relative accuracy ``floor`` carries:
    ⌊−log10(floor)⌋ + 1, at least 2 and at most ``most`` (bfloat16: 2, float16: 3)."""
    if floor <= 0.0:
        return most
    return max(2, min(most, math.floor(-math.log10(floor)) + 1))


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
