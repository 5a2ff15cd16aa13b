"""Per-module curvature: λmax and trace of each module's diagonal Hessian block.

The block of module M is H restricted to M's own parameters (``recurse=False``: a container's
children are blocks of their own): H_MM = ∇²_{θ_M} L with every other parameter fixed. Its
eigenvalues are not those of H, and Σ_M tr(H_MM) = tr(H).
"""

from __future__ import annotations

import glob

from curvcal.curvature.eigen import DEFAULT_TOL, power_iteration
from curvcal.curvature.gauss_newton import TensorTraces, trace_result
from curvcal.curvature.operator import HessianOperator
from curvcal.curvature.progress import OnStep, Stopped
from curvcal.curvature.results import LayerCurvature
from curvcal.curvature.trace import exact_trace, hutchinson_trace
from curvcal.settings.fields import former_keywords


def _module_of(parameter_name: str) -> str:
    return parameter_name.rpartition(".")[0]


@former_keywords(n_probes="probes", distribution="probe_dist")
def layer_curvature(
    operator: HessianOperator,
    *,
    tol: float = DEFAULT_TOL,
    max_iter: int | None = None,
    probes: int = 100,
    probe_dist: str = "rademacher",
    seed: int = 0,
    on_step: OnStep = None,
    gauss_newton: TensorTraces | None = None,
) -> list[LayerCurvature]:
    """λmax (power iteration with the λmax shift rule) and trace of each module's block.

    The modules are those owning one of ``operator``'s parameters, in parameter order. A block
    with at most ``probes`` parameters gets its exact trace (one product per parameter),
    a larger one a Hutchinson estimate with ``probes`` probes — unless ``gauss_newton``, the
    per-tensor traces of :func:`~curvcal.curvature.gauss_newton.tensor_traces` for an operator
    whose logits were shown linear in every tensor, gives every block its exact trace for free
    (the sum of its tensors' shares). ``on_step`` receives the count of modules finished, as
    each is finished and between the products of each module's λmax; when it raises
    :class:`~curvcal.curvature.progress.Stopped`, that is raised again carrying the list of the
    modules finished (the one running is dropped).
    """
    groups: dict[str, list[str]] = {}
    for name in operator.param_names:
        groups.setdefault(_module_of(name), []).append(name)
    results: list[LayerCurvature] = []
    for index, (module, names) in enumerate(groups.items()):
        block = operator.restrict([glob.escape(n) for n in names])
        try:
            spectrum = power_iteration(
                block,
                1,
                tol=tol,
                max_iter=max_iter,
                seed=seed,
                on_step=_between_products(on_step, index),
            )
        except Stopped as stop:  # the modules finished are kept; this one is not
            raise Stopped(list(results), stop.stage) from None
        size = block.shape[0]
        if gauss_newton is not None:
            trace = trace_result(gauss_newton, names)
        elif size <= probes:
            trace = exact_trace(block, probe_batch=operator.probe_batch)
        else:
            trace = hutchinson_trace(
                block,
                probes,
                probe_dist=probe_dist,
                seed=seed,
                probe_batch=operator.probe_batch,
            )
        results.append(
            LayerCurvature(
                module=module or "<root>",
                parameters=tuple(names),
                n_params=size,
                lambda_max=spectrum.values[0],
                trace=trace,
                engine=block.engine,
            )
        )
        if on_step is not None:
            try:
                on_step(index + 1)
            except Stopped as stop:
                raise Stopped(list(results), stop.stage) from None
    return results


def _between_products(on_step: OnStep, finished: int) -> OnStep:
    """The hook a module's λmax reports through: the count of modules finished before it."""
    if on_step is None:
        return None
    report = on_step
    return lambda _iterations: report(finished)
