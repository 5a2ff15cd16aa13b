"""KS, Kuiper, MMCE, AURC and E-AURC reach the `metrics` table and JSON at every stage and can
be gated by `check` policies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from curvcal.assets import demo_checkpoint
from curvcal.calibration import binfree, selective
from tests.commands.test_check_command import SETTINGS, row, run_check
from tests.commands.test_metrics import as_json, logits_file

NEW = ("ks_ce", "kuiper", "mmce", "aurc", "e_aurc")


def test_metrics_json_and_table_carry_the_new_metrics(run_cli, tmp_path: Path) -> None:
    path = logits_file(tmp_path / "z.npz", 200, 4, seed=1)
    document = as_json(run_cli("metrics", path, "--val-split", "0.5", "--gammas", "0,1", "--json"))
    evaluation = document["results"]["evaluation"]
    split = document["results"]["split"]
    for stage in ("uncalibrated", "ts", "focal_ts"):
        values = evaluation[stage]
        for name in NEW:
            assert 0.0 <= values[name] <= 1.0, (stage, name)
        assert [pair[0] for pair in values["risk_coverage"]] == pytest.approx(
            [j / 10 for j in range(1, 11)]
        )
        assert values["risk_coverage"][-1][1] == pytest.approx(1 - values["accuracy"])
    assert split["n_eval"] == 100
    table = run_cli("metrics", path, "--val-split", "0.5", "--gammas", "0,1")
    assert table.code == 0, table.stderr
    for label in ("KS calibration error", "Kuiper", "MMCE", "AURC", "E-AURC"):
        assert label in table.stdout


def test_metrics_on_the_whole_file_match_the_kernels(run_cli, tmp_path: Path) -> None:
    path = logits_file(tmp_path / "z.npz", 150, 3, seed=2)
    document = as_json(run_cli("metrics", path, "--json"))
    values = document["results"]["evaluation"]["uncalibrated"]
    data = np.load(path)
    p = torch.softmax(torch.from_numpy(data["logits"]).to(torch.float64), dim=1)
    conf = p.max(dim=1).values
    correct = (p.argmax(dim=1) == torch.from_numpy(data["labels"])).to(torch.float64)
    assert values["ks_ce"] == pytest.approx(binfree.ks_calibration_error(conf, correct), 1e-12)
    assert values["kuiper"] == pytest.approx(binfree.kuiper_statistic(conf, correct), 1e-12)
    assert values["mmce"] == pytest.approx(binfree.mmce(conf, correct), 1e-12)
    assert values["aurc"] == pytest.approx(selective.risk_coverage_curve(conf, correct).aurc, 1e-12)
    assert values["e_aurc"] == pytest.approx(selective.excess_aurc(conf, correct), 1e-12)


def test_check_gates_the_new_metrics(run_cli, tmp_path: Path) -> None:
    text = SETTINGS + (
        "\n[ks_ce]\nmax = 0.9\n[ts.mmce]\nmax = 0.9\n[aurc]\nmax = 0.9\n[e_aurc]\nmax = 0.0\n"
        "[kuiper]\nmin = 0.0\n"
    )
    code, document = run_check(run_cli, tmp_path, text)
    assert code == 1  # E-AURC of a real model is above 0
    assert row(document, "ks_ce", "max")["passed"]
    assert row(document, "ts.mmce", "max")["passed"]
    assert row(document, "aurc", "max")["passed"]
    assert row(document, "kuiper", "min")["passed"]
    assert not row(document, "e_aurc", "max")["passed"]


def test_policy_bound_outside_the_range_is_refused(run_cli, tmp_path: Path) -> None:
    gate = tmp_path / "gate.toml"
    gate.write_text(SETTINGS + "\n[mmce]\nmax = -0.1\n")
    result = run_cli("check", demo_checkpoint(), "--policy", gate)
    assert result.code == 2, result.output
    assert "mmce" in result.stderr
