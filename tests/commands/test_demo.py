"""`curvcal demo` runs end to end on the bundled example, with its check and plots."""

from __future__ import annotations

import json


def test_demo_json_reports_accuracy_check_and_plots(run_cli, tmp_path) -> None:
    result = run_cli("demo", "--json", "--plot-dir", tmp_path)
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
    # the bundled ReLU CNN is linear in each parameter tensor: the exact Gauss–Newton trace runs
    assert hessian["spectrum"]["method"] == "lanczos"
    assert hessian["trace"]["method"] == "gauss-newton" and hessian["trace"]["matvecs"] == 0
    assert hessian["trace"]["ci95"][0] < hessian["trace"]["estimate"] < hessian["trace"]["ci95"][1]
    assert hessian["operator"]["n_samples"] == 797 and hessian["operator"]["n_params"] == 9802
    check = document["results"]["check"]
    assert check["policy"].endswith("demo_policy.toml") and check["passed"] is True
    rows = {row["metric"]: row for row in check["rows"]}
    assert rows["lambda_max"]["value"] == hessian["lambda_max"]
    assert rows["trace"]["value"] == hessian["trace"]["estimate"]
    ts = document["results"]["calibration"]["evaluation"]["ts"]
    assert rows["ts.ece"]["value"] == ts["ece"]
    from matplotlib.image import imread

    reliability, spectrum = tmp_path / "reliability.png", tmp_path / "spectrum.png"
    assert imread(str(reliability)).shape[:2] == (400, 1080)  # three panels of 3.6 × 4 in
    assert imread(str(spectrum)).shape[:2] == (350, 400)  # 4 × 3.2 in + 0.3 of caption


def test_demo_markdown_and_tour(run_cli) -> None:
    result = run_cli("demo", "--format", "markdown")
    assert result.code == 0, result.stderr
    assert "### held-out digits" in result.stdout
    tail = result.stdout[result.stdout.index("held-out digits") :]
    assert "### Hessian eigenvalues" in tail and "### Hessian trace" in tail
    assert "### check: the bundled policy demo_policy.toml" in tail
    assert "| metric | value | bound | baseline | change | result | note |" in tail
    assert "What the tables say" in result.stderr and "curvcal check model.pt" in result.stderr
