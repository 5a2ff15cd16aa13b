"""Where each calibration map runs: the maps with a torch kernel on the device of the settings
(``--device``), every other map and the metrics on the CPU.

On a device, temperature scaling (``ts``), focal temperature scaling (``focal_ts``) and
ensemble temperature scaling (``ets``) are fitted and applied by the same torch code as on the
CPU, in float64 as there, in larger row chunks (:func:`~curvcal.calibration.inputs.chunk_rows`);
the float32 searches of the fits are float32 on both, every number they report comes from a
float64 pass, and ETS's simplex weights are fitted on the CPU from the N×3 label columns. The two paths differ
only in the order of the sums, so they agree to about 1e-12 relative (the tests allow 1e-9
absolute: the polish of the NLL fit stops at |dN/d ln T| < 1e-10, which leaves T to about that).
A map outside :data:`DEVICE_STAGES` runs on the CPU for the reason :data:`CPU_REASONS` gives,
and a run on a device says so once.

The commands check the device before any work (``curvcal.load.device.resolve_device``: a name
that is no device, or CUDA absent, exit 2); :func:`map_device` reads a name already checked,
and refuses one torch cannot read (a call from Python).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from curvcal.errors import InputError

#: the stages whose fit and apply run as torch kernels on the device of the settings
DEVICE_STAGES = ("ts", "focal_ts", "ets")
#: why each other stage runs on the CPU, whatever ``--device`` says
CPU_REASONS = {
    "vector": "fitted by SciPy's optimisers on NumPy float64 arrays",
    "matrix": "fitted by SciPy's optimisers on NumPy float64 arrays",
    "dirichlet": "fitted by SciPy's optimisers on NumPy float64 arrays",
    "dirichlet_l2": "fitted by SciPy's optimisers on NumPy float64 arrays",
    "laplace": "its posterior is a dense float64 LAPACK solve",
    "platt": "two columns, fitted by SciPy's optimisers",
    "beta": "two columns, fitted by SciPy's optimisers",
    "histogram": "sort-heavy: bins cut on sorted scores with ties kept together, in float64 NumPy",
    "histogram_ovr": "sort-heavy: bins cut on sorted scores with ties kept together, in float64 "
    "NumPy",
    "isotonic": "sort-heavy: pool-adjacent-violators on sorted scores, in float64 NumPy",
    "isotonic_ovr": "sort-heavy: pool-adjacent-violators on sorted scores, in float64 NumPy",
    "bbq": "sort-heavy: its binnings are cut on sorted scores, in float64 NumPy",
    "venn_abers": "sort-heavy: isotonic fits on sorted scores, in float64 NumPy",
}
#: the key of the metrics in :func:`placement`: they run on the CPU (exact float64 binning, ties
#: and bootstrap resamples), reading each map's output there
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
    """Where ``stage`` runs under the device name ``spec``: that device for the stages of
    :data:`DEVICE_STAGES`, the CPU for every other."""
    return map_device(spec) if stage in DEVICE_STAGES else CPU


def placement(stages: Iterable[str], spec: str) -> dict[str, str]:
    """``{stage: device}`` of the ``stages`` that ran, and of the metrics, as a report says
    where each map ran."""
    placed = {stage: str(stage_device(stage, spec)) for stage in stages}
    placed[METRICS] = str(CPU)
    return placed


def cpu_note(stages: Iterable[str], spec: str) -> str | None:
    """What a run on a device says once about the ``stages`` that ran on the CPU all the same
    (and why), or ``None`` on the CPU or when every stage ran on the device."""
    device = map_device(spec)
    if device.type == "cpu":
        return None
    staying = [stage for stage in stages if stage not in DEVICE_STAGES]
    if not staying:
        return f"--device {device}: the metrics run on the CPU"
    reasons: dict[str, list[str]] = {}
    for stage in staying:
        reasons.setdefault(CPU_REASONS[stage], []).append(stage)
    said = "; ".join(f"{', '.join(names)} ({why})" for why, names in reasons.items())
    return f"--device {device}: these maps and the metrics run on the CPU: {said}"
