"""One value per single-valued option: ``--seed 1 --seed 2`` is refused, not "the last wins".

click keeps the last occurrence of an option silently, so a command line assembled from pieces
(a script's defaults, then the user's own ``--seed``) runs with a setting nobody chose knowingly.
:class:`RefuseRepeats` is mixed into every curvcal command and the group: before click's own
parse, it parses the arguments once more with every single-valued option collecting all its
occurrences, and refuses two *different* values of one option (exit 2, naming the option and
both values). The same value given twice, ``multiple=True`` options and counters are accepted.
"""

from __future__ import annotations

from typing import Any

import click

#: single-valued parser actions and the collecting action that stands in for each
_COLLECTING = {"store": "append", "store_const": "append_const"}


def _spelling(param: Any) -> str:
    names = [*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())]
    return "/".join(names) or str(getattr(param, "name", "?"))


def _shown(param: Any, value: Any) -> str:
    """A value as the user gave it; a flag's value as the spelling that sets it."""
    if isinstance(value, bool) and getattr(param, "is_flag", False):
        opts = list(getattr(param, "opts", ()))
        secondary = list(getattr(param, "secondary_opts", ()))
        if value and opts:
            return opts[-1]
        if not value and secondary:
            return secondary[-1]
    if isinstance(value, (tuple, list)):
        return " ".join(repr(str(v)) for v in value)
    return repr(str(value))


def refuse_repeats(command: click.Command, ctx: click.Context, args: list[str]) -> None:
    """Raise a :class:`click.UsageError` when a single-valued option of ``command`` occurs in
    ``args`` with two different values (compared as given, before conversion). Malformed
    arguments are left for click's own parse to report."""
    if ctx.resilient_parsing:  # shell completion: say nothing
        return
    parser = command.make_parser(ctx)
    # click's parser keeps its options in these two tables (private, stable since click 7);
    # a fresh parser is made per call, so changing their actions touches nothing else
    parsed = {id(o): o for o in [*parser._long_opt.values(), *parser._short_opt.values()]}
    collected: dict[str, Any] = {}
    for option in parsed.values():
        if option.action in _COLLECTING and option.dest is not None:
            option.action = _COLLECTING[option.action]
            collected[option.dest] = option.obj
    try:
        opts, _rest, _order = parser.parse_args(args=list(args))
    except click.ClickException:
        return
    for dest, param in collected.items():
        values = opts.get(dest)
        if not isinstance(values, list):
            continue
        distinct: list[Any] = []
        for value in values:
            if value not in distinct:
                distinct.append(value)
        if len(distinct) > 1:
            given = " and ".join(_shown(param, v) for v in distinct)
            raise click.UsageError(
                f"{_spelling(param)} given {len(values)} times with different values "
                f"({given}); give it once",
                ctx=ctx,
            )


class RefuseRepeats(click.Command):
    """A click command (or, mixed in first, a group) that refuses a single-valued option
    given twice with different values; see :func:`refuse_repeats`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        refuse_repeats(self, ctx, args)
        return super().parse_args(ctx, args)


#: the class every curvcal command is declared with: ``@click.command(cls=Command)``
Command = RefuseRepeats
