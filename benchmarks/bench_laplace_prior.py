"""Laplace's prior precision by held-out NLL (``--laplace-prior nll``): the search before and
after the descent from the probit minimum, on the bundled digits as ``calibrate`` fits them.

The problem is the one ``curvcal calibrate digits_cnn.safetensors --data curvcal:digits
--method laplace --laplace-prior nll`` solves: the inputs of the bundled DigitsCNN's last
``nn.Linear`` (D = 32, K = 10, a bias: P = 330) on the bundled 797 digits, the fit split of
``--val-split 0.5 --seed 0`` (398 rows, :func:`~curvcal.load.datasets.labels.stratified_split`). For each
structure (``full``, ``kron``) and predictive (``probit``, ``mc`` with ``--samples`` draws) two
searches are timed, each from the folds' GGNs to the chosen δ:

- ``before``: the rule as it was: :func:`~curvcal.calibration.laplace.heldout_nll` asked at
  all 65 grid points (:func:`~curvcal.calibration.laplace.minimise_on_grid` without a start),
  then SciPy's bounded Brent method in log δ between the grid neighbours of the minimum
  (``xatol`` 1e-10), kept when no worse (:func:`previous_search`);
- ``after``: :func:`~curvcal.calibration.laplace.search_prior_precision`, what ``calibrate``
  runs: the probit NLL of the grid at once, the Monte Carlo objective asked only on the
  descent from the probit minimum, then Brent's method started from the grid minimum and its
  two neighbours.

One thread, the two interleaved in each repeat, the minimum of ``--repeats`` CPU seconds
(``time.process_time``); each row gives the δ at which the held-out NLL was computed, both
δ and the ratio. ``--agreement HEADS`` also runs both Monte Carlo searches on that many random
heads (:func:`random_head`: 1 to 100 draws, over- and under-confident, Gaussian or ReLU
features) and says how often they choose the same grid point.

    OMP_NUM_THREADS=1 python benchmarks/bench_laplace_prior.py --repeats 5
    OMP_NUM_THREADS=1 python benchmarks/bench_laplace_prior.py --repeats 1 --agreement 300
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from curvcal.calibration import laplace as lp

#: ``--quick``: a synthetic head of 120 rows (D = 6, K = 4) instead of the digits.
QUICK = (120, 6, 4)


def digits_problem() -> dict[str, Any]:
    """The fit split of the bundled digits as ``calibrate --val-split 0.5 --seed 0`` takes it:
    the last layer's input features (float64), labels, weight and bias."""
    from safetensors.torch import load_file

    from curvcal.assets import demo_checkpoint, demo_data
    from curvcal.load.checkpoint import load_model
    from curvcal.load.datasets.labels import stratified_split
    from curvcal.settings.checkpoint import CheckpointSettings

    model = load_model(demo_checkpoint(), CheckpointSettings(device="cpu")).module.eval()
    data = load_file(str(demo_data()))
    _name, head = lp.last_linear(model)
    caught: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda _m, args, _out: caught.append(args[0].detach()))
    with torch.no_grad():
        model(data["x"])
    handle.remove()
    labels = data["y"].to(torch.int64)
    fit, _evaluation = stratified_split(labels, 0.5, 0)
    return {
        "features": caught[0][fit].to(torch.float64),
        "labels": labels[fit],
        "weight": head.weight.detach().to(torch.float64),
        "bias": head.bias.detach().to(torch.float64),
        "name": "bundled digits, fit split (398 × 32, K = 10)",
    }


def synthetic_problem(n: int, d: int, k: int, seed: int = 0) -> dict[str, Any]:
    """A head of ``k`` classes over ``d`` Gaussian features and labels drawn from softmax(½f)."""
    g = torch.Generator().manual_seed(seed)
    weight = 2.0 * torch.randn(k, d, generator=g, dtype=torch.float64) / math.sqrt(d)
    bias = torch.randn(k, generator=g, dtype=torch.float64)
    features = torch.randn(n, d, generator=g, dtype=torch.float64)
    logits = features @ weight.T + bias
    labels = torch.multinomial(torch.softmax(0.5 * logits, 1), 1, generator=g)[:, 0]
    return {"features": features, "labels": labels, "weight": weight, "bias": bias,
            "name": f"synthetic ({n} × {d}, K = {k})"}  # fmt: skip


def previous_search(objective: Any, grid: tuple[float, ...] = lp.NLL_GRID) -> lp.PriorSearch:
    """The search before the descent: every grid point asked, then SciPy's bounded Brent
    method between the grid neighbours of the minimum, kept when no worse."""
    from scipy.optimize import minimize_scalar

    memo: dict[float, float] = {}

    def asked(delta: float) -> float:
        if delta not in memo:
            memo[delta] = objective(delta)
        return memo[delta]

    on_grid = lp.minimise_on_grid(asked, grid, refine=False)
    best = grid.index(on_grid.grid_choice)
    if on_grid.at_bracket_end:
        return replace(on_grid, asked=len(memo))
    found = minimize_scalar(
        lambda t: asked(math.exp(t)),
        bounds=(math.log(grid[best - 1]), math.log(grid[best + 1])),
        method="bounded",
        options={"xatol": 1e-10},
    )
    refined = math.exp(float(found.x))
    value = asked(refined)
    if value <= on_grid.objective:
        return replace(on_grid, prior_precision=refined, objective=value, asked=len(memo))
    return replace(on_grid, asked=len(memo))


def search(problem: dict[str, Any], structure: str, predictive: str, samples: int,
           previous: bool) -> tuple[float, lp.PriorSearch]:  # fmt: skip
    """CPU seconds and the result of one search, from the folds' GGNs on."""
    phi, labels = problem["features"], problem["labels"]
    weight, bias = problem["weight"], problem["bias"]
    start = time.process_time()
    probs = torch.softmax(phi @ weight.T + bias, 1)
    folds = lp.heldout_folds(phi, probs, labels, True, structure, lp.PRIOR_FOLDS, 0)
    template = lp.LaplaceMap(weight, bias, 1.0, structure, predictive, samples, 0, "")
    if previous:
        found = previous_search(lambda delta: lp.heldout_nll(delta, folds, template))
    else:
        found = lp.search_prior_precision(folds, template)
    return time.process_time() - start, found


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    problem = synthetic_problem(*QUICK) if args.quick else digits_problem()
    rows = []
    for structure in args.structures.split(","):
        for predictive in args.predictives.split(","):
            best: dict[str, float] = {}
            found: dict[str, lp.PriorSearch] = {}
            for _ in range(args.repeats):
                for name in ("before", "after"):
                    seconds, found[name] = search(
                        problem, structure, predictive, args.samples, name == "before"
                    )
                    best[name] = min(best.get(name, math.inf), seconds)
            before, after = found["before"], found["after"]
            rows.append(
                {
                    "problem": problem["name"],
                    "structure": structure,
                    "predictive": predictive if predictive == "probit" else f"mc ({args.samples})",
                    "before_seconds": best["before"],
                    "after_seconds": best["after"],
                    "ratio": best["before"] / max(best["after"], 1e-9),
                    "before_evaluations": before.asked,
                    "after_evaluations": after.asked,
                    "delta_before": before.prior_precision,
                    "delta_after": after.prior_precision,
                    "delta_rel_diff": abs(after.prior_precision / before.prior_precision - 1),
                    "same_grid_point": before.grid_choice == after.grid_choice,
                }
            )
    return rows


def random_head(rng: random.Random) -> tuple[dict[str, Any], str, int, int]:
    """One head of the agreement study: sizes, scale, label temperature (over- or
    under-confident), Gaussian or ReLU features, structure, draws and seed drawn by ``rng``."""
    n, k, d = rng.choice([40, 80, 150, 300]), rng.choice([2, 3, 5, 10]), rng.choice([2, 4, 8, 16])
    g = torch.Generator().manual_seed(rng.randrange(10**6))
    weight = rng.choice([0.3, 1.0, 3.0, 10.0]) * torch.randn(k, d, generator=g,
                                                             dtype=torch.float64) / math.sqrt(d)  # fmt: skip
    bias = torch.randn(k, generator=g, dtype=torch.float64) if rng.random() < 0.7 else None
    features = torch.randn(n, d, generator=g, dtype=torch.float64)
    if rng.random() < 0.5:
        features = features.clamp_min(0.0)
    logits = features @ weight.T + (0 if bias is None else bias)
    temperature = rng.choice([0.3, 0.5, 1.0, 1.5])
    labels = torch.multinomial(torch.softmax(temperature * logits, 1), 1, generator=g)[:, 0]
    problem = {"features": features, "labels": labels, "weight": weight, "bias": bias}
    return (
        problem,
        rng.choice(["full", "kron"]),
        rng.choice([1, 3, 10, 30, 100]),
        rng.randrange(1000),
    )


def _heldout(delta: float, folds: list[lp.HeldOutFold], template: lp.LaplaceMap) -> float:
    return lp.heldout_nll(delta, folds, template)


def agreement(heads: int, seed: int) -> dict[str, Any]:
    """How often the descent's Monte Carlo search chooses what asking every grid point chooses,
    over ``heads`` random heads (:func:`random_head`): the same grid point, δ's relative
    difference and the held-out NLL's when it is (a flat objective leaves δ loose), the
    held-out NLL's relative excess when it is not, and the δ asked."""
    rng = random.Random(seed)
    rows = []
    for _ in range(heads):
        problem, structure, draws, fold_seed = random_head(rng)
        phi, labels = problem["features"], problem["labels"]
        weight, bias = problem["weight"], problem["bias"]
        probs = torch.softmax(phi @ weight.T + (0 if bias is None else bias), 1)
        folds = lp.heldout_folds(phi, probs, labels, bias is not None, structure,
                                 lp.PRIOR_FOLDS, fold_seed)  # fmt: skip
        if not folds:
            continue
        template = lp.LaplaceMap(weight, bias, 1.0, structure, "mc", draws, fold_seed, "")
        before = previous_search(partial(_heldout, folds=folds, template=template))
        after = lp.search_prior_precision(folds, template)
        rows.append(
            {
                "structure": structure,
                "draws": draws,
                "same": before.grid_choice == after.grid_choice,
                "delta_rel_diff": abs(after.prior_precision / before.prior_precision - 1),
                "nll_excess": after.objective / before.objective - 1,
                "asked": after.asked,
                "asked_before": before.asked,
            }
        )
    same = [r for r in rows if r["same"]]
    diffs = sorted(r["delta_rel_diff"] for r in same)
    others = [r for r in rows if not r["same"]]
    excess = [r["nll_excess"] for r in others]
    return {
        "heads": len(rows),
        "same": len(same),
        "different_by_draws": {
            str(draws): sum(1 for r in others if r["draws"] == draws)
            for draws in (1, 3, 10, 30, 100)
        },
        "heads_by_draws": {
            str(draws): sum(1 for r in rows if r["draws"] == draws) for draws in (1, 3, 10, 30, 100)
        },
        "nll_excess_when_different": [min(excess, default=0.0), max(excess, default=0.0)],
        "delta_rel_diff_median": diffs[len(diffs) // 2] if diffs else 0.0,
        "delta_rel_diff_p99": diffs[int(0.99 * (len(diffs) - 1))] if diffs else 0.0,
        "delta_rel_diff_max": diffs[-1] if diffs else 0.0,
        "nll_rel_diff_max_when_same": max((abs(r["nll_excess"]) for r in same), default=0.0),
        "asked_mean": sum(r["asked"] for r in rows) / max(len(rows), 1),
        "asked_max": max((r["asked"] for r in rows), default=0),
        "asked_before_mean": sum(r["asked_before"] for r in rows) / max(len(rows), 1),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| structure | predictive | before CPU s (δ asked) | after CPU s (δ asked) | ratio "
        "| δ | δ rel. diff |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['structure']} | {r['predictive']} | {r['before_seconds']:.3f} "
            f"({r['before_evaluations']}) | {r['after_seconds']:.3f} ({r['after_evaluations']}) "
            f"| {r['ratio']:.1f} | {r['delta_after']:.4g} | {r['delta_rel_diff']:.1e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--structures", default="full,kron")
    parser.add_argument("--predictives", default="probit,mc")
    parser.add_argument("--samples", type=int, default=100, help="Monte Carlo draws")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a small synthetic head, 1 repeat")
    parser.add_argument("--agreement", type=int, default=0, metavar="HEADS",
                        help="also compare the choices on this many random heads")  # fmt: skip
    parser.add_argument("--agreement-seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.samples, args.agreement = 1, 20, min(args.agreement, 3)
    torch.set_num_threads(1)
    rows = run(args)
    print(rows[0]["problem"])
    print(markdown(rows))
    result: dict[str, Any] = {"rows": rows}
    if args.agreement:
        result["agreement"] = agreement(args.agreement, args.agreement_seed)
        print(json.dumps(result["agreement"], indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
