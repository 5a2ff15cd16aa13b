"""Ctrl-C: a real `python -m curvcal hessian` process gets SIGINT mid-run, exits 130, prints
`curvcal: interrupted` last and no terminal codes. Before the first stage (the eigenvalues) is
finished it leaves no output file (nor a temporary one); after it, the whole report of the
stages finished, with status interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import curvcal

CHECKPOINT = Path(curvcal.__file__).parent / "assets" / "digits_cnn.safetensors"
STARTUP_SECONDS = 4.0  # past `import click` (before which Python itself would take the signal)


def _as_a_shell_starts_it() -> None:
    """SIGINT unblocked and at its default in the child, as a terminal would start curvcal:
    a child inherits the parent's signal mask and ignored signals, and what other tests in
    this process (threads of the libraries they load) leave there is not curvcal's to test."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_sigint_exits_130_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(Path(curvcal.__file__).parent.parent), "NO_COLOR": "1"}
    command = [sys.executable, "-m", "curvcal", "hessian", str(CHECKPOINT),
               "--data", "curvcal:digits", "--device", "cpu", "--method", "power",
               "--top-k", "20", "--tol", "1e-30", "--max-iter", "100000",
               "--no-trace", "-o", str(out)]  # fmt: skip
    # power iteration for 20 values to a tolerance float32 never meets keeps the run in its
    # first stage (the eigenvalues) for minutes: nothing is finished when the signal comes
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_a_shell_starts_it,
    )
    try:
        time.sleep(STARTUP_SECONDS)
        assert process.poll() is None, process.communicate()  # still working
        process.send_signal(signal.SIGINT)
        try:
            stdout, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired as error:
            state = (
                f"parent SIGINT handler {signal.getsignal(signal.SIGINT)!r}, "
                f"blocked {sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))}"
            )
            raise AssertionError(
                f"no exit 60 s after SIGINT ({state}): {error.stderr!r}"
            ) from error
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert stderr.rstrip().endswith("curvcal: interrupted")
    assert "Traceback" not in stderr and "\x1b" not in stderr and stdout == ""
    assert list(tmp_path.iterdir()) == []


def _interrupt_hessian(
    tmp_path: Path, args: list[str], ready: Callable[[str], bool]
) -> tuple[int, str, str]:
    """Run ``curvcal hessian CHECKPOINT ARGS -o tmp_path/report.json`` in a real process, send it
    SIGINT at the first stderr line ``ready`` accepts (off a terminal: the progress lines), and
    return its exit code, stdout and stderr."""
    env = {**os.environ, "PYTHONPATH": str(Path(curvcal.__file__).parent.parent), "NO_COLOR": "1"}
    command = [sys.executable, "-m", "curvcal", "hessian", str(CHECKPOINT), *args,
               "-o", str(tmp_path / "report.json")]  # fmt: skip
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_a_shell_starts_it,
    )
    said: list[str] = []
    try:
        assert process.stderr is not None
        for line in process.stderr:
            said.append(line)
            if ready(line):
                break
        else:
            raise AssertionError(f"the run ended before the line awaited: {said}")
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, stdout, stderr


def test_sigint_in_the_trace_writes_the_eigenvalues_with_status_interrupted(
    tmp_path: Path,
) -> None:
    import json

    args = ["--data", "curvcal:digits", "--device", "cpu", "--probes", "29000",
            "--trace-method", "hutchinson"]  # fmt: skip
    # off a terminal the progress lines begin after a few seconds; the first one of the trace
    # stage says the eigenvalues are finished
    code, stdout, stderr = _interrupt_hessian(tmp_path, args, lambda line: "(trace)" in line)
    assert code == 130, stderr
    assert stderr.rstrip().endswith("curvcal: interrupted")
    assert "Traceback" not in stderr
    assert [path.name for path in tmp_path.iterdir()] == ["report.json"]  # no temporary file
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "interrupted" and report["results"]["trace"] is None
    assert report["results"]["spectrum"]["values"][0]["converged"]
    assert "Hessian eigenvalues" in stdout


# slow: a real process runs power iteration past λ1 (about 30 products on the digits) first
@pytest.mark.slow
def test_sigint_after_lambda_1_converged_writes_a_partial_report_of_it(
    tmp_path: Path, run_cli
) -> None:
    import json
    import re

    common = ["--data", "curvcal:digits", "--device", "cpu", "--method", "power", "--no-trace"]
    one = run_cli("hessian", CHECKPOINT, *common, "--top-k", "1", "--json")
    assert one.code == 0, one.stderr
    lambda_1 = json.loads(one.stdout)["results"]["spectrum"]["values"][0]

    def past_lambda_1(line: str) -> bool:
        count = re.search(r"\(eigenvalues\): (\d+)\b", line)
        return count is not None and int(count.group(1)) > lambda_1["matvecs"] + 1

    # 20 values by power iteration with deflation take minutes; λ1 alone (the same start
    # vector: the same seed) converges after lambda_1["matvecs"] products
    code, stdout, stderr = _interrupt_hessian(tmp_path, [*common, "--top-k", "20"], past_lambda_1)
    assert code == 130, stderr
    assert stderr.rstrip().endswith("curvcal: interrupted") and "Traceback" not in stderr
    assert [path.name for path in tmp_path.iterdir()] == ["report.json"]  # no temporary file
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "interrupted" and report["partial"] is True
    values = report["results"]["spectrum"]["values"]
    assert 1 <= len(values) < 20 and all(value["converged"] for value in values)
    assert values[0]["value"] == pytest.approx(lambda_1["value"], rel=1e-6)
    assert report["results"]["spectrum"]["stopped_by"] == "interrupted"
    assert f"the {len(values)} of 20 eigenvalues that converged" in " ".join(stderr.split())
    assert "Hessian eigenvalues" in stdout
    from jsonschema import Draft202012Validator

    schema = json.loads(
        (Path(curvcal.__file__).parent / "assets" / "report.schema.json").read_text()
    )
    Draft202012Validator(schema).validate(report)
