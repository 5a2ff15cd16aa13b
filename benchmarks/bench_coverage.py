"""Coverage of curvcal's 95% calibration intervals, measured on models with a known answer.

Each cell draws ``--datasets`` data sets of N samples from a model of
:mod:`curvcal.calibration.simulate` (population values by quadrature), runs
``calibration_metrics(..., bootstrap=--resamples)`` on each, and counts how often each
metric's interval holds the population value; the binomial standard error is printed
beside each rate. ``--gate`` instead measures the false-pass and false-fail rates of the
three ``judge`` rules of ``curvcal check`` on a ``max`` ECE bound.

    python benchmarks/bench_coverage.py                 # the table of the guide (minutes)
    python benchmarks/bench_coverage.py --full          # 100 data sets a cell, K = 100 at 50,000
    python benchmarks/bench_coverage.py --gate          # the judge table of docs/guide/check.md
    python benchmarks/bench_coverage.py --ranking --classes 2 --sizes 500 2000 --datasets 100
    python benchmarks/bench_coverage.py --nll --classes 2 10 --sizes 5000 --datasets 400
    python benchmarks/bench_coverage.py --classes 2 10 --sizes 200 500 --models calibrated --datasets 100
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from curvcal.calibration.intervals import mean_interval
from curvcal.calibration.metrics import calibration_metrics, top_label_of
from curvcal.calibration.ranking import rank_stages
from curvcal.calibration.simulate import SimulatedModel, binomial_se, models

METRICS = ("ece", "adaece", "mce", "classwise_ece", "smooth_ece", "nll")
HEADERS = ("ECE", "AdaECE", "MCE", "classwise", "smooth", "NLL")


def coverage_cell(
    model: SimulatedModel, n: int, datasets: int, resamples: int, truth: dict[str, float]
) -> dict[str, list[bool]]:
    """Per metric, whether each data set's interval held the population value (and the
    estimate lay inside its own interval: checked, an error otherwise)."""
    held: dict[str, list[bool]] = {name: [] for name in METRICS}
    for seed in range(datasets):
        scores, labels = model.draw(n, seed=1_000_003 * n + seed)
        m = calibration_metrics(scores, labels, kind="probs", bootstrap=resamples, seed=seed)
        for name in METRICS:
            if name not in m.intervals:
                continue
            low, high = m.intervals[name]
            estimate = getattr(m, name)
            if not low <= estimate <= high:
                raise AssertionError(f"{name} {estimate} outside its interval [{low}, {high}]")
            held[name].append(low <= truth[name] <= high)
    return held


def chosen_models(args: argparse.Namespace, k: int) -> list[SimulatedModel]:
    """The models of ``k`` classes that ``--models`` names (all four without it)."""
    return [model for model in models(k) if not args.models or model.name in args.models]


def _rate(flags: list[bool]) -> str:
    if not flags:
        return "—"
    p = sum(flags) / len(flags)
    return f"{100 * p:.0f} ± {100 * binomial_se(p, len(flags)):.0f}"


def coverage_table(args: argparse.Namespace) -> None:
    print(f"datasets per cell: {args.datasets}, resamples: {args.resamples}, 15 bins")
    print("| K | model | population ECE | N | " + " | ".join(HEADERS) + " |")
    print("|---|---|---|---|" + "---|" * len(HEADERS))
    for k in args.classes:
        for model in chosen_models(args, k):
            truth = model.population()
            for n in args.sizes:
                if k >= 100 and n > 5000 and not args.full:
                    continue
                start = time.perf_counter()
                held = coverage_cell(model, n, args.datasets, args.resamples, truth)
                cells = " | ".join(_rate(held[name]) for name in METRICS)
                print(
                    f"| {k} | {model.name} | {truth['ece']:.4f} | {n} | {cells} |"
                    f"  <!-- {time.perf_counter() - start:.0f} s -->",
                    flush=True,
                )


def gate_model(target_ece: float) -> SimulatedModel:
    """A binary model with a linear accuracy curve whose population ECE is ``target_ece``:
    the gap (s - 1)(c - 1/2) keeps one sign, so ECE = (1 - s)·E[c - 1/2] exactly."""
    mean_excess = 0.5 * 5.0 / 6.5  # E[c - 1/2] for c = 1/2 + t/2, t ~ Beta(5, 1.5)
    return SimulatedModel("gate", 2, 5.0, 1.5, "linear", 1.0 - target_ece / mean_excess)


def gate_table(args: argparse.Namespace) -> None:
    limit = args.limit
    print(f"max ECE bound {limit}; datasets per cell: {args.datasets}; resamples: {args.resamples}")
    print("| population ECE | N | pass: interval | pass: whole-interval | pass: estimate |")
    print("|---|---|---|---|---|")
    for fraction in (0.0, 0.5, 0.8, 1.25, 2.0):
        model = gate_model(fraction * limit)
        truth = model.ece()
        for n in (500, 5000):
            passes = {"interval": [], "whole-interval": [], "estimate": []}
            for seed in range(args.datasets):
                scores, labels = model.draw(n, seed=7_000_001 * n + seed)
                m = calibration_metrics(
                    scores, labels, kind="probs", bootstrap=args.resamples, seed=seed
                )
                low, high = m.intervals["ece"]
                passes["interval"].append(not low > limit)
                passes["whole-interval"].append(high <= limit)
                passes["estimate"].append(m.ece <= limit)
            cells = " | ".join(_rate(flags) for flags in passes.values())
            print(f"| {truth:.4f} ({fraction:g}×) | {n} | {cells} |", flush=True)


def ranking_table(args: argparse.Namespace) -> None:
    """Coverage of ranking's paired difference intervals: the model's scores against their
    perfect recalibration (population ECE 0, NLL by quadrature) on the same rows."""
    print(f"datasets per cell: {args.datasets}; resamples: {args.resamples}; 15 bins")
    print("| K | model | ΔECE | ΔNLL | N | ΔECE held | ΔNLL held |")
    print("|---|---|---|---|---|---|---|")
    for k in args.classes:
        for model in chosen_models(args, k):
            truth = {"ece": -model.ece(), "nll": model.recalibrated_nll() - model.nll()}
            for n in args.sizes:
                held: dict[str, list[bool]] = {"ece": [], "nll": []}
                for seed in range(args.datasets):
                    scores, labels = model.draw(n, seed=3_000_017 * n + seed)
                    tops = {
                        "uncalibrated": top_label_of(scores, labels, "probs"),
                        "recalibrated": top_label_of(model.recalibrate(scores), labels, "probs"),
                    }
                    ranking = rank_stages(tops, n_bootstrap=args.resamples, seed=seed)
                    stage = next(s for s in ranking.stages if s.stage == "recalibrated")
                    assert stage.vs_uncalibrated is not None
                    for score in held:
                        interval = stage.vs_uncalibrated[score].interval
                        assert interval is not None
                        held[score].append(interval[0] <= truth[score] <= interval[1])
                print(
                    f"| {k} | {model.name} | {truth['ece']:.4f} | {truth['nll']:.4f} | {n} | "
                    f"{_rate(held['ece'])} | {_rate(held['nll'])} |",
                    flush=True,
                )


def nll_table(args: argparse.Namespace) -> None:
    """Coverage of the NLL's interval alone (Student's t over the rows' -log p_y, as
    ``calibration_metrics`` forms it), which needs no resamples: so many more data sets a cell
    than the whole table affords."""
    print(f"NLL only; datasets per cell: {args.datasets}")
    print("| K | model | population NLL | N | NLL held |")
    print("|---|---|---|---|---|")
    for k in args.classes:
        for model in chosen_models(args, k):
            truth = model.population()["nll"]
            for n in args.sizes:
                held: list[bool] = []
                for seed in range(args.datasets):
                    scores, labels = model.draw(n, seed=1_000_003 * n + seed)
                    interval = mean_interval(top_label_of(scores, labels, "probs").nll, floor=0.0)
                    assert interval is not None
                    held.append(interval[0] <= truth <= interval[1])
                print(f"| {k} | {model.name} | {truth:.4f} | {n} | {_rate(held)} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=int, default=None)
    parser.add_argument("--resamples", type=int, default=100)
    parser.add_argument("--sizes", type=int, nargs="+", default=[200, 1000, 5000, 50000])
    parser.add_argument("--classes", type=int, nargs="+", default=[2, 10, 100])
    parser.add_argument(
        "--models", nargs="+", default=None, help="model names to run (default: all four)"
    )
    parser.add_argument("--full", action="store_true", help="100 data sets, K = 100 at 50,000")
    parser.add_argument("--gate", action="store_true", help="the judge table instead")
    parser.add_argument("--ranking", action="store_true", help="ranking's differences instead")
    parser.add_argument("--nll", action="store_true", help="the NLL's interval alone instead")
    parser.add_argument("--limit", type=float, default=0.05, help="the gate's max ECE")
    args = parser.parse_args(argv)
    if args.datasets is None:
        args.datasets = 100 if args.full else (40 if args.gate else 25)
    np.seterr(all="ignore")
    table = (
        ranking_table
        if args.ranking
        else gate_table
        if args.gate
        else nll_table
        if args.nll
        else coverage_table
    )
    table(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
