"""What a report measured, as the first table of every table and markdown output.

One function for every command: :func:`measured_table` reads only the report's envelope —
``inputs`` (each file's name and SHA-256, each dataset's spec, N, normalisation and
transforms), ``settings`` (loss, γ, curvature kind and mode of a Hessian; the dtype) and
``environment`` (the device) — so a pasted table says what it is about without the JSON.
"""

from __future__ import annotations

import dataclasses
from pathlib import PurePath
from typing import Any

from curvcal.report.tables import Table, fmt_float
from curvcal.results import Report

#: hex digits of a SHA-256 shown (enough to tell files apart, short enough for 80 columns)
DIGEST_PREFIX = 12


def measured_table(report: Report) -> Table | None:
    """The rows ``checkpoint``, ``data``, ``preprocessing``, ``loss``, ``mode``, ``dtype``,
    ``device`` (those the report has), titled with the command; None when the report names
    no input."""
    rows: list[tuple[str, str]] = []
    for role, described in report.inputs.items():
        items = described if isinstance(described, list) else [described]
        for index, entry in enumerate(items):
            item = dataclasses.asdict(entry) if _is_record(entry) else entry
            if not isinstance(item, dict):
                continue
            label = role.replace("_", " ")
            if len(items) > 1:
                label = f"{label.rstrip('s')} {index + 1}"
            rows.extend(_input_rows(label, item))
    if not rows:
        return None
    rows.extend(_setting_rows(report))
    return Table(
        title=f"curvcal {report.command}: what was measured", columns=("", ""), rows=tuple(rows)
    )


def _is_record(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _input_rows(label: str, item: dict[str, Any]) -> list[tuple[str, str]]:
    if "spec" in item:  # a dataset
        text = f"{item['spec']}, N = {item.get('n_samples', '?')}"
        subset = item.get("subset")
        if isinstance(subset, dict) and subset.get("of") is not None:
            text += f" (of {subset['of']}, seed {subset.get('subset_seed', 0)})"
        rows = [(label, text)]
        preprocessing = _preprocessing(item)
        if preprocessing:
            rows.append((f"{label} preprocessing", preprocessing))
        return rows
    if "path" in item:  # a file: checkpoint, logits, calibrator
        text = PurePath(str(item["path"])).name
        digest = item.get("sha256")
        if isinstance(digest, str) and digest and digest != "<masked>":
            text += f" (sha256 {digest[:DIGEST_PREFIX]})"
        if "n_samples" in item:
            text += f", N = {item['n_samples']}"
        return [(label, text)]
    return []


def _preprocessing(item: dict[str, Any]) -> str:
    parts: list[str] = []
    normalisation = item.get("normalisation")
    if isinstance(normalisation, dict):
        mean, std = normalisation.get("mean"), normalisation.get("std")
        if mean is not None and std is not None:
            parts.append(f"mean {_numbers(mean)}, std {_numbers(std)}")
        if normalisation.get("scale"):
            parts.insert(0, str(normalisation["scale"]))
    transforms = [str(t) for t in item.get("transforms") or () if t]
    parts.extend(transforms)
    return "; ".join(parts)


def _numbers(values: Any) -> str:
    if isinstance(values, list | tuple):
        return "(" + ", ".join(fmt_float(float(v), 3) for v in values) + ")"
    return fmt_float(float(values), 3)


def _setting_rows(report: Report) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    hessian = report.settings.get("hessian")
    if isinstance(hessian, dict):
        loss = str(hessian.get("loss", ""))
        if hessian.get("gamma") is not None:
            loss += f" (γ {hessian['gamma']:g})"
        kind = hessian.get("curvature")
        if kind and kind != "hessian":
            loss += f"; curvature {kind}"
        rows.append(("loss", loss))
        rows.append(("mode", str(hessian.get("mode", ""))))
    checkpoint = report.settings.get("checkpoint")
    if isinstance(checkpoint, dict) and checkpoint.get("dtype"):
        rows.append(("dtype", str(checkpoint["dtype"])))
    device = report.environment.get("device") if isinstance(report.environment, dict) else None
    if device:
        rows.append(("device", str(device)))
    return rows
