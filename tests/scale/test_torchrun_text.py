"""`torchrun --nproc-per-node 2 -m curvcal hessian|calibrate` on text classifier folders (gloo,
CPU): each rank tokenizes the texts, takes its shard of them padded per batch, and the run gives
the numbers of one process, with the model whole on every rank or sharded (`--shard-model
blocks`, whose products are central differences). The four command lines run in one launch
(tests/scale/cli_worker.py): a launch's start-up costs more than a command here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from .launch import TEXTS, text_classifier, worker_results

WORKER = Path(__file__).with_name("cli_worker.py")
COMMON = ["--dtype", "float64", "--device", "cpu", "--batch-size", "4"]


def _common(data: Path) -> list[str]:
    return ["--data", str(data), *COMMON]


def _hessian(folder: Path, data: Path) -> list[str]:
    return ["hessian", str(folder), *_common(data), "--no-trace", "--tol", "1e-8"]


def _calibrate(folder: Path, data: Path) -> list[str]:
    return ["calibrate", str(folder), *_common(data), "--method", "none"]


def _sharded_hessian(folder: Path, data: Path) -> list[str]:
    return ["hessian", str(folder), *_common(data), "--trace-method", "hutchinson", "--probes",
            "4", "--tol", "1e-8"]  # fmt: skip


def _sharded_calibrate(folder: Path, data: Path) -> list[str]:
    return ["calibrate", str(folder), *_common(data), "--method", "ts"]


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One torchrun launch of two ranks running the four command lines: a one-layer BERT's
    hessian and calibrate, a two-layer one's with ``--shard-model blocks``. The folders, the
    data files and what each rank's commands gave."""
    root = tmp_path_factory.mktemp("torchrun_text")
    one, one_data = text_classifier(root / "one", layers=1)
    two, two_data = text_classifier(root / "two", layers=2)
    shard = ["--shard-model", "blocks", "--json"]
    runs = {
        "hessian": [*_hessian(one, one_data), "--json"],
        "calibrate": [*_calibrate(one, one_data), "--json"],
        "sharded hessian": [
            *_sharded_hessian(two, two_data),
            *shard,
            "--save-eigenvectors",
            str(root / "sharded.safetensors"),
        ],
        "sharded calibrate": [*_sharded_calibrate(two, two_data), *shard],
    }
    (root / "runs.json").write_text(json.dumps(runs))
    (root / "out").mkdir()
    ranks = worker_results(WORKER, root / "out", 2, str(root / "runs.json"))
    return {"one": (one, one_data), "two": (two, two_data), "ranks": ranks, "root": root}


def _report(launched: dict[str, Any], name: str) -> dict[str, Any]:
    """The report of the launch's command ``name``: it succeeded on both ranks and only rank 0
    printed it."""
    first, second = (rank[name] for rank in launched["ranks"])
    assert first["code"] == second["code"] == 0, (first["stderr"], second["stderr"])
    assert first["stdout"].count('"schema"') == 1 and '"schema"' not in second["stdout"]
    return json.loads(first["stdout"])  # type: ignore[no-any-return]


@pytest.mark.slow
def test_two_processes_match_one_on_texts(run_cli, launched: dict[str, Any]) -> None:
    folder, data = launched["one"]
    distributed = _report(launched, "hessian")
    single = run_cli(*_hessian(folder, data), "--json")
    assert single.code == 0, single.stderr
    assert distributed["results"]["operator"]["n_samples"] == len(TEXTS)
    assert distributed["results"]["lambda_max"] == pytest.approx(
        json.loads(single.stdout)["results"]["lambda_max"], rel=1e-6
    )
    distributed = _report(launched, "calibrate")
    single = run_cli(*_calibrate(folder, data), "--json")
    assert single.code == 0, single.stderr
    got = distributed["results"]["evaluation"]["uncalibrated"]
    expected = json.loads(single.stdout)["results"]["evaluation"]["uncalibrated"]
    for metric in ("accuracy", "nll", "ece"):
        assert got[metric] == pytest.approx(expected[metric], abs=1e-12)


def _same_eigenvectors(got_path: Path, expected_path: Path) -> None:
    from safetensors import safe_open

    with (
        safe_open(str(got_path), framework="pt") as got,
        safe_open(str(expected_path), framework="pt") as expected,
    ):
        keys = list(got.keys())
        assert sorted(keys) == sorted(expected.keys())
        got_meta, expected_meta = got.metadata(), expected.metadata()
        assert got_meta["parameters"] == expected_meta["parameters"]
        assert got_meta["checkpoint_sha256"] == expected_meta["checkpoint_sha256"]
        values = json.loads(got_meta["eigenvalues"])
        assert values == pytest.approx(json.loads(expected_meta["eigenvalues"]), rel=1e-5)
        for index in range(len(values)):  # each eigenvector, up to its sign
            names = sorted(n for n in keys if n.startswith(f"v{index}/"))
            a = torch.cat([got.get_tensor(n).reshape(-1) for n in names])
            b = torch.cat([expected.get_tensor(n).reshape(-1) for n in names])
            assert float(a.norm()) == pytest.approx(1.0, rel=1e-9)
            sign = 1.0 if float(a @ b) > 0 else -1.0
            assert float((sign * a - b).abs().max()) < 1e-3 * float(b.abs().max())


@pytest.mark.slow
def test_sharded_bert_matches_one_process(run_cli, launched: dict[str, Any]) -> None:
    folder, data = launched["two"]
    sharded = _report(launched, "sharded hessian")
    single_vectors = launched["root"] / "single.safetensors"
    single = run_cli(
        *_sharded_hessian(folder, data), "--json", "--save-eigenvectors", str(single_vectors)
    )
    assert single.code == 0, single.stderr
    expected = json.loads(single.stdout)["results"]
    got = sharded["results"]
    assert got["operator"]["engine"] == "central-difference"
    assert got["operator"]["world_size"] == 2
    product = got["operator"]["product"]
    assert product["method"] == "central-difference"
    # a Gaussian vector's product is held to b·‖Hv‖ (4.8e-11 in float64): Richardson's five
    # points where three are not enough; the run's products and their passes beside it
    assert product["stencil"] in {"3-point", "5-point"}
    assert product["gradient_passes"] in {2, 4, 6}
    assert 0 < product["relative_error_bound"] < 1e-7
    assert sum(product["products_by_rule"].values()) > 0 and product["start_passes"] == 3
    assert 2.0 <= product["passes_per_product"] <= 6.0
    # and along the top eigenvector, where the truncation is largest
    assert 0 < product["top_eigenvector"]["relative_error_bound"] < 1e-5
    # products good to 5e-9 here, but Lanczos stops at the precision floor the products'
    # asymmetry sets (a true residual near 7e-7 against --tol 1e-8): λmax within 1.1e-6
    assert got["lambda_max"] == pytest.approx(expected["lambda_max"], rel=1e-5)
    assert got["trace"]["estimate"] == pytest.approx(expected["trace"]["estimate"], rel=1e-7)
    assert sharded["settings"]["checkpoint"]["shard_model"] == "blocks"
    # the eigenvector file, written by rank 0 a parameter at a time from the ranks' slices:
    # one process's tensors (up to the sign of the vector) and metadata
    _same_eigenvectors(launched["root"] / "sharded.safetensors", single_vectors)

    sharded = _report(launched, "sharded calibrate")
    single = run_cli(*_sharded_calibrate(folder, data), "--json")
    assert single.code == 0, single.stderr
    got = sharded["results"]["evaluation"]["uncalibrated"]
    expected = json.loads(single.stdout)["results"]["evaluation"]["uncalibrated"]
    for metric in ("accuracy", "nll", "ece", "brier"):
        assert got[metric] == pytest.approx(expected[metric], rel=1e-10, abs=1e-12)
