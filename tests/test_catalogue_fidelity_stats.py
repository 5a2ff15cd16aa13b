"""Catalogue of the "no silent wrong number" findings on statistics, goldens and peer docs.

Each test names a finding and fails on the code before its fix:

* ``study`` printed ρ = −1, p = 0 for three checkpoints of which two were byte-identical (the t
  approximation at n = 3, where the smallest exact p is 1/3), did not flag the duplicates, and
  printed sixteen rows of "needs at least 3" for two checkpoints.
* the golden JSON comparison froze float32 iteration counts and memory-plan fields, and the golden
  workspace's weights and data depended on the CPU's vector unit.
* the docs said ``--edges right`` bins "as torchmetrics" (torchmetrics keeps c = 1 in an extra
  bin) and that focal TS's ``ece`` objective is the paper's (the authors select T by adaptive ECE
  on a linear grid); the authors' protocol is now a named objective.

Numbers are checked against scipy (``permutation_test``, ``spearmanr``) and against hand
enumeration, never against the code under test.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from curvcal.study.summary import CalibrationSummary, CurvatureSummary, StudyRow
from tests.conftest import CliResult

# --- honest statistics -------------------------------------------------------------------------


def _pearson(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    a = a - a.mean(axis=axis, keepdims=True)
    b = b - b.mean(axis=axis, keepdims=True)
    return (a * b).sum(axis) / np.sqrt((a * a).sum(axis) * (b * b).sum(axis))


def _scipy_exact_p(xs: list[float], ys: list[float]) -> float:
    """scipy's exact two-sided permutation p of Spearman's ρ (all pairings, average ranks)."""
    from scipy.stats import permutation_test, rankdata

    result = permutation_test(
        (rankdata(xs), rankdata(ys)),
        _pearson,
        permutation_type="pairings",
        n_resamples=math.inf,
        alternative="two-sided",
        vectorized=True,
    )
    return float(result.pvalue)


def _samples(n: int, seed: int, ties: bool) -> tuple[list[float], list[float]]:
    rng = np.random.default_rng(seed)
    while True:
        xs = rng.integers(0, 4, n).astype(float) if ties else rng.normal(size=n)
        ys = np.round(rng.normal(size=n)) if ties else rng.normal(size=n)
        if len(set(xs)) > 1 and len(set(ys)) > 1:
            return list(xs), list(ys)


@pytest.mark.parametrize("n", [3, 4, 5, 6])
@pytest.mark.parametrize("ties", [False, True])
def test_spearman_p_is_scipys_exact_permutation_p(n: int, ties: bool) -> None:
    from scipy.stats import spearmanr

    from curvcal.study.spearman import spearman

    for seed in range(3):
        xs, ys = _samples(n, seed, ties)
        result = spearman(xs, ys)
        assert result.rho == pytest.approx(float(spearmanr(xs, ys).statistic), abs=1e-12)
        assert result.p_value == pytest.approx(_scipy_exact_p(xs, ys), abs=1e-12)
        assert result.p_method == "exact permutation"


def test_spearman_p_matches_brute_force_enumeration_at_n_8() -> None:
    """Past what scipy's exact pairings enumerate in memory: every one of the 8! pairings."""
    from scipy.stats import rankdata

    from curvcal.study.spearman import spearman

    xs, ys = _samples(8, 5, ties=True)
    rx, ry = rankdata(xs), rankdata(ys)
    observed = float(_pearson(rx, ry))
    null = np.array([_pearson(rx, ry[list(p)]) for p in itertools.permutations(range(8))])
    eps = 1e-12
    p = min(1.0, 2 * min(np.mean(null >= observed - eps), np.mean(null <= observed + eps)))
    assert spearman(xs, ys).p_value == pytest.approx(p, abs=1e-12)


def _row(name: str, values: tuple[float, ...]) -> StudyRow:
    """A row whose measures are functions of ``values``, except ECE after TS: always 0.01."""
    a, b, c = values
    curvature = CurvatureSummary(a, True, 0.0, b, 0.1, "ce", None, 0.1, 10, 5, 3, "autograd")
    calibration = CalibrationSummary(10, 10, 0.9, c, c + a, b, a * 2, b + c, a + c, 0.01, a - c)
    return StudyRow(name, "ce", 0.0, None, curvature, calibration)


def test_three_checkpoints_two_identical_give_no_p_below_one_third() -> None:
    """Finding: ρ = −1 with p = 0 at n = 3 (the t approximation's infinite t). Of the 3! = 6
    pairings of three ranks, the observed order and its reverse are two: p ≥ 2·1/6 = 1/3."""
    from curvcal.study.summary import rank_correlations

    twin = (1.0, 2.0, 0.5)
    rows = [_row("a", twin), _row("b", twin), _row("c", (2.0, 1.0, 0.25))]
    defined = [c for c in rank_correlations(rows) if c.rho is not None]
    assert defined
    for correlation in defined:
        assert correlation.p_value is not None and correlation.p_value >= 1 / 3 - 1e-12
        # ground truth: scipy's exact permutation test on the same measures
        xs = [r.measure(correlation.curvature) for r in rows]
        ys = [r.measure(correlation.calibration) for r in rows]
        assert correlation.p_value == pytest.approx(_scipy_exact_p(xs, ys), abs=1e-12)


def test_two_checkpoints_give_one_line_not_sixteen() -> None:
    """Finding: sixteen rows of "needs at least 3" for two checkpoints."""
    from curvcal.report.study import correlation_table
    from curvcal.study.summary import rank_correlations

    rows = [_row("a", (1.0, 2.0, 0.5)), _row("b", (2.0, 1.0, 0.25))]
    table = correlation_table(rank_correlations(rows))
    assert len(table.rows) == 1
    assert "at least 3" in table.rows[0][2] and table.rows[0][:2] == ("all", "all")


def test_a_constant_measure_is_one_line_naming_it() -> None:
    from curvcal.report.study import correlation_table
    from curvcal.study.summary import CALIBRATION_MEASURES, CURVATURE_MEASURES, rank_correlations

    rows = [_row(str(i), (1.0 + i, 3.0 - i, 0.1 * i * i)) for i in range(4)]
    correlations = rank_correlations(rows)
    undefined = [c for c in correlations if c.rho is None]
    assert {c.calibration for c in undefined} == {"ece_after_ts"}
    assert len(undefined) == len(CURVATURE_MEASURES)
    table = correlation_table(correlations)
    assert len(table.rows) == len(correlations) - len(undefined) + 1
    last = table.rows[-1]
    assert last[1] == CALIBRATION_MEASURES["ece_after_ts"] and last[0] == "all"
    assert "ECE after TS is constant" in last[2]


def test_byte_identical_checkpoints_are_grouped() -> None:
    from curvcal.study.summary import duplicate_checkpoints

    groups = duplicate_checkpoints(["a", "b", "c", "d"], ["x", "y", "x", "z"])
    assert groups == [("a", "c")]
    assert duplicate_checkpoints(["a", "b"], ["x", "y"]) == []


@pytest.fixture
def study_files(tmp_path: Path) -> Path:
    from safetensors.torch import save_file

    from curvcal.models import DigitsCNN

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(30, 1, 8, 8, generator=generator)
    y = torch.arange(30) % 10
    save_file({"x": x, "y": y}, str(tmp_path / "data.safetensors"))
    for name, seed in (("a", 1), ("b", 2)):
        torch.manual_seed(seed)
        state = {k: v.contiguous() for k, v in DigitsCNN(width=2).state_dict().items()}
        meta = {"curvcal.arch": "curvcal:DigitsCNN", "curvcal.arch_kwargs": '{"width": 2}'}
        save_file(state, str(tmp_path / f"{name}.safetensors"), metadata=meta)
    (tmp_path / "a_copy.safetensors").write_bytes((tmp_path / "a.safetensors").read_bytes())
    return tmp_path


def test_study_of_a_duplicated_checkpoint_warns_and_keeps_p_honest(
    study_files: Path, run_cli: Callable[..., CliResult]
) -> None:
    """The issue's case end to end: three checkpoints, two of them byte-identical."""
    args = [
        "study",
        *(str(study_files / f"{n}.safetensors") for n in ("a", "a_copy", "b")),
        "--data",
        str(study_files / "data.safetensors"),
        "--probes",
        "4",
        "--tol",
        "1e-3",
        "--gammas",
        "0,1",
        "--batch-size",
        "16",
    ]
    result = run_cli(*args, "--json")
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    assert any("byte-identical" in w and "a_copy" in w for w in document["warnings"])
    assert "byte-identical" in result.stderr
    for correlation in document["results"]["correlations"]:
        if correlation["p_value"] is not None:
            assert correlation["p_value"] >= 1 / 3 - 1e-12
            assert correlation["p_method"] == "exact permutation"


# --- a suite that passes on any machine -------------------------------------------------------

GOLDEN = Path(__file__).resolve().parent / "golden"


def _golden_module(name: str) -> object:
    import importlib.util

    path = Path(__file__).resolve().parent / name
    spec = importlib.util.spec_from_file_location(f"fidelity_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_golden_float32_iteration_counts_may_move_by_one() -> None:
    """Finding: on an AVX-512 CPU a float32 per-layer power iteration stopped after 27 steps
    where the golden said 28 (products 176 against 177), and the comparison was exact."""
    compare = _golden_module("test_golden_json.py")
    want = json.loads((GOLDEN / "hessian_float32.json").read_text())
    got = json.loads(json.dumps(want))
    layer = got["results"]["layers"][0]["lambda_max"]
    layer["iterations"] -= 1
    layer["matvecs"] -= 1
    got["results"]["operator"]["n_matvecs"] -= 1
    assert compare._differences(got, want, 1e-5, 1e-6, counters=False) == []  # type: ignore[attr-defined]
    assert compare._differences(got, want, 1e-9, 1e-12, counters=True)  # type: ignore[attr-defined]


def test_golden_files_mask_the_memory_plan() -> None:
    """Finding: the goldens froze ``lanczos_basis``, ``kept_rows`` and the operator's
    ``probe_batch``, which follow the free memory, not the arithmetic."""
    for name in ("hessian_float32", "hessian_float64", "hessian_hutchpp_float64"):
        document = json.loads((GOLDEN / f"{name}.json").read_text())
        operator = document["results"]["operator"]
        for key in ("lanczos_basis", "kept_rows", "probe_batch"):
            assert operator[key] == "<masked>", (name, key)
        assert document["settings"]["hessian"]["probe_batch"] == 8  # the user's option stays


def test_golden_workspace_is_the_same_on_every_cpu_vector_path(tmp_path: Path) -> None:
    """Finding: the golden checkpoints and data came from torch's ``randn``/``uniform_``, whose
    scalar path (``ATEN_CPU_CAPABILITY=default``) differs in the last bits from the AVX ones,
    enough to fail the float64 study golden at 1e-9."""
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file

    script = (
        "import importlib.util, sys; from pathlib import Path; "
        "spec = importlib.util.spec_from_file_location('r', sys.argv[1]); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
        "m.build_workspace(Path(sys.argv[2]))"
    )
    folders = {}
    for capability in ("default", "avx2"):
        folder = tmp_path / capability
        folder.mkdir()
        env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
        subprocess.run(
            [sys.executable, "-c", script, str(GOLDEN / "regenerate.py"), str(folder)],
            env=env,
            check=True,
            timeout=300,
        )
        folders[capability] = folder
    for file in sorted(p.name for p in folders["default"].iterdir()):
        scalar = load_file(str(folders["default"] / file))
        vector = load_file(str(folders["avx2"] / file))
        for key in scalar:
            assert torch.equal(scalar[key], vector[key]), (file, key)


def test_make_test_reruns_float32_goldens_under_another_cpu_capability() -> None:
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    test_line = next(line for line in makefile.splitlines() if line.startswith("test:"))
    assert "test-cpu-capability" in test_line
    assert "ATEN_CPU_CAPABILITY=default" in makefile and "ATEN_CPU_CAPABILITY=avx2" in makefile


# --- docs true to the peers -------------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[1] / "docs" / "guide" / "calibration.md"
EDGE_CASE_P = [[0.9, 0.1, 0.0], [1.0, 0.0, 0.0], [0.0, 0.3, 0.7]]
EDGE_CASE_Y = [0, 1, 2]


def _torchmetrics_binned(
    confidence: np.ndarray, correct: np.ndarray, bins: int
) -> tuple[float, ...]:
    """ECE, MCE, RMS-CE binned as torchmetrics' ``_binning_bucketize`` does: boundaries
    linspace(0, 1, M + 1), ``bucketize(c, boundaries, right=True) - 1``, M + 1 counters, so c = 1
    lands in a bin of its own."""
    boundaries = np.linspace(0, 1, bins + 1)
    index = np.searchsorted(boundaries, confidence, side="right") - 1
    gaps, weights = [], []
    for b in range(bins + 1):
        inside = index == b
        if inside.any():
            gaps.append(abs(correct[inside].mean() - confidence[inside].mean()))
            weights.append(inside.mean())
    gap, weight = np.array(gaps), np.array(weights)
    return float(gap @ weight), float(gap.max()), float(np.sqrt((gap**2) @ weight))


def test_the_torchmetrics_extra_bin_is_described_with_its_numbers() -> None:
    """Finding: ``--edges right`` was said to bin "as torchmetrics"; torchmetrics keeps c = 1 in
    an extra bin, so ECE, MCE and RMS-CE differ once a confidence reaches 1."""
    from curvcal.calibration.metrics import calibration_metrics

    probabilities = np.array(EDGE_CASE_P)
    confidence = probabilities.max(axis=1)
    correct = (probabilities.argmax(axis=1) == np.array(EDGE_CASE_Y)).astype(float)
    ece, mce, rms = _torchmetrics_binned(confidence, correct, 2)
    assert (ece, mce, rms) == pytest.approx((0.4667, 1.0, 0.6), abs=1e-4)
    for edges in ("left", "right"):
        ours = calibration_metrics(
            torch.tensor(EDGE_CASE_P, dtype=torch.float64),
            torch.tensor(EDGE_CASE_Y),
            kind="probs",
            bins=2,
            edges=edges,
        )
        assert (ours.ece, ours.mce, ours.rms_ce) == pytest.approx((0.2, 0.2, 0.2), abs=1e-12)
    text = DOCS.read_text()
    assert "as torchmetrics and netcal bin |" not in text
    assert "extra (M+1)-th bin" in text and "0.4667" in text and "0.200" in text


def test_the_focal_objective_is_not_said_to_be_the_papers() -> None:
    """Finding: the ``ece`` objective of focal TS was said to be "as in the paper"; the
    authors' code picks T by adaptive ECE on a linear grid (now ``adaece-grid``)."""
    text = DOCS.read_text()
    assert "as in the paper" not in text
    assert "adaece-grid" in text and "0.05, 0.10, …, 5.00" in text


def _log_focal_map(logp: np.ndarray, gamma: float) -> np.ndarray:
    """log φ_γ(q) by the definition of references.md, φ_γ(q)_k ∝ 1/g_γ(q_k) with
    g_γ(q) = (1−q)^γ/q − γ(1−q)^(γ−1)·ln q = (1−q)^(γ−1)·((1−q) + γ·q·(−ln q))/q, and 1 − q_k
    summed from the other classes (q_k rounds to 1 at T = 0.05)."""
    from scipy.special import logsumexp

    k = logp.shape[1]
    log_rest = np.stack(
        [logsumexp(np.delete(logp, j, axis=1), axis=1) for j in range(k)], axis=1
    )  # ln(1 − q_k)
    q = np.exp(logp)
    log_inverse = logp - (gamma - 1) * log_rest - np.log(np.exp(log_rest) + gamma * q * -logp)
    return log_inverse - logsumexp(log_inverse, axis=1, keepdims=True)


def _hand_adaece(confidence: np.ndarray, correct: np.ndarray, bins: int) -> float:
    """Equal-mass ECE of references.md: cuts at round(i·N/M) moved to the end of their tie
    group, empty bins dropped."""
    order = np.argsort(confidence, kind="stable")
    c, a = confidence[order], correct[order]
    n = len(c)
    cuts = [0]
    for i in range(1, bins):
        cut = math.floor(i * n / bins + 0.5)
        while 0 < cut < n and c[cut] == c[cut - 1]:
            cut += 1
        cuts.append(max(cut, cuts[-1]))
    cuts.append(n)
    total = 0.0
    for lo, hi in itertools.pairwise(cuts):
        if hi > lo:
            total += (hi - lo) / n * abs(a[lo:hi].mean() - c[lo:hi].mean())
    return total


def test_the_authors_focal_protocol_is_a_named_objective() -> None:
    """``adaece-grid`` = for each γ, T on 0.05, 0.10, ..., 5.00 by AdaECE-15, first minimum;
    γ by the same; checked against an exhaustive hand implementation."""
    from curvcal.calibration.scaling import fit_focal_temperature

    rng = np.random.default_rng(7)
    n, k = 300, 4
    labels = rng.integers(0, k, n)
    logits = rng.normal(0, 1.5, (n, k))
    logits[np.arange(n), labels] += 1.2  # better than chance, overconfident after scaling up
    logits *= 1.8
    gammas = (0.0, 0.5, 1.0, 2.0)
    grid = [round(0.05 * i, 2) for i in range(1, 101)]

    def hand(gamma: float, temperature: float) -> float:
        z = logits / temperature
        logp = z - z.max(axis=1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(axis=1, keepdims=True))
        calibrated = _log_focal_map(logp, gamma) if gamma else logp
        confidence = np.exp(calibrated.max(axis=1))
        correct = (calibrated.argmax(axis=1) == labels).astype(float)
        return _hand_adaece(confidence, correct, 15)

    table = {g: [hand(g, t) for t in grid] for g in gammas}
    fit = fit_focal_temperature(
        torch.tensor(logits), torch.tensor(labels), objective="adaece-grid", gammas=gammas
    )
    assert fit.objective == "adaece-grid"
    assert [p.gamma for p in fit.profile] == list(gammas)
    for point in fit.profile:
        values = table[point.gamma]
        best = min(values)
        assert point.temperature in grid
        assert point.objective == pytest.approx(best, abs=1e-12)
        # the first minimum (the smallest T) wherever the hand minimum is not a near-tie
        assert point.temperature == grid[values.index(best)] or sorted(values)[1] - best < 1e-12
    best_gamma = min(gammas, key=lambda g: min(table[g]))
    assert fit.gamma == best_gamma
    assert fit.objective_after == pytest.approx(min(table[best_gamma]), abs=1e-12)
    assert fit.bracket == (0.05, 5.0)


def test_the_authors_objective_is_offered_on_the_command_line(
    run_cli: Callable[..., CliResult],
) -> None:
    result = run_cli("calibrate", "--help")
    assert result.code == 0
    assert "adaece-grid" in result.stdout


def test_the_eight_model_p_values_in_the_guide_are_exact() -> None:
    """Finding: the guide quoted p = 3e-5 for ρ = 0.98 over 8 models, below the smallest p
    that 8! pairings allow (2/8! = 5e-5). By hand: one adjacent swap (Σd² = 2, ρ = 0.976) is
    matched or beaten by the identity and the 7 adjacent swaps, so p = 2·8/8! = 4.0e-4."""
    from curvcal.study.spearman import spearman

    result = spearman(list(range(8)), [1, 0, 2, 3, 4, 5, 6, 7])
    assert result.rho == pytest.approx(1 - 6 * 2 / (8 * 63))
    assert result.p_value == pytest.approx(16 / math.factorial(8))
    papers = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "papers.md").read_text()
    assert "AdaECE 0.98 (4e-4)" in papers and "(3e-5)" not in papers
