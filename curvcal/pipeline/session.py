"""One run session: the steps every command that reads a checkpoint takes, written once.

:func:`open_session` places the process (the device of ``--device``; under torchrun its rank,
the process group and a quiet reporter on every rank but 0) and yields a :class:`Session` that

- loads a checkpoint on that device, once per path (:meth:`Session.model`);
- loads a dataset with the checkpoint's trust, preprocessing and tokenizer, checks that the
  model takes it (one forward of one sample), and says the preprocessing curvcal chose, once
  per spec (:meth:`Session.dataset`);
- hands out this rank's batches of a dataset (:meth:`Session.batches`);
- predicts every sample, each rank its shard, gathered on rank 0, under ``--nan-policy``
  (:meth:`Session.predict`);
- measures the Hessian (:meth:`Session.hessian`): ``--loss own`` and the default parameters
  resolved, impossible requests refused before any product, products summed across ranks, a
  progress count on stderr.

``hessian``, ``calibrate``, ``check``, ``study`` and ``demo`` all go through it, so torchrun,
the NaN policy and loading once hold for every command alike.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal.errors import InputError, NumericalError

if TYPE_CHECKING:
    import torch

    from curvcal.console import Reporter
    from curvcal.curvature.analysis import OnEigenvectors
    from curvcal.curvature.eigenvectors import TopEigenvectors
    from curvcal.curvature.results import HessianAnalysis
    from curvcal.distributed import DistContext
    from curvcal.load.checkpoints.loaded_model import LoadedModel
    from curvcal.load.datasets.loaded_data import LoadedData
    from curvcal.rows import Inputs
    from curvcal.settings.checkpoint import CheckpointSettings
    from curvcal.settings.data import DataSettings
    from curvcal.settings.fields import Settings
    from curvcal.settings.hessian import HessianSettings

#: ``--nan-policy``: stop at a sample whose logits are NaN or Inf, or leave such samples out
NAN_POLICIES = ("error", "drop")


@dataclass(frozen=True)
class ResolvedHessian:
    """Hessian settings as they run on one model (:meth:`Session.hessian_settings`), and the
    words for the parameters they chose where those are worth saying (``choice``: not the
    plain "every parameter" nor a given ``--params``; else None), said on stderr and recorded
    in the results when the Hessian is measured."""

    settings: HessianSettings
    choice: str | None = None


@dataclass(frozen=True)
class HessianMeasurement:
    """A Hessian measurement of a session: the ``analysis``, the settings it ran with
    (``--loss own`` and the parameters resolved), the ``notes`` already said on stderr and the
    ``messages`` (convergence, engine fallback) left for the command to say at the end."""

    analysis: HessianAnalysis
    settings: HessianSettings
    notes: list[str]
    messages: list[str]
    #: the stage Ctrl-C stopped (the analysis holds the stages before it), or None
    interrupted: str | None = None


@dataclass
class Session:
    """The run's place (``device``, ``context``), its ``reporter`` (quiet on ranks but 0), the
    checkpoint and data settings, what it has loaded, and the ``warnings`` and ``timings`` its
    steps gathered for the report."""

    device: torch.device
    context: DistContext
    reporter: Reporter
    checkpoint_settings: CheckpointSettings
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    _models: dict[Path, LoadedModel] = field(default_factory=dict)
    _datasets: dict[tuple[Any, ...], LoadedData] = field(default_factory=dict)

    @property
    def is_main(self) -> bool:
        """Whether this process speaks for the run (rank 0, or the only process)."""
        return bool(self.context.is_main)

    def model(self, path: Path) -> LoadedModel:
        """The checkpoint at ``path`` on the session's device (loaded once per path); under
        torchrun every rank's must be the same file (:func:`~curvcal.distributed.agree`)."""
        from curvcal.distributed import agree
        from curvcal.inputs import opened_within
        from curvcal.load.checkpoint import load_model
        from curvcal.load.checkpoints.loaded_model import LIBRARY_NOTES
        from curvcal.pipeline.agreement import model_fingerprint

        if path not in self._models:
            self.reporter.stage(f"loading {path.name}")
            began = time.perf_counter()
            options = self.checkpoint_settings.replace(device=str(self.device))
            with opened_within() as opened:  # the files the model is built from
                loaded = load_model(path, options)
            # before any rank shards or sums
            agree("checkpoint", lambda: model_fingerprint(loaded, opened))
            if "classifier_built" in loaded.metadata and self.is_main:  # from a causal LM
                self.reporter.warn(loaded.metadata["classifier_built"])
            notes = loaded.metadata.get(LIBRARY_NOTES, "")  # held back by the loader
            for note in notes.splitlines() if self.is_main else ():
                self.reporter.warn(f"{path}: {note}")
            if options.shard_model != "none":
                self._shard(loaded, options.shard_model)
            self._models[path] = loaded
            self._add_time("load", began)
        return self._models[path]

    def _shard(self, loaded: LoadedModel, how: str) -> None:
        """Shard ``loaded``'s module over the ranks (``--shard-model``); refused in one
        process, and for a 16-bit model (the central-difference step is sized for float32 and
        float64 rounding, far too small for 16-bit gradients)."""
        import torch

        from curvcal.curvature.central_difference import sixteen_bit_floor
        from curvcal.sharding import shard_model

        dtype = self.checkpoint_settings.dtype
        if dtype in ("bfloat16", "float16"):
            step, error = sixteen_bit_floor(getattr(torch, dtype))
            raise InputError(
                f"--shard-model {how}",
                f"is not offered with --dtype {dtype}: its products are central differences "
                f"of gradients, and with {dtype} weights and gradients the best step "
                f"({step:.2g} of the weights' scale) still leaves about {error:.1%} error "
                "(rounding 3u/h against truncation h^4/30), more along sharply curved directions",
                "use --dtype float32 (or float64) with --shard-model",
            )
        if not self.context.active:
            raise InputError(
                f"--shard-model {how}",
                "shards the model over torchrun's processes, and this is one process",
                "launch with torchrun --nproc-per-node 2 (or more), or drop --shard-model",
            )
        activations = self.checkpoint_settings.checkpoint_activations
        units = shard_model(loaded.module, how, self.device, checkpoint_activations=activations)
        if self.is_main:
            self.reporter.warn(
                f"model sharded over {self.context.world_size} ranks in {units} units "
                f"(--shard-model {how}); Hessian products by central differences of gradients"
                + ("; activations recomputed in each backward" if activations else "")
            )

    def release(self, path: Path) -> None:
        """Forget the checkpoint at ``path`` (its memory goes back once nothing holds it)."""
        self._models.pop(path, None)

    def dataset(
        self,
        loaded: LoadedModel | None,
        settings: DataSettings,
        option: str = "--data",
        *,
        text_model: Any = None,
        check: bool = True,
    ) -> LoadedData:
        """The dataset of ``settings`` (``option`` names it in messages) as ``loaded`` reads it:
        its preprocessing and tokenizer, ``--trust-checkpoint`` for ``py:`` factories; checked
        against the model (``check``) and its chosen preprocessing said once. ``loaded`` None
        (several checkpoints): ``text_model`` gives the tokenizer's folder. Under torchrun
        every rank's data must be the same (:func:`~curvcal.distributed.agree`)."""
        from curvcal.distributed import agree
        from curvcal.inputs import opened_within
        from curvcal.load.data import load_dataset
        from curvcal.load.texts.text import text_model_of
        from curvcal.pipeline.agreement import data_fingerprint
        from curvcal.pipeline.compatibility import check_compatible, say_preprocessing

        began = time.perf_counter()
        settings = settings.replace(trust_checkpoint=self.checkpoint_settings.trust_checkpoint)
        key = (settings, None if loaded is None else loaded.path)
        new = key not in self._datasets
        if new:
            self.reporter.stage(f"reading {option} {settings.data}")
            if loaded is not None:
                text_model = text_model_of(loaded)
            preprocessing = None if loaded is None else loaded.preprocessing
            with opened_within() as opened:
                read = load_dataset(settings, preprocessing, text_model)
            agree("data", lambda: data_fingerprint(read, self.context.world_size, opened))
            self._datasets[key] = read
        data = self._datasets[key]
        if check and loaded is not None:
            if new:
                self.reporter.stage("checking that the model takes the data")
            check_compatible(loaded, data, option)
        if new and self.is_main:  # once the model is known to take it
            say_preprocessing(data, self.reporter, self.warnings, option)
        self._add_time("load", began)
        return data

    def shard(self, data: LoadedData, option: str = "--data") -> list[int] | None:
        """This rank's sample indices of ``data`` (``None``: all, in one process)."""
        from curvcal.pipeline.runtime import shard

        return shard(data, self.context, option)

    def batches(
        self, data: LoadedData, batch_size: int, option: str = "--data"
    ) -> Callable[[], Iterator[tuple[Inputs, torch.Tensor]]]:
        """A fresh iterator over this rank's batches of ``data`` at each call."""
        from curvcal.load.datasets.batches import iter_batches

        indices = self.shard(data, option)

        def batches() -> Iterator[tuple[Inputs, torch.Tensor]]:
            return iter_batches(data.dataset, batch_size, indices)

        return batches

    def predict(
        self,
        loaded: LoadedModel,
        data: LoadedData,
        batch_size: int,
        *,
        option: str = "--data",
        nan_policy: str = "error",
    ) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        """Logits and labels of every sample of ``data`` in dataset order, and how many rows
        ``nan_policy`` left out (``None`` on ranks but 0, which get no rows)."""
        from curvcal.pipeline.runtime import predict

        began = time.perf_counter()
        indices = self.shard(data, option)
        total = data.n_samples if indices is None else len(indices)
        title = "inference" if option == "--data" else f"inference ({option.lstrip('-')})"
        with self.reporter.progress(title, total) as advance:
            predictions = predict(loaded, data, batch_size, advance, option)
        self._add_time("inference", began)
        if predictions is None:
            return None
        logits, labels = predictions
        return finite_rows(logits, labels, nan_policy, f"{option} {data.spec}", self.warnings)

    def hessian_settings(self, loaded: LoadedModel, settings: HessianSettings) -> ResolvedHessian:
        """``settings`` as they run on ``loaded``, checked before the data is read: ``--loss
        own`` becomes the loss the checkpoint records; without ``--params`` a text model's
        token embeddings are left out; a ``--params`` glob that matches nothing and a
        ``--top-k`` above P are refused. With them, the parameter choice where it is worth
        saying (not the plain "every parameter" or the given ``--params``), else None."""
        settings = resolve_loss(loaded, settings)
        params, choice, say_choice = default_params(loaded, settings.params)
        settings = settings.replace(params=params)
        check_parameters(loaded, settings)
        if self.checkpoint_settings.shard_model != "none":
            settings = sharded_settings(settings, self.checkpoint_settings.shard_model)
        return ResolvedHessian(settings, choice if say_choice else None)

    def hessian(
        self,
        loaded: LoadedModel,
        data: LoadedData,
        resolved: ResolvedHessian,
        batch_size: int,
        *,
        option: str = "--data",
        on_operator: Callable[[Any], None] | None = None,
        keep_stages: bool = False,
        on_vectors: OnEigenvectors | None = None,
    ) -> HessianMeasurement:
        """The Hessian analysis of ``loaded``'s mean loss over ``data`` with the settings
        :meth:`hessian_settings` resolved (and their parameter choice, said on stderr and
        recorded in the results), products summed across ranks under torchrun.
        ``on_operator`` sees the operator once it is built (``study`` counts FLSD-53's γ
        groups on it); ``on_vectors`` the top-k eigenvectors and their values. ``keep_stages``:
        the first Ctrl-C after the eigenvalues stops the analysis and keeps the stages finished
        (``HessianMeasurement.interrupted`` names the stage stopped); only a command that reports them
        as interrupted asks for it."""
        import dataclasses

        settings, choice = resolved.settings, resolved.choice
        if choice is not None and settings.params and self.is_main:
            self.reporter.warn(f"Hessian over {choice}")
        batches = self.batches(data, batch_size, option)
        built: list[Any] = []

        def seen(operator: Any) -> None:
            built.append(operator)
            if on_operator is not None:
                on_operator(operator)

        # a central-difference operator (a sharded model) measures its products' error along
        # the top eigenvector too, where it is largest: that vector (this rank's slice) is kept.
        # Elsewhere the eigenvectors (k x P values at the end of the eigenvalue stage) are made
        # only when the caller asks for them.
        top: list[Any] = []
        sharded = self.checkpoint_settings.shard_model != "none"

        def vectors_seen(vectors: TopEigenvectors) -> None:
            if sharded:
                top.append(vectors.block[:, 0].clone())
            if on_vectors is not None:
                on_vectors(vectors)

        given = frozenset({"--max-samples"}) if data.subset is not None else frozenset()
        analysis, notes, messages, stopped = _measure(
            loaded.module,
            batches,
            settings,
            self.reporter,
            self.context,
            seen,
            given,
            keep_stages=keep_stages and not self.context.active,
            on_vectors=vectors_seen if sharded or on_vectors is not None else None,
        )
        extra: dict[str, Any] = {}
        error_estimate = getattr(built[0], "error_estimate", None) if built else None
        if error_estimate is not None:  # a sharded model: say how exact its products are
            costs = built[0].rules_taken()  # the run's products, before the estimates' own
            estimate = error_estimate(settings.seed)
            extra["product"] = {**estimate.as_dict(), **costs}
            along = ""
            if top:  # the eigenvalue stage finished
                top_estimate = error_estimate(settings.seed, vector=top[0])
                extra["product"]["top_eigenvector"] = top_estimate.errors()
                along = f"; {top_estimate.bound:.1e} along the top eigenvector"
            notes.append(
                "Hessian products by central differences of gradients (--shard-model "
                f"{self.checkpoint_settings.shard_model}): relative error about "
                f"{estimate.bound:.1e} on a Gaussian vector (truncation "
                f"{estimate.truncation:.1e}, rounding {estimate.rounding:.1e}){along}; "
                f"{costs['passes_per_product']:.2f} gradient passes a product"
            )
            if self.is_main:
                self.reporter.warn(notes[-1])
        analysis = dataclasses.replace(
            analysis,
            operator={
                **analysis.operator,
                "world_size": self.context.world_size,
                **({"params_choice": choice} if choice is not None else {}),
                **extra,
            },
        )
        return HessianMeasurement(analysis, settings, notes, messages, stopped)

    def _add_time(self, stage: str, began: float) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + time.perf_counter() - began


@contextmanager
def open_session(
    checkpoint_settings: CheckpointSettings,
    reporter: Reporter,
    run_settings: Sequence[Settings],
) -> Iterator[Session]:
    """A :class:`Session` on the device of ``--device``; under torchrun, this process's rank
    in the process group, which every rank leaves together when the block ends (a failure on
    one rank stops them all, :func:`~curvcal.pipeline.runtime.distributed_run`).

    ``run_settings``: the run's other settings objects. Under torchrun every rank's settings
    (these and ``checkpoint_settings``) must be the same, and so must the checkpoints and data
    the session loads (:mod:`~curvcal.pipeline.agreement`): a rank that differs stops every
    rank, naming it and what differs, before anything is loaded or summed."""
    from curvcal.console import Reporter
    from curvcal.distributed import agree
    from curvcal.pipeline.agreement import settings_fingerprint
    from curvcal.pipeline.runtime import distributed_run

    if checkpoint_settings.checkpoint_activations and checkpoint_settings.shard_model == "none":
        raise InputError(
            "--checkpoint-activations",
            "is offered only with --shard-model blocks|modules: a product by double backward "
            "keeps the first backward's graph, recomputed activations included (measured to "
            "save no memory)",
            "add --shard-model blocks under torchrun, or drop --checkpoint-activations",
        )
    with distributed_run(checkpoint_settings.device) as (device, context):
        if not context.is_main:  # rank 0 speaks for the run
            reporter = Reporter(quiet=True)
        agree("settings", lambda: settings_fingerprint((checkpoint_settings, *run_settings)))
        yield Session(device, context, reporter, checkpoint_settings)


def finite_rows(
    logits: torch.Tensor, labels: torch.Tensor, policy: str, source: str, warnings: list[str]
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The model's logits under ``--nan-policy``: rows with a NaN or Inf stop the run (exit 3,
    naming the data and the first such sample) or are left out with a warning; returns the
    rows kept and how many were left out."""
    from curvcal.load.scores.logits import drop_rows, nonfinite_rows

    rows = nonfinite_rows(logits)
    count, total = int(rows.numel()), int(logits.shape[0])
    if count == 0:
        return logits, labels, 0
    if policy == "error" or count == total:
        raise NumericalError(
            source,
            f"the model's logits are NaN or Inf for {count} of {total} samples, the first "
            f"being sample {int(rows[0])}",
            "check the weights and inputs"
            + ("; --nan-policy drop leaves such samples out" if count < total else ""),
        )
    warnings.append(dropped_warning(count, total, source))
    kept_logits, kept_labels = drop_rows(logits, labels, rows)
    return kept_logits, kept_labels, count


def dropped_warning(count: int, total: int, source: str) -> str:
    """The warning for rows left out by ``--nan-policy drop``."""
    return f"{source}: left out {count} of {total} rows with a NaN or Inf (--nan-policy drop)"


#: what a sharded model's products (central differences of gradients) cannot do, by option
_SHARDED_REFUSALS = (
    ("curvature", "hessian", "--curvature"),
    ("mode", "eval", "--mode"),
    ("per_layer", False, "--per-layer"),
)


def sharded_settings(settings: HessianSettings, how: str) -> HessianSettings:
    """``settings`` as they run on a model sharded with ``--shard-model``: the Hessian only, in
    eval mode, without --per-layer, --hvp func or a Gauss–Newton trace (which need double
    backward or torch.func on the whole model), each refused in one line; ``--trace-method
    auto`` becomes ``hutchpp``."""
    for name, allowed, option in _SHARDED_REFUSALS:
        value = getattr(settings, name)
        if value != allowed:
            shown = option if isinstance(value, bool) else f"{option} {value}"
            raise InputError(
                shown,
                f"cannot run on a model sharded with --shard-model {how}: its products are "
                "central differences of gradients (Hessian only, eval mode, whole model)",
                "drop it, or drop --shard-model",
            )
    if settings.hvp == "func" or settings.trace_method.startswith("gauss-newton"):
        option = "--hvp func" if settings.hvp == "func" else "--trace-method"
        raise InputError(
            option,
            f"cannot run on a model sharded with --shard-model {how}: it needs double backward "
            "or torch.func through the whole model",
            "use --trace-method hutchpp, xtrace or hutchinson, or drop --shard-model",
        )
    if settings.trace_method == "auto":
        settings = settings.replace(trace_method="hutchpp")
    return settings


def resolve_loss(loaded: LoadedModel, settings: HessianSettings) -> HessianSettings:
    """``settings`` with ``--loss own`` replaced by the loss ``loaded`` records in its metadata
    (:func:`~curvcal.load.checkpoint.recorded_loss`; γ kept for focal only); other losses as
    given."""
    from curvcal.load.checkpoints.metadata import recorded_loss

    if settings.loss != "own":
        return settings
    loss, gamma = recorded_loss(loaded)
    return settings.replace(loss=loss, gamma=gamma if loss == "focal" else None)


def default_params(
    loaded: LoadedModel, params: tuple[str, ...]
) -> tuple[tuple[str, ...], str, bool]:
    """The parameters a Hessian covers, how they were chosen, and whether that choice is worth
    saying (it is not the plain "every parameter" or the given ``--params``).

    ``--params all`` (alone) is every trainable parameter. Without ``--params``: every
    trainable parameter for image models; for a PEFT adapter the adapter's (peft freezes the
    base model's); for text models every one except the token embedding matrix (vocab x hidden, whose Hessian block is almost all zero rows: only the
    tokens in the data get gradient), listed by name. Given globs are used as given.
    """
    from curvcal.load.models.hf import token_embedding_names

    if params == ("all",):
        return (), "all trainable parameters (--params all)", True
    if params:
        return params, "--params", False
    if loaded.form == "peft_adapter":  # peft froze the base: the trainable ones are the adapter's
        names = tuple(n for n, p in loaded.module.named_parameters() if p.requires_grad)
        return (
            names,
            f"the adapter's parameters, {loaded.metadata.get('adapter_parameters', '')} "
            "(LoRA matrices and modules_to_save; the base model is frozen)",
            True,
        )
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


def check_parameters(loaded: LoadedModel, settings: HessianSettings) -> None:
    """--params patterns that match nothing and a --top-k above P, before the data is read."""
    from curvcal.curvature.plan import selected_parameter_count

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
    module: torch.nn.Module,
    batches: Any,
    settings: HessianSettings,
    reporter: Reporter,
    context: DistContext,
    on_operator: Callable[[Any], None] | None = None,
    given: frozenset[str] = frozenset(),
    keep_stages: bool = False,
    on_vectors: OnEigenvectors | None = None,
) -> tuple[HessianAnalysis, list[str], list[str], str | None]:
    """Run the analysis with a progress count of Hessian-vector products against the products
    planned (:mod:`~curvcal.curvature.forecast`) on stderr, and the long-run note once the
    first products are timed; ``on_vectors`` receives the top eigenvectors and their values.

    Returns the analysis, the notes already said on stderr as they came (the sketch's memory),
    the warnings it raised (convergence, engine fallback) as messages to say at the end, and
    the stage Ctrl-C stopped (``None``: it ran to the end). With ``keep_stages`` the first
    Ctrl-C after the eigenvalues keeps the stages finished (:func:`curvcal.interrupt.stages`);
    before them, or without it, it ends the run with nothing written. Only rank 0 says notes."""
    from curvcal import interrupt
    from curvcal.curvature.analysis import analyse_hessian_with_messages
    from curvcal.curvature.forecast import forecast_for
    from curvcal.curvature.progress import Stopped
    from curvcal.curvature.results import HessianAnalysis
    from curvcal.distributed import all_reduce_sum

    forecast, replan, planned, typical = forecast_for(
        module, settings, lambda text: reporter.info(f"curvcal: note: {text}"), given
    )
    notes: list[str] = []

    def on_note(text: str) -> None:
        notes.append(text)
        if context.is_main:
            reporter.warn(text)

    reporter.stage("Hessian: the mean loss and the first product")
    staged = interrupt.stages() if keep_stages else contextlib.nullcontext()
    with staged, reporter.progress("Hessian-vector products", planned()) as advance:
        done = [0]
        advance.plan(planned(), *typical())

        def on_plan(resolved: HessianSettings) -> None:
            replan(resolved)
            advance.plan(planned(), *typical())

        def on_step(stage: str, matvecs: int) -> None:
            forecast(stage, matvecs)  # first: a stage that ended revises the plan
            advance.describe(f"Hessian-vector products ({stage})")
            advance.plan(planned(), *typical())
            advance(matvecs - done[0])
            done[0] = matvecs
            if interrupt.stop_requested():
                raise Stopped(stage=stage)

        try:
            analysis, messages = analyse_hessian_with_messages(
                module,
                batches,
                settings,
                all_reduce=all_reduce_sum if context.active else None,
                on_step=on_step,
                on_note=on_note,
                on_plan=on_plan,
                on_operator=on_operator,
                on_vectors=on_vectors,
            )
        except Stopped as stopped:
            if not isinstance(stopped.finished, HessianAnalysis):
                interrupt.stop_now()
                raise
            return stopped.finished, notes, [], stopped.stage
    return analysis, notes, messages, None
