"""Focal temperature scaling's γ has one upper bound, MAX_GAMMA, shared by ``--gammas``, the
fit and a saved focal TS map: a γ past it is refused where it is given (the option, the fit's
grid, the file naming itself), not found later as NaN log-probabilities or an internal error
of the ECE fit's binning."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import curvcal
from curvcal.calibration.scaling import fit_focal_temperature
from curvcal.errors import InputError
from curvcal.settings.calibration import MAX_GAMMA
from tests.commands.test_calibrate import one_line_error


def _scores(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (n,), generator=generator)
    logits = torch.randn(n, 3, generator=generator, dtype=torch.float64)
    logits[torch.arange(n), labels] += 1.5
    return 3 * logits, labels


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, dict, Path]:
    """A saved focal TS map (its file and JSON) and a file of scores to apply it to."""
    root = tmp_path_factory.mktemp("gamma")
    scores, labels = _scores(120, 0)
    path = root / "fts.json"
    curvcal.fit_map("focal-ts", scores, labels, gammas=(0.0, 1.0)).save(path)
    test, test_labels = _scores(60, 1)
    npz = root / "s.npz"
    np.savez(npz, logits=test.numpy(), labels=test_labels.numpy())
    return path, json.loads(path.read_text()), npz


@pytest.mark.parametrize("gamma", [MAX_GAMMA * 1.5, 1e6, 1e308])
def test_a_saved_gamma_past_the_bound_is_exit_2_naming_the_file(
    run_cli, files, tmp_path: Path, gamma: float
) -> None:
    _, document, npz = files
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**document, "focal_ts": {**document["focal_ts"], "gamma": gamma}}))
    one_line_error(run_cli("metrics", npz, "--apply", bad), str(bad), "gamma", "0..100")


def test_a_saved_gamma_at_the_bound_applies(run_cli, files, tmp_path: Path) -> None:
    """Border: γ = MAX_GAMMA is read and gives a distribution on every row; φ_γ sharpens
    (it acts like an inverse temperature above 1 for γ > 0), so the top class's probability
    never falls below softmax(z / T)'s."""
    _, document, npz = files
    edge = tmp_path / "edge.json"
    body = {**document["focal_ts"], "gamma": MAX_GAMMA}
    edge.write_text(json.dumps({**document, "focal_ts": body}))
    result = run_cli("metrics", npz, "--apply", edge, "--json")
    assert result.code == 0, result.stderr
    loaded = curvcal.load_map(edge)
    test, _ = _scores(60, 1)
    p = loaded.probabilities(test)
    assert torch.isfinite(p).all()
    torch.testing.assert_close(p.sum(1), torch.ones(60, dtype=torch.float64))
    scaled = torch.softmax(test / body["temperature"], 1)
    assert (p.max(1).values >= scaled.max(1).values - 1e-12).all()


def test_gammas_past_the_bound_are_refused_by_the_option(run_cli, files) -> None:
    _, _, npz = files
    result = run_cli("metrics", npz, "--val-split", "0.5", "--gammas", f"0,{MAX_GAMMA + 1:g}")
    assert result.code == 2 and "--gammas" in result.stderr and "at most 100" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("objective", ["nll", "ece"])
def test_the_fit_refuses_a_gamma_past_the_bound(objective: str) -> None:
    """The ECE fit's binning failed with an internal error at γ = 1e100: the grid is checked
    before any work."""
    scores, labels = _scores(120, 0)
    with pytest.raises(InputError, match=r"gamma 1e\+100 is outside 0\.\.100") as caught:
        fit_focal_temperature(scores, labels, objective=objective, gammas=(0.0, 1e100))
    assert caught.value.what == "gammas"
    fit = fit_focal_temperature(scores, labels, objective=objective, gammas=(0.0, MAX_GAMMA))
    assert [point.gamma for point in fit.profile] == [0.0, MAX_GAMMA]
