"""What every command shares: output options, the per-run context, and the final emit."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click

from curvcal import inputs as run_inputs
from curvcal.commands.clashes import Named, refuse_clashes
from curvcal.console import Reporter
from curvcal.errors import (
    EXIT_CHECK_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NUMERICAL,
    EXIT_OK,
    CurvcalError,
)
from curvcal.report.outputs import FORMATS, emit, refuse_unjudged_formats
from curvcal.report.tables import Table, check_output_path
from curvcal.results import STATUS_ERROR, STATUS_FAIL, STATUS_INTERRUPTED, Report

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class OutputOptions:
    """Output settings; given on the group (``curvcal --json hessian``) or on the command."""

    fmt: str = "table"
    output: Path | None = None
    force: bool = False
    quiet: bool = False
    debug: bool = False
    explain: bool = False
    verbose: bool = False
    #: the option that set each of ``fmt`` and ``output``, to refuse a second, different one
    given: dict[str, str] = field(default_factory=dict)


def get_output_options(ctx: click.Context | None = None) -> OutputOptions:
    ctx = ctx or click.get_current_context()
    root = ctx.find_root()
    if not isinstance(root.obj, OutputOptions):
        root.obj = OutputOptions()
    return root.obj


def typed_options(names: Iterable[str]) -> list[str]:
    """Those of the current command's parameters ``names`` that were given (on the command line
    or by an environment variable), not left at their defaults; in the order of ``names``."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    return [
        name
        for name in names
        if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)
    ]


def _setter(attr: str, transform: Callable[[Any], Any] = lambda v: v) -> Callable[..., None]:
    """The callback that records an output option; ``fmt`` and ``output`` may be given on the
    group and on the command, but not as two different values (``--json --format table``, two
    ``-o`` files): the last would win unnoticed."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value in (None, False):
            return
        options = get_output_options(ctx)
        new = transform(value)
        spelled = f"{param.opts[0] if param.opts else param.name} {value}".replace(" True", "")
        if attr in ("fmt", "output"):
            before = options.given.get(attr)
            if before is not None and getattr(options, attr) != new:
                raise click.UsageError(f"{before} and {spelled} disagree; give one of them")
            options.given[attr] = spelled
        setattr(options, attr, new)

    return callback


def _flag(option: str, attr: str, help: str, *more: str) -> Callable[[F], F]:
    """An output switch recorded in :class:`OutputOptions` (``attr``)."""
    return click.option(
        option, *more, attr, is_flag=True, expose_value=False, callback=_setter(attr), help=help
    )


#: ``--policy FILE`` of ``check`` and ``compare`` (the keyword ``policy_path``; None: the
#: ``[tool.curvcal]`` table of ./pyproject.toml, :func:`~curvcal.policy.parse.policy_file`)
policy_option = click.option(
    "--policy",
    "policy_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Policy TOML file [default: [tool.curvcal] in ./pyproject.toml].",
)


def output_options(func: F) -> F:
    """Add ``--json``, ``--format``, ``-o/--output``, ``--force``, ``-q/--quiet``, ``--debug``,
    ``--explain``, ``--verbose``."""
    decorators = [
        click.option(
            "--json",
            "as_json",
            is_flag=True,
            expose_value=False,
            callback=_setter("fmt", lambda _v: "json"),
            help="Write only the JSON result to stdout.",
        ),
        click.option(
            "--format",
            "fmt",
            type=click.Choice(FORMATS),
            expose_value=False,
            callback=_setter("fmt"),
            help="Output on stdout: table (default), json, markdown, html; for check and "
            "compare also junit, github (workflow commands) and model-card.",
        ),
        click.option(
            "-o",
            "--output",
            "--out",
            "output",
            type=click.Path(dir_okay=False, path_type=Path),
            expose_value=False,
            callback=_setter("output"),
            help="Also write the result to this file (atomically), as its suffix says: .json "
            "(JSON; any other suffix too), .md, .html, and for check and compare .xml "
            "(JUnit) and .yml/.yaml (model card).",
        ),
        _flag("--force", "force", "Overwrite an existing --output file."),
        _flag(
            "-q", "quiet", "No progress or messages on stderr (warnings still shown).", "--quiet"
        ),
        _flag("--debug", "debug", "Show a traceback on errors."),
        _flag("--explain", "explain", "Show the tables' captions whole (the conventions)."),
        _flag(
            "--verbose",
            "verbose",
            "Also show the detail tables a summary stands for (calibrate/metrics --method all: "
            "the per-metric tables, the fits and the reliability bins; the JSON has them always).",
        ),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def start(
    inputs: Sequence[Named] = (), outputs: Sequence[Named] = ()
) -> tuple[OutputOptions, Reporter]:
    """Called first by every command, with the files its options name that the run reads
    (``inputs``) and writes besides ``-o`` (``outputs``, as ``(option, path)``): refuses,
    before any work, an output that would replace an input or another output, whatever
    ``--force`` says, then checks that ``-o`` can be written. The inputs join the run's record
    (:mod:`curvcal.inputs`), with every file the loaders open later, and the outputs' options
    name them when a write is refused at publication."""
    options = get_output_options()
    written = [("-o/--output", options.output)] if options.output is not None else []
    ctx = click.get_current_context()
    if not run_inputs.active():  # a command invoked without the group (the group records)
        ctx.find_root().with_resource(run_inputs.recording())
    refuse_clashes([*written, *outputs], inputs)
    run_inputs.declare(inputs)
    run_inputs.name_outputs([*written, *outputs])
    refuse_unjudged_formats(ctx.command.name or "", options.fmt, options.output)
    if options.output is not None:
        check_output_path(options.output, options.force)
    reporter = Reporter(quiet=options.quiet)
    ctx.find_root().meta[_REPORTER] = reporter
    return options, reporter


#: where :func:`start` keeps the run's reporter for :func:`finish`
_REPORTER = "curvcal.reporter"


def current_reporter() -> Reporter | None:
    """The running command's reporter, once :func:`start` has made it (None before, or
    outside a command)."""
    ctx = click.get_current_context(silent=True)
    reporter = ctx.find_root().meta.get(_REPORTER) if ctx is not None else None
    return reporter if isinstance(reporter, Reporter) else None


def finish(report: Report, tables: Sequence[Table]) -> int:
    """Emit the report, its tables after what was measured
    (:func:`~curvcal.report.header.measured_table`, for every command alike), and return the
    exit code its status implies. Every warning the run's reporter said on stderr is in the
    report's ``warnings`` (the one path by which a warning reaches the JSON as well as stderr):
    those the pipeline did not record are added, in the order they were said."""
    options = get_output_options()
    from curvcal.report.header import measured_table

    reporter = click.get_current_context().find_root().meta.get(_REPORTER)
    if isinstance(reporter, Reporter):
        recorded = set(report.warnings)
        missing = [message for message in reporter.warned if message not in recorded]
        report.warnings = [*report.warnings, *dict.fromkeys(missing)]
    emit(
        report,
        tables,
        options.fmt,
        options.output,
        options.explain,
        measured_table(report),
        options.verbose,
    )
    if report.status == STATUS_FAIL:
        return EXIT_CHECK_FAILED
    if report.status == STATUS_ERROR:
        return EXIT_NUMERICAL
    if report.status == STATUS_INTERRUPTED:  # the stages finished are written; say so last
        click.echo("curvcal: interrupted", err=True)
        return EXIT_INTERRUPTED
    return EXIT_OK


def end_with(failure: CurvcalError | None, code: int) -> int:
    """The exit code of a run whose report is out: ``code`` (:func:`finish`'s), or, for a
    ``failure`` found in the results (``--strict``'s unconverged estimate, a gated metric that
    came out NaN), its one ``curvcal: error:`` line and its exit code. Returned, not raised: the
    run ended with a result, so the outputs it wrote (the report that says ``status: error``,
    the plots) stay, where an error raised removes them (:func:`curvcal.cli.main`) — and with
    ``--force``, the file they replaced would be lost with them."""
    if failure is None:
        return code
    click.echo(f"curvcal: error: {failure.message}", err=True)
    return failure.exit_code
