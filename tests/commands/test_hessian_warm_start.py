"""`curvcal hessian --warm-start F` end to end: the same λmax as the plain run (both to tol,
checked against the dense Hessian by tests/commands/test_hessian.py for the plain one), the
warm stage's products recorded apart, and bad fractions refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from console_text import said


def _args(files: tuple[Path, Path], *extra: str, output: str = "--json") -> list[str]:
    checkpoint, data = files
    return ["hessian", str(checkpoint), "--data", str(data), "--dtype", "float64",
            "--device", "cpu", "--no-trace", "--tol", "1e-8", output, *extra]  # fmt: skip


def test_warm_start_records_its_products_and_finds_the_same_lambda_max(
    run_cli, digits_files: tuple[Path, Path]
) -> None:
    plain = run_cli(*_args(digits_files))
    warm = run_cli(*_args(digits_files, "--warm-start", "0.25", "--seed", "3"))
    assert plain.code == warm.code == 0, warm.stderr
    plain_results = json.loads(plain.stdout)["results"]
    document = json.loads(warm.stdout)
    results = document["results"]
    assert results["lambda_max"] == pytest.approx(plain_results["lambda_max"], rel=1e-7)
    record = results["operator"]["warm_start"]
    assert record["fraction"] == 0.25 and record["n_samples"] == 8  # ⌈0.25 · 30⌉
    assert record["n_matvecs"] >= 2 and record["tol"] == 1e-2
    assert results["operator"]["n_matvecs"] == results["spectrum"]["matvecs"]
    assert document["settings"]["hessian"]["warm_start"] == 0.25
    assert "warm_start" not in plain_results["operator"]
    assert json.loads(plain.stdout)["settings"]["hessian"]["warm_start"] is None

    table = run_cli(*_args(digits_files, "--warm-start", "0.25", output="--format=markdown"))
    assert table.code == 0, table.stderr
    assert said("warm start (--warm-start)", table.stdout)
    assert said("products over 8 samples (0.25 of the data)", table.stdout)


@pytest.mark.parametrize("value", ["0", "1", "-0.5", "nan", "abc"])
def test_a_bad_fraction_is_refused_in_one_line(
    run_cli, digits_files: tuple[Path, Path], value: str
) -> None:
    result = run_cli(*_args(digits_files, "--warm-start", value))
    assert result.code == 2
    assert "--warm-start" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_warm_start_with_power_iteration_is_refused(
    run_cli, digits_files: tuple[Path, Path]
) -> None:
    result = run_cli(*_args(digits_files, "--warm-start", "0.5", "--method", "power"))
    assert result.code == 2
    assert said("--warm-start: starts Lanczos only, not --method power", result.stderr)
