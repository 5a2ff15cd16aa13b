"""One spelling of each trace method (``hutchpp``, as ``--trace-method`` spells it) in every
layer; the former spelling (``hutch++``) is still read wherever a user could have written it,
with a :class:`~curvcal.errors.FormerSpellingWarning`."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import curvcal
from curvcal.curvature.trace import trace_estimate
from curvcal.errors import FormerSpellingWarning, SettingsError
from curvcal.policy.parse import load_policy
from curvcal.settings.fields import Spec, settings_fields
from curvcal.settings.hessian import FORMER_TRACE_METHODS, TRACE_METHODS, HessianSettings

PACKAGE = Path(curvcal.__file__).parent


def test_the_former_words_are_todays_choices_and_not_choices_themselves() -> None:
    for old, new in FORMER_TRACE_METHODS:
        assert new in TRACE_METHODS and old not in TRACE_METHODS


def test_no_module_spells_a_trace_method_the_former_way() -> None:
    """Only the settings' table of former words holds them: a kernel, a report or a policy
    that compared with ``"hutch++"`` would never see it again."""
    former = {old for old, _new in FORMER_TRACE_METHODS}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).as_posix() == "settings/hessian.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in former:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert found == []


def test_settings_from_python_read_the_former_spelling_as_todays() -> None:
    with pytest.warns(FormerSpellingWarning, match="trace_method 'hutch\\+\\+' is now spelled"):
        settings = HessianSettings(trace_method="hutch++")
    assert settings.trace_method == "hutchpp"
    with pytest.warns(FormerSpellingWarning):
        split = HessianSettings(trace_method="gauss-newton+hutch++")
    assert split.trace_method == "gauss-newton+hutchpp"
    with pytest.raises(SettingsError, match=r"unknown value 'hutch\+'"):
        HessianSettings(trace_method="hutch+")  # a typo stays a typo


def test_todays_spelling_gives_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", FormerSpellingWarning)
        assert HessianSettings(trace_method="hutchpp").trace_method == "hutchpp"


def test_the_trace_kernel_reads_the_former_spelling_and_reports_todays() -> None:
    """Hutch++ with 3P + 6 products on a P × P matrix is exact: its sketch of Gaussian probes
    spans the space."""
    generator = torch.Generator().manual_seed(0)
    factor = torch.randn(6, 6, generator=generator, dtype=torch.float64)
    matrix = factor @ factor.T
    today = trace_estimate(matrix, 24, trace_method="hutchpp", seed=3, probe_dist="gaussian")
    with pytest.warns(FormerSpellingWarning, match="method 'hutch\\+\\+' is now spelled 'hutchpp'"):
        former = trace_estimate(matrix, 24, trace_method="hutch++", seed=3, probe_dist="gaussian")
    assert former.method == today.method == "hutchpp"
    assert former.estimate == today.estimate
    assert today.stopped_by == "exhausted"
    assert today.estimate == pytest.approx(float(torch.trace(matrix)), rel=1e-12)


def test_the_api_reads_the_former_split_spelling() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    x = torch.randn(20, 3, dtype=torch.float64)
    y = torch.arange(20) % 3
    with pytest.warns(FormerSpellingWarning, match="trace_method 'gauss-newton\\+hutch\\+\\+'"):
        result = curvcal.hessian_trace(model, (x, y), 40, trace_method="gauss-newton+hutch++")
    assert result.method == "gauss-newton+hutchpp"
    today = curvcal.hessian_trace(model, (x, y), 40, trace_method="gauss-newton+hutchpp")
    assert result.estimate == today.estimate


def test_a_policy_reads_the_former_spelling_and_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[settings]\ntrace = "hutch++"\n\n[ece]\nmax = 0.1\n')
    with pytest.warns(FormerSpellingWarning) as caught:
        policy = load_policy(path)
    assert policy.settings["trace"] == "hutchpp"
    assert str(caught[0].message) == (
        f"{path}:2: trace 'hutch++' is now spelled 'hutchpp'; the old spelling will be removed"
    )


def test_former_words_are_declared_by_fields_only_as_pairs_of_strings() -> None:
    for field, spec in settings_fields(HessianSettings):
        assert isinstance(spec, Spec)
        for pair in spec.former_words:
            assert len(pair) == 2 and spec.choices is not None and pair[1] in spec.choices, field


def test_the_trace_kernels_take_the_settings_names_and_the_former_keywords() -> None:
    """``probes``, ``trace_method``, ``trace_rtol`` and ``probe_dist`` as the fields name them;
    the former ``n_probes`` (``matvecs`` for the sketching estimators), ``method``, ``rtol`` and
    ``distribution`` with a DeprecationWarning, not both."""
    from curvcal.curvature.trace import hutchinson_trace, hutchpp_trace, xtrace

    matrix = torch.diag(torch.arange(1.0, 9.0, dtype=torch.float64))
    for kernel in (trace_estimate, hutchinson_trace):
        today = kernel(matrix, probes=12, seed=1)
        with pytest.warns(DeprecationWarning, match="'n_probes' is now called 'probes'"):
            former = kernel(matrix, n_probes=12, seed=1)
        assert former.estimate == today.estimate
        assert today.n_probes <= 12 and today.matvecs <= 12
        with pytest.raises(SettingsError, match="given twice"):
            kernel(matrix, probes=12, n_probes=12)
    for kernel in (hutchpp_trace, xtrace):
        today = kernel(matrix, probes=12, seed=1)
        with pytest.warns(DeprecationWarning, match="'matvecs' is now called 'probes'"):
            former = kernel(matrix, matvecs=12, seed=1)
        assert former.estimate == today.estimate and today.matvecs <= 12
    today = trace_estimate(
        matrix, 12, trace_method="hutchinson", trace_rtol=0.5, probe_dist="gaussian"
    )
    with pytest.warns(DeprecationWarning) as caught:
        former = trace_estimate(matrix, 12, method="hutchinson", rtol=0.5, distribution="gaussian")
    said = " ".join(str(warning.message) for warning in caught)
    for old, new in (
        ("method", "trace_method"),
        ("rtol", "trace_rtol"),
        ("distribution", "probe_dist"),
    ):
        assert f"'{old}' is now called '{new}'" in said
    assert former.estimate == today.estimate and former.stopped_by == today.stopped_by
    # Rademacher probes of a diagonal matrix: every vᵀAv is the trace exactly
    assert hutchinson_trace(matrix, probes=5).estimate == pytest.approx(36.0, rel=1e-15)


def test_layer_curvature_takes_the_settings_names_and_the_former_keywords() -> None:
    from curvcal.curvature.layers import layer_curvature
    from curvcal.curvature.operator import HessianOperator

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    x = torch.randn(12, 3, dtype=torch.float64)
    y = torch.arange(12) % 3
    operator = HessianOperator(model, [(x, y)])
    today = layer_curvature(operator, probes=6, probe_dist="gaussian", seed=2)
    with pytest.warns(DeprecationWarning) as caught:
        former = layer_curvature(operator, n_probes=6, distribution="gaussian", seed=2)
    assert {str(w.message).split(":")[1].split(" is")[0].strip() for w in caught} == {
        "'n_probes'",
        "'distribution'",
    }
    assert [row.trace.estimate for row in former] == [row.trace.estimate for row in today]


def test_a_report_read_back_compares_the_former_spelling_as_todays() -> None:
    """A baseline written with ``hutch++`` compared with a report of ``hutchpp``: the same
    setting, so no difference is said; a real change still is."""
    from curvcal.policy.baseline import flat_settings, setting_differences

    def report(method: str, probes: int) -> dict[str, object]:
        return {
            "schema": "2.0",
            "settings": {"hessian": {"trace_method": method, "probes": probes}},
        }

    old, new = report("gauss-newton+hutch++", 100), report("gauss-newton+hutchpp", 100)
    assert flat_settings(old)["hessian.trace_method"] == "gauss-newton+hutchpp"
    assert setting_differences(new, old) == []
    assert setting_differences(report("xtrace", 50), old) == [
        "--probes: 100 → 50",
        "--trace-method: gauss-newton+hutchpp → xtrace",
    ]
