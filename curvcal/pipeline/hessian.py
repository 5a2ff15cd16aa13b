"""``curvcal hessian``: checkpoint and data in, the Hessian analysis and its report out.

Load the model on the run's device, check it takes the data, shard the data under torchrun
(products are summed across ranks), run
:func:`~curvcal.curvature.analysis.analyse_hessian_with_messages` with a progress count of
Hessian-vector products, and build the report's envelope.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal.errors import EXIT_INTERRUPTED, EXIT_NUMERICAL, EXIT_OK, NumericalError
from curvcal.results import STATUS_ERROR, STATUS_INTERRUPTED, STATUS_OK, Report
from curvcal.settings.fields import groups
from curvcal.settings.hessian import HessianSettings

if TYPE_CHECKING:
    from collections.abc import Callable

    from curvcal.console import Reporter
    from curvcal.curvature.eigenvectors import TopEigenvectors
    from curvcal.curvature.results import HessianAnalysis
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings


@dataclass(frozen=True)
class HessianRun:
    """A finished run: the ``analysis``, its ``report``, the ``device`` it ran on, whether this
    process is rank 0 (the only one that writes), and the ``failure`` to raise once the report
    is out (``--strict`` and an estimate that did not converge)."""

    analysis: HessianAnalysis
    report: Report
    device: str
    is_main: bool
    failure: NumericalError | None

    @property
    def exit_code(self) -> int:
        if self.report.status == STATUS_INTERRUPTED:
            return EXIT_INTERRUPTED
        return EXIT_NUMERICAL if self.report.status == STATUS_ERROR else EXIT_OK


def _kept_after_interrupt(analysis: HessianAnalysis, stage: str, top_k: int) -> str:
    """What an interrupted run keeps, in words: the stage Ctrl-C stopped and what of it and
    before it the results hold (only values that converged, only modules finished)."""
    said = f"interrupted (Ctrl-C) in the {stage} stage: "
    values = analysis.spectrum.values
    if analysis.spectrum.stopped_by == "interrupted":
        shown = ", ".join(f"λ{i + 1} = {r.value:.6g}" for i, r in enumerate(values))
        return (
            said + f"the results hold the {len(values)} of {top_k} eigenvalues that converged "
            f"({shown}) and no later stage"
        )
    if stage == "layers":
        done = len(analysis.layers or [])
        return (
            said + f"the results hold the stages finished before it and the {done} modules "
            "whose per-layer curvature was finished"
        )
    return said + "the results hold the stages finished before it"


def _strict_hint(analysis: HessianAnalysis) -> str:
    """What to change, from the limits that stopped the unconverged estimates (float64 is
    suggested only to a run not already in it)."""
    from curvcal.curvature.precision import float64_advice

    stops = {analysis.spectrum.stopped_by}
    if analysis.smallest is not None:
        stops.add(analysis.smallest.stopped_by)
    if "precision" in stops:
        wider = float64_advice(
            str(analysis.operator.get("model_dtype", "")), " use --dtype float64,"
        )
        return f"the products' rounding floors the residual: loosen --tol,{wider} or drop --strict"
    return "raise --max-iter (or --probes), loosen --tol/--trace-rtol, or drop --strict"


def run_hessian(
    checkpoint: Path,
    checkpoint_options: CheckpointSettings,
    data_options: DataSettings,
    settings: HessianSettings,
    reporter: Reporter,
    save_vectors: Callable[[TopEigenvectors, dict[str, Any], bool], None] | None = None,
) -> HessianRun:
    """Measure the Hessian of ``checkpoint``'s mean loss over the data as ``settings`` ask;
    under torchrun every rank runs this on its shard. ``save_vectors`` (the command's
    writer, e.g. :func:`~curvcal.report.landscape.write_eigenvectors`) receives the top-k
    eigenvectors once the eigenvalue stage ends, with the checkpoint's description and
    whether this is rank 0, on every rank, while the ranks can still gather (it streams them a
    parameter at a time, so a sharded model's ranks never hold a whole vector)."""
    from curvcal.pipeline.provenance import environment
    from curvcal.pipeline.session import open_session

    began = time.perf_counter()
    with open_session(checkpoint_options, reporter, (data_options, settings)) as session:
        loaded = session.model(checkpoint)
        described = loaded.describe()
        resolved = session.hessian_settings(loaded, settings)
        data = session.dataset(loaded, data_options)
        on_vectors = None
        if save_vectors is not None:
            save, is_main = save_vectors, session.is_main

            def on_vectors(top: TopEigenvectors) -> None:
                save(top, described, is_main)

        curvature = session.hessian(
            loaded,
            data,
            resolved,
            data_options.batch_size,
            keep_stages=True,
            on_vectors=on_vectors,
        )
    analysis, messages = curvature.analysis, curvature.messages
    failed = analysis.unconverged
    status = STATUS_ERROR if (settings.strict and failed) else STATUS_OK
    stopped = []
    if curvature.interrupted is not None:
        status = STATUS_INTERRUPTED
        stopped = [_kept_after_interrupt(analysis, curvature.interrupted, settings.top_k)]
        if session.is_main:  # said before the table, which shows only what was kept
            session.reporter.warn(stopped[0])
    failure = None
    if status == STATUS_ERROR:
        failure = NumericalError(
            "--strict", f"{', '.join(failed)} did not converge", _strict_hint(analysis)
        )
    if session.is_main and not settings.strict:
        for message in messages:
            session.reporter.warn(message)
    report = Report(
        command="hessian",
        results=analysis,
        status=status,
        inputs={"checkpoint": described, "data": data.describe()},
        settings=groups(
            checkpoint_options.replace(device=str(session.device)), data_options, settings
        ),
        timings={
            "load": session.timings["load"],
            **analysis.timings,
            "total": time.perf_counter() - began,
        },
        environment=environment(loaded.device),
        warnings=session.warnings + curvature.notes + messages + stopped,
    )
    return HessianRun(analysis, report, str(loaded.device), session.is_main, failure)
