"""``--format html``: a report as one self-contained HTML page, to attach to a CI run.

Everything is inside the file: the style sheet, the tables, and the figures as ``data:`` URIs
(SVG, base64). No script, no font, no image is fetched from anywhere, so the page reads the
same offline, in a mail client or from an artifact store, and with JavaScript off. A judged
run (``check``, ``compare``) opens with its verdict (✅/❌, counts, model, data, policy,
baseline with its release); the tables follow as on the terminal (numbers right-aligned);
then, when matplotlib (the ``plot`` extra) is installed and the run measured them, the
reliability diagram and the Hessian spectrum.
"""

from __future__ import annotations

import base64
import html
import tempfile
from collections.abc import Sequence
from pathlib import Path

from curvcal.errors import bounded
from curvcal.report.judged import JudgedRun, judged_run
from curvcal.report.tables import Table, numeric_column, short_caption
from curvcal.report.verdict import VERDICT_COLUMNS, verdict_line
from curvcal.results import Report

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
.pass { color: #1a7f37; } .fail { color: #cf222e; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { border: 1px solid #d0d7de; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f6f8fa; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.broken td { background: #ffebe9; } p.caption { color: #57606a; font-size: .9em; }
figure { margin: 1em 0; } img { max-width: 100%; height: auto; }
"""


def html_report(report: Report, tables: Sequence[Table], explain: bool = False) -> str:
    """The page of ``report``: the verdict of a judged run, ``tables`` (a judged run's verdict
    table first), and its figures where they can be drawn."""
    judged = judged_run(report)
    title = f"curvcal {report.command}"
    body: list[str] = []
    if judged is not None:
        body.append(_verdict(judged))
        tables = [
            *(t for t in tables if t.columns == VERDICT_COLUMNS),
            *(t for t in tables if t.columns != VERDICT_COLUMNS),
        ]
        title += f": {judged.model.name}"
    else:
        body.append(f"<h1>{_text(title)}</h1>")
    body.extend(_table(table, explain) for table in tables)
    body.extend(_figure(name, svg) for name, svg in figures(report))
    if report.warnings:
        items = "".join(f"<li>{_text(w)}</li>" for w in report.warnings)
        body.append(f"<h2>warnings</h2>\n<ul>{items}</ul>")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{_text(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


def _verdict(judged: JudgedRun) -> str:
    css = "pass" if judged.verdict.passed else "fail"
    lines = [f'<h1 class="{css}">{_text(verdict_line(judged.verdict))}</h1>', "<p>"]
    about = f"curvcal {judged.command}: <b>{_text(judged.model.describe())}</b>"
    if judged.data_spec:
        about += f" on <code>{_text(judged.data_spec)}</code>"
        if judged.n_samples is not None:
            about += f", N = {judged.n_samples}"
    if judged.policy:
        about += f", policy <code>{_text(judged.policy)}</code>"
    lines.append(about + "<br>")
    baseline = judged.baseline.describe() if judged.baseline is not None else "none"
    lines.append(f"baseline: {_text(baseline)}</p>")
    return "\n".join(lines)


def _table(table: Table, explain: bool) -> str:
    numeric = [numeric_column(table, i) for i in range(len(table.columns))]
    parts = [f"<h2>{_text(table.title)}</h2>", "<table>"]
    if any(table.columns):
        heads = "".join(f"<th>{_text(c)}</th>" for c in table.columns)
        parts.append(f"<thead><tr>{heads}</tr></thead>")
    parts.append("<tbody>")
    result = table.columns.index("result") if table.columns == VERDICT_COLUMNS else None
    for row in table.rows:
        broken = result is not None and row[result] == "FAIL"
        cells = "".join(
            f'<td class="num">{_text(cell)}</td>'
            if i < len(numeric) and numeric[i]
            else f"<td>{_text(cell)}</td>"
            for i, cell in enumerate(row)
        )
        parts.append(f'<tr class="broken">{cells}</tr>' if broken else f"<tr>{cells}</tr>")
    parts.append("</tbody></table>")
    caption = short_caption(table.caption, explain)
    if caption:
        parts.append(f'<p class="caption">{_text(caption)}</p>')
    return "\n".join(parts)


def _text(text: str) -> str:
    """``text`` as the page shows it: cut as on the terminal when long
    (:func:`~curvcal.errors.bounded`: a person reads the page, and a 300,000-character
    state-dict key would be most of it; the JSON keeps it whole), then escaped."""
    return html.escape(bounded(text))


def _figure(name: str, svg: bytes) -> str:
    encoded = base64.b64encode(svg).decode("ascii")
    return (
        f'<figure><img alt="{_text(name)}" src="data:image/svg+xml;base64,{encoded}">'
        f"<figcaption>{_text(name)}</figcaption></figure>"
    )


def figures(report: Report) -> list[tuple[str, bytes]]:
    """The figures of ``report`` as SVG bytes, ``(name, svg)``: the reliability diagram of its
    calibration analysis and the spectrum of its Hessian analysis (a ``check`` that measured
    them, a ``calibrate``, ``metrics`` or ``hessian`` run); none without matplotlib or without
    the analyses. Drawn by :mod:`curvcal.report.plots` into a private temporary folder and
    read back."""
    from curvcal.calibration.analysis import CalibrationAnalysis
    from curvcal.curvature.results import HessianAnalysis

    results = report.results
    calibration = getattr(results, "calibration", None)
    hessian = getattr(results, "hessian", None)
    if isinstance(results, CalibrationAnalysis):
        calibration = results
    if isinstance(results, HessianAnalysis):
        hessian = results
    if not isinstance(calibration, CalibrationAnalysis):
        calibration = None
    if not isinstance(hessian, HessianAnalysis):
        hessian = None
    if calibration is None and hessian is None:
        return []
    from curvcal.errors import InputError
    from curvcal.report.calibration import reliability_panels
    from curvcal.report.plots import reliability_diagram, require_matplotlib, spectrum_plot

    try:
        require_matplotlib()
    except InputError:  # the plot extra is not installed: the page has the tables only
        return []

    judged = judged_run(report)
    caption = judged.model.describe() if judged is not None else None
    if judged is not None and judged.data_spec:
        caption = f"{caption} on {judged.data_spec}"
    drawn: list[tuple[str, bytes]] = []
    with tempfile.TemporaryDirectory(prefix="curvcal-html-") as folder:
        if calibration is not None:
            path = Path(folder) / "reliability.svg"
            reliability_diagram(reliability_panels(calibration), path, caption=caption)
            drawn.append(("reliability diagram", path.read_bytes()))
        if hessian is not None and hessian.spectrum.eigenvalues:
            path = Path(folder) / "spectrum.svg"
            trace = hessian.trace
            spectrum_plot(
                list(hessian.spectrum.eigenvalues),
                path,
                trace=None if trace is None else (trace.estimate, *trace.ci95),
                lambda_min=hessian.lambda_min,
                caption=caption,
            )
            drawn.append(("Hessian spectrum", path.read_bytes()))
    return drawn
