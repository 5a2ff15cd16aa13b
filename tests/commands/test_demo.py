"""`curvcal demo` runs end to end on the bundled example."""

from __future__ import annotations

import json


def test_demo_json_reports_accuracy_of_bundled_model(run_cli) -> None:
    result = run_cli("demo", "--json")
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["command"] == "demo"
    assert document["results"]["n_samples"] == 797
    assert 0.9 < document["results"]["accuracy"] <= 1.0
    assert document["inputs"]["checkpoint"]["sha256"]
    hessian = document["results"]["hessian"]
    eigenvalues = hessian["eigenvalues"]
    assert len(eigenvalues) == 3 and eigenvalues == sorted(eigenvalues, reverse=True)
    assert hessian["lambda_max"] == eigenvalues[0] and hessian["converged"] is True
    assert hessian["spectrum"]["method"] == "lanczos" and hessian["trace"]["method"] == "hutchinson"
    assert hessian["trace"]["ci95"][0] < hessian["trace"]["estimate"] < hessian["trace"]["ci95"][1]
    assert hessian["operator"]["n_samples"] == 797 and hessian["operator"]["n_params"] == 9802


def test_demo_table(run_cli) -> None:
    result = run_cli("demo")
    assert result.code == 0, result.stderr
    assert "held-out digits" in result.stdout and "accuracy" in result.stdout
    tail = result.stdout[result.stdout.index("held-out digits") :]
    assert "Hessian eigenvalues" in tail and "Hessian trace" in tail
