"""The tables of what a checkpoint holds (``curvcal inspect`` and ``curvcal demo``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from curvcal.report.tables import Table

if TYPE_CHECKING:
    from curvcal.load.checkpoints.inspect import CheckpointInfo

TENSOR_ROWS = 40
#: metadata entries shown in the table (all of them in --json): a file's header may hold a
#: million (a safetensors header of 60 MB), which a table would take many minutes to lay out
METADATA_ROWS = 40
_LIST_CELL = 8


def inspect_tables(info: CheckpointInfo) -> list[Table]:
    """The checkpoint summary table and (when tensors are listed) the tensor table."""
    rows: list[tuple[str, str]] = [
        ("file", str(info.path)),
        ("format", info.format),
        ("container", info.container),
        ("top-level type", info.top_level_type or "-"),
        ("top-level keys", _short_list(info.top_level_keys)),
        ("state-dict key", info.state_dict_key or "-"),
        ("prefix", _prefix(info)),
        ("tensors", str(len(info.tensors)) if info.tensors else "-"),
        ("parameters", _parameters(info)),
        ("classes", str(info.num_classes) if info.num_classes is not None else "-"),
        *((("architecture", info.architecture),) if info.architecture else ()),
        *((("labels", _short_list(info.labels)),) if info.labels else ()),
        *((("recorded model", info.recorded_arch),) if info.recorded_arch else ()),
        *((("suggested --arch", info.suggested_arch),) if info.suggested_arch else ()),
        ("unsafe globals", _short_list(info.unsafe_globals, limit=len(info.unsafe_globals))),
        ("needs --trust-checkpoint", "yes" if info.needs_trust else "no"),
        *(
            (("needs", " ".join(f"--allow-global {name}" for name in info.needs_allow_global)),)
            if info.needs_allow_global
            else ()
        ),
    ]
    if info.container == "pickle":  # a plain pickle: what it would import is all there is
        rows.append(("pickle globals", _short_list(info.pickle_globals, len(info.pickle_globals))))
    rows += _metadata_rows(info.metadata)
    tables = [Table(title="checkpoint", columns=("item", "value"), rows=tuple(rows))]
    if info.tensors:
        shown = info.tensors[:TENSOR_ROWS]
        caption = None
        if len(info.tensors) > TENSOR_ROWS:
            caption = f"... and {len(info.tensors) - TENSOR_ROWS} more (all in --json)"
        tables.append(
            Table(
                title="tensors",
                columns=("name", "shape", "dtype"),
                rows=tuple(
                    (s.name, "×".join(map(str, s.shape)) or "scalar", s.dtype) for s in shown
                ),
                caption=caption,
            )
        )
    return tables


def _metadata_rows(metadata: dict[str, str]) -> list[tuple[str, str]]:
    """The first :data:`METADATA_ROWS` entries and a row saying how many more there are (a
    long key or value is cut where every table cell is, :func:`curvcal.errors.bounded`)."""
    rows = []
    for index, (key, value) in enumerate(metadata.items()):
        if index == METADATA_ROWS:
            more = len(metadata) - METADATA_ROWS
            rows.append(("metadata: ...", f"{more:,} more entries (all in --json)"))
            break
        rows.append((f"metadata: {key}", str(value)))
    return rows


def _short_list(items: tuple[str, ...], limit: int = _LIST_CELL) -> str:
    if not items:
        return "-"
    text = ", ".join(items[:limit])
    if len(items) > limit:
        text += f", ... ({len(items) - limit} more)"
    return text


def _prefix(info: CheckpointInfo) -> str:
    if info.detected_prefix is None:
        return "-"
    if info.prefix_is_wrapper:  # DataParallel's and torch.compile's, always stripped
        return f"{info.detected_prefix} (stripped)"
    return f"{info.detected_prefix} (shared by every key; stripped when the architecture's keys lack it)"


def _parameters(info: CheckpointInfo) -> str:
    if info.parameter_count is None:
        return "-"
    if info.buffer_count:
        return f"{info.parameter_count:,} (and {info.buffer_count:,} in buffers)"
    return f"{info.parameter_count:,}"
