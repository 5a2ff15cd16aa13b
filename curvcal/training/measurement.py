"""One measurement of chosen curvature and calibration quantities of a model on a held-out
loader, taken in the middle of training without disturbing it.

Curvature comes from :func:`curvcal.analyse_hessian` (the Hessian of the mean loss over the
loader, as ``curvcal hessian`` measures it, with :class:`~curvcal.settings.hessian.HessianSettings`
field names as keyword overrides: ``top_k``, ``probes``, ``trace_method``, ``params``, ``loss``,
``seed`` ...); calibration from :func:`curvcal.calibration_metrics` of the model's logits over
the loader (``bins``, ``edges``). Both run in eval mode by default.

Training is left exactly as it was: every module's training flag, each parameter's ``.grad``
(the tensor object itself), grad mode, and the global random states (torch's CPU and CUDA
generators, Python's ``random`` and NumPy's), which shuffling the held-out loader would
otherwise advance. The Hessian's own probes come from its seeded private generator.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from curvcal.errors import InputError
from curvcal.results import CALIBRATION_METRIC_FIELDS
from curvcal.settings.hessian import HessianSettings

#: curvature quantities: λmax, the top-k eigenvalues (``eigenvalue_1`` .. ``eigenvalue_k``,
#: with ``top_k``), λmin, and the trace (with its standard error ``trace_se``)
CURVATURE = ("lambda_max", "top_k", "lambda_min", "trace")
#: calibration quantities: every metric of :class:`~curvcal.calibration.results.CalibrationMetrics`
CALIBRATION = CALIBRATION_METRIC_FIELDS
QUANTITIES = CURVATURE + CALIBRATION
_SETTINGS = frozenset(field.name for field in dataclasses.fields(HessianSettings))
#: settings the measurement decides from ``quantities``
_DECIDED = frozenset({"trace", "smallest"})


def check_request(quantities: Sequence[str], overrides: dict[str, Any]) -> tuple[str, ...]:
    """``quantities`` as a tuple, refused (naming the bad one) unless each is one of
    :data:`QUANTITIES` and each override is a ``HessianSettings`` field; the overrides are
    checked as ``curvcal hessian`` checks its options."""
    if isinstance(quantities, str):
        quantities = (quantities,)
    if not isinstance(quantities, Sequence) or not all(isinstance(q, str) for q in quantities):
        raise InputError(
            "quantities",
            f"must be a name or a sequence of names, got {quantities!r}",
            f"choose from {', '.join(QUANTITIES)}",
        )
    chosen = tuple(quantities)
    if not chosen:
        raise InputError("quantities", "is empty", f"choose from {', '.join(QUANTITIES)}")
    for name in chosen:
        if name not in QUANTITIES:
            raise InputError(
                "quantities", f"unknown quantity {name!r}", f"choose from {', '.join(QUANTITIES)}"
            )
    for name in overrides:
        if name in _DECIDED:
            raise InputError(
                name, "is decided by quantities", "name 'trace' or 'lambda_min' in quantities"
            )
        if name not in _SETTINGS:
            raise InputError(
                name,
                "is not a curvature setting",
                "use HessianSettings field names (top_k, probes)",
            )
    _settings(chosen, overrides)  # checked now, not at the first measurement
    return chosen


def _settings(quantities: tuple[str, ...], overrides: dict[str, Any]) -> HessianSettings:
    values = {k: v for k, v in overrides.items() if not callable(v) or isinstance(v, str)}
    values["trace"] = "trace" in quantities
    values["smallest"] = "lambda_min" in quantities
    if isinstance(values.get("params"), str):
        values["params"] = (values["params"],)
    if "loss" in values and not isinstance(values["loss"], str):
        values.pop("loss")
    return dataclasses.replace(HessianSettings(), **values)


@contextlib.contextmanager
def undisturbed(model: nn.Module) -> Iterator[None]:
    """Run the body with gradients enabled (outside inference mode) and put back afterwards
    every module's training flag, each parameter's ``.grad`` object, and the global random
    states of torch (CPU and every CUDA device), Python and NumPy."""
    flags = [(module, module.training) for module in model.modules()]
    grads = [(p, p.grad) for p in model.parameters()]
    python_state = random.getstate()
    numpy_state = _numpy_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with (
            torch.random.fork_rng(devices=devices),
            torch.inference_mode(False),
            torch.enable_grad(),
        ):
            yield
    finally:
        for module, flag in flags:
            module.training = flag
        for parameter, grad in grads:
            parameter.grad = grad
        random.setstate(python_state)
        if numpy_state is not None:
            import numpy

            numpy.random.set_state(numpy_state)


def _numpy_state() -> Any:
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy comes with torch's usual installs
        return None
    return numpy.random.get_state()


def measure(
    model: nn.Module,
    data: Any,
    quantities: Sequence[str] = ("lambda_max", "ece"),
    *,
    bins: int = 15,
    edges: str = "left",
    **overrides: Any,
) -> dict[str, float]:
    """The chosen ``quantities`` of ``model`` on ``data`` (a DataLoader or any re-iterable of
    ``(x, y)`` batches), as ``{name: value}``, without disturbing training
    (:func:`undisturbed`).

    Curvature: ``lambda_max`` (the largest algebraic eigenvalue of the Hessian of the mean
    loss), ``top_k`` (``eigenvalue_1`` .. ``eigenvalue_k``), ``lambda_min``, ``trace`` (and
    ``trace_se``, its standard error; 0 when the method is exact), measured by
    :func:`curvcal.analyse_hessian` with ``overrides`` (``HessianSettings`` fields; ``loss`` may
    also be a torch loss module or a callable). Calibration: any field of
    :data:`CALIBRATION`, from :func:`curvcal.calibration_metrics` with ``bins`` and ``edges``.
    """
    from curvcal.calibration.inference import predict
    from curvcal.calibration.metrics import calibration_metrics
    from curvcal.curvature.api import analyse_hessian
    from curvcal.curvature.options import check_model

    check_model(model)
    chosen = check_request(quantities, overrides)
    results: dict[str, float] = {}
    with undisturbed(model):
        if any(name in CURVATURE for name in chosen):
            settings = _settings(chosen, overrides)
            loss = overrides.get("loss")
            extra = {} if loss is None or isinstance(loss, str) else {"loss": loss}
            analysis = analyse_hessian(model, data, settings, **extra)
            if "lambda_max" in chosen:
                results["lambda_max"] = float(analysis.lambda_max)
            if "top_k" in chosen:
                for index, value in enumerate(analysis.spectrum.eigenvalues, start=1):
                    results[f"eigenvalue_{index}"] = float(value)
            if "lambda_min" in chosen and analysis.lambda_min is not None:
                results["lambda_min"] = float(analysis.lambda_min)
            if "trace" in chosen and analysis.trace is not None:
                results["trace"] = float(analysis.trace.estimate)
                results["trace_se"] = float(analysis.trace.standard_error)
        asked = [name for name in chosen if name in CALIBRATION]
        if asked:
            logits, labels = predict(model, data)
            metrics = calibration_metrics(logits, labels, bins=bins, edges=edges)
            for name in asked:
                results[name] = float(getattr(metrics, name))
    return results


def check_callback(
    quantities: Sequence[str],
    overrides: dict[str, Any],
    *,
    loader: Any = (),
    prefix: str = "",
    model: Any = None,
    bins: int = 15,
    edges: str = "left",
    **counts: int | None,
) -> tuple[str, ...]:
    """What a training callback checks when it is built, so that no argument of its is found
    wrong at the first measurement, hours into training: each ``every_n_*`` count is a positive
    integer or ``None``, ``loader`` a re-iterable (not ``None``, not a one-shot iterator; each
    measurement reads it again), ``prefix`` a string, ``model`` ``None`` or a callable,
    ``bins``/``edges`` as :func:`~curvcal.settings.calibration.check_bins` says (else an
    :class:`InputError` or :class:`SettingsError` naming the argument), and ``quantities`` and
    ``overrides`` pass :func:`check_request`; the quantities as a tuple."""
    from curvcal.settings.calibration import check_bins

    if not isinstance(loader, Iterable) or isinstance(loader, Iterator):  # no iter(): workers
        raise InputError(
            "loader",
            f"must be a DataLoader or a list of (x, y) batches, got {type(loader).__name__}",
            "each measurement reads it again, so a one-shot iterator or None cannot serve",
        )
    if not isinstance(prefix, str):
        raise InputError("prefix", f"must be a string, got {prefix!r}")
    if model is not None and not callable(model):
        raise InputError(
            "model",
            f"must be None or a function from the trained model to the classifier, got {model!r}",
        )
    check_bins(bins, edges)
    for name, value in counts.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise InputError(name, f"must be a positive integer or None, got {value!r}")
    return check_request(quantities, overrides)


class CallbackMeasurement:
    """What the training callbacks (Hugging Face, Lightning) share: what they measure and how.
    :meth:`configure` checks and keeps ``loader``, ``quantities``, ``prefix`` (of each logged
    name), ``model`` (the function from the framework's model to the classifier; ``None``: the
    framework's default), ``bins``/``edges`` and ``overrides`` (``HessianSettings`` fields);
    :meth:`measured` measures a classifier with them and names each value as it is logged."""

    loader: Any
    quantities: tuple[str, ...]
    prefix: str
    model: Any
    bins: int
    edges: str
    overrides: dict[str, Any]

    def configure(
        self,
        loader: Any,
        quantities: Sequence[str],
        prefix: str,
        model: Any,
        bins: int,
        edges: str,
        overrides: dict[str, Any],
        **counts: int | None,
    ) -> None:
        """Keep the settings above and the callback's ``every_n_*`` ``counts`` (as attributes
        of their names), checked first by :func:`check_callback`."""
        self.quantities = check_callback(
            quantities,
            overrides,
            loader=loader,
            prefix=prefix,
            model=model,
            bins=bins,
            edges=edges,
            **counts,
        )
        for name, count in counts.items():
            setattr(self, name, count)
        self.loader = loader
        self.prefix = prefix
        self.model = model
        self.bins, self.edges = bins, edges
        self.overrides = overrides

    def measured(self, classifier: nn.Module) -> tuple[dict[str, float], dict[str, float]]:
        """The values of :func:`measure` on ``classifier``, and the same keyed by their
        logged names (``prefix + name``)."""
        values = measure(
            classifier,
            self.loader,
            self.quantities,
            bins=self.bins,
            edges=self.edges,
            **self.overrides,
        )
        return values, {self.prefix + name: value for name, value in values.items()}
