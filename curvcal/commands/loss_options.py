"""The ``--loss``/``--gamma`` checks shared by ``curvcal hessian`` and ``curvcal study``."""

from __future__ import annotations

from curvcal.errors import InputError


def check_loss_options(loss: str, gamma: float | None) -> None:
    """``--loss``/``--gamma`` combinations that make sense (shared by hessian and study)."""
    if loss == "own" and gamma is not None:
        raise InputError(
            "--gamma", "cannot be combined with --loss own, which reads γ from the checkpoint"
        )
    if loss == "focal" and gamma is None:
        raise InputError("--loss focal", "needs --gamma γ (γ = 0 is cross-entropy)")
    if loss == "ce" and gamma not in (None, 0.0):
        raise InputError("--gamma", f"{gamma} is only used by --loss focal")
