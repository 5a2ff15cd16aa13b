"""Where each calibration map runs: the maps with a torch kernel, and the metrics' N×K pass, on
the device of the settings (``--device``); every other map on the CPU.

On a device, temperature scaling (``ts``), focal temperature scaling (``focal_ts``) and
ensemble temperature scaling (``ets``) are fitted and applied by the same torch code as on the
CPU, in float64 as there, in larger row chunks (:func:`~curvcal.calibration.inputs.chunk_rows`);
the float32 searches of the fits are float32 on both, every number they report comes from a
float64 pass, and ETS's three simplex weights are fitted on the CPU from its N×3 label columns.
The metrics make their one N×K pass there too (probabilities, top label, NLL, Brier, classwise
bin sums) and bin the N confidences, bootstrap and rank on the CPU. The two paths differ only in
the order of their sums (and in the last bit of a CUDA ``exp``), which the tests bound by 1e-9
absolute on T, γ and every metric: the NLL fit's polish stops at |dN/d ln T| < 1e-10, which
fixes T to about that. A map outside :data:`DEVICE_STAGES` runs on the CPU for the reason
:data:`CPU_REASONS` gives, and a run on a device says so once.

The commands check the device before any work (``curvcal.load.checkpoints.device.resolve_device``: a name
that is no device, or CUDA absent, exit 2); :func:`map_device` reads a name already checked,
and refuses one torch cannot read (a call from Python).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from curvcal.errors import InputError, setting_name

#: the stages whose fit and apply run as torch kernels on the device of the settings
DEVICE_STAGES = ("ts", "focal_ts", "ets")
#: why each other stage runs on the CPU, whatever ``--device`` says (one reason per family of
#: maps: the variants of one map run as it does)
CPU_REASONS = {
    stage: reason
    for stages, reason in (
        (
            ("vector", "matrix", "dirichlet", "dirichlet_l2"),
            "fitted by SciPy's optimisers on NumPy float64 arrays",
        ),
        (("laplace",), "its posterior is a dense float64 LAPACK solve"),
        (("platt", "beta"), "two columns, fitted by SciPy's optimisers"),
        (
            ("histogram", "histogram_ovr"),
            "sort-heavy: bins cut on sorted scores with ties kept together, in float64 NumPy",
        ),
        (
            ("isotonic", "isotonic_ovr"),
            "sort-heavy: pool-adjacent-violators on sorted scores, in float64 NumPy",
        ),
        (("bbq",), "sort-heavy: its binnings are cut on sorted scores, in float64 NumPy"),
        (("venn_abers",), "sort-heavy: isotonic fits on sorted scores, in float64 NumPy"),
    )
    for stage in stages
}
#: the key of the metrics in :func:`placement` and :func:`stage_device`: their N×K pass (the
#: probabilities, top label, NLL, Brier and classwise bin sums) runs on the device; the binning
#: of the N confidences (exact float64 ties), the bootstrap and the rest run on the CPU
METRICS = "metrics"
CPU = torch.device("cpu")


def map_device(spec: str) -> torch.device:
    """The device a checked ``--device`` name means for the maps: ``auto`` is CUDA when it is
    available, else the CPU; any other name is itself (``cpu``, ``cuda``, ``cuda:1``)."""
    text = spec.strip().lower()
    if text == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else CPU
    try:
        return torch.device(text)
    except RuntimeError:
        raise InputError(
            "device", f"{spec!r} is not a device", "use auto, cpu, cuda or cuda:N"
        ) from None


def stage_device(stage: str, spec: str) -> torch.device:
    """Where ``stage`` (or :data:`METRICS`) runs under the device name ``spec``: that device
    for the stages of :data:`DEVICE_STAGES` and the metrics, the CPU for every other."""
    return map_device(spec) if stage in DEVICE_STAGES or stage == METRICS else CPU


def placement(stages: Iterable[str], spec: str) -> dict[str, str]:
    """``{stage: device}`` of the ``stages`` that ran, and of the metrics, as a report says
    where each map ran."""
    placed = {stage: str(stage_device(stage, spec)) for stage in stages}
    placed[METRICS] = str(stage_device(METRICS, spec))
    return placed


def cpu_note(stages: Iterable[str], spec: str) -> str | None:
    """What a run on a device says once about the ``stages`` that ran on the CPU all the same
    (and why), or ``None`` on the CPU or when every stage ran on the device."""
    device = map_device(spec)
    if device.type == "cpu":
        return None
    staying = [stage for stage in stages if stage not in DEVICE_STAGES]
    if not staying:
        return None
    reasons: dict[str, list[str]] = {}
    for stage in staying:
        reasons.setdefault(CPU_REASONS[stage], []).append(stage)
    said = "; ".join(f"{', '.join(names)} ({why})" for why, names in reasons.items())
    return f"{setting_name('device')} {device}: these maps run on the CPU: {said}"
