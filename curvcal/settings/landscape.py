"""The settings of ``curvcal landscape``: the loss (and accuracy, ECE) along the top Hessian
eigenvectors or random filter-normalised directions, declared once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from curvcal.settings.fields import Settings, file_setting, setting
from curvcal.settings.hessian import DEFAULT_TOL, LOSSES, MAX_SEED, HessianSettings

#: The kinds of direction: the top Hessian eigenvectors (unit norm over the parameters the
#: Hessian covers), or Gaussian draws normalised filter by filter (Li et al. 2018).
DIRECTIONS = ("eigenvectors", "random")


@dataclass(frozen=True)
class LandscapeSettings(Settings):
    """``directions``/``dims``: one or two directions of a kind; ``steps`` points per axis,
    evenly spaced over [−radius, radius]; ``loss``/``gamma``: the loss measured (and whose
    Hessian gives the eigenvectors); ``seed``: the random directions' draws and the eigenvector
    search's start; ``tol``: the eigenvector search's stopping tolerance; ``bins``: equal-width
    bins of the ECE; ``plot``: the 1-D curve or 2-D contour."""

    GROUP: ClassVar[str] = "landscape"

    directions: str = setting(
        "eigenvectors",
        "eigenvectors: the top Hessian eigenvectors of the loss (unit norm); random: Gaussian "
        "directions scaled filter by filter to the weights (Li et al. 2018; biases and "
        "normalisation scales not moved).",
        choices=DIRECTIONS,
    )
    dims: int = setting(1, "One direction (a curve) or two (a grid).", low=1, high=2)
    steps: int = setting(
        21, "Points per axis, evenly spaced over [-radius, radius].", low=2, high=1001
    )
    radius: float = setting(
        0.5, "Largest step along each direction (the grid spans ±radius).", low=0, low_open=True
    )
    loss: str = setting(
        "ce",
        "ce, focal (with --gamma), flsd53, or own: the loss recorded in the checkpoint's metadata.",
        choices=LOSSES,
    )
    gamma: float | None = setting(None, "γ of the focal loss.", low=0)
    seed: int = setting(
        0,
        "Seed of the random directions and of the eigenvector search's start vectors.",
        low=-MAX_SEED - 1,
        high=MAX_SEED,
    )
    tol: float = setting(
        DEFAULT_TOL,
        "Stop the eigenvector search when each eigenvalue's relative residual and change are "
        "below this.",
        low=0,
        low_open=True,
    )
    bins: int = setting(15, "Equal-width bins of the ECE.", low=1)
    plot: Path | None = file_setting(
        "Write the curve (one direction) or contour (two) of the loss to a .png, .svg or .pdf "
        "file (needs matplotlib).",
    )

    def validate(self) -> None:
        """The loss and γ as ``hessian`` checks them (the same errors)."""
        self.hessian()

    def hessian(self) -> HessianSettings:
        """The Hessian settings whose top ``dims`` eigenvectors are the directions: this loss,
        seed and tolerance, no trace."""
        return HessianSettings(
            top_k=self.dims, trace=False, loss=self.loss, gamma=self.gamma, seed=self.seed,
            tol=self.tol,
        )  # fmt: skip

    @property
    def alphas(self) -> tuple[float, ...]:
        """The steps along each axis: ``steps`` points from −radius to radius."""
        last = self.steps - 1
        return tuple(self.radius * (2.0 * i / last - 1.0) for i in range(self.steps))
