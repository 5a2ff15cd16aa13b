"""The tables and plots of a Hessian analysis (``curvcal hessian`` and ``curvcal demo``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from curvcal.report.tables import Table, fmt_float

if TYPE_CHECKING:
    from curvcal.curvature.results import EigenResult, HessianAnalysis


def write_plots(
    analysis: HessianAnalysis,
    spectrum_path: Path,
    layers_path: Path | None,
    caption: str | None = None,
) -> None:
    """The top-k eigenvalues with λmin and the trace when measured (and the SLQ density beside
    them when measured) and, when asked and measured, λmax and trace per module with the
    trace's 95% interval; ``caption`` (model and data) above each."""
    from curvcal.report.plots import per_layer_plot, spectrum_plot

    density = analysis.density
    trace = analysis.trace
    spectrum_plot(
        list(analysis.spectrum.eigenvalues),
        spectrum_path,
        None if density is None else list(density.grid),
        None if density is None else list(density.density),
        trace=None if trace is None else (trace.estimate, *trace.ci95),
        lambda_min=analysis.lambda_min,
        caption=caption,
    )
    if layers_path is not None and analysis.layers:
        per_layer_plot(
            [layer.module or "(root)" for layer in analysis.layers],
            [layer.lambda_max.value for layer in analysis.layers],
            [layer.trace.estimate for layer in analysis.layers],
            layers_path,
            trace_intervals=[layer.trace.ci95 for layer in analysis.layers],
            caption=caption,
        )


def plot_outputs(path: Path | None, per_layer: bool) -> list[tuple[str, Path]]:
    """The files ``--plot`` writes, as ``(option, path)``: the spectrum and, with
    ``per_layer``, the per-layer chart beside it."""
    if path is None:
        return []
    written = [("--plot", path)]
    if per_layer:
        written.append(("--plot (per-layer chart)", _layers_path(path)))
    return written


def _layers_path(path: Path) -> Path:
    return path.with_name(f"{path.stem}-layers{path.suffix}")


def plot_paths(path: Path, per_layer: bool, force: bool) -> tuple[Path, Path | None]:
    """The spectrum file and, with ``per_layer``, the per-layer file beside it
    (``spectrum.png`` -> ``spectrum-layers.png``), checked before any work."""
    from curvcal.errors import InputError
    from curvcal.report.plots import SUFFIXES, require_matplotlib
    from curvcal.report.tables import check_output_path

    if path.suffix.lower() not in SUFFIXES:
        raise InputError(
            "--plot", f"cannot tell the format of {path}", "name a .png, .svg or .pdf file"
        )
    require_matplotlib()
    layers = _layers_path(path) if per_layer else None
    for target in (path, layers):
        if target is not None:
            check_output_path(target, force)
    return path, layers


def hessian_tables(analysis: HessianAnalysis, device: str) -> list[Table]:
    """The tables of a Hessian analysis: eigenvalues, trace, per-module blocks and density
    (when measured), and the run (engine, mode, loss, N, P, device, products, seconds)."""
    tables = [_eigen_table(analysis)]
    if analysis.trace is not None:
        tables.append(_trace_table(analysis))
    if analysis.layers is not None:
        tables.append(_layers_table(analysis))
    if analysis.density is not None:
        tables.append(_density_table(analysis))
    tables.append(_run_table(analysis, device))
    return tables


#: how a table names each curvature kind (results.operator.curvature)
_KIND_NAMES = {
    "hessian": "Hessian",
    "ggn": "GGN",
    "fisher": "Fisher",
    "empirical-fisher": "empirical Fisher",
}


def _kind(analysis: HessianAnalysis) -> str:
    """The matrix measured, as the tables' titles say it."""
    kind = str(analysis.operator.get("curvature", "hessian"))
    return _KIND_NAMES.get(kind, kind)


def _digits(analysis: HessianAnalysis) -> int:
    """Significant digits of a value: 6, fewer when the model runs in bfloat16 or float16 (the
    products' precision floor allows no more; results.operator.significant_digits)."""
    return int(analysis.operator.get("significant_digits", 6))


def _value(value: float, digits: int) -> str:
    """``value`` to ``digits`` significant digits; positional (131, not 1.3e+02) when it is
    between 1e-3 and 1e6 and the digits are cut by a precision floor."""
    if digits >= 6 or value != value or not 1e-3 <= abs(value) < 1e6:
        return fmt_float(value, digits)
    decimals = digits - 1 - math.floor(math.log10(abs(value)))
    return f"{round(value, decimals):.{max(0, decimals)}f}"


def _converged(analysis: HessianAnalysis, result: EigenResult) -> str:
    """The converged cell of an eigenvalue: ``yes`` only when its residual met the tol asked
    for, else the reason it stopped (:func:`~curvcal.curvature.results.convergence_text`)."""
    from curvcal.curvature.results import convergence_text

    dtype = str(analysis.operator.get("model_dtype", ""))
    return convergence_text(result, analysis.spectrum.precision_floor, dtype)


def _eigen_table(analysis: HessianAnalysis) -> Table:
    spectrum = analysis.spectrum
    digits = _digits(analysis)
    rows = [
        (
            str(index + 1),
            _value(value.value, digits),
            fmt_float(value.residual, 2),
            str(value.iterations),
            str(value.matvecs),
            _converged(analysis, value),
        )
        for index, value in enumerate(spectrum.values)
    ]
    if analysis.smallest is not None:
        low = analysis.smallest.values[0]
        rows.append(
            (
                "min",
                _value(low.value, digits),
                fmt_float(low.residual, 2),
                str(low.iterations),
                str(low.matvecs),
                _converged(analysis, low),
            )
        )
    caption = (
        f"{spectrum.method}, tol {spectrum.tol:g}; λ1 is λmax, the largest algebraic eigenvalue"
    )
    bound = analysis.operator.get("accuracy_bound")
    if spectrum.precision_floor > spectrum.tol:
        caption += (
            f"; {analysis.operator.get('model_dtype', 'half-precision')} products: judged against "
            f"their precision floor {spectrum.precision_floor:.2g} (relative)"
        )
    if bound:
        caption += (
            f"; values within {bound:.2g} (relative) of the float64 model's (the "
            f"{analysis.operator.get('model_dtype', 'half-precision')} accuracy bound: the "
            f"precision floor plus its normalising layers), {digits} significant digits shown"
        )
    elif spectrum.precision_floor > spectrum.tol:
        caption += f", {digits} significant digits shown"
    if spectrum.shift is not None:
        caption += f"; dominant eigenvalue {spectrum.shift:.4g} was negative, so the search was shifted by it"
    return Table(
        title=f"{_kind(analysis)} eigenvalues",
        columns=("index", "λ", "residual", "iterations", "HVPs", "converged"),
        rows=tuple(rows),
        caption=caption,
    )


def _trace_table(analysis: HessianAnalysis) -> Table:
    trace = analysis.trace
    assert trace is not None
    digits = _digits(analysis)
    low, high = trace.ci95
    if trace.method == "gauss-newton":
        caption = (
            f"Gauss–Newton, {trace.n_probes} sample–eigenvector norms, no product; exact, so no "
            f"95% interval: the bounds shown are its rounding allowance ({trace.interval})"
        )
    else:
        caption = (
            f"{_TRACE_NAMES.get(trace.method, trace.method)}, {trace.matvecs} products, "
            f"{trace.distribution} probes; standard error {trace.standard_error:.3g}; "
            f"95% interval: {trace.interval}"
        )
    if trace.parts is not None:
        caption += (
            f"; tr(G) = {_value(trace.parts['gauss_newton'], digits)} (Gauss–Newton part, exact), "
            f"tr(R) ≈ {_value(trace.parts['residual'], digits)} (the network's own curvature)"
        )
    choice = analysis.operator.get("trace_choice")
    if choice:
        caption += f"; chosen by --trace-method auto: {choice}"
    if trace.rtol is not None:
        caption += f"; adaptive (rtol {trace.rtol:g}), stopped by {trace.stopped_by}"
    if trace.stopped_by == "exhausted":
        caption += "; the sketch spans the whole space, so no further product was spent"
    if trace.sketch_bytes:
        caption += f"; sketch memory {trace.sketch_bytes / 2**20:.4g} MiB"
    above = trace_below_lambda_max(analysis.lambda_max, trace.estimate, analysis.lambda_min)
    if above:
        caption += f"; {above}"
    bounds = f"[{_value(low, digits)}, {_value(high, digits)}]"
    return Table(
        title=f"{_kind(analysis)} trace",
        columns=("estimate", "95% CI", "products", "estimator"),
        rows=(
            (
                f"{_value(trace.estimate, digits)} (exact)"
                if trace.exact
                else f"{_value(trace.estimate, digits)} ± {fmt_float(trace.half_width, 3)}",
                f"rounding {bounds}" if trace.exact else bounds,
                str(trace.matvecs),
                trace.method,
            ),
        ),
        caption=caption,
    )


def trace_below_lambda_max(lambda_max: float, trace: float, lambda_min: float | None = None) -> str:
    """A note when λmax exceeds the trace ('' otherwise): tr(H) = Σ λ_i, so a trace below its
    largest term means negative eigenvalues pull the sum down (λmin named when measured).
    The study and hessian tables both say it through this one function."""
    if not lambda_max > trace:
        return ""
    note = (
        f"λmax {fmt_float(lambda_max, 4)} exceeds the trace {fmt_float(trace, 4)}: the trace "
        "is the sum of all eigenvalues, and negative ones pull it below the largest"
    )
    if lambda_min is not None:
        note += f" (λmin {fmt_float(lambda_min, 4)})"
    return note


_TRACE_NAMES = {
    "hutchpp": "Hutch++",
    "xtrace": "XTrace",
    "hutchinson": "Hutchinson",
    "gauss-newton": "Gauss–Newton",
    "gauss-newton+hutchpp": "Gauss–Newton part exact + Hutch++ on the rest",
    "gauss-newton+xtrace": "Gauss–Newton part exact + XTrace on the rest",
}


def _layers_table(analysis: HessianAnalysis) -> Table:
    digits = _digits(analysis)
    rows = tuple(
        (
            layer.module,
            f"{layer.n_params:,}",
            _value(layer.lambda_max.value, digits),
            _value(layer.trace.estimate, digits)
            + (" (exact)" if layer.trace.exact else f" ± {fmt_float(layer.trace.half_width, 3)}"),
            _converged(analysis, layer.lambda_max),
        )
        for layer in analysis.layers or []
    )
    return Table(
        title=f"per-module {_kind(analysis)} blocks",
        columns=("module", "params", "λmax", "trace", "converged"),
        rows=rows,
        caption=f"each block is the {_kind(analysis)} with respect to the module's own parameters; "
        + (
            "every block's trace is its exact Gauss–Newton share"
            if analysis.trace is not None and analysis.trace.method == "gauss-newton"
            else "traces of blocks up to --probes parameters are exact"
        ),
    )


def _density_table(analysis: HessianAnalysis) -> Table:
    density = analysis.density
    assert density is not None
    digits = _digits(analysis)
    return Table(
        title="eigenvalue density (SLQ)"
        if _kind(analysis) == "Hessian"
        else f"{_kind(analysis)} eigenvalue density (SLQ)",
        columns=("grid min", "grid max", "runs", "steps", "bandwidth"),
        rows=(
            (
                _value(density.grid[0], digits),
                _value(density.grid[-1], digits),
                str(density.runs),
                str(density.steps),
                fmt_float(density.bandwidth, 3),
            ),
        ),
        caption=(
            ""
            if density.reorthogonalised
            else "each run by the three-term Lanczos recurrence, without reorthogonalisation; "
        )
        + "the density itself is in the JSON result (results.density)"
        + (
            ""
            if density.reorthogonalised
            else "; its basis would exceed the memory budget or --max-basis; converged values "
            "repeat as copies that share their weight"
        ),
    )


def _central_difference_rows(product: dict[str, Any] | None) -> list[tuple[str, str]]:
    """A sharded model's products (central differences of gradients): their gradient passes
    beside the relative error measured on a Gaussian vector (and along the top eigenvector),
    and the products whose error was predicted over the stated bound at their best step."""
    if not product or "passes_per_product" not in product:
        return []
    error = f"relative error {product['relative_error_bound']:.1e} on a Gaussian vector"
    top = product.get("top_eigenvector")
    if top:
        error += f", {top['relative_error_bound']:.1e} along the top eigenvector"
    passes = (
        f"{product['passes_per_product']:.2f} gradient passes a product "
        f"(+{product['start_passes']} once)"
    )
    over = product.get("products_over_bound") or 0
    if over:  # their predicted error is the bound that holds for them
        error += (
            f"; {over} product{'s' if over > 1 else ''} predicted over the stated bound, up to "
            f"{product['worst_predicted_over_bound']:.2g}×"
        )
    return [("central-difference products", f"{passes}; {error}")]


def _warm_start_rows(warm: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The warm start's own products (each over its sample), beside the full data's."""
    if not warm:
        return []
    return [
        (
            "warm start (--warm-start)",
            f"{warm['n_matvecs']:,} products over {warm['n_samples']:,} samples "
            f"({warm['fraction']:g} of the data), λmax {warm['lambda_max']:.6g} there",
        )
    ]


def _run_table(analysis: HessianAnalysis, device: str) -> Table:
    op = analysis.operator
    loss = op["loss"] if op["loss"] != "focal" else f"{op['loss']} (γ = {op['gamma']:g})"
    engine = op["engine"] + (" (fallback)" if op.get("engine_fallback") else "")
    rows = [
        ("loss", f"{loss}, mean over all samples = {_value(op['mean_loss'], _digits(analysis))}"),
        ("mode", op["mode"]),
        ("engine", engine),
        ("samples (N)", f"{op['n_samples']:,}"),
        ("parameters (P)", f"{op['n_params']:,}"),
        (
            "device",
            device + (f" × {op['world_size']} processes" if op.get("world_size", 1) > 1 else ""),
        ),
        ("Hessian-vector products", f"{op['n_matvecs']:,}"),
        *_warm_start_rows(op.get("warm_start")),
        ("passes over the data", f"{op['n_data_passes']:,}"),
        *_central_difference_rows(op.get("product")),
        ("seconds", fmt_float(sum(analysis.timings.values()), 3)),
    ]
    return Table(title="run", columns=("item", "value"), rows=tuple(rows))
