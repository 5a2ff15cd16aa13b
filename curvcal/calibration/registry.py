"""The calibration maps curvcal fits, by name: one entry per map, one interface.

Every map is fitted by ``fit(fit_scores, fit_labels, kind, settings, source, labels_source)``,
which returns a fit record whose ``calibrator`` is a frozen map object (:class:`CalibrationMap`):
``apply(scores, kind, source)`` gives float64 log-probabilities, ``probabilities`` their
exponentials, ``to_dict()`` plain numbers only and ``load(dict, source)`` (the entry's) rebuilds
it from them without running anything from the file. The report stage of a map is its key
(``ts``, ``focal_ts``, ``vector``, ``matrix``, ``dirichlet``, ``dirichlet_l2``, ``ets``); ``option`` is its ``--method`` spelling and
``method`` the name its saved form carries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from curvcal.calibration.dirichlet import fit_dirichlet
from curvcal.calibration.ensemble import EnsembleMap, fit_ensemble_temperature
from curvcal.calibration.linear import LinearMap, fit_linear, fit_matrix_odir
from curvcal.calibration.results import Calibrator
from curvcal.calibration.scaling import fit_focal_temperature, fit_temperature
from curvcal.settings.calibration import CalibrationSettings


class CalibrationMap(Protocol):
    """A fitted map: frozen, saved as plain numbers, applied to N×K scores."""

    @property
    def method(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...

    def apply(self, scores: Any, kind: str = "logits", source: str = "scores") -> Any: ...

    def probabilities(self, scores: Any, kind: str = "logits", source: str = "scores") -> Any: ...


@dataclass(frozen=True)
class MapKind:
    """One calibration map: its report ``stage``, ``--method`` ``option``, saved ``method``,
    table ``title``, ``fit`` and ``load`` (see the module docstring)."""

    stage: str
    option: str
    method: str
    title: str
    fit: Callable[..., Any]
    load: Callable[[Any, str], CalibrationMap]


def _fit_ts(
    scores: Any, labels: Any, kind: str, settings: CalibrationSettings, **common: Any
) -> Any:
    return fit_temperature(
        scores,
        labels,
        kind=kind,
        objective=settings.objective,
        bins=settings.bins,
        edges=settings.edges,
        **common,
    )


def _fit_focal_ts(
    scores: Any, labels: Any, kind: str, settings: CalibrationSettings, **common: Any
) -> Any:
    return fit_focal_temperature(
        scores,
        labels,
        kind=kind,
        objective=settings.focal_objective,
        gammas=settings.gammas,
        bins=settings.bins,
        edges=settings.edges,
        **common,
    )


def _fit_vector(
    scores: Any, labels: Any, kind: str, settings: CalibrationSettings, **common: Any
) -> Any:
    return fit_linear(scores, labels, "vector", kind=kind, **common)


def _fit_matrix(
    scores: Any, labels: Any, kind: str, settings: CalibrationSettings, **common: Any
) -> Any:
    return fit_matrix_odir(scores, labels, kind=kind, seed=settings.seed, **common)


def _fit_dirichlet(
    scores: Any, labels: Any, kind: str, settings: CalibrationSettings, **common: Any
) -> Any:
    return fit_dirichlet(scores, labels, kind=kind, seed=settings.seed, **common)


def _fit_dirichlet_l2(
    scores: Any, labels: Any, kind: str, settings: CalibrationSettings, **common: Any
) -> Any:
    return fit_dirichlet(scores, labels, kind=kind, seed=settings.seed, regulariser="l2", **common)


def _fit_ets(
    scores: Any, labels: Any, kind: str, settings: CalibrationSettings, **common: Any
) -> Any:
    return fit_ensemble_temperature(scores, labels, kind=kind, **common)


MAPS: dict[str, MapKind] = {
    kind.stage: kind
    for kind in (
        MapKind("ts", "ts", "temperature", "TS", _fit_ts, Calibrator.from_dict),
        MapKind(
            "focal_ts",
            "focal-ts",
            "focal-temperature",
            "focal TS",
            _fit_focal_ts,
            Calibrator.from_dict,
        ),
        MapKind("vector", "vector", "vector", "vector", _fit_vector, LinearMap.from_dict),
        MapKind("matrix", "matrix", "matrix", "matrix", _fit_matrix, LinearMap.from_dict),
        MapKind(
            "dirichlet", "dirichlet", "dirichlet", "Dirichlet", _fit_dirichlet, LinearMap.from_dict
        ),
        MapKind(
            "dirichlet_l2",
            "dirichlet-l2",
            "dirichlet",
            "Dirichlet L2",
            _fit_dirichlet_l2,
            LinearMap.from_dict,
        ),
        MapKind("ets", "ets", "ensemble-temperature", "ETS", _fit_ets, EnsembleMap.from_dict),
    )
}
#: The saved method of every stage.
STAGE_METHODS = {stage: kind.method for stage, kind in MAPS.items()}


def fitted_stages(method: str | None) -> tuple[str, ...]:
    """The stages a ``--method`` value fits (``both``: TS and focal TS; ``none``: nothing)."""
    if method == "both":
        return ("ts", "focal_ts")
    return tuple(stage for stage, kind in MAPS.items() if kind.option == method)
