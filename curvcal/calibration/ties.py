"""Tie groups of sorted confidences: values equal up to float64 rounding form one group.

Confidences that are equal in exact arithmetic often differ in their last bits: a softmax
sums each row in some order, so rows whose logits are permutations of one another, or rows a
piecewise-constant calibration map sends to the same value and that are then handled with
their other entries, give confidences a few units of rounding apart, and which rows come out
larger depends on the device and on the last bits of the inputs. A metric that treats only
exactly equal values as tied would split such a group by rounding noise.

Rule: sort the values ascending, c_1 ≤ … ≤ c_N. Position i > 1 starts a new group unless

    c_i − c_{i−1} ≤ TIE_RELATIVE · max(|c_{i−1}|, |c_i|),   TIE_RELATIVE = 16·2⁻⁵³ ≈ 1.8e-15,

applied sequentially along the sorted values, so the groups are well defined (a chain of
values each within the bound of the next is one group). Exactly equal values are always one
group; values further apart than the bound at every step are never joined. The bound is 16
units of float64 rounding (u = 2⁻⁵³): confidences of rows whose logits are permutations of one
another spread over at most about 10 u (measured for K = 10 to 50 000 classes), and float32
scores converted to float64 are at least 2²⁹ u apart when they differ.
"""

from __future__ import annotations

import torch

#: Units of float64 rounding (2⁻⁵³, relative) within which sorted neighbours are tied.
TIE_ULPS = 16
#: The relative bound of the rule in the module docstring.
TIE_RELATIVE = TIE_ULPS * 2.0**-53


def group_starts(ascending: torch.Tensor) -> torch.Tensor:
    """Boolean mask over 1-D ascending values: True where a tie group starts (position 0
    always; none for an empty input)."""
    starts = torch.ones(ascending.shape[0], dtype=torch.bool)
    if ascending.shape[0] > 1:
        values = ascending.to(torch.float64)
        previous, current = values[:-1], values[1:]
        scale = torch.maximum(previous.abs(), current.abs())
        starts[1:] = (current - previous) > TIE_RELATIVE * scale
    return starts


def group_sizes(ascending: torch.Tensor) -> torch.Tensor:
    """The size of each tie group of 1-D ascending values, in order (int64; sums to N)."""
    if ascending.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int64)
    starts = group_starts(ascending).nonzero()[:, 0]
    ends = torch.cat((starts[1:], starts.new_tensor([ascending.shape[0]])))
    return ends - starts
