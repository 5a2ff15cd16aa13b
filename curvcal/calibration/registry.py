"""The calibration maps curvcal fits, by name: one entry per map, one interface.

Every map is fitted by ``fit(fit_scores, fit_labels, kind, settings, names=names)`` (``names``:
an :class:`~curvcal.calibration.inputs.InputNames`, what its errors call the two inputs), which
returns a fit record whose ``calibrator`` is a frozen map object (:class:`CalibrationMap`,
implemented once by :class:`~curvcal.calibration.saved.SavedMap`, which every map derives from):
``apply(scores, kind, source)`` gives float64 log-probabilities, ``probabilities`` their
exponentials, ``to_dict()`` plain numbers only and ``load(dict, source)`` (the entry's) rebuilds
it from them without running anything from the file. The report stage of a map is its key
(``ts``, ``focal_ts``, ``vector``, ``matrix``, ``laplace``, ``histogram``, ``histogram_ovr``,
``isotonic``, ``isotonic_ovr``, ``platt``, ``beta``, ``dirichlet``, ``dirichlet_l2``, ``ets``,
``bbq``, ``venn_abers``);
``option`` is its ``--method`` spelling and ``method`` the name its saved form carries.
``input`` is what the map reads: ``scores`` (N×K), or ``features`` (a
:class:`~curvcal.calibration.laplace.HeadFeatures`: the model's last-layer inputs and head,
which logits alone do not give).

A map says when it applies by ``skip_reason(n_classes, has_model)``: ``None`` when it can be
fitted to scores with ``n_classes`` columns (and, with ``has_model``, the model at hand), else
the reason it cannot (:func:`binary_only`, :func:`needs_model`). The default applies always.
``--method all`` fits every map that applies and says why each other one was skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from curvcal.calibration.bbq import BBQMap, fit_bbq
from curvcal.calibration.binary import BinaryMap, fit_binary
from curvcal.calibration.binning import HistogramMap, fit_histogram
from curvcal.calibration.device import stage_device
from curvcal.calibration.dirichlet import fit_dirichlet
from curvcal.calibration.ensemble import EnsembleMap, fit_ensemble_temperature
from curvcal.calibration.isotonic import IsotonicMap, fit_isotonic
from curvcal.calibration.linear import LinearMap, fit_linear, fit_matrix_odir
from curvcal.calibration.results import Calibrator
from curvcal.calibration.scaling import fit_focal_temperature, fit_temperature
from curvcal.calibration.venn_abers import VennAbersMap, fit_venn_abers
from curvcal.settings.calibration import CalibrationSettings


class CalibrationMap(Protocol):
    """A fitted map: frozen, saved as plain numbers, applied to N×K scores."""

    @property
    def method(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...

    def apply(self, scores: Any, kind: str = "logits", source: str = "scores") -> Any: ...

    def probabilities(self, scores: Any, kind: str = "logits", source: str = "scores") -> Any: ...

    def check_model(self, module: Any, where: str) -> None: ...


#: ``--method`` value that fits every map that applies.
ALL = "all"


def applies_always(n_classes: int, has_model: bool) -> str | None:
    """The default ``skip_reason``: the map applies to any scores."""
    return None


def binary_only(n_classes: int, has_model: bool) -> str | None:
    """``skip_reason`` of a map defined for binary problems only (K = 2)."""
    return (
        None
        if n_classes == 2
        else f"binary problems (K = 2) only; these scores have {n_classes} classes"
    )


def needs_model(n_classes: int, has_model: bool) -> str | None:
    """``skip_reason`` of a map fitted from the model itself, not from its scores."""
    return (
        None
        if has_model
        else "needs the model's last-layer inputs (a checkpoint whose logits come from a final "
        "nn.Linear), not only its scores"
    )


@dataclass(frozen=True)
class MapKind:
    """One calibration map: its report ``stage``, ``--method`` ``option``, saved ``method``,
    table ``title``, ``fit``, ``load`` and ``skip_reason`` (see the module docstring)."""

    stage: str
    option: str
    method: str
    title: str
    fit: Callable[..., Any]
    load: Callable[[Any, str], CalibrationMap]
    input: str = "scores"
    skip_reason: Callable[[int, bool], str | None] = applies_always


def _fit_with(
    fitter: Callable[..., Any],
    *arguments: Any,
    options: Callable[[CalibrationSettings], dict[str, Any]] = lambda settings: {},
    **fixed: Any,
) -> Callable[..., Any]:
    """The entry's ``fit`` of a map fitted to scores: ``fitter(scores, labels, *arguments,
    kind=kind, **fixed, **options(settings), **common)``: ``arguments`` and ``fixed`` are the
    entry's own (its method's name, a regulariser), ``options`` the settings it reads."""

    def fit(
        scores: Any, labels: Any, kind: str, settings: CalibrationSettings, **common: Any
    ) -> Any:
        return fitter(scores, labels, *arguments, kind=kind, **fixed, **options(settings), **common)

    return fit


def _fit_laplace(
    head: Any, labels: Any, kind: str, settings: CalibrationSettings, **common: Any
) -> Any:
    from curvcal.calibration.laplace import fit_laplace

    return fit_laplace(
        head.features,
        labels,
        head.weight,
        head.bias,
        structure=settings.laplace_structure,
        predictive=settings.laplace_predictive,
        samples=settings.laplace_samples,
        prior=settings.laplace_prior,
        seed=settings.seed,
        layer=head.layer,
        **common,
    )


def _load_laplace(data: Any, source: str) -> CalibrationMap:
    from curvcal.calibration.laplace import LaplaceMap

    return LaplaceMap.from_dict(data, source)


def _ts_options(settings: CalibrationSettings) -> dict[str, Any]:
    return {
        "objective": settings.objective,
        "bins": settings.bins,
        "edges": settings.edges,
        "device": stage_device("ts", settings.device),
    }


def _focal_ts_options(settings: CalibrationSettings) -> dict[str, Any]:
    return {
        "objective": settings.focal_objective,
        "gammas": settings.gammas,
        "bins": settings.bins,
        "edges": settings.edges,
        "device": stage_device("focal_ts", settings.device),
    }


def _ets_options(settings: CalibrationSettings) -> dict[str, Any]:
    return {"device": stage_device("ets", settings.device)}


def _histogram_options(settings: CalibrationSettings) -> dict[str, Any]:
    return {"n_bins": settings.histogram_bins, "scheme": settings.histogram_scheme}


def _seed(settings: CalibrationSettings) -> dict[str, Any]:
    return {"seed": settings.seed}


MAPS: dict[str, MapKind] = {
    kind.stage: kind
    for kind in (
        MapKind(
            "ts",
            "ts",
            "temperature",
            "TS",
            _fit_with(fit_temperature, options=_ts_options),
            Calibrator.from_dict,
        ),
        MapKind(
            "focal_ts",
            "focal-ts",
            "focal-temperature",
            "focal TS",
            _fit_with(fit_focal_temperature, options=_focal_ts_options),
            Calibrator.from_dict,
        ),
        MapKind(
            "vector",
            "vector",
            "vector",
            "vector",
            _fit_with(fit_linear, "vector"),
            LinearMap.from_dict,
        ),
        MapKind(
            "matrix",
            "matrix",
            "matrix",
            "matrix",
            _fit_with(fit_matrix_odir, options=_seed),
            LinearMap.from_dict,
        ),
        MapKind(
            "laplace",
            "laplace",
            "laplace",
            "Laplace",
            _fit_laplace,
            _load_laplace,
            "features",
            needs_model,
        ),
        MapKind(
            "histogram",
            "histogram",
            "histogram",
            "histogram",
            _fit_with(fit_histogram, "histogram", options=_histogram_options),
            HistogramMap.from_dict,
        ),
        MapKind(
            "histogram_ovr",
            "histogram-ovr",
            "histogram-ovr",
            "histogram OvR",
            _fit_with(fit_histogram, "histogram-ovr", options=_histogram_options),
            HistogramMap.from_dict,
        ),
        MapKind(
            "isotonic",
            "isotonic",
            "isotonic",
            "isotonic",
            _fit_with(fit_isotonic, "isotonic"),
            IsotonicMap.from_dict,
        ),
        MapKind(
            "isotonic_ovr",
            "isotonic-ovr",
            "isotonic-ovr",
            "isotonic OvR",
            _fit_with(fit_isotonic, "isotonic-ovr"),
            IsotonicMap.from_dict,
        ),
        MapKind(
            "platt",
            "platt",
            "platt",
            "Platt",
            _fit_with(fit_binary, "platt"),
            BinaryMap.from_dict,
            skip_reason=binary_only,
        ),
        MapKind(
            "beta",
            "beta",
            "beta",
            "beta",
            _fit_with(fit_binary, "beta"),
            BinaryMap.from_dict,
            skip_reason=binary_only,
        ),
        MapKind(
            "dirichlet",
            "dirichlet",
            "dirichlet",
            "Dirichlet",
            _fit_with(fit_dirichlet, options=_seed),
            LinearMap.from_dict,
        ),
        MapKind(
            "dirichlet_l2",
            "dirichlet-l2",
            "dirichlet",
            "Dirichlet L2",
            _fit_with(fit_dirichlet, options=_seed, regulariser="l2"),
            LinearMap.from_dict,
        ),
        MapKind(
            "ets",
            "ets",
            "ensemble-temperature",
            "ETS",
            _fit_with(fit_ensemble_temperature, options=_ets_options),
            EnsembleMap.from_dict,
        ),
        MapKind("bbq", "bbq", "bbq", "BBQ", _fit_with(fit_bbq, "bbq"), BBQMap.from_dict),
        MapKind(
            "venn_abers",
            "venn-abers",
            "venn-abers",
            "Venn-Abers",
            _fit_with(fit_venn_abers),
            VennAbersMap.from_dict,
        ),
    )
}
#: The saved method of every stage.
STAGE_METHODS = {stage: kind.method for stage, kind in MAPS.items()}


def fitted_stages(method: str | None) -> tuple[str, ...]:
    """The stages a ``--method`` value fits (``both``: TS and focal TS; ``all``: every map,
    before :func:`applicable_stages` leaves out those that do not apply; ``none``: nothing)."""
    if method == "both":
        return ("ts", "focal_ts")
    if method == ALL:
        return tuple(MAPS)
    return tuple(stage for stage, kind in MAPS.items() if kind.option == method)


def applicable_stages(
    stages: tuple[str, ...], n_classes: int, has_model: bool
) -> tuple[tuple[str, ...], dict[str, str]]:
    """``stages`` split into those that apply to ``n_classes`` scores (in order) and, for each
    other one, the reason it does not (its entry's ``skip_reason``)."""
    reasons = {stage: MAPS[stage].skip_reason(n_classes, has_model) for stage in stages}
    kept = tuple(stage for stage in stages if reasons[stage] is None)
    return kept, {stage: reason for stage, reason in reasons.items() if reason is not None}
