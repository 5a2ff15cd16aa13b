"""``curvcal landscape``: checkpoint and data in, the loss (accuracy, ECE) along directions out.

Through the run session: load the model, check it takes the data, find the top Hessian
eigenvectors (:meth:`~curvcal.pipeline.session.Session.hessian`, no trace) or draw random
filter-normalised directions, and measure the model moved along them on a grid
(:func:`curvcal.curvature.landscape.loss_landscape`); the model is left as it was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal.errors import InputError
from curvcal.results import Report
from curvcal.settings.fields import groups

if TYPE_CHECKING:
    from curvcal.console import Reporter
    from curvcal.curvature.landscape import LandscapeAnalysis
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings
    from curvcal.settings.landscape import LandscapeSettings


@dataclass(frozen=True)
class LandscapeRun:
    """A finished run: the ``analysis``, its ``report`` and the ``device`` it ran on."""

    analysis: LandscapeAnalysis
    report: Report
    device: str


def run_landscape(
    checkpoint: Path,
    checkpoint_options: CheckpointSettings,
    data_options: DataSettings,
    settings: LandscapeSettings,
    reporter: Reporter,
) -> LandscapeRun:
    """Measure ``checkpoint``'s loss, accuracy and ECE over the data along ``settings.dims``
    directions of ``settings.directions``, at ``settings.alphas`` on each axis."""
    import torch

    from curvcal.calibration.metrics import expected_calibration_error
    from curvcal.curvature.landscape import (
        LandscapeAnalysis,
        filter_normalised_direction,
        loss_landscape,
    )
    from curvcal.losses import loss_from_name
    from curvcal.pipeline.provenance import environment
    from curvcal.pipeline.session import open_session, resolve_loss

    began = time.perf_counter()
    with open_session(checkpoint_options, reporter, (data_options, settings)) as session:
        if session.context.active:
            raise InputError("torchrun", "landscape runs in one process", "run it without torchrun")
        loaded = session.model(checkpoint)
        eigenvalues: tuple[float, ...] | None = None
        directions: list[Any] = []
        notes: list[str] = []
        if settings.directions == "eigenvectors":
            resolved = session.hessian_settings(loaded, settings.hessian())
            hessian_settings = resolved.settings
            data = session.dataset(loaded, data_options)
            curvature = session.hessian(
                loaded,
                data,
                resolved,
                data_options.batch_size,
                on_vectors=lambda top: directions.extend(top.by_name()),
            )
            eigenvalues = curvature.analysis.spectrum.eigenvalues
            notes = curvature.notes + curvature.messages
            for message in curvature.messages:
                reporter.warn(message)
        else:
            hessian_settings = resolve_loss(loaded, settings.hessian())
            data = session.dataset(loaded, data_options)
            generator = torch.Generator().manual_seed(settings.seed)
            directions = [
                filter_normalised_direction(loaded.module, generator) for _ in range(settings.dims)
            ]
        loss = loss_from_name(hessian_settings.loss, hessian_settings.focal_gamma)
        measuring = time.perf_counter()
        points = len(settings.alphas) ** settings.dims
        with reporter.progress("landscape points", points) as advance:
            landscape = loss_landscape(
                loaded.module,
                session.batches(data, data_options.batch_size),
                loss.sum,
                directions,
                settings.alphas,
                settings.alphas if settings.dims == 2 else (),
                ece=lambda logits, labels: expected_calibration_error(
                    logits, labels, "logits", settings.bins
                ),
                kind=settings.directions,
                on_point=advance,
            )
        seconds = time.perf_counter() - measuring
    analysis = LandscapeAnalysis(
        landscape=landscape,
        loss=loss.name,
        n_parameters=sum(int(t.numel()) for t in directions[0].values()),
        eigenvalues=eigenvalues,
    )
    report = Report(
        command="landscape",
        results=analysis,
        inputs={"checkpoint": loaded.describe(), "data": data.describe()},
        settings=groups(
            checkpoint_options.replace(device=str(session.device)), data_options, settings
        ),
        timings={
            "load": session.timings["load"],
            "landscape": seconds,
            "total": time.perf_counter() - began,
        },
        environment=environment(loaded.device),
        warnings=session.warnings + notes,
    )
    return LandscapeRun(analysis, report, str(loaded.device))
