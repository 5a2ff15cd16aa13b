"""Griffe extension: curvcal's reStructuredText-flavoured docstrings as Markdown for the API pages.

The docstrings keep the Sphinx roles the code is written with; on the docs site

- ``:class:`~curvcal.errors.InputError``` (and ``:func:``, ``:meth:``, ``:mod:``, ``:data:``,
  ``:attr:``, ``:exc:``, ``:obj:``) becomes a cross-reference to the object's page when the
  site documents it, else inline code (a name without dots is looked up where the docstring
  is, as Python would; ``~`` shows the last part only; ``title <target>`` shows ``title``);
- a run of ``>>>`` lines and their output becomes a fenced ``pycon`` block (instead of one
  paragraph);
- a paragraph ending in ``::`` before an indented literal block ends in ``:``.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|data|attr|exc|obj):`([^`]+)`")
_TITLED = re.compile(r"^(.*?)\s*<([^<>]+)>$", re.DOTALL)
_LITERAL_MARKER = re.compile(r"::\n(?=\n[ \t]+\S)")


def _resolve(name: str, obj: griffe.Object | griffe.Alias) -> str | None:
    """The full path of ``name`` as seen from ``obj``'s docstring, or None."""
    if name.startswith("curvcal."):
        return name
    head, _, rest = name.partition(".")
    scope: Any = obj
    while scope is not None:
        members = getattr(scope, "members", {})
        if head in members:
            member = members[head]
            path = member.target_path if isinstance(member, griffe.Alias) else member.path
            return f"{path}.{rest}" if rest else path
        scope = scope.parent
    return None


def _role(match: re.Match[str], obj: griffe.Object | griffe.Alias) -> str:
    text = " ".join(match.group(2).split())
    titled = _TITLED.match(text)
    if titled:
        title, target = titled.group(1), titled.group(2)
    else:
        target = text.lstrip("~")
        title = target.rsplit(".", 1)[-1] if text.startswith("~") else target
    if match.group(1) in ("func", "meth") and not title.endswith(")"):
        title += "()"
    path = _resolve(target, obj)
    shown = f"<code>{html.escape(title)}</code>"
    if path is None or not path.startswith("curvcal"):
        return shown
    return f'<autoref identifier="{html.escape(path)}" optional>{shown}</autoref>'


def _fence_doctests(text: str) -> str:
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith(">>>"):
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
                i += 1
            if out and out[-1].strip():
                out.append("")
            out += [f"{indent}```pycon", *(indent + line for line in block), f"{indent}```"]
            continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def markdown_docstring(text: str, obj: griffe.Object | griffe.Alias) -> str:
    """The docstring ``text`` of ``obj`` in the Markdown mkdocstrings renders."""
    text = _ROLE.sub(lambda match: _role(match, obj), text)
    text = _LITERAL_MARKER.sub(":\n", text)
    return _fence_doctests(text)


class SphinxRolesToMarkdown(griffe.Extension):
    """Rewrite every docstring once, after the whole package is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._walk(pkg, set())

    def _walk(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value, obj)
        for member in obj.members.values():
            if not isinstance(member, griffe.Alias):
                self._walk(member, seen)
