"""The saved form of a calibration map: its fields declared once, read back by one schema.

Every map (:class:`SavedMap`) declares the fields of its saved body once, as :class:`Field`
rows (name, kind, shape, bounds); :func:`read_fields` is the one reader that checks a body
against them, for every map alike:

- the body is a JSON object with exactly the declared keys (an optional field may be absent:
  older files lack it);
- ``number``: a JSON number (not a boolean), finite, within ``[low, high]``; ``integer``: a
  whole number within ``[low, high]``; ``choice``: one of ``choices``; ``text``: a string of
  at most :data:`MAX_TEXT` characters; ``digest``: a SHA-256, 64 lowercase hex digits;
- ``array``: nested lists of finite numbers within ``[low, high]``, of ``shape``: each
  dimension a fixed length, a named size (every field naming it must agree: ``weight`` K×D and
  ``bias`` K), or ``None`` (free, row by row: a ragged table such as per-class bin edges).

What a field's numbers must satisfy beyond that (edges rising, a covariance positive
semi-definite) is the map's own ``from_fields``. Duplicate JSON keys never reach here: the
one JSON reader (:func:`curvcal.jsontext.loads`) refuses them.

:data:`COEFFICIENT_BOUND` bounds every linear coefficient of a saved map (Platt's slope, beta's
a and b, the weights of vector, matrix and Dirichlet maps): it is the largest inverse
temperature temperature scaling may hold, 1/T_min, beyond which the scores times the
coefficient leave float range and every probability rounds to 0 or 1.
"""

from __future__ import annotations

import array as array_module
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from curvcal.errors import InputError

if TYPE_CHECKING:
    import torch

#: Temperatures a saved map may hold: float32's smallest normal number and its inverse (z / T of
#: float32 scores overflows, or every score rounds to 0, out of this range).
TEMPERATURE_RANGE = (1.1754943508222875e-38, 8.507059173023462e37)
#: Largest magnitude of a saved linear coefficient (1/T_min of :data:`TEMPERATURE_RANGE`).
COEFFICIENT_BOUND = TEMPERATURE_RANGE[1]
#: Longest string a saved field may hold.
MAX_TEXT = 1000
#: Field kinds.
KINDS = ("number", "integer", "choice", "text", "digest", "array")
#: The characters of a hex digest as :mod:`hashlib` writes it.
_HEX = frozenset("0123456789abcdef")

Dimension = int | str | None


@dataclass(frozen=True)
class Field:
    """One field of a saved map: its JSON ``name``, ``kind`` (:data:`KINDS`), the ``shape`` of
    an array, the closed range ``[low, high]`` of a number, an integer or every element of an
    array, the ``choices`` of a choice; ``optional``: may be absent (read as ``None``);
    ``nullable``: may be ``null``."""

    name: str
    kind: str
    shape: tuple[Dimension, ...] = ()
    low: float = -math.inf
    high: float = math.inf
    choices: tuple[Any, ...] = ()
    optional: bool = False
    nullable: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown field kind {self.kind!r}")
        if (self.kind == "array") != bool(self.shape):
            raise ValueError(f"field {self.name!r}: only an array has a shape")

    def out_of_range(self, value: Any) -> str:
        """What is wrong with ``value`` outside ``[low, high]``."""
        if self.kind == "integer" and self.low > -math.inf and self.high < math.inf:
            return f"{self.name} {value!r} is outside {int(self.low)}..{int(self.high)}"
        if self.low > -math.inf and self.high < math.inf:
            return f"{self.name} {value!r} is outside {_bound(self.low)}..{_bound(self.high)}"
        if self.low > -math.inf:
            return f"{self.name} must be >= {self.low:g}, got {value!r}"
        return f"{self.name} must be <= {self.high:g}, got {value!r}"


def _bound(value: float) -> str:
    """A bound as a reader reads it: 0, 1, 1e-08, or 1.2e-38 (not the full 17 digits)."""
    return f"{value:g}" if value == 0 or 1e-4 <= abs(value) <= 1e6 else f"{value:.1e}"


def number(name: str, low: float = -math.inf, high: float = math.inf, **more: Any) -> Field:
    """A finite number within ``[low, high]``."""
    return Field(name, "number", low=low, high=high, **more)


def integer(name: str, low: float = -math.inf, high: float = math.inf, **more: Any) -> Field:
    """A whole number within ``[low, high]``."""
    return Field(name, "integer", low=low, high=high, **more)


def choice(name: str, choices: tuple[Any, ...], **more: Any) -> Field:
    """One of ``choices`` (strings)."""
    return Field(name, "choice", choices=choices, **more)


def text(name: str, **more: Any) -> Field:
    """A string of at most :data:`MAX_TEXT` characters."""
    return Field(name, "text", **more)


def digest(name: str, **more: Any) -> Field:
    """A SHA-256 digest: 64 lowercase hex digits."""
    return Field(name, "digest", **more)


def array(
    name: str,
    shape: tuple[Dimension, ...],
    low: float = -math.inf,
    high: float = math.inf,
    **more: Any,
) -> Field:
    """Nested lists of finite numbers of ``shape``, each within ``[low, high]``."""
    return Field(name, "array", shape=shape, low=low, high=high, **more)


def coefficients(name: str, shape: tuple[Dimension, ...], **more: Any) -> Field:
    """An array of linear coefficients, bounded by :data:`COEFFICIENT_BOUND`."""
    return array(name, shape, -COEFFICIENT_BOUND, COEFFICIENT_BOUND, **more)


def read_fields(
    data: Any, fields: tuple[Field, ...], source: str, sizes: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """The values of ``fields`` in the saved body ``data``, checked (module docstring):
    numbers as ``float``, integers as ``int``, arrays as float64 numpy arrays (a ragged array:
    a list of rows, or of such lists), an absent optional field as ``None``. ``sizes``: named
    dimensions known beforehand. Every fault is an :class:`InputError` naming ``source``."""
    if not isinstance(data, dict):
        raise InputError(source, f"expected a JSON object, got {type(data).__name__}")
    bound: dict[str, int] = dict(sizes or {})
    values: dict[str, Any] = {}
    # the choices first: a method or structure decides which other keys the body holds, and a
    # wrong one is the fault to name, not the keys that follow from it
    for spec in fields:
        if spec.kind == "choice" and spec.name in data:
            values[spec.name] = _value(spec, data, source, bound)
    names = [f.name for f in fields]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise InputError(source, f"unknown calibrator keys {unknown}")
    missing = [f.name for f in fields if not f.optional and f.name not in data]
    if missing:
        raise InputError(source, f"missing keys {missing}")
    for spec in fields:
        if spec.name not in values:
            values[spec.name] = _value(spec, data, source, bound)
    return values


def shown_value(value: Any) -> str:
    """``value`` as an error shows it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _value(spec: Field, data: dict[str, Any], source: str, bound: dict[str, int]) -> Any:
    value = data.get(spec.name)
    if value is None and (spec.nullable or (spec.optional and spec.name not in data)):
        return None
    return _read(spec, value, source, bound)


def _read(spec: Field, value: Any, source: str, bound: dict[str, int]) -> Any:
    name = spec.name
    if spec.kind == "choice":
        if isinstance(value, bool) or not isinstance(value, str) or value not in spec.choices:
            shown = " or ".join(map(str, spec.choices))
            raise InputError(source, f"unknown {name} {shown_value(value)}", f"{name} is {shown}")
        return value
    if spec.kind == "text":
        if not isinstance(value, str) or len(value) > MAX_TEXT:
            raise InputError(source, f"{name} must be a string of at most {MAX_TEXT} characters")
        return value
    if spec.kind == "digest":
        if not isinstance(value, str) or len(value) != 64 or not set(value) <= _HEX:
            raise InputError(
                source,
                f"{name} must be a SHA-256 (64 lowercase hex digits), got {shown_value(value)}",
            )
        return value
    if spec.kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(source, f"{name} must be a whole number, got {shown_value(value)}")
        if not spec.low <= value <= spec.high:
            raise InputError(source, spec.out_of_range(value))
        return value
    if spec.kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputError(source, f"{name} must be a number, got {shown_value(value)}")
        if not math.isfinite(value):
            raise InputError(source, f"{name} must be finite, got {value!r}")
        if not spec.low <= value <= spec.high:
            raise InputError(source, spec.out_of_range(value))
        return float(value)
    return _array(spec, value, spec.shape, source, bound)


def _array(
    spec: Field, value: Any, shape: tuple[Dimension, ...], source: str, bound: dict[str, int]
) -> Any:
    """An array of ``shape``; a ``None`` dimension makes each row its own array (bound names
    inside it are bound per row, so they are not shared across rows)."""
    name = spec.name
    if not isinstance(value, list) or not value:
        raise InputError(source, f"{name} must be {_shape_text(spec.shape)}")
    _check_length(spec, shape[0], len(value), source, bound)
    if len(shape) > 1 and shape[0] is None:
        return [_array(spec, row, shape[1:], source, dict(bound)) for row in value]
    if len(shape) > 1 and any(dim is None for dim in shape[1:]):
        return [_array(spec, row, shape[1:], source, bound) for row in value]
    rows = value
    for depth in range(1, len(shape)):
        if not all(isinstance(row, list) for row in rows):
            raise InputError(source, f"{name} must be {_shape_text(spec.shape)}")
        lengths = {len(row) for row in rows}
        if len(lengths) > 1:
            raise InputError(source, f"{name} must have rows of one length")
        _check_length(spec, shape[depth], lengths.pop() if lengths else 0, source, bound)
        rows = [item for row in rows for item in row]
    if not set(map(type, rows)) <= {float, int}:
        for item in rows:
            if isinstance(item, bool) or not isinstance(item, int | float):
                raise InputError(source, f"{name} must hold numbers only, got {shown_value(item)}")
    out = np.asarray(value, dtype=np.float64)
    if not np.isfinite(out).all():
        raise InputError(source, f"{name} must be finite")
    if out.size and not (spec.low <= out.min() and out.max() <= spec.high):
        worst = out.min() if out.min() < spec.low else out.max()
        raise InputError(source, spec.out_of_range(float(worst)))
    return out


def _check_length(
    spec: Field, dim: Dimension, length: int, source: str, bound: dict[str, int]
) -> None:
    if isinstance(dim, int) and length != dim:
        raise InputError(source, f"{spec.name} must have {dim} entries, got {length}")
    if isinstance(dim, str):
        if length == 0:
            raise InputError(source, f"{spec.name} must be {_shape_text(spec.shape)}")
        if bound.setdefault(dim, length) != length:
            raise InputError(
                source,
                f"{spec.name} has {length} entries where {dim} = {bound[dim]} "
                "(from the fields before it)",
            )
    if dim is None and length == 0:
        raise InputError(source, f"{spec.name} must be {_shape_text(spec.shape)}")


def _shape_text(shape: tuple[Dimension, ...]) -> str:
    """``a non-empty list of lists of numbers (K×D)``."""
    words = "a non-empty list of " + "lists of " * (len(shape) - 1) + "numbers"
    sizes = "×".join("n" if dim is None else str(dim) for dim in shape)
    return words if all(dim is None for dim in shape) else f"{words} ({sizes})"


def saved_value(value: Any) -> Any:
    """A map's value as its saved body holds it: rows (tuples, lists, ``array("d")``) as JSON
    lists, numbers and names as they are."""
    if isinstance(value, tuple | list | array_module.array):
        return [saved_value(item) for item in value]
    return value


def held_value(value: Any) -> Any:
    """A checked value (:func:`read_fields`) as a frozen map holds it: an array, or a list of
    rows, as (nested) tuples of floats; numbers and names as they are."""
    if isinstance(value, np.ndarray):
        return tuple(value.tolist()) if value.ndim == 1 else tuple(map(held_value, value))
    if isinstance(value, list):
        return tuple(map(held_value, value))
    return value


class SavedMap:
    """The base of every calibration map: fitted (by its registry entry's ``fit``), applied
    (:meth:`apply`: float64 log-probabilities; :meth:`probabilities`), saved (:meth:`to_dict`)
    and read back (:meth:`from_dict`: the fields of :meth:`saved_fields` checked by
    :func:`read_fields`, then :meth:`from_fields`), and checked against the model it is applied
    with (:meth:`check_model`; nothing for a map of scores)."""

    FIELDS: ClassVar[tuple[Field, ...]] = ()

    @classmethod
    def saved_fields(cls, data: Mapping[str, Any]) -> tuple[Field, ...]:
        """The fields of the saved body ``data`` (a map whose fields depend on its method or
        structure reads them from ``data``)."""
        return cls.FIELDS

    @classmethod
    def from_fields(cls, values: dict[str, Any], source: str) -> Any:
        """The map of checked ``values`` (:func:`read_fields`); faults beyond the fields' own
        are :class:`InputError` naming ``source``. Here: every value the class holds as a
        field, its arrays as tuples of numbers (:func:`held_value`; a value it does not hold,
        a fixed ``method``, is only checked); a map with rules of its own checks them first."""
        held = {item.name for item in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**{name: held_value(value) for name, value in values.items() if name in held})

    @classmethod
    def from_dict(cls, data: Any, source: str = "calibrator") -> Any:
        """Rebuild from :meth:`to_dict` output; every fault is an :class:`InputError` naming
        ``source``. Nothing in the body is run: it is numbers and names."""
        if not isinstance(data, dict):
            raise InputError(source, f"expected a JSON object, got {type(data).__name__}")
        return cls.from_fields(read_fields(data, cls.saved_fields(data), source), source)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form: each field of :attr:`FIELDS` by its name, in their order, rows of
        numbers as lists (a map whose saved fields depend on its method writes its own)."""
        return {spec.name: saved_value(getattr(self, spec.name)) for spec in self.FIELDS}

    def apply(self, scores: Any, kind: str = "logits", source: str = "scores") -> Any:
        raise NotImplementedError

    def probabilities(self, scores: Any, kind: str = "logits", source: str = "scores") -> Any:
        """float64 calibrated probabilities: exp of :meth:`apply`."""
        import torch

        return torch.exp(self.apply(scores, kind, source))

    def check_model(self, module: torch.nn.Module, where: str) -> None:
        """Refuse (an :class:`InputError` naming ``where``, the file) a map that does not
        belong to ``module``. A map of scores belongs to any model."""
