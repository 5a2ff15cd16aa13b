"""Reading JSON a user gave, within bounds every curvcal reader can live with.

Every JSON document curvcal reads (a report, a baseline, a calibrator, an HF ``config.json``, a
``.jsonl`` line, a safetensors header, ``--arch-kwargs``) goes through :func:`loads`. Beyond the
decoder's own syntax errors (:class:`json.JSONDecodeError`, left to the caller, who knows how to
name the line), it refuses, as an :class:`~curvcal.errors.InputError` naming ``what``:

- nesting deeper than :data:`MAX_DEPTH` arrays or objects (the decoder recurses once per level,
  and so do the walkers after it: 200,000 ``[`` would be a RecursionError deep inside either);
- an integer outside the 64-bit signed range (no count, index, label, seed or size curvcal
  uses is larger, ``float()`` of one with 309 digits raises OverflowError, and one with more
  than 4,300 digits does not even convert);
- an object that names one key twice (the decoder keeps the last, so a saved temperature or a
  config value could be read as something other than what a reader of the file sees first).

A library's own metadata (a Hugging Face ``config.json`` or ``tokenizer_config.json``, a saved
dataset's ``state.json``) is read with ``wide_ints=True``: transformers writes
``model_max_length`` as 10³⁰ to mean "no limit", so there an integer beyond 64 bits but within
float64's range (at most 308 digits) is read as the float it stands for, and only a longer one
is refused.
"""

from __future__ import annotations

import json
import re
from typing import Any

from curvcal.errors import InputError

#: Deepest nesting of arrays and objects accepted (curvcal's own reports reach about 8).
MAX_DEPTH = 100

#: Largest magnitude of a JSON integer accepted: the 64-bit signed range torch and numpy index with.
MAX_INT = 2**63 - 1

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")

# more digits than any int64 has: refused before int() spends time on (or refuses) the text
_MAX_INT_DIGITS = len(str(MAX_INT))
# the most digits an integer float64 can hold the magnitude of (10**308 < max float < 10**309)
_MAX_FLOAT_DIGITS = 308


def loads(text: str | bytes, what: str, *, wide_ints: bool = False) -> Any:
    """Parse ``text`` as JSON; too deep or too large an integer is an InputError on ``what``
    (with ``wide_ints``, integers beyond 64 bits up to 308 digits are read as floats).

    Syntax errors are raised as :class:`json.JSONDecodeError` (a ValueError), as by
    :func:`json.loads`; a bytes ``text`` that is not UTF-8 raises UnicodeDecodeError.
    """
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8")
    if _bracket_depth_at_least(text, MAX_DEPTH + 1):
        raise _too_deep(what)
    try:
        value = json.loads(
            text,
            parse_int=lambda digits: _parse_int(digits, what, wide_ints),
            object_pairs_hook=lambda pairs: _unique_keys(pairs, what),
        )
    except RecursionError:  # pragma: no cover - the scan above refuses these first
        raise _too_deep(what) from None
    return value


def _unique_keys(pairs: list[tuple[str, Any]], what: str) -> dict[str, Any]:
    """The object of ``pairs``, refused when a key appears twice."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise InputError(
                what,
                f"the JSON object key {key!r} appears more than once",
                "give each key once: JSON readers disagree on which value wins",
            )
        obj[key] = value
    return obj


def _too_deep(what: str) -> InputError:
    return InputError(
        what,
        f"JSON nested more than {MAX_DEPTH} levels deep",
        "no curvcal input nests that deep",
    )


def _parse_int(digits: str, what: str, wide: bool = False) -> int | float:
    magnitude = digits.lstrip("-")
    if (
        wide
        and _MAX_INT_DIGITS <= len(magnitude) <= _MAX_FLOAT_DIGITS
        and abs(int(digits)) > MAX_INT
    ):
        return float(int(digits))
    if len(magnitude) > _MAX_INT_DIGITS or abs(int(digits)) > MAX_INT:
        shown = digits if len(digits) <= 24 else f"{digits[:12]}…({len(magnitude)} digits)"
        raise InputError(
            what,
            f"the JSON integer {shown} is outside the 64-bit range (±{MAX_INT:.2e})",
        )
    return int(digits)


def _bracket_depth_at_least(text: str, limit: int) -> bool:
    """Whether ``[`` / ``{`` outside strings nest ``limit`` deep somewhere in ``text``.

    A quick count first (no text nests deeper than it has openers); then strings are cut out
    and only the brackets left are walked, so a large flat document costs two regex passes.
    """
    if text.count("[") + text.count("{") < limit:
        return False
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    depth = 0
    for char in brackets:
        if char in "[{":
            depth += 1
            if depth >= limit:
                return True
        else:
            depth -= 1
    return False
