"""``curvcal hessian``: checkpoint and data in, the Hessian analysis and its report out.

Load the model on the run's device, check it takes the data, shard the data under torchrun
(products are summed across ranks), run
:func:`~curvcal.curvature.analysis.analyse_hessian_with_messages` with a progress count of
Hessian-vector products, and build the report's envelope.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal.errors import EXIT_NUMERICAL, EXIT_OK, InputError, NumericalError
from curvcal.results import STATUS_ERROR, STATUS_OK, Report
from curvcal.settings.fields import record
from curvcal.settings.hessian import HessianSettings

if TYPE_CHECKING:
    import torch

    from curvcal.console import Reporter
    from curvcal.curvature.results import HessianAnalysis
    from curvcal.load.checkpoint import CheckpointOptions, LoadedModel
    from curvcal.load.data import DataOptions
    from curvcal.rows import Inputs


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
        return EXIT_NUMERICAL if self.report.status == STATUS_ERROR else EXIT_OK


def _strict_hint(analysis: HessianAnalysis) -> str:
    """What to change, from the limits that stopped the unconverged estimates."""
    stops = {analysis.spectrum.stopped_by}
    if analysis.smallest is not None:
        stops.add(analysis.smallest.stopped_by)
    if "precision" in stops:
        return "the products' rounding floors the residual: loosen --tol, use --dtype float64, or drop --strict"
    return "raise --max-iter (or --probes), loosen --tol/--trace-rtol, or drop --strict"


def run_hessian(
    checkpoint: Path,
    checkpoint_options: CheckpointOptions,
    data_options: DataOptions,
    batch_size: int,
    settings: HessianSettings,
    reporter: Reporter,
) -> HessianRun:
    """Measure the Hessian of ``checkpoint``'s mean loss over the data as ``settings`` ask;
    under torchrun every rank runs this on its shard."""
    from curvcal.console import Reporter
    from curvcal.load.checkpoint import load_model
    from curvcal.load.data import iter_batches, load_dataset
    from curvcal.load.text import text_model_of
    from curvcal.pipeline.fitness import check_fitness, say_preprocessing
    from curvcal.pipeline.runtime import distributed_run, shard
    from curvcal.provenance import environment

    began = time.perf_counter()
    asked = settings
    with distributed_run(checkpoint_options.device) as (device, context):
        if not context.is_main:  # rank 0 speaks for the run
            reporter = Reporter(quiet=True)
        checkpoint_options = dataclasses.replace(checkpoint_options, device=str(device))
        loaded = load_model(checkpoint, checkpoint_options)
        settings = resolve_loss(loaded, settings)
        params, params_choice, say_choice = default_params(loaded, settings.params)
        settings = dataclasses.replace(settings, params=params)
        _check_parameters(loaded, settings)
        data = load_dataset(
            dataclasses.replace(data_options, trust=checkpoint_options.trust),
            loaded.preprocessing,
            text_model_of(loaded),
        )
        check_fitness(loaded, data, "--data")
        data_warnings: list[str] = []
        if context.is_main:
            say_preprocessing(data, reporter, data_warnings)
        if say_choice and params:  # once the inputs are known good: an error stays one line
            reporter.warn(f"Hessian over {params_choice}")
        indices = shard(data, context)
        loaded_seconds = time.perf_counter() - began

        def batches() -> Iterator[tuple[Inputs, torch.Tensor]]:
            return iter_batches(data.dataset, batch_size, indices)

        analysis, notes, messages = _measure(
            loaded, batches, settings, reporter, distributed=context.active, speak=context.is_main
        )
    analysis = dataclasses.replace(
        analysis,
        operator={
            **analysis.operator,
            "world_size": context.world_size,
            # recorded where the choice is not the plain "every parameter" or --params
            **({"params_choice": params_choice} if say_choice else {}),
        },
    )
    failed = analysis.unconverged
    status = STATUS_ERROR if (settings.strict and failed) else STATUS_OK
    failure = None
    if status == STATUS_ERROR:
        failure = NumericalError(
            "--strict", f"{', '.join(failed)} did not converge", _strict_hint(analysis)
        )
    if context.is_main and not settings.strict:
        for message in messages:
            reporter.warn(message)
    report = Report(
        command="hessian",
        results=analysis,
        status=status,
        inputs={"checkpoint": loaded.describe(), "data": data.describe()},
        settings={
            "checkpoint": checkpoint_record(checkpoint_options),
            "data": data_record(data_options, batch_size),
            HessianSettings.GROUP: record(asked),
        },
        timings={
            "load": loaded_seconds,
            **analysis.timings,
            "total": time.perf_counter() - began,
        },
        environment=environment(loaded.device),
        warnings=data_warnings + notes + messages,
    )
    return HessianRun(analysis, report, str(loaded.device), context.is_main, failure)


def resolve_loss(loaded: LoadedModel, settings: HessianSettings) -> HessianSettings:
    """``settings`` with ``--loss own`` replaced by the loss ``loaded`` records in its metadata
    (:func:`~curvcal.load.checkpoint.recorded_loss`; γ kept for focal only); other losses as
    given."""
    from curvcal.load.checkpoint import recorded_loss

    if settings.loss != "own":
        return settings
    criterion, gamma = recorded_loss(loaded)
    return settings.replace(loss=criterion, gamma=gamma if criterion == "focal" else None)


def _check_parameters(loaded: LoadedModel, settings: HessianSettings) -> None:
    """--params patterns that match nothing and a --top-k above P, before the data is read."""
    from curvcal.curvature.analysis import selected_parameter_count

    for pattern in settings.params:
        if selected_parameter_count(loaded.module, (pattern,)) == 0:
            names = [n for n, p in loaded.module.named_parameters() if p.requires_grad]
            shown = ", ".join(names[:8]) + (", …" if len(names) > 8 else "")
            raise InputError(
                "--params", f"{pattern!r} matches no trainable parameter", f"names are: {shown}"
            )
    n_params = selected_parameter_count(loaded.module, settings.params)
    if n_params == 0:
        raise InputError(str(loaded.path), "the model has no trainable parameters")
    if settings.top_k > n_params:
        raise InputError(
            "--top-k",
            f"{settings.top_k} eigenvalues asked of a Hessian with {n_params} parameters",
            f"use --top-k {n_params} or less",
        )


def _measure(
    loaded: LoadedModel,
    batches: Any,
    settings: HessianSettings,
    reporter: Reporter,
    *,
    distributed: bool,
    speak: bool = True,
) -> tuple[HessianAnalysis, list[str], list[str]]:
    """Run the analysis with a progress count of Hessian-vector products on stderr, and the
    long-run note (:mod:`~curvcal.curvature.forecast`) once the first products are timed.

    Returns the analysis, the notes already said on stderr as they came (the sketch's memory)
    and the warnings it raised (convergence, engine fallback) as messages to say at the end;
    other warnings are passed on untouched. Only the process that ``speak``s (rank 0) says notes.
    """
    from curvcal.curvature.analysis import analyse_hessian_with_messages
    from curvcal.curvature.forecast import forecast_for
    from curvcal.distributed import all_reduce_sum

    forecast, replan = forecast_for(
        loaded.module, settings, lambda text: reporter.info(f"curvcal: note: {text}")
    )
    notes: list[str] = []

    def on_note(text: str) -> None:
        notes.append(text)
        if speak:
            reporter.warn(text)

    with reporter.progress("Hessian-vector products", None) as advance:
        done = [0]

        def on_step(stage: str, matvecs: int) -> None:
            advance.describe(f"Hessian-vector products ({stage})")
            advance(matvecs - done[0])
            done[0] = matvecs
            forecast(stage, matvecs)

        analysis, messages = analyse_hessian_with_messages(
            loaded.module,
            batches,
            settings,
            all_reduce=all_reduce_sum if distributed else None,
            on_step=on_step,
            on_note=on_note,
            on_plan=replan,
        )
    return analysis, notes, messages


def checkpoint_record(options: CheckpointOptions) -> dict[str, Any]:
    """The checkpoint options as the report's ``settings`` records them."""
    return {
        "arch": options.arch,
        "arch_kwargs": dict(options.arch_kwargs),
        "num_classes": options.num_classes,
        "state_dict_key": options.state_dict_key,
        "trust_checkpoint": options.trust,
        "allow_globals": list(options.allow_globals),
        "device": options.device,
        "dtype": options.dtype,
    }


def data_record(options: DataOptions, batch_size: int) -> dict[str, Any]:
    """The data options as the report's ``settings`` records them."""
    return {
        "data": options.spec,
        "data_root": options.root,
        "download": options.download,
        "mean": options.mean,
        "std": options.std,
        "resize": options.resize,
        "crop": options.crop,
        "max_samples": options.max_samples,
        "subset_seed": options.subset_seed,
        "x_key": options.x_key,
        "y_key": options.y_key,
        **_text_record(options),
        "batch_size": batch_size,
    }


def _text_record(options: DataOptions) -> dict[str, Any]:
    from curvcal.load.text import is_text_spec

    if not is_text_spec(options.spec):
        return {}
    return {
        "text_key": options.text_key,
        "label_key": options.label_key,
        "text_pair_key": options.text_pair_key,
        "tokenizer": str(options.tokenizer) if options.tokenizer is not None else None,
        "max_length": options.max_length,
    }


def default_params(
    loaded: LoadedModel, params: tuple[str, ...]
) -> tuple[tuple[str, ...], str, bool]:
    """The parameters a Hessian covers, how they were chosen, and whether that choice is worth
    saying (it is not the plain "every parameter" or the given ``--params``).

    ``--params all`` (alone) is every trainable parameter. Without ``--params``: every
    trainable parameter for image models; for text models every one except the token
    embedding matrix (vocab x hidden, whose Hessian block is almost all zero rows: only the
    tokens in the data get gradient), listed by name. Given globs are used as given.
    """
    from curvcal.load.hf import token_embedding_names

    if params == ("all",):
        return (), "all trainable parameters (--params all)", True
    if params:
        return params, "--params", False
    excluded = token_embedding_names(loaded.module) if loaded.modality == "text" else ()
    if not excluded:
        return (), "all trainable parameters", False
    names = tuple(
        name
        for name, p in loaded.module.named_parameters()
        if p.requires_grad and name not in excluded
    )
    return (
        names,
        f"all trainable parameters except the token embeddings ({', '.join(excluded)}); "
        "--params all includes them",
        True,
    )
