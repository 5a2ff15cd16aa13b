"""The top-label maps' one-dimensional work against the peers that do only that work.

The top-label peers (netcal's ``HistogramBinning`` and ``BBQ``, scikit-learn's
``IsotonicRegression`` and torch-uncertainty's ``BBQScaler`` on the top-label confidence) take
the confidences c and correctness computed outside their timing and return N calibrated
confidences; curvcal's map (``bench_calibration.py --maps``) takes the logits and returns the
calibrated N×K rows, about 16 passes over N×K more (benchmarks/README.md). This benchmark times
the same one-dimensional work on both sides: fit on (c, correct) and map the N confidences,
curvcal's kernels (:func:`~curvcal.calibration.binning.histogram_edges`,
:func:`~curvcal.calibration.binning.histogram_values`,
:func:`~curvcal.calibration.binning.cell_bin_of`,
:func:`~curvcal.calibration.isotonic.isotonic_points`,
:func:`~curvcal.calibration.isotonic.interpolate_points`,
:func:`~curvcal.calibration.bbq.fit_models`, :func:`~curvcal.calibration.bbq.kept_models`,
:func:`~curvcal.calibration.bbq.merged_map`, which the maps' fit and apply use) against the
peers', interleaved, one thread, the minimum CPU seconds (``time.process_time``) of
``--repeats``, with the largest difference of the outputs. torch-uncertainty's binary case
takes logits: it is handed the float32 logits of c, made outside its timing::

    python benchmarks/bench_top_label.py [--n 200000] [--k 100] [--repeats 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_calibration import (
    N_BINS,
    probabilities,
    synthetic_logits,
    top_label_pairs,
    torch_uncertainty_bbq,
)

from curvcal.calibration.bbq import fit_models, kept_models, merged_map
from curvcal.calibration.binning import bin_cells, cell_bin_of, histogram_edges, histogram_values
from curvcal.calibration.isotonic import interpolate_points, isotonic_points


def tasks(c: np.ndarray, correct: np.ndarray) -> dict[str, tuple[str, Callable[[], np.ndarray]]]:
    """Per task: (its map, fit on (c, correct) and the N mapped confidences)."""

    def curvcal_histogram() -> np.ndarray:
        edges = histogram_edges(c, N_BINS, "equal-width")
        values, _empty = histogram_values(c, correct, edges)
        return values[cell_bin_of(c, edges)]

    def curvcal_isotonic() -> np.ndarray:
        points_x, points_y = isotonic_points(c, correct)
        return interpolate_points(points_x, points_y, c)

    def netcal_histogram() -> np.ndarray:
        from netcal.binning import HistogramBinning

        model = HistogramBinning(bins=N_BINS)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit(c, correct)
            return np.asarray(model.transform(c))

    def sklearn_isotonic() -> np.ndarray:
        from sklearn.isotonic import IsotonicRegression

        model = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
        return np.asarray(model.fit(c, correct).predict(c))

    def curvcal_bbq() -> np.ndarray:
        edges, values, weights = kept_models(*fit_models(c, correct)[:3])
        union, merged = merged_map(edges, values, weights)
        return merged[cell_bin_of(c, union, bin_cells(union))]

    def netcal_bbq() -> np.ndarray:
        from netcal.binning import BBQ

        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),  # its progress bar
        ):
            warnings.simplefilter("ignore")
            return np.asarray(BBQ().fit(c, correct).transform(c))

    logit = torch.logit(torch.from_numpy(c)).to(torch.float32)
    target = torch.from_numpy(correct)

    return {
        "curvcal histogram (equal-width)": ("histogram", curvcal_histogram),
        "netcal HistogramBinning": ("histogram", netcal_histogram),
        "curvcal isotonic": ("isotonic", curvcal_isotonic),
        "scikit-learn IsotonicRegression": ("isotonic", sklearn_isotonic),
        "curvcal BBQ": ("bbq", curvcal_bbq),
        "torch-uncertainty BBQScaler": ("bbq", lambda: torch_uncertainty_bbq(logit, target)),
        "netcal BBQ": ("bbq", netcal_bbq),
    }


def bench(n: int, k: int, repeats: int) -> list[dict[str, Any]]:
    """One row per task: minimum CPU seconds, the ratio to curvcal's task of the same map, and
    the largest |difference| of its output from curvcal's."""
    torch.set_num_threads(1)
    logits, labels = synthetic_logits(n, k, 0)
    c, correct = top_label_pairs(probabilities(logits), labels.numpy())
    correct = correct.astype(np.float64)
    chosen = tasks(c, correct)
    best = dict.fromkeys(chosen, float("inf"))
    outputs: dict[str, np.ndarray] = {}
    for _ in range(repeats):
        for name, (_map, task) in chosen.items():
            began = time.process_time()
            outputs[name] = task()
            best[name] = min(best[name], time.process_time() - began)
    rows = []
    for name, (kind, _task) in chosen.items():
        ours = next(n for n, (m, _t) in chosen.items() if m == kind and n.startswith("curvcal"))
        rows.append({
            "map": kind, "task": name, "n": n, "k": k, "cpu_s": best[name],
            "peer_over_curvcal": None if name == ours else best[name] / best[ours],
            "max_abs_diff": float(np.abs(outputs[name] - outputs[ours]).max()),
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = bench(args.n, args.k, args.repeats)
    print("| map | task | CPU s (min) | peer / curvcal | max abs diff |")
    print("|---|---|---:|---:|---:|")
    for row in rows:
        ratio = "—" if row["peer_over_curvcal"] is None else f"{row['peer_over_curvcal']:.2f}"
        print(f"| {row['map']} | {row['task']} | {row['cpu_s']:.4f} | {ratio} | "
              f"{row['max_abs_diff']:.1e} |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
