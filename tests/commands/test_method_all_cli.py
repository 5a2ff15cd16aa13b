"""`--method all` through `curvcal metrics`, `calibrate` and `check`: every map that applies is
fitted, ranked in a table and in the JSON `ranking` (which follows the shipped schema), maps that
do not apply are skipped with their reason, and a policy may gate several maps at once."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from curvcal.assets import demo_checkpoint
from curvcal.calibration import registry
from tests.commands.test_check_command import SETTINGS, run_check
from tests.commands.test_metrics import as_json, logits_file
from tests.console_text import cells, said

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema comes with the dev extra")


def _validate(document: dict) -> None:
    from curvcal.assets import report_schema

    schema = json.loads(report_schema().read_text())
    jsonschema.Draft202012Validator(schema).validate(document)


def test_metrics_ranks_every_map_in_json_and_table(run_cli, tmp_path: Path) -> None:
    test = logits_file(tmp_path / "test.npz", 600, 4, seed=3)  # over-confident (3·w)
    args = ("--val-split", "0.5", "--method", "all", "--bootstrap", "40", "--gammas", "0,1")
    document = as_json(run_cli("metrics", test, *args, "--json"))
    _validate(document)
    results = document["results"]
    ranking = results["ranking"]
    assert document["settings"]["calibration"]["method"] == "all"
    assert ranking["n_bootstrap"] == 40 and ranking["paired"] is True
    ranked = {item["stage"]: item for item in ranking["stages"]}
    assert {"uncalibrated", "ts", "focal_ts", "vector", "matrix"} <= set(ranked)
    for stage, item in ranked.items():  # the ranking's scores are the evaluation's metrics
        assert item["nll"] == pytest.approx(results["evaluation"][stage]["nll"], rel=1e-12)
        assert item["ece"] == pytest.approx(results["evaluation"][stage]["ece"], rel=1e-12)
    assert [item["rank"]["nll"] for item in ranking["stages"]] == list(range(1, len(ranked) + 1))
    worst = ranked["uncalibrated"]
    # last among the maps whose NLL is finite (histogram binning and isotonic regression can
    # give a probability of 0 to a label, an infinite NLL, ranked after every finite one)
    finite = [item for item in ranked.values() if item["nll"] is not None]
    assert worst["rank"]["nll"] == len(finite)
    assert worst["vs_best"]["nll"]["distinguishable"] is True
    assert ranking["best"]["nll"] == ranking["stages"][0]["stage"]

    table = run_cli("metrics", test, *args)
    assert table.code == 0, table.stderr
    assert said("maps ranked by NLL on the evaluation split", table.stdout)
    assert "ranked by ECE" not in table.stdout  # the per-score rankings are detail
    verbose = run_cli("metrics", test, *args, "--verbose")
    assert said("ranked by NLL", verbose.stdout) and said("ranked by ECE", verbose.stdout)
    assert "best" in verbose.stdout and said("paired interval", verbose.stdout)


def test_other_methods_carry_no_ranking_key(run_cli, tmp_path: Path) -> None:
    test = logits_file(tmp_path / "test.npz", 200, 3, seed=3)
    results = as_json(run_cli("metrics", test, "--val-split", "0.5", "--json"))["results"]
    assert "ranking" not in results


def test_a_map_that_does_not_apply_is_skipped_and_said(
    run_cli, tmp_path: Path, monkeypatch
) -> None:
    binary = dataclasses.replace(registry.MAPS["matrix"], skip_reason=registry.binary_only)
    monkeypatch.setitem(registry.MAPS, "matrix", binary)
    test = logits_file(tmp_path / "test.npz", 300, 3, seed=3)
    args = ("--val-split", "0.5", "--method", "all", "--gammas", "0")
    document = as_json(run_cli("metrics", test, *args, "--json"))
    _validate(document)
    skipped = {item["stage"]: item["reason"] for item in document["results"]["ranking"]["skipped"]}
    assert skipped["matrix"] == "binary problems (K = 2) only; these scores have 3 classes"
    assert set(skipped) == {"matrix", "platt", "beta", "laplace"}  # K = 3, and scores only
    assert "matrix" not in document["results"]["evaluation"]
    table = run_cli("metrics", test, *args)
    rows = cells(table.stdout, " matrix ", "binary")  # the summary's table of maps not fitted
    assert rows == ["binary problems (K = 2) only; these scores have 3 classes"]
    verbose = run_cli("metrics", test, *args, "--verbose")
    rows = cells(verbose.stdout, " matrix ", "skipped:")  # one row per ranking table
    assert len(rows) == 2
    assert all(row.startswith("skipped: binary problems (K = 2) only") for row in rows)
    refused = run_cli("metrics", test, "--val-split", "0.5", "--method", "matrix")
    assert refused.code == 2 and "binary problems (K = 2) only" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_calibrate_method_all_on_a_checkpoint(run_cli, tmp_path: Path) -> None:
    small = ("--data", "curvcal:digits", "--max-samples", "200", "--batch-size", "100")
    result = run_cli(
        "calibrate", demo_checkpoint(), *small, "--method", "all", "--bootstrap", "20",
        "--gammas", "0,1", "--json",
    )  # fmt: skip
    document = as_json(result)
    _validate(document)
    ranking = document["results"]["ranking"]
    assert ranking["stages"][0]["stage"] == ranking["best"]["nll"]
    assert set(document["results"]["fits"]) >= {"ts", "focal_ts", "vector", "matrix"}


def test_a_policy_gates_several_maps_through_method_all(run_cli, tmp_path: Path) -> None:
    text = SETTINGS + "\n[ts.ece]\nmax = 0.5\n[vector.nll]\nmax = 50\n[matrix.ece]\nmax = 0.5\n"
    code, document = run_check(run_cli, tmp_path, text)
    assert code == 0, document["results"]["rows"]
    assert document["results"]["calibration"]["settings"]["method"] == "all"
    assert [row["metric"] for row in document["results"]["rows"]] == [
        "ts.ece",
        "vector.nll",
        "matrix.ece",
    ]
    narrow = tmp_path / "narrow.toml"
    narrow.write_text(
        SETTINGS.replace("gammas = [0, 1]", 'gammas = [0, 1]\nmethod = "vector"')
        + "\n[ts.ece]\nmax = 0.5\n[vector.nll]\nmax = 5\n"
    )
    result = run_cli("check", demo_checkpoint(), "--policy", narrow)
    assert result.code == 2 and 'use method = "all"' in result.stderr, result.stderr


def test_the_ranking_schema_is_not_vacuous(run_cli, tmp_path: Path) -> None:
    test = logits_file(tmp_path / "test.npz", 200, 3, seed=3)
    args = ("--val-split", "0.5", "--method", "all", "--gammas", "0", "--json")
    document = as_json(run_cli("metrics", test, *args))
    _validate(document)
    broken = [
        lambda r: r.pop("stages"),
        lambda r: r["stages"][0].pop("vs_best"),
        lambda r: r["stages"][0]["vs_best"]["nll"].update(interval=[0.0]),
        lambda r: r.update(edges="middle"),
        lambda r: r["skipped"].append({"stage": "platt"}),
    ]
    for breaks in broken:
        copy = json.loads(json.dumps(document))
        breaks(copy["results"]["ranking"])
        with pytest.raises(jsonschema.ValidationError):
            _validate(copy)
