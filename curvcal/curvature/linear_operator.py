"""Any curvcal operator as a :class:`scipy.sparse.linalg.LinearOperator`.

scipy's solvers (``eigsh``, ``cg``, ``expm_multiply``, ...) take an object with ``shape``,
``dtype`` and products of NumPy arrays. :func:`scipy_operator` gives them one: a float64
(P, P) operator whose ``matvec`` and ``matmat`` turn the NumPy float64 input into a tensor of
the operator's dtype on its device, multiply (a block of m columns in one call of the operator's
``matmat``, so in ⌈m / probe_batch⌉ passes over the data for a Hessian), and return the
product as NumPy float64 on the host. The operator is symmetric, so the adjoint products are
the same products. Products through a float32 operator carry float32 rounding whatever the
dtype scipy sees; build the model in float64 for reference figures.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy.sparse.linalg import LinearOperator as ScipyLinearOperator
from torch import Tensor

from curvcal.curvature.operators import LinearOperator, as_operator


class _ScipyOperator(ScipyLinearOperator):
    """The float64 NumPy face of a symmetric curvcal operator."""

    def __init__(self, operator: LinearOperator) -> None:
        self.operator = operator
        size = int(operator.shape[0])
        super().__init__(dtype=np.dtype(np.float64), shape=(size, size))

    def _to_tensor(self, values: Any) -> Tensor:
        array = np.ascontiguousarray(values, dtype=np.float64)
        return torch.from_numpy(array).to(device=self.operator.device, dtype=self.operator.dtype)

    def _matvec(self, vector: Any) -> np.ndarray:
        product = self.operator.matvec(self._to_tensor(vector).reshape(-1))
        return product.detach().to(device="cpu", dtype=torch.float64).numpy()

    def _matmat(self, block: Any) -> np.ndarray:
        product = self.operator.matmat(self._to_tensor(block))
        return product.detach().to(device="cpu", dtype=torch.float64).numpy()

    # H is symmetric: H^T v = H v
    def _rmatvec(self, vector: Any) -> np.ndarray:
        return self._matvec(vector)

    def _rmatmat(self, block: Any) -> np.ndarray:
        return self._matmat(block)

    def _adjoint(self) -> _ScipyOperator:
        return self


def scipy_operator(operator: LinearOperator | Tensor) -> ScipyLinearOperator:
    """``operator`` (a Hessian operator of :func:`~curvcal.curvature.api.hessian_operator`, any
    curvcal operator, or a dense symmetric tensor) as a float64
    :class:`scipy.sparse.linalg.LinearOperator` of shape (P, P), with ``matvec``, ``matmat``
    and their adjoints (the same products: the operator is symmetric).

    Every product goes through ``operator``, so a Hessian operator's NaN guard, cache and
    counts (``total_matvecs``) hold for scipy's products too.

    >>> import torch, scipy.sparse.linalg
    >>> matrix = torch.diag(torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64))
    >>> values = scipy.sparse.linalg.eigsh(scipy_operator(matrix), k=1)[0]
    >>> round(float(values[0]), 6)
    3.0
    """
    return _ScipyOperator(as_operator(operator))
