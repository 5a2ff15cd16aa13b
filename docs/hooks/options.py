"""MkDocs hook: the option tables of the command pages, from the commands' own click options.

A page says where a table goes with::

    ::: curvcal-options
        :module: curvcal.commands.hessian
        :command: hessian
        :prog_name: curvcal hessian

and gets the usage line and one row per option: its names, the kind of value, the help text
and the default exactly as ``--help`` prints them (click's own ``get_help_extra``; a default
that only a sentence can give is written at the end of the help as ``[default: ...]`` and is
moved to the default column). Cells are escaped for Markdown tables, so a ``|`` inside a help
text stays in its cell.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import click

_DIRECTIVE = re.compile(r"^::: curvcal-options\n((?:[ \t]+:\w+: .*\n?)+)", re.MULTILINE)
_FIELD = re.compile(r"^[ \t]+:(\w+): (.*)$", re.MULTILINE)
_DEFAULT_IN_HELP = re.compile(r"\s*\[default: (.*)\]\s*$")
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>|#])")


def cell(text: str) -> str:
    """``text`` as the content of a Markdown table cell: special characters escaped, one line."""
    text = _MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(text.split()))
    return text.replace("\\<", "&lt;").replace("\\>", "&gt;")


def code(text: str) -> str:
    """``text`` as inline code in a table cell (a ``|`` would end the cell, so it is an entity
    outside any code span)."""
    return " \\| ".join(f"`{part}`" for part in text.split("|"))


def _kind(option: click.Option, extra: dict[str, Any]) -> str:
    if option.is_flag:
        return "flag"
    kind = option.type
    if isinstance(kind, click.Choice):
        return "one of " + ", ".join(code(str(choice)) for choice in kind.choices)
    name = option.metavar or {
        "integer range": "integer",
        "float range": "number",
        "float": "number",
    }.get(kind.name, kind.name)
    if "range" in extra:
        name += " " + code(str(extra["range"]))
    if option.multiple:
        name += ", repeatable"
    return cell(name) if "`" not in name else name


def _default(option: click.Option, extra: dict[str, Any], help_default: str | None) -> str:
    if option.required:
        return "required"
    if "default" in extra:
        return code(str(extra["default"]))
    if help_default:
        return cell(help_default)
    if option.is_flag and not option.secondary_opts:
        return "off"
    return "—"


def option_row(option: click.Option, ctx: click.Context) -> str:
    """One table row: names, kind of value, help, default."""
    names = ", ".join(f"`{name}`" for name in option.opts)
    if option.secondary_opts:
        names += " / " + ", ".join(f"`{name}`" for name in option.secondary_opts)
    extra = dict(option.get_help_extra(ctx))
    help_text = option.help or ""
    found = _DEFAULT_IN_HELP.search(help_text)
    help_default = None
    if found:
        help_default, help_text = found.group(1), help_text[: found.start()]
    cells = [names, _kind(option, extra), cell(help_text), _default(option, extra, help_default)]
    return "| " + " | ".join(cells) + " |"


def options_markdown(module: str, command: str, prog_name: str) -> str:
    """The usage line and the option table of one command."""
    found = getattr(importlib.import_module(module), command)
    ctx = click.Context(found, info_name=prog_name)
    usage = found.get_usage(ctx).removeprefix("Usage: ")
    rows = [
        option_row(param, ctx)
        for param in found.get_params(ctx)
        if isinstance(param, click.Option) and not param.hidden
    ]
    return "\n".join(
        [
            "```text",
            usage,
            "```",
            "",
            "| Option | Value | Description | Default |",
            "| ------ | ----- | ----------- | ------- |",
            *rows,
            "",
        ]
    )


def on_page_markdown(markdown: str, **_: Any) -> str:
    def replace(match: re.Match[str]) -> str:
        fields = dict(_FIELD.findall(match.group(1)))
        return options_markdown(fields["module"], fields["command"], fields["prog_name"])

    return _DIRECTIVE.sub(replace, markdown)
