"""Reading what curvcal printed independently of the terminal's width and of how long the
test's paths are.

The console wraps at the width of the terminal, or at ``COLUMNS`` off a terminal (120 when unset;
pytest-xdist's workers set 80), folding a word longer than a line in the middle; and a message
names a value of more than ``curvcal.errors.LONGEST_WORD`` characters (a path under a long
temporary folder) by its ends only. Tests compare with the text as it would read on one line and
with a path as curvcal shows it, never with a line width.
"""

from __future__ import annotations

import re
from os import PathLike

from curvcal.errors import shorten

#: A line break the console put in, with the indentation a wrapped table cell or panel adds.
_BREAK = r"[ \t]*\n[ \t]*"


def shown(value: str | PathLike[str], end: str = "") -> str:
    """``value`` (a path, an option's value) followed by ``end`` (the punctuation that closes
    its word, such as the ``:`` after the file an error names) as one of curvcal's messages
    shows them: whole up to ``LONGEST_WORD`` characters with ``end``, else the value's ends
    around an ellipsis, its length, then ``end``."""
    return shorten(f"{value}{end}")


def unwrapped(text: str) -> str:
    """``text`` on one line: every run of white space (a line break the console put in between
    two words among them) made one space."""
    return " ".join(text.split())


def _folded(word: str) -> str:
    return f"(?:{_BREAK})?".join(re.escape(char) for char in word)


def _phrase(phrase: str) -> re.Pattern[str]:
    return re.compile(r"\s+".join(_folded(word) for word in phrase.split()))


def said(phrase: str, text: str) -> bool:
    """Whether ``text`` says ``phrase`` whatever the width it was wrapped at: the words of
    ``phrase`` in order, separated by white space, each whole or folded over lines."""
    return _phrase(phrase).search(text) is not None


def times_said(phrase: str, text: str) -> int:
    """How many times ``text`` says ``phrase``, read as :func:`said` reads it."""
    return len(_phrase(phrase).findall(text))


def cells(table: str, row: str, column: str) -> list[str]:
    """The text of the cell that starts with ``column`` in each row of the rich ``table`` whose
    first line contains ``row``, put back on one line: a cell too wide for its column goes on
    in the same column of the lines below, until the next row starts (a line with text in the
    table's first column) or the table ends (a blank line)."""
    lines = table.splitlines()
    found = []
    for index, line in enumerate(lines):
        if row not in line or column not in line:
            continue
        start = line.index(column)
        indent = len(line) - len(line.lstrip())
        parts = [_cell_part(line, start)]
        for after in lines[index + 1 :]:
            if not after.strip() or len(after) - len(after.lstrip()) <= indent:
                break
            parts.append(_cell_part(after, start))
        found.append(" ".join(part for part in parts if part))
    return found


def _cell_part(line: str, start: int) -> str:
    """The part of ``line`` in the column starting at ``start``: up to the gap between columns
    (two spaces at least; a cell's own words are one space apart); nothing where the column is
    blank on that line."""
    rest = line[start:]
    if not rest or rest[0].isspace():
        return ""
    return re.split(r" {2,}", rest.rstrip(), maxsplit=1)[0]
