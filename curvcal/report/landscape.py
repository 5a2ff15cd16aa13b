"""The tables and plot of a loss landscape (``curvcal landscape``), and the eigenvector file of
``curvcal hessian --save-eigenvectors``."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal.report.tables import Table, fmt_float

if TYPE_CHECKING:
    import torch
    from matplotlib.figure import Figure

    from curvcal.curvature.eigenvectors import TopEigenvectors
    from curvcal.curvature.landscape import LandscapeAnalysis


def landscape_tables(analysis: LandscapeAnalysis, caption: str | None = None) -> list[Table]:
    """One row per grid point (α, and β on a grid) with loss, accuracy and ECE, and what the
    directions were; titled with ``caption`` (checkpoint and data) when given."""
    landscape = analysis.landscape
    two = bool(landscape.betas)
    columns = ("α", "β", "loss", "accuracy", "ECE") if two else ("α", "loss", "accuracy", "ECE")
    rows = tuple(
        (
            fmt_float(point.alpha),
            *((fmt_float(point.beta),) if two else ()),
            fmt_float(point.loss, 6),
            fmt_float(point.accuracy),
            fmt_float(point.ece),
        )
        for point in landscape.points
    )
    if landscape.directions == "eigenvectors":
        values = ", ".join(fmt_float(v, 6) for v in analysis.eigenvalues or ())
        what = f"top Hessian eigenvectors (unit norm; λ = {values})"
    else:
        what = "random filter-normalised directions (Li et al. 2018)"
    text = (
        f"{analysis.loss} loss over N = {landscape.n_samples} at θ + α·d1"
        f"{' + β·d2' if two else ''}; d: {what}; {analysis.n_parameters} parameter values moved"
    )
    title = "Loss landscape" + (f" of {caption}" if caption else "")
    return [Table(title, columns, rows, text)]


def landscape_plot(analysis: LandscapeAnalysis, path: Path, caption: str | None = None) -> Figure:
    """The loss along one direction (a curve, with accuracy and ECE on a second panel) or over
    two (filled contours of the loss, the starting point marked); ``caption`` (checkpoint and
    data) above."""
    from curvcal.report.style import drawing, file_format, save

    landscape = analysis.landscape
    fmt = file_format(path)
    kind = "eigenvector" if landscape.directions == "eigenvectors" else "random direction"
    with drawing() as new_figure:
        if not landscape.betas:
            figure = new_figure(8.0, 3.2)
            loss_axes, rate_axes = figure.subplots(1, 2)
            alphas = list(landscape.alphas)
            loss_axes.plot(alphas, landscape.grid("loss")[0], "o-", markersize=3)
            loss_axes.set(xlabel=f"α ({kind} 1)", ylabel=f"{analysis.loss} loss", title="loss")
            rate_axes.plot(
                alphas, landscape.grid("accuracy")[0], "o-", markersize=3, label="accuracy"
            )
            rate_axes.plot(alphas, landscape.grid("ece")[0], "s-", markersize=3, label="ECE")
            rate_axes.set(xlabel=f"α ({kind} 1)", ylim=(0.0, 1.0), title="accuracy and ECE")
            rate_axes.legend()
        else:
            figure = new_figure(4.8, 4.0)
            axes = figure.subplots()
            filled = axes.contourf(
                list(landscape.alphas), list(landscape.betas), landscape.grid("loss"), levels=20
            )
            axes.contour(
                list(landscape.alphas),
                list(landscape.betas),
                landscape.grid("loss"),
                levels=20,
                colors="k",
                linewidths=0.4,
            )
            axes.plot([0.0], [0.0], "w*", markersize=10)
            figure.colorbar(filled, ax=axes, label=f"{analysis.loss} loss")
            axes.set(xlabel=f"α ({kind} 1)", ylabel=f"β ({kind} 2)", title="loss landscape")
        if caption:
            figure.suptitle(caption)
        save(figure, path, fmt)
    return figure


def write_eigenvectors(
    path: Path,
    top: TopEigenvectors,
    checkpoint: Mapping[str, Any],
    is_main: bool = True,
) -> None:
    """Write the top eigenvectors as a safetensors file, atomically, on the first rank
    (``is_main``): tensor ``v{i}/{parameter name}`` holds eigenvector i (0 for λmax)
    restricted to that parameter, in the parameter's shape (the concatenation over parameters
    has unit norm). Metadata (strings, as safetensors requires): ``eigenvalues`` (a JSON
    list, largest first), ``checkpoint_sha256``, ``checkpoint`` (its path), ``parameters`` (a
    JSON list of the names, in order).

    Streamed a parameter at a time (:meth:`TopEigenvectors.per_parameter`): on a sharded model
    the first rank gathers one parameter's k columns at a time and writes them, so no rank
    holds a whole eigenvector. Every rank must call this (the gathers are collective); the
    others take part and write nothing. The file takes its name when the eigenvalue stage
    ends; a run that then fails puts back the file it replaced (:mod:`curvcal.atomic`), as
    for every output."""
    from curvcal.atomic import atomic_output
    from curvcal.report.tensor_stream import write_stream

    k = len(top.values)
    entries = [
        (f"v{index}/{name}", top.block.dtype, tuple(shape))
        for name, shape in zip(top.names, top.shapes, strict=True)
        for index in range(k)
    ]
    metadata = {
        "format": "curvcal-eigenvectors",
        "eigenvalues": json.dumps([float(v) for v in top.values]),
        "checkpoint_sha256": str(checkpoint.get("sha256", "")),
        "checkpoint": str(checkpoint.get("path", "")),
        "parameters": json.dumps(list(top.names)),
    }
    parts = top.per_parameter()
    if not is_main:
        for _ in parts:  # take part in every gather
            pass
        return

    def tensors() -> Iterator[torch.Tensor]:
        for _, part in parts:
            assert part is not None
            yield from part

    try:
        with atomic_output(path) as out:
            write_stream(out, entries, metadata, tensors())
    finally:
        for _ in parts:  # the other ranks wait in the gathers of what is left
            pass


def eigenvector_path(path: Path, force: bool) -> None:
    """Refuse, before any work, a ``--save-eigenvectors`` file that is not ``.safetensors``, or
    that exists without ``--force``."""
    from curvcal.errors import InputError
    from curvcal.report.tables import check_output_path

    if path.suffix.lower() != ".safetensors":
        raise InputError(
            "--save-eigenvectors", f"{path} is not a .safetensors file", "name a .safetensors file"
        )
    check_output_path(path, force)
