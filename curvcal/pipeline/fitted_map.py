"""Every calibration map from Python, one way: :func:`fit_map`, :func:`load_map`, :class:`FittedMap`.

>>> import torch, curvcal
>>> logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.5, 0.5], [0.2, 0.1]])
>>> labels = torch.tensor([0, 1, 1, 0])
>>> fitted = curvcal.fit_map("ts", logits, labels)
>>> fitted.probabilities(logits).shape
torch.Size([4, 2])

The map is looked up in the registry (:data:`~curvcal.calibration.registry.MAPS`) by its
``--method`` spelling (``focal-ts``, ``dirichlet-l2``) or its report stage (``focal_ts``), fitted
by the same function the CLI calls, with the same settings (the fields of
:class:`~curvcal.settings.calibration.CalibrationSettings`, passed as keywords:
``objective="ece"``, ``histogram_bins=20``, ``seed=3``; a field the map's fit does not read,
such as ``val_split``, is refused). :meth:`FittedMap.save` writes the same
calibrator file as ``--save-calibrator``; :func:`load_map` reads one back through the same
reader as ``--apply`` (its schema, bounds and provenance checks).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from curvcal.errors import InputError


@dataclass(frozen=True)
class FittedMap:
    """A calibration map with its registry ``stage``, the ``kind`` of input it reads
    (``logits``, ``probs``, ``logprobs``; ``features`` for Laplace: a
    :class:`~curvcal.calibration.laplace.HeadFeatures` or the N×D last-layer inputs), the
    ``fit`` record (``None`` for a map read from a file) and the file's ``provenance``."""

    stage: str
    map: Any
    kind: str = "logits"
    fit: Any = None
    provenance: Any = None
    n_classes: int | None = None

    @property
    def method(self) -> str:
        return str(self.map.method)

    def probabilities(self, scores: Any) -> Any:
        """float64 calibrated probabilities of N×K ``scores`` (of this map's ``kind``)."""
        return self.map.probabilities(self._checked(scores), self.kind)

    def log_probabilities(self, scores: Any) -> Any:
        """float64 calibrated log-probabilities of N×K ``scores``."""
        return self.map.apply(self._checked(scores), self.kind)

    def _checked(self, scores: Any) -> Any:
        """``scores``, refused (:class:`InputError` naming them) when their class count is not
        the one the map was fitted on, as ``--apply`` refuses them: a map whose parameters do
        not depend on K (temperature scaling, ETS) would otherwise give probabilities for
        classes it never saw."""
        if self.kind == "features" or self.n_classes is None:
            return scores
        from curvcal.calibration.inputs import as_tensor

        tensor = as_tensor(scores, "scores")
        if tensor.ndim == 2 and int(tensor.shape[1]) != self.n_classes:
            raise InputError(
                "scores",
                f"have {int(tensor.shape[1])} classes, but this {self.stage} map was fitted on "
                f"{self.n_classes}",
                "apply it to scores like those it was fitted on",
            )
        return tensor

    def save(self, path: str | Path) -> None:
        """Write the calibrator file of this map to ``path`` (a new file: an existing one is
        refused), as ``--save-calibrator`` writes it."""
        from curvcal.atomic import atomic_output, mark_output
        from curvcal.paths import path_argument
        from curvcal.pipeline.calibrator import CalibratorProvenance, calibrators_json

        target = path_argument(path, "path")
        if target.exists() or target.is_symlink():
            raise InputError(str(target), "exists already", "save the map to a new path")
        provenance = self.provenance
        n_classes = self.n_classes or getattr(self.map, "n_classes", None)
        if provenance is None and n_classes is not None:
            provenance = CalibratorProvenance(
                n_classes=int(n_classes),
                input_kind=self.kind if self.kind != "features" else "logits",
            )
        mark_output(target, replace=False)
        with atomic_output(target) as out:
            out.write(calibrators_json({self.stage: self.map}, provenance).encode("utf-8"))


def fit_map(name: str, scores: Any, labels: Any, **options: Any) -> FittedMap:
    """Fit the calibration map ``name`` (``--method`` spelling or stage) on N×K ``scores``
    and their ``labels``. ``kind`` (keyword): what the scores are, ``logits`` (default),
    ``probs`` or ``logprobs``; for ``laplace``, ``scores`` is the model's
    :class:`~curvcal.calibration.laplace.HeadFeatures`. Every other keyword is a
    :class:`~curvcal.settings.calibration.CalibrationSettings` field, checked as the option is."""
    from curvcal.calibration.inputs import as_tensor
    from curvcal.calibration.registry import MAPS
    from curvcal.settings.calibration import CalibrationSettings

    stage = map_stage(name)
    kind = options.pop("kind", "logits")
    known = [field.name for field in dataclasses.fields(CalibrationSettings) if field.init]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InputError(
            "fit_map",
            f"unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}",
            f"the settings are kind, {', '.join(known)}",
        )
    if "device" in options:  # the maps' kernels would meet CUDA's absence in torch's words
        from curvcal.devices import device_named

        device_named(options["device"], "device", "use device='cpu', or leave it unset", True)
    entry = MAPS[stage]
    if options.get("method", entry.option) not in (entry.option, stage):
        raise InputError(
            "fit_map",
            f"method={options['method']!r} contradicts the map named {name!r}",
            "the name says which map is fitted: leave method out",
        )
    if entry.input == "features":
        from curvcal.calibration.laplace import HeadFeatures

        if not isinstance(scores, HeadFeatures):
            raise InputError(
                "scores",
                f"the {stage} map is fitted on the model's last-layer inputs and head (a "
                f"curvcal.calibration.laplace.HeadFeatures), not on {type(scores).__name__}",
                "logits alone are not enough: pass HeadFeatures(features, weight, bias, layer)",
            )
        kind = "features"
    settings = _Reads(CalibrationSettings(**options))
    fit = entry.fit(scores, labels, "logits" if kind == "features" else kind, settings)
    unread = sorted(set(options) - settings.read - {"method"})
    if unread:
        raise InputError(
            "fit_map",
            f"the {stage} map's fit reads no {', '.join(unread)}",
            "leave out what it does not read (a split, a bootstrap, plots and files are the "
            "commands' own)",
        )
    calibration_map = fit.calibrator
    n_classes = getattr(calibration_map, "n_classes", None)
    if n_classes is None:
        n_classes = int(as_tensor(scores, "scores").shape[1])
    return FittedMap(stage, calibration_map, kind, fit, None, int(n_classes))


class _Reads:
    """The settings a fit is given, recording which fields it reads: a keyword of
    :func:`fit_map` that the map's fit never reads (``val_split=0.5``, which only the commands
    carve out) is refused rather than ignored."""

    def __init__(self, settings: Any) -> None:
        self._settings = settings
        self.read: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        self.read.add(name)
        return getattr(self._settings, name)


def load_map(path: str | Path, stage: str | None = None) -> FittedMap:
    """The map saved in the calibrator file ``path`` (``stage``: which one, when the file
    holds several), read and checked as ``--apply`` reads it."""
    from curvcal.calibration.registry import MAPS
    from curvcal.paths import path_argument
    from curvcal.pipeline.calibrator import load_calibrator_file

    read = load_calibrator_file(path_argument(path, "path"))
    if stage is None:
        if len(read.calibrators) > 1:
            raise InputError(
                str(path),
                f"holds {len(read.calibrators)} maps ({', '.join(read.calibrators)})",
                "name one: load_map(path, stage=...)",
            )
        stage = next(iter(read.calibrators))
    stage = map_stage(stage, "stage")
    if stage not in read.calibrators:
        raise InputError(str(path), f"holds no {stage!r} map", f"it holds {list(read.calibrators)}")
    kind = "features" if MAPS[stage].input == "features" else "logits"
    if read.provenance is not None and kind != "features":
        kind = read.provenance.input_kind
    n_classes = None if read.provenance is None else read.provenance.n_classes
    return FittedMap(stage, read.calibrators[stage], kind, None, read.provenance, n_classes)


def map_stage(name: str, what: str = "name") -> str:
    """The registry stage of a map named by its ``--method`` spelling or its stage (an unknown
    one is an :class:`InputError` naming ``what``, the argument that gave it)."""
    from curvcal.calibration.registry import MAPS

    if name in MAPS:
        return name
    for stage, entry in MAPS.items():
        if entry.option == name:
            return stage
    options = ", ".join(entry.option for entry in MAPS.values())
    raise InputError(what, f"unknown calibration map {name!r}", f"one of {options}")
