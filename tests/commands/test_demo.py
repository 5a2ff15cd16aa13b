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


def test_demo_table(run_cli) -> None:
    result = run_cli("demo")
    assert result.code == 0, result.stderr
    assert "held-out digits" in result.stdout and "accuracy" in result.stdout
