"""The non-parametric calibration maps on the peers' own work, apart, and in the whole CLI run.

For each size (N × K) and map this times, one thread, interleaved, the minimum CPU seconds
(``time.process_time``) of ``--repeats``:

- **fit** and **apply** apart, on given float64 probabilities (the work a peer is handed:
  netcal and scikit-learn take probabilities, not logits): curvcal's registry map fitted with
  ``kind="probs"`` (its fit also finds the in-sample NLL) and its calibrated N×K probabilities;
  netcal's ``fit`` and ``transform``; torch-uncertainty's one-vs-rest scalers, which take logits,
  are handed the float32 logits. The top-label peers return N confidences from (c, correct),
  which they find from the probabilities inside their timing; curvcal returns the N×K rows, and
  its one-dimensional part alone (the kernels of ``bench_top_label.py``) is a row of its own;
- the **floor**: the bytes of the N×K float64 probabilities read once (fit), read and written
  once (apply), as seconds at the memory bandwidth measured here (a large ``numpy.copyto``);
- each task's **peak memory** above what the process held before it (resident set sampled
  every millisecond) as a multiple of the N×K float64 input;
- the **whole CLI run** (with ``--cli``): ``curvcal metrics ev.npz --fit fit.npz --method M``
  on N fit and N evaluation rows of float32 logits, as a user runs it (process start, imports,
  every metric of both stages), beside the peer's whole run of the same map in a process of its
  own (imports, float64 softmax, fit on the fit rows, transform of the evaluation rows), CPU
  seconds of each process (``os.wait4``) and its peak resident memory.

Histogram maps run with equal-width bins (15), the peers' scheme. A peer that is not installed
is reported and skipped::

    python benchmarks/bench_map_work.py [--sizes 200000x100,50000x1000,1000000x10]
        [--maps histogram_ovr,...] [--repeats 2] [--cli] [--json OUT] [--markdown OUT]
    python benchmarks/bench_map_work.py --quick --cli
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_calibration import N_BINS, load_peer, measure_cpu, synthetic_logits, top_label_pairs
from bench_top_label import tasks as top_label_tasks

SIZES = ((200_000, 100), (50_000, 1_000), (1_000_000, 10))
QUICK_SIZES = ((3_000, 10), (1_000, 50))
MAPS = ("histogram_ovr", "isotonic_ovr", "histogram", "isotonic", "bbq")
#: The registry's method option of each map (the CLI's ``--method``).
METHOD = {
    "histogram_ovr": "histogram-ovr",
    "isotonic_ovr": "isotonic-ovr",
    "histogram": "histogram",
    "isotonic": "isotonic",
    "bbq": "bbq",
}
#: The curvcal task of ``bench_top_label.tasks`` doing a top-label map's one-dimensional work.
ONE_DIMENSIONAL = {
    "histogram": "curvcal histogram (equal-width)",
    "isotonic": "curvcal isotonic",
    "bbq": "curvcal BBQ",
}
PEERS = ("netcal", "sklearn", "torch_uncertainty")

#: A task in two timed parts: ``fit()`` returns the fitted model, ``apply(model)`` the output.
Fit = Callable[[], Any]
Apply = Callable[[Any], Any]


def curvcal_parts(stage: str, probs: np.ndarray, labels: torch.Tensor) -> tuple[Fit, Apply]:
    """curvcal's registry map ``stage`` fitted on the float64 probabilities (equal-width bins
    for histograms), and its calibrated N×K probabilities of the same rows."""
    from curvcal.calibration.inputs import InputNames
    from curvcal.calibration.registry import MAPS as REGISTRY
    from curvcal.settings.calibration import CalibrationSettings

    settings = CalibrationSettings()
    if stage.startswith("histogram"):
        settings = dataclasses.replace(
            settings, histogram_scheme="equal-width", histogram_bins=N_BINS
        )

    def fit() -> Any:
        result = REGISTRY[stage].fit(probs, labels, "probs", settings, names=InputNames("probs"))
        return result.calibrator

    def apply(calibrator: Any) -> Any:
        return calibrator.probabilities(probs, "probs", "probs")

    return fit, apply


def _quiet() -> contextlib.ExitStack:
    """Warnings, stdout and stderr (progress bars) of a peer silenced."""
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
    return stack


def netcal_parts(name: str, top_label: bool, probs: np.ndarray, y: np.ndarray) -> tuple[Fit, Apply]:
    """netcal's ``netcal.binning.<name>``: ``fit`` and ``transform`` of the probabilities
    (one-vs-rest) or of the top-label confidence against correctness (found from the
    probabilities inside the timing)."""
    options = {"bins": N_BINS} if name == "HistogramBinning" else {}

    def fit() -> Any:
        cls = getattr(importlib.import_module("netcal.binning"), name)
        model = cls(**options)
        with _quiet():
            if top_label:
                confidence, correct = top_label_pairs(probs, y)
                model.fit(confidence, correct)
            else:
                model.fit(probs, y)
        return model

    def apply(model: Any) -> Any:
        with _quiet():
            return np.asarray(model.transform(probs.max(axis=1) if top_label else probs))

    return fit, apply


def sklearn_parts(probs: np.ndarray, y: np.ndarray) -> tuple[Fit, Apply]:
    """scikit-learn's ``IsotonicRegression`` on the top-label confidence against correctness."""

    def fit() -> Any:
        from sklearn.isotonic import IsotonicRegression

        confidence, correct = top_label_pairs(probs, y)
        model = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
        return model.fit(confidence, correct)

    def apply(model: Any) -> Any:
        return np.asarray(model.predict(probs.max(axis=1)))

    return fit, apply


def torch_uncertainty_parts(
    name: str, logits: torch.Tensor, labels: torch.Tensor
) -> tuple[Fit, Apply]:
    """torch-uncertainty's ``post_processing.<name>`` (one-vs-rest, scikit-learn or its own
    binning per class): ``fit`` on one batch of the float32 logits, then the softmax of its
    output on them."""

    def fit() -> Any:
        import logging

        from torch.utils.data import DataLoader, TensorDataset

        cls = getattr(importlib.import_module("torch_uncertainty.post_processing"), name)
        model = cls(model=None, **({"num_bins": N_BINS} if "Histogram" in name else {}))
        loader = DataLoader(TensorDataset(logits, labels), batch_size=len(labels))
        logging.disable(logging.WARNING)  # "model is None" on every fit
        try:
            model.fit(loader, progress=False)
        finally:
            logging.disable(logging.NOTSET)
        return model

    def apply(model: Any) -> Any:
        with torch.no_grad():
            return torch.softmax(model(logits).to(torch.float64), dim=1)

    return fit, apply


def peer_parts(
    stage: str, logits: torch.Tensor, labels: torch.Tensor, probs: np.ndarray
) -> list[tuple[str, str, Fit, Apply]]:
    """(label, library, fit, apply) of every peer implementing ``stage``."""
    y = labels.numpy()
    peers: dict[str, list[tuple[str, str, tuple[Fit, Apply]]]] = {
        "histogram_ovr": [
            (
                "netcal HistogramBinning",
                "netcal",
                netcal_parts("HistogramBinning", False, probs, y),
            ),
            (
                "torch-uncertainty HistogramBinningScaler (logits)",
                "torch_uncertainty",
                torch_uncertainty_parts("HistogramBinningScaler", logits, labels),
            ),
        ],
        "isotonic_ovr": [
            (
                "netcal IsotonicRegression",
                "netcal",
                netcal_parts("IsotonicRegression", False, probs, y),
            ),
            (
                "torch-uncertainty IsotonicRegressionScaler (logits)",
                "torch_uncertainty",
                torch_uncertainty_parts("IsotonicRegressionScaler", logits, labels),
            ),
        ],
        "histogram": [
            (
                "netcal HistogramBinning (top-label, N values)",
                "netcal",
                netcal_parts("HistogramBinning", True, probs, y),
            )
        ],
        "isotonic": [
            (
                "scikit-learn IsotonicRegression (top-label, N values)",
                "sklearn",
                sklearn_parts(probs, y),
            )
        ],
        "bbq": [
            ("netcal BBQ (top-label, N values)", "netcal", netcal_parts("BBQ", True, probs, y))
        ],
    }
    return [(label, library, *parts) for label, library, parts in peers.get(stage, [])]


def memory_bandwidth(megabytes: int = 256, repeats: int = 3) -> float:
    """Bytes per second of one thread's ``numpy.copyto`` of a ``megabytes`` float64 array
    (counting the read and the write), the fastest of ``repeats``."""
    source = np.ones(megabytes * 2**20 // 8)
    target = np.empty_like(source)
    np.copyto(target, source)  # the pages mapped before timing
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - began)
    return 2 * source.nbytes / best


def _min_into(best: dict[str, float], key: str, value: float) -> None:
    best[key] = min(best.get(key, float("inf")), value)


def bench_size(
    n: int,
    k: int,
    stages: tuple[str, ...],
    repeats: int,
    libraries: dict[str, Any],
    bandwidth: float,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Fit and apply of each map and its peers at N × K, interleaved, with the floor and the
    peak memory as a multiple of the N×K float64 input; ``progress`` is called with the size's
    result so far after every map (a long run that is stopped keeps its rows)."""
    logits, labels = synthetic_logits(n, k)
    probs = torch.softmax(logits.to(torch.float64), dim=1).numpy()
    input_bytes = probs.nbytes
    rows: list[dict[str, Any]] = []
    size = {
        "n": n,
        "k": k,
        "input_mb": input_bytes / 2**20,
        "floor_fit_s": input_bytes / bandwidth,
        "floor_apply_s": 2 * input_bytes / bandwidth,
        "rows": rows,
    }
    for stage in stages:
        tasks = [("curvcal " + METHOD[stage], "curvcal", *curvcal_parts(stage, probs, labels))]
        tasks += [
            task for task in peer_parts(stage, logits, labels, probs) if libraries.get(task[1])
        ]
        cpu: dict[str, float] = {}
        peak: dict[str, float] = {}
        errors: dict[str, str] = {}
        for _ in range(repeats):
            for label, _library, fit, apply in tasks:
                if label in errors:
                    continue
                try:
                    _wall, fit_cpu, model, fit_peak = measure_cpu(fit)
                    _wall, apply_cpu, _out, apply_peak = measure_cpu(lambda f=apply, m=model: f(m))
                except Exception as error:  # a peer that cannot run this size is reported
                    errors[label] = f"{type(error).__name__}: {error}"[:200]
                    continue
                del model, _out
                print(f"  {label}: fit {fit_cpu:.3f}, apply {apply_cpu:.3f} CPU s", file=sys.stderr)
                _min_into(cpu, label + "/fit", fit_cpu)
                _min_into(cpu, label + "/apply", apply_cpu)
                peak[label + "/fit"] = max(peak.get(label + "/fit", 0.0), fit_peak)
                peak[label + "/apply"] = max(peak.get(label + "/apply", 0.0), apply_peak)
                gc.collect()
        ours = tasks[0][0]
        for label, library, _fit, _apply in tasks:
            row: dict[str, Any] = {"map": stage, "task": label, "library": library}
            row["error"] = errors.get(label)
            for part in ("fit", "apply"):
                seconds = cpu.get(f"{label}/{part}")
                row[f"{part}_cpu_s"] = seconds
                row[f"{part}_peak_over_input"] = (
                    peak[f"{label}/{part}"] * 2**20 / input_bytes if seconds is not None else None
                )
            total = (row["fit_cpu_s"] or 0.0) + (row["apply_cpu_s"] or 0.0)
            row["total_cpu_s"] = total if row["error"] is None else None
            mine = cpu.get(f"{ours}/fit", 0.0) + cpu.get(f"{ours}/apply", 0.0)
            row["peer_over_curvcal"] = (
                total / mine if library != "curvcal" and row["error"] is None and mine else None
            )
            rows.append(row)
        if stage in ONE_DIMENSIONAL:
            rows.append(_one_dimensional_row(stage, probs, labels.numpy(), repeats))
        if progress is not None:
            progress(size)
    return size


def _one_dimensional_row(
    stage: str, probs: np.ndarray, y: np.ndarray, repeats: int
) -> dict[str, Any]:
    """curvcal's top-label kernels alone: fit on (c, correct) and map the N confidences, the
    peers' task (c and correct found inside the timing, as the peers' rows find them)."""
    name = ONE_DIMENSIONAL[stage]
    best = float("inf")
    for _ in range(repeats):
        began = time.process_time()
        confidence, correct = top_label_pairs(probs, y)
        top_label_tasks(confidence, correct)[name][1]()
        best = min(best, time.process_time() - began)
    return {
        "map": stage,
        "task": f"{name}: its one-dimensional part (N values)",
        "library": "curvcal",
        "error": None,
        "fit_cpu_s": None,
        "apply_cpu_s": None,
        "fit_peak_over_input": None,
        "apply_peak_over_input": None,
        "total_cpu_s": best,
        "peer_over_curvcal": None,
    }


# ---------------------------------------------------------------------------------------------
# The whole run in a process of its own.


def _child_run(command: list[str]) -> dict[str, Any]:
    """Run ``command`` (one thread) and return its exit code, wall and CPU seconds (its own,
    ``os.wait4``) and peak resident memory: its ``VmHWM`` read every 2 ms while it runs (the
    rusage maximum of a child started from this process includes this process's own peak,
    which the kernel carries over the exec)."""
    environment = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    began = time.perf_counter()
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=errors, env=environment
        )
        peak_kb = 0
        while True:
            peak_kb = max(peak_kb, _high_water_kb(process.pid))
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.002)
        process.returncode = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        stderr = errors.read()
    return {
        "returncode": process.returncode,
        "wall_s": time.perf_counter() - began,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_mb": peak_kb / 1024,
        "stderr_tail": stderr.decode(errors="replace")[-300:] if process.returncode else "",
    }


def _high_water_kb(pid: int) -> int:
    """The process's peak resident memory so far (``VmHWM`` of /proc; 0 once it has gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def curvcal_command(stage: str, fit: Path, ev: Path) -> list[str]:
    """``curvcal metrics EV --fit FIT --method M`` (equal-width histogram bins)."""
    command = [sys.executable, "-m", "curvcal", "metrics", str(ev), "--fit", str(fit)]
    command += ["--method", METHOD[stage]]
    if stage.startswith("histogram"):
        command += ["--histogram-scheme", "equal-width", "--histogram-bins", str(N_BINS)]
    return command


#: The peer whose whole run stands beside curvcal's CLI run, per map.
CLI_PEER = {
    "histogram_ovr": ("netcal", "HistogramBinning", False),
    "isotonic_ovr": ("netcal", "IsotonicRegression", False),
    "histogram": ("netcal", "HistogramBinning", True),
    "isotonic": ("sklearn", "IsotonicRegression", True),
    "bbq": ("netcal", "BBQ", True),
}


def peer_run(stage: str, fit: str, ev: str) -> None:
    """The peer's whole run of ``stage`` (``--peer-run``): load both files, float64 softmax,
    fit on the fit rows, transform the evaluation rows."""
    library, _name, top_label = CLI_PEER[stage]
    torch.set_num_threads(1)

    def load(path: str) -> tuple[torch.Tensor, torch.Tensor]:
        with np.load(path) as data:
            return torch.from_numpy(data["logits"]), torch.from_numpy(data["labels"])

    fit_logits, fit_labels = load(fit)
    ev_logits, _ev_labels = load(ev)
    fit_probs = torch.softmax(fit_logits.to(torch.float64), dim=1).numpy()
    ev_probs = torch.softmax(ev_logits.to(torch.float64), dim=1).numpy()
    if library == "sklearn":
        fit_part, _apply = sklearn_parts(fit_probs, fit_labels.numpy())
    else:
        fit_part, _apply = netcal_parts(_name, top_label, fit_probs, fit_labels.numpy())
    model = fit_part()
    if library == "sklearn":
        model.predict(ev_probs.max(axis=1))
    else:
        with _quiet():
            model.transform(ev_probs.max(axis=1) if top_label else ev_probs)


def bench_cli(
    n: int, k: int, stages: tuple[str, ...], repeats: int, libraries: dict[str, Any]
) -> list[dict[str, Any]]:
    """The whole CLI run of each map on N fit and N evaluation rows beside its peer's whole
    run, interleaved, minimum CPU seconds of ``repeats``."""
    logits, labels = synthetic_logits(2 * n, k)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        fit, ev = Path(folder) / "fit.npz", Path(folder) / "ev.npz"
        np.savez(fit, logits=logits[:n].numpy(), labels=labels[:n].numpy())
        np.savez(ev, logits=logits[n:].numpy(), labels=labels[n:].numpy())
        del logits, labels
        for stage in stages:
            library, name, _top = CLI_PEER[stage]
            commands = {
                "curvcal metrics --method " + METHOD[stage]: curvcal_command(stage, fit, ev)
            }
            if libraries.get(library):
                script = str(Path(__file__).resolve())
                commands[f"{library} {name} (fit + transform, own process)"] = [
                    sys.executable, script, "--peer-run", stage, str(fit), str(ev)
                ]  # fmt: skip
            best: dict[str, dict[str, Any]] = {}
            for _ in range(repeats):
                for label, command in commands.items():
                    run = _child_run(command)
                    if label not in best or run["cpu_s"] < best[label]["cpu_s"]:
                        best[label] = run
            ours = next(iter(commands))
            for label, run in best.items():
                ratio = None
                if label != ours and run["returncode"] == 0 and best[ours]["cpu_s"]:
                    ratio = run["cpu_s"] / best[ours]["cpu_s"]
                rows.append({"map": stage, "task": label, **run, "peer_over_curvcal": ratio})
    return rows


# ---------------------------------------------------------------------------------------------
# Report.


def _number(value: float | None, form: str) -> str:
    return "" if value is None else format(value, form)


def markdown(result: dict[str, Any]) -> str:
    """The tables of a run: per size, fit and apply apart with the floor and peak memory; then
    the whole CLI runs."""
    lines = [f"memory bandwidth (one thread, copy): {result['bandwidth_gb_s']:.1f} GB/s"]
    for size in result["sizes"]:
        lines.append(
            f"\n### {size['n']:,} × {size['k']:,} (input {size['input_mb']:.0f} MB float64; floor: "
            f"fit {size['floor_fit_s']:.3f} s, apply {size['floor_apply_s']:.3f} s)\n"
        )
        lines.append(
            "| map | task | fit CPU s | apply CPU s | total | peer / curvcal | "
            "peak / input, fit | peak / input, apply |"
        )
        lines.append("|---|---|---:|---:|---:|---:|---:|---:|")
        for r in size["rows"]:
            total = r["error"] or _number(r["total_cpu_s"], ".3f")
            lines.append(
                f"| {r['map']} | {r['task']} | {_number(r['fit_cpu_s'], '.3f')} "
                f"| {_number(r['apply_cpu_s'], '.3f')} | {total} "
                f"| {_number(r['peer_over_curvcal'], '.2f')} "
                f"| {_number(r['fit_peak_over_input'], '.2f')} "
                f"| {_number(r['apply_peak_over_input'], '.2f')} |"
            )
        if size.get("cli"):
            lines.append(f"\nwhole runs, {size['n']:,} fit + {size['n']:,} evaluation rows:\n")
            lines.append("| map | run | CPU s | wall s | peak MB | peer / curvcal |")
            lines.append("|---|---|---:|---:|---:|---:|")
            for r in size["cli"]:
                cpu = f"{r['cpu_s']:.2f}" if r["returncode"] == 0 else f"exit {r['returncode']}"
                lines.append(
                    f"| {r['map']} | {r['task']} | {cpu} | {r['wall_s']:.2f} "
                    f"| {r['peak_mb']:.0f} | {_number(r['peer_over_curvcal'], '.2f')} |"
                )
    return "\n".join(lines)


def _sizes(text: str) -> tuple[tuple[int, int], ...]:
    return tuple((int(n), int(k)) for n, k in (s.lower().split("x") for s in text.split(",")))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", metavar="NxK,...", help="default 200000x100,50000x1000,1000000x10"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    parser.add_argument("--maps", metavar="NAME,...", help=f"default {','.join(MAPS)}")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cli", action="store_true", help="time the whole CLI runs too")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("--markdown", metavar="OUT")
    parser.add_argument("--peer-run", nargs=3, metavar=("MAP", "FIT", "EV"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peer_run:
        peer_run(*args.peer_run)
        return {}
    torch.set_num_threads(1)
    sizes = _sizes(args.sizes) if args.sizes else QUICK_SIZES if args.quick else SIZES
    stages = tuple(args.maps.split(",")) if args.maps else MAPS
    unknown = sorted(set(stages) - set(MAPS))
    if unknown:
        parser.error(f"unknown maps {unknown}; choose from {', '.join(MAPS)}")
    libraries = {} if args.no_peers else {name: load_peer(name) for name in PEERS}
    for name in PEERS:
        if not libraries.get(name):
            print(f"{name}: not installed or not asked for (skipped)", file=sys.stderr)
    result: dict[str, Any] = {
        "threads": 1,
        "repeats": args.repeats,
        "peers": {name: bool(libraries.get(name)) for name in PEERS},
        "bandwidth_gb_s": memory_bandwidth() / 1e9,
        "sizes": [],
    }

    def write(size: dict[str, Any]) -> None:
        """The run so far, the size in progress included, rewritten whole."""
        done = [s for s in result["sizes"] if s is not size]
        so_far = {**result, "sizes": [*done, size]}
        if args.json:
            Path(args.json).write_text(json.dumps(so_far, indent=2) + "\n")
        if args.markdown:
            Path(args.markdown).write_text(markdown(so_far) + "\n")

    for n, k in sizes:
        print(f"{n} x {k} ...", file=sys.stderr)
        size = bench_size(
            n, k, stages, args.repeats, libraries, result["bandwidth_gb_s"] * 1e9, write
        )
        if args.cli:
            size["cli"] = bench_cli(n, k, stages, args.repeats, libraries)
        result["sizes"].append(size)
        write(size)
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
