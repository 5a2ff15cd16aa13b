"""Ctrl-C at any moment, hangs and absurd plans (the hardening catalogue, round three).

* Ctrl-C swept over a `calibrate -o` run from curvcal's first line (start-up and imports
  included): exit 130, no report, no temporary file, stderr the one line `curvcal: interrupted`.
* The register behind it (curvcal.interrupt): an output already moved into place is removed by
  an interrupt before the exit code is decided, kept after; a failed run removes its outputs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import curvcal
from curvcal.cli import main

ROOT = Path(curvcal.__file__).parent.parent
CHECKPOINT = ROOT / "curvcal" / "assets" / "digits_cnn.safetensors"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "OMP_NUM_THREADS": "1"}

# Starts `python -m curvcal` as the interpreter does (sys.argv[0] is "-m" while the package is
# located and imported, which is when curvcal takes over Ctrl-C) and says so once that import
# is done: the sweep's clock starts at curvcal's first line, not inside Python's own start-up
# (site and .pth imports run before any code of curvcal could take the signal).
LAUNCHER = (
    "import os, runpy, sys; ready = int(sys.argv[1]); sys.argv = ['-m', *sys.argv[2:]]; "
    "import curvcal; os.write(ready, b'.'); os.close(ready); "
    "runpy.run_module('curvcal', run_name='__main__', alter_sys=True)"
)
DELAYS = (0.0, 0.01, 0.02, 0.04, 0.07, 0.1, 0.15, 0.25, 0.4, 0.6, 0.9, 1.3, 1.8, 2.4, 3.0)


def _as_a_shell_starts_it() -> None:
    """SIGINT unblocked and at its default in the child, as a terminal would start curvcal."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupted_run(folder: Path, delay: float, signals: int = 1) -> tuple[int, str]:
    """Start `curvcal calibrate -o report.json` in ``folder``, send SIGINT ``delay`` seconds
    after curvcal's first line (``signals`` times, 50 ms apart); the exit code and stderr."""
    read_end, write_end = os.pipe()
    command = [sys.executable, "-c", LAUNCHER, str(write_end), "calibrate", str(CHECKPOINT),
               "--data", "curvcal:digits", "--device", "cpu", "-o", "report.json"]  # fmt: skip
    process = subprocess.Popen(
        command,
        cwd=folder,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        pass_fds=(write_end,),
        preexec_fn=_as_a_shell_starts_it,
    )
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b"."
        os.close(read_end)
        time.sleep(delay)
        for count in range(signals):
            if count:
                time.sleep(0.05)
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, stderr


def _after(folder: Path, code: int, stderr: str, delay: float) -> None:
    """Either the interrupt ended the run (130, nothing written, one line) or it came after the
    exit code was decided (0, the whole report)."""
    left = sorted(path.name for path in folder.iterdir())
    where = f"SIGINT at {delay} s: exit {code}, files {left}, stderr {stderr!r}"
    if code == 0:  # a fast machine finished first: the report is whole and nothing else is there
        assert left == ["report.json"], where
        assert json.loads((folder / "report.json").read_text())["command"] == "calibrate", where
        return
    assert code == 130, where
    assert left == [], where
    assert stderr == "curvcal: interrupted\n", where


@pytest.mark.slow
def test_ctrl_c_swept_over_start_up_imports_and_the_run_gives_130_and_writes_nothing(
    tmp_path: Path,
) -> None:
    codes = []
    for number, delay in enumerate(DELAYS):
        folder = tmp_path / f"run{number}"
        folder.mkdir()
        code, stderr = _interrupted_run(folder, delay)
        _after(folder, code, stderr, delay)
        codes.append(code)
    assert codes.count(130) >= len(DELAYS) // 2, codes  # the sweep did interrupt runs


@pytest.mark.slow
def test_ctrl_c_twice_during_imports_still_gives_one_line_and_130(tmp_path: Path) -> None:
    code, stderr = _interrupted_run(tmp_path, 0.3, signals=2)
    _after(tmp_path, code, stderr, 0.3)


def _script(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` in a fresh interpreter with curvcal's interrupt handler installed."""
    code = "import os, signal, time\nfrom pathlib import Path\n"
    code += "from curvcal import interrupt\nfrom curvcal.atomic import atomic_output\n"
    code += "interrupt.install()\n" + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_as_a_shell_starts_it,
    )


def test_an_output_in_place_before_the_exit_is_decided_is_removed_by_ctrl_c(
    tmp_path: Path,
) -> None:
    done = _script(
        tmp_path,
        """
        with interrupt.run_scope():
            with atomic_output(Path("report.json")) as out:
                out.write(b"{}")
            with atomic_output(Path("plot.png")) as out:
                out.write(b"png")
                os.kill(os.getpid(), signal.SIGINT)  # mid-write: a temporary file exists
                time.sleep(30)
        """,
    )
    assert (done.returncode, done.stderr) == (130, "curvcal: interrupted\n")
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_after_the_exit_is_decided_changes_nothing(tmp_path: Path) -> None:
    done = _script(
        tmp_path,
        """
        with interrupt.run_scope():
            with atomic_output(Path("report.json")) as out:
                out.write(b"{}")
        interrupt.decided()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        """,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert (tmp_path / "report.json").read_bytes() == b"{}"


def test_ctrl_c_waits_for_a_held_step_then_removes_what_it_wrote(tmp_path: Path) -> None:
    done = _script(
        tmp_path,
        """
        with interrupt.run_scope():
            with interrupt.held():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
                Path("reached").write_text("the held step ran to its end")
                with atomic_output(Path("report.json")) as out:
                    out.write(b"{}")
            time.sleep(30)
        """,
    )
    assert (done.returncode, done.stderr) == (130, "curvcal: interrupted\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["reached"]


# The real command under a hook at the moment a signal must be handled (no sleeps that race):
# `metrics LOGITS --val-split 0.5 -o report.json --save-calibrator c.json`, run by the entry
# point with `curvcal.interrupt` patched where the moment is.
_SIGNALLED_RUN = """
import os, signal, sys
from curvcal import interrupt
moment, signum, name = sys.argv[1], getattr(signal, sys.argv[2]), sys.argv[3]
if moment == "temporary":  # right after a temporary file of `name` appears and is registered
    real_created = interrupt.temporary_created

    def created(temp):
        real_created(temp)
        if os.path.basename(temp).startswith("." + name + "."):
            os.kill(os.getpid(), signum)

    interrupt.temporary_created = created
else:  # after the command returned, before the exit code is decided
    real_decided = interrupt.decided

    def decided():
        os.kill(os.getpid(), signum)
        for _ in range(10_000):  # bytecodes: the handler runs between two of them
            pass
        real_decided()

    interrupt.decided = decided
from curvcal.cli import run
sys.argv = ["curvcal", *sys.argv[4:]]
run()
"""


def _without_warnings(stderr: str) -> str:
    """``stderr`` less the warnings the random scores earn (a fit stopped at its bracket)."""
    kept = [line for line in stderr.splitlines(keepends=True) if line.startswith("curvcal: ")]
    return "".join(line for line in kept if not line.startswith("curvcal: warning: "))


def _signalled_run(tmp_path: Path, moment: str, signum: str, name: str) -> tuple[int, str]:
    logits = tmp_path / "logits.npz"
    rng = np.random.default_rng(0)
    np.savez(logits, logits=rng.normal(size=(40, 3)), labels=rng.integers(0, 3, size=40))
    done = subprocess.run(
        [sys.executable, "-c", _SIGNALLED_RUN, moment, signum, name, "metrics", "logits.npz",
         "--val-split", "0.5", "-o", "report.json", "--save-calibrator", "c.json"],
        cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        timeout=120, preexec_fn=_as_a_shell_starts_it,
    )  # fmt: skip
    return done.returncode, done.stderr


@pytest.mark.parametrize("name", ["report.json", "c.json"])
@pytest.mark.parametrize(
    ("signum", "code", "said"),
    [("SIGTERM", -signal.SIGTERM, ""), ("SIGINT", 130, "curvcal: interrupted\n")],
)
def test_a_signal_as_an_outputs_temporary_file_appears_leaves_nothing(
    tmp_path: Path, name: str, signum: str, code: int, said: str
) -> None:
    """SIGTERM as c.json's (or the report's) temporary file appeared left the other output
    behind, and the temporary file: SIGTERM then raised in the middle of the held step that
    registers it, and ended the process by the signal without removing what the run wrote."""
    returncode, stderr = _signalled_run(tmp_path, "temporary", signum, name)
    assert returncode == code, stderr
    assert _without_warnings(stderr) == said, stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["logits.npz"]


@pytest.mark.parametrize(("signum", "code"), [("SIGINT", 0), ("SIGTERM", -signal.SIGTERM)])
def test_a_signal_after_the_command_returned_comes_too_late_to_change_anything(
    tmp_path: Path, signum: str, code: int
) -> None:
    """Between the command's return and the decided exit code the register was already empty:
    Ctrl-C there ended the run with 130 ("nothing written") and left both outputs. Now the
    outputs stand; SIGTERM, given back to its default, still ends the process by itself."""
    returncode, stderr = _signalled_run(tmp_path, "decided", signum, "")
    assert returncode == code, stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "c.json",
        "logits.npz",
        "report.json",
    ]


def test_the_run_that_loses_a_race_for_its_output_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli
) -> None:
    """Two runs to one `-o`: the other run's report appears while this one writes its own (as
    its temporary file appears). This run ends with the one error line and exit 2, the other's
    report untouched, its own second output removed."""
    from curvcal import interrupt

    logits = tmp_path / "logits.npz"
    rng = np.random.default_rng(0)
    np.savez(logits, logits=rng.normal(size=(40, 3)), labels=rng.integers(0, 3, size=40))
    monkeypatch.chdir(tmp_path)
    real_created = interrupt.temporary_created

    def the_other_run_wins(temp: str) -> None:
        real_created(temp)
        if os.path.basename(temp).startswith(".report.json."):
            Path("report.json").write_text('{"the other run": true}')

    monkeypatch.setattr(interrupt, "temporary_created", the_other_run_wins)
    result = run_cli("metrics", "logits.npz", "--val-split", "0.5", "--save-calibrator",
                     "c.json", "-o", "report.json", "-q")  # fmt: skip
    assert result.code == 2, result.output
    assert _without_warnings(result.stderr) == (
        "curvcal: error: report.json: already exists (it was created while this run worked) "
        "(pass --force to overwrite it, or name another file)\n"
    ), result.stderr
    assert Path("report.json").read_text() == '{"the other run": true}'
    assert sorted(path.name for path in tmp_path.iterdir()) == ["logits.npz", "report.json"]


def test_a_failed_run_removes_the_outputs_it_had_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error after a first output is in place (here: right after the report is written)
    leaves no output behind: exit 2, one line, no report."""
    from curvcal.commands import common
    from curvcal.errors import InputError

    logits = tmp_path / "logits.npz"
    rng = np.random.default_rng(0)
    np.savez(logits, logits=rng.normal(size=(40, 3)), labels=rng.integers(0, 3, size=40))
    real_emit = common.emit

    def emit_then_fail(*args: object, **kwargs: object) -> None:
        real_emit(*args, **kwargs)  # type: ignore[arg-type]
        assert (tmp_path / "report.json").exists()
        raise InputError("--plot", "could not be drawn")

    monkeypatch.setattr(common, "emit", emit_then_fail)
    monkeypatch.chdir(tmp_path)
    assert main(["metrics", str(logits), "-o", "report.json", "--quiet"]) == 2
    assert sorted(path.name for path in tmp_path.iterdir()) == ["logits.npz"]


def test_a_run_that_ends_with_a_result_keeps_its_outputs(tmp_path: Path) -> None:
    logits = tmp_path / "logits.npz"
    rng = np.random.default_rng(0)
    np.savez(logits, logits=rng.normal(size=(40, 3)), labels=rng.integers(0, 3, size=40))
    assert main(["metrics", str(logits), "-o", str(tmp_path / "report.json"), "--quiet"]) == 0
    assert json.loads((tmp_path / "report.json").read_text())["command"] == "metrics"


# -- plans capped by what can exist ------------------------------------------------------------


def _address_space_of_6_gib() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, 6 * 2**30))


def test_a_batch_size_of_a_billion_is_a_batch_of_the_data(tmp_path: Path) -> None:
    """`calibrate --batch-size 1000000000` made a list of a billion sample numbers (killed by
    the kernel, or a MemoryError and exit 70 where memory is bounded, as here): a batch holds
    at most the data, so the run is the run of a batch size of N."""
    command = [sys.executable, "-m", "curvcal", "calibrate", str(CHECKPOINT), "--data",
               "curvcal:digits", "--device", "cpu", "--batch-size", "1000000000", "-o",
               "report.json"]  # fmt: skip
    done = subprocess.run(
        command,
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
        preexec_fn=_address_space_of_6_gib,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["settings"]["data"]["batch_size"] == 1_000_000_000  # as given, recorded


def test_inspect_shows_a_bounded_part_of_a_huge_safetensors_metadata(
    tmp_path: Path, run_cli
) -> None:
    """60 MB of header metadata (a million entries) made `inspect` lay out a table of a million
    rows: past two minutes. The table shows the first entries, cut to a cell, and says how many
    more; the JSON report keeps every entry whole."""
    import torch
    from safetensors.torch import save_file

    from curvcal.report.inspect import METADATA_ROWS

    metadata = {f"key{i:05d}": f"value {i}" for i in range(5_000)}
    path = tmp_path / "noted.safetensors"
    save_file({"w": torch.zeros(2, 2)}, str(path), metadata)
    report = tmp_path / "inspect.json"

    result = run_cli("inspect", path, "-o", report)

    assert result.code == 0, result.output
    shown = [line for line in result.stdout.splitlines() if "metadata: key" in line]
    assert len(shown) == METADATA_ROWS
    assert f"{5_000 - METADATA_ROWS:,} more entries (all in --json)" in result.stdout
    assert json.loads(report.read_text())["results"]["metadata"] == metadata

    save_file({"w": torch.zeros(2, 2)}, str(path), {"long": "q" * 100_000})  # no other q
    result = run_cli("inspect", path)
    assert result.code == 0, result.output
    # cut where every cell is (curvcal.errors.bounded): its first 140 and last 40 characters
    assert result.stdout.count("q") == 140 + 40
    assert "[100,000 characters]" in " ".join(result.stdout.split())


class _Counted:
    """A cost function that counts its calls and refuses to be called more than ``limit`` times
    (a plan that scans every width from --probe-batch down would call it a billion times)."""

    def __init__(self, cost: Callable[..., float], limit: int = 10_000) -> None:
        self.cost, self.limit, self.calls = cost, limit, 0

    def __call__(self, *args: object, **kwargs: object) -> float:
        self.calls += 1
        assert self.calls <= self.limit, "the plan scans the widths one by one"
        return self.cost(*args, **kwargs)


def test_widest_is_the_last_width_that_fits() -> None:
    from curvcal.curvature.memory import widest

    for limit in (0, 1, 2, 7, 8, 1000):
        for width in (1, 2, 8, 1000):
            assert widest(lambda m, limit=limit: m <= limit, width) == min(limit, width)
    calls = []
    assert widest(lambda m: calls.append(m) is None and m <= 123_456_789, 10**18) == 123_456_789
    assert len(calls) < 70


def test_a_probe_batch_of_a_billion_is_planned_by_the_budget_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from curvcal.curvature import memory
    from curvcal.curvature.memory import GraphSize, GraphSizes, plan_pass

    graphs = GraphSizes(gradient=GraphSize(1000.0, 100.0), double=GraphSize(2000.0, 300.0))
    counted = _Counted(memory.pass_bytes)
    monkeypatch.setattr(memory, "pass_bytes", counted)
    # worked by hand: G(64) = 2000 + 300·64 = 21,200; 21,200 + 400·(1 + 3m) ≤ 10**12 gives
    # m ≤ (10**12 − 21,600) / 1,200 = 833,333,315.3
    plan = plan_pass(graphs, param_bytes=400, rows=64, width=10**9, budget=10**12, vmapped=False)
    assert (plan.rows, plan.width, plan.fits) == (64, 833_333_315, True)
    # with the budget of the hand-worked case of tests/curvature/test_memory.py: 7 vectors
    plan = plan_pass(graphs, param_bytes=400, rows=64, width=10**9, budget=30_000, vmapped=False)
    assert (plan.rows, plan.width) == (64, 7)


def test_kept_graphs_are_planned_for_a_billion_vectors_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from curvcal.curvature import kept
    from curvcal.curvature.memory import GraphSize, GraphSizes

    graphs = GraphSizes(GraphSize(100.0, 10.0), GraphSize(1000.0, 50.0))
    counted = _Counted(kept.kept_pass_bytes)
    monkeypatch.setattr(kept, "kept_pass_bytes", counted)
    chunks, budget = [4, 4, 4, 2], 10**9
    count, width = kept.kept_prefix(
        graphs, param_bytes=400, chunks=chunks, input_row_bytes=0.0, width=10**9, budget=budget
    )
    assert count == len(chunks)
    # the most vectors: one more would not fit (the module's own cost model is the plan's truth)
    held = 400 + sum(graphs.double.at(rows) for rows in chunks)

    def need(m: int) -> float:
        return held + kept.kept_pass_bytes(graphs, 400, max(chunks), m)

    assert need(width) <= budget < need(width + 1)


def test_density_steps_beyond_the_parameter_count_are_capped_and_said() -> None:
    import torch
    from torch import nn

    from curvcal.curvature.analysis import HessianSettings, analyse_batches

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    n_params = sum(p.numel() for p in model.parameters())  # 26
    x, y = torch.randn(20, 3, dtype=torch.float64), torch.randint(0, 2, (20,))
    planned: list[int] = []
    notes: list[str] = []
    settings = HessianSettings(
        trace=False, density=True, density_runs=1, density_steps=200, tol=1e-6
    )
    result = analyse_batches(
        model,
        [(x[:9], y[:9]), (x[9:], y[9:])],
        settings,
        on_note=notes.append,
        on_plan=lambda resolved: planned.append(resolved.density_steps),
    )
    assert planned == [n_params]
    # from Python the note names the field (the command line words it --density-steps)
    assert [note for note in notes if "density_steps" in note] == [
        f"density_steps 200 capped at {n_params}, the parameter count: Lanczos on a "
        "Hessian of P rows ends within P steps"
    ]
    assert result.density is not None and result.density.steps == n_params


# -- named pipes among the data: refused, never opened ----------------------------------------


def _refused_in_time(load: Callable[[], object], fifo: Path) -> str:
    """The message ``load`` raises, within 20 s; a loader blocked opening ``fifo`` (waiting for
    a writer that never comes) is released and the test fails."""
    import threading

    from curvcal.errors import InputError

    outcome: list[BaseException | object] = []
    worker = threading.Thread(target=lambda: outcome.append(_caught(load)), daemon=True)
    worker.start()
    worker.join(20)
    if worker.is_alive():  # open a writer end so that the blocked reader sees end-of-file
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(20)
        pytest.fail(f"blocked on the named pipe {fifo}")
    assert len(outcome) == 1 and isinstance(outcome[0], InputError), outcome
    return outcome[0].message


def _caught(load: Callable[[], object]) -> BaseException | object:
    try:
        return load()
    except Exception as exc:
        return exc


def test_a_named_pipe_as_an_arrow_member_of_a_saved_dataset_is_refused(tmp_path: Path) -> None:
    from curvcal.load.texts.text import read_table

    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data.arrow"}]}))
    os.mkfifo(folder / "data.arrow")
    message = _refused_in_time(lambda: read_table(str(folder)), folder / "data.arrow")
    assert message == f"{folder / 'data.arrow'}: is not a regular file (a FIFO, socket or device)"


def test_a_named_pipe_as_a_jsonl_file_is_refused_as_what_it_is(tmp_path: Path) -> None:
    from curvcal.load.texts.text import read_table

    os.mkfifo(tmp_path / "texts.jsonl")
    message = _refused_in_time(lambda: read_table(str(tmp_path / "texts.jsonl")), tmp_path)
    assert message == (
        f"--data {tmp_path / 'texts.jsonl'}: is not a regular file (a FIFO, socket or device)"
    )


def test_a_named_pipe_as_an_image_of_a_folder_is_refused(tmp_path: Path) -> None:
    from PIL import Image

    from curvcal.load.data import load_dataset
    from curvcal.load.datasets.batches import iter_batches
    from curvcal.settings.data import DataSettings

    root = tmp_path / "images"
    for label, colour in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
        (root / label).mkdir(parents=True)
        Image.new("RGB", (6, 5), colour).save(root / label / "0.png")
    os.mkfifo(root / "dog" / "1.png")
    data = load_dataset(DataSettings(data=f"folder:{root}", resize=4, crop=4))
    message = _refused_in_time(lambda: list(iter_batches(data.dataset, 3)), root / "dog" / "1.png")
    assert message == f"{root / 'dog' / '1.png'}: is not a regular file (a FIFO, socket or device)"


# -- torchrun: a failing rank tells the others, and every rank stops with one line ---------------

RANKED = '''
import os

import torch
from torch.utils.data import Dataset

GENERATOR = torch.Generator().manual_seed(0)
X = torch.rand(40, 1, 8, 8, generator=GENERATOR)
Y = torch.randint(0, 10, (40,), generator=GENERATOR)


def unreadable_on_rank_1():
    """Rank 1 cannot read its data: the factory fails while rank 0 goes on."""
    if os.environ.get("RANK") == "1":
        return 42
    return X, Y


class LastSampleUnreadable(Dataset):
    """Rank 1 fails on the last sample of its shard, once rank 0 waits in a collective."""

    def __len__(self):
        return 40

    def __getitem__(self, index):
        if os.environ.get("RANK") == "1" and index == 39:
            raise RuntimeError("sample 39 is unreadable")
        return X[index], Y[index]


def failing_late():
    return LastSampleUnreadable()
'''
FACTORY_MESSAGE = (
    "--data py:ranked:unreadable_on_rank_1: returned a int, not a Dataset or a tuple (x, y)"
)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _two_ranks(tmp_path: Path, factory: str) -> list[tuple[int, str]]:
    """Run `calibrate -o report.json` as ranks 0 and 1 of a gloo group of two, as torchrun would
    start them but with no launcher to stop a rank: what they agree on is all there is. Each
    rank's exit code and stderr."""
    (tmp_path / "ranked.py").write_text(RANKED)
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
           "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "CURVCAL_DIST_TIMEOUT": "300"}  # fmt: skip
    command = [sys.executable, "-m", "curvcal", "calibrate", str(CHECKPOINT), "--data",
               f"py:ranked:{factory}", "--trust-checkpoint", "--device", "cpu",
               "-o", "report.json"]  # fmt: skip
    ranks = [
        subprocess.Popen(
            command,
            cwd=tmp_path,
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    results = []
    try:
        for process in ranks:
            _, stderr = process.communicate(timeout=120)  # far below the collective timeout
            results.append((process.returncode, stderr))
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
    return results


@pytest.mark.slow
def test_a_rank_that_cannot_read_its_data_stops_every_rank_with_one_line(tmp_path: Path) -> None:
    (code0, err0), (code1, err1) = _two_ranks(tmp_path, "unreadable_on_rank_1")
    assert (code0, code1) == (2, 2), (err0, err1)
    assert err1 == f"curvcal: error: rank 1: {FACTORY_MESSAGE}\n"
    assert err0 == f"curvcal: error: rank 1 failed, so rank 0 stopped: {FACTORY_MESSAGE}\n"
    assert not (tmp_path / "report.json").exists()


@pytest.mark.slow
def test_a_rank_failing_while_the_other_waits_in_a_collective_stops_both(tmp_path: Path) -> None:
    (code0, err0), (code1, err1) = _two_ranks(tmp_path, "failing_late")
    # what the dataset's own code raises is the data's error (exit 2), said by both ranks
    cause = (
        "--data py:ranked:failing_late: reading sample 39 failed: RuntimeError: sample 39 is "
        "unreadable"
    )
    assert (code0, code1) == (2, 2), (err0, err1)
    assert err1.startswith(f"curvcal: error: rank 1: {cause}") and err1.count("\n") == 1, err1
    assert err0.startswith(f"curvcal: error: rank 1 failed, so rank 0 stopped: {cause}"), err0
    assert err0.count("\n") == 1, err0
    assert not (tmp_path / "report.json").exists()


@pytest.mark.slow
def test_under_torchrun_both_ranks_stop_at_once_and_say_why(tmp_path: Path) -> None:
    (tmp_path / "ranked.py").write_text(RANKED)
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               "2", "-m", "curvcal", "calibrate", str(CHECKPOINT), "--data",
               "py:ranked:unreadable_on_rank_1", "--trust-checkpoint", "--device", "cpu",
               "-o", "report.json"]  # fmt: skip
    completed = subprocess.run(
        command,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode != 0
    lines = completed.stderr.splitlines()
    assert f"curvcal: error: rank 1: {FACTORY_MESSAGE}" in lines, completed.stderr
    assert f"curvcal: error: rank 1 failed, so rank 0 stopped: {FACTORY_MESSAGE}" in lines
    assert not (tmp_path / "report.json").exists()


def test_the_collective_timeout_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from datetime import timedelta

    from curvcal.distributed import DEFAULT_TIMEOUT_S, collective_timeout
    from curvcal.errors import InputError

    monkeypatch.delenv("CURVCAL_DIST_TIMEOUT", raising=False)
    assert collective_timeout() == timedelta(seconds=DEFAULT_TIMEOUT_S) < timedelta(minutes=30)
    monkeypatch.setenv("CURVCAL_DIST_TIMEOUT", "42.5")
    assert collective_timeout() == timedelta(seconds=42.5)
    for bad in ("0", "-3", "nan", "soon"):
        monkeypatch.setenv("CURVCAL_DIST_TIMEOUT", bad)
        with pytest.raises(InputError, match=f"CURVCAL_DIST_TIMEOUT={bad}: is not a positive"):
            collective_timeout()


@pytest.mark.slow
@pytest.mark.parametrize("interrupted", [1, 0])  # rank 0 also hosts the store here
def test_ctrl_c_on_one_rank_mid_run_stops_the_other_at_once(
    tmp_path: Path, interrupted: int
) -> None:
    """One rank alone gets SIGINT while both ranks are in the product loop (rank 0 has timed
    its first products and said how long the run will take): it exits 130, and the other,
    which would wait for it in the next all-reduce, stops with 130 too and says why."""
    env = {**ENV, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "CURVCAL_DIST_TIMEOUT": "300"}  # fmt: skip
    command = [sys.executable, "-m", "curvcal", "hessian", str(CHECKPOINT), "--data",
               "curvcal:digits", "--device", "cpu", "--probes", "29000", "--trace-method",
               "hutchinson", "-o", "report.json"]  # fmt: skip
    ranks = [
        subprocess.Popen(
            command,
            cwd=tmp_path,
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_as_a_shell_starts_it,
        )
        for rank in (0, 1)
    ]
    other = 1 - interrupted
    try:
        assert ranks[0].stderr is not None
        seen = []
        for line in ranks[0].stderr:  # rank 0 speaks once it has timed the first products
            seen.append(line)
            if "this run will take" in line:
                break
        assert seen and "this run will take" in seen[-1], seen
        ranks[interrupted].send_signal(signal.SIGINT)
        said = {rank: ranks[rank].communicate(timeout=60)[1] for rank in (interrupted, other)}
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
    assert (ranks[interrupted].returncode, said[interrupted]) == (130, "curvcal: interrupted\n")
    assert ranks[other].returncode == 130, said[other]
    assert said[other] == (
        f"curvcal: error: rank {interrupted} failed, so rank {other} stopped: interrupted\n"
    )
    assert list(tmp_path.iterdir()) == []
