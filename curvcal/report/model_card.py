"""``--format model-card``: the measured metrics as a Hugging Face ``model-index`` block.

The metadata block a model card (a Hub repository's README.md) opens with, in the layout of
the Hub's model-card specification, which ``huggingface_hub`` reads
(``repocard_data.model_index_to_eval_results``)::

    ---
    model-index:
    - name: <model>
      results:
      - task:
          type: <task>
        dataset:
          name: <data spec>
          type: <data spec>
        metrics:
        - name: <metric key>
          type: <metric key>
          value: <number>
    ---

One metric per gated key that has a finite value (each key once, though several bounds may
judge it), in the verdict's order. ``task`` is ``text-classification`` for a dataset read
through a tokenizer, else ``image-classification``. The YAML is written by hand (curvcal
needs no YAML library): every string is a double-quoted scalar, JSON-escaped, which YAML
reads as written. No ``source`` entry: the Hub requires it to carry a URL, and a
report names no place on the web.
"""

from __future__ import annotations

import json
import math
from typing import Any

from curvcal.report.judged import JudgedRun
from curvcal.results import Report, to_jsonable


def model_index(report: Report, judged: JudgedRun) -> list[dict[str, Any]]:
    """The ``model-index`` list of ``judged``: one model, one result (task, dataset, metrics)."""
    metrics: dict[str, dict[str, Any]] = {}
    for row in judged.verdict.rows:
        if row.value is None or not math.isfinite(row.value) or row.metric in metrics:
            continue
        metrics[row.metric] = {"name": row.metric, "type": row.metric, "value": row.value}
    data = judged.data_spec or "unknown"
    result: dict[str, Any] = {
        "task": {"type": _task(report)},
        "dataset": {"name": data, "type": data},
        "metrics": list(metrics.values()),
    }
    return [{"name": judged.model.name, "results": [result]}]


def _task(report: Report) -> str:
    settings = to_jsonable(report.settings)
    data = settings.get("data") if isinstance(settings, dict) else None
    if isinstance(data, dict) and data.get("tokenizer"):
        return "text-classification"
    inputs = to_jsonable(report.inputs)
    described = inputs.get("data") if isinstance(inputs, dict) else None
    if isinstance(described, dict) and described.get("tokenizer"):
        return "text-classification"
    return "image-classification"


def model_card_yaml(report: Report, judged: JudgedRun) -> str:
    """The ``model-index`` block of ``judged`` between ``---`` lines, ready to open a model
    card (or to merge into one that has metadata already)."""
    body = _yaml({"model-index": model_index(report, judged)}, 0)
    return "---\n" + body + "---\n"


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):  # finite; YAML 1.1 readers want a dot in the mantissa
        mantissa, e, exponent = repr(value).partition("e")
        if "." not in mantissa:
            mantissa += ".0"
        return mantissa + e + exponent
    return json.dumps(str(value), ensure_ascii=False)


def _yaml(value: Any, indent: int) -> str:
    """Block-style YAML of nested dicts and lists of scalars (keys are plain words)."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, dict | list) and not item:
                lines.append(f"{pad}{key}: {'[]' if isinstance(item, list) else '{}'}\n")
            elif isinstance(item, dict | list):
                lines.append(f"{pad}{key}:\n" + _yaml(item, indent + 2))
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}\n")
    else:
        for item in value:
            if isinstance(item, dict | list):
                nested = _yaml(item, indent + 2)
                lines.append(f"{pad}- " + nested[indent + 2 :])
            else:
                lines.append(f"{pad}- {_scalar(item)}\n")
    return "".join(lines)
