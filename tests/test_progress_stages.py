"""The Hessian progress: the count at the end equals the products the report counts; Ctrl-C
after a finished stage writes the stages finished with status interrupted (exit 130)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from curvcal import interrupt
from curvcal.curvature.analysis import HessianSettings, analyse_batches
from curvcal.curvature.progress import Stopped


def _model_and_batches() -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))
    x = torch.randn(23, 5)
    y = torch.randint(0, 3, (23,))
    return model, [(x[:10], y[:10]), (x[10:], y[10:])]  # uneven batches


@pytest.mark.parametrize(
    "settings",
    [
        HessianSettings(top_k=3, trace=False),  # ends in Lanczos's residual checks
        HessianSettings(top_k=2, smallest=True, trace_method="hutchinson", probes=7),
        HessianSettings(
            top_k=3,
            trace_method="hutchinson",
            probes=7,
            density=True,
            density_runs=2,
            density_steps=5,
            per_layer=True,
        ),
    ],
)
def test_the_last_count_equals_the_products_the_report_counts(settings: HessianSettings) -> None:
    model, batches = _model_and_batches()
    counts: list[tuple[str, int]] = []
    analysis = analyse_batches(
        model, batches, settings, on_step=lambda stage, done: counts.append((stage, done))
    )
    # Lanczos's residual checks come after its last step: the count at the stage's end has them
    assert counts[-1][1] == analysis.operator["n_matvecs"]
    eigen_end = max(done for stage, done in counts if stage == "eigenvalues")
    assert eigen_end == analysis.spectrum.matvecs


def test_a_hook_that_stops_after_the_eigenvalues_keeps_them() -> None:
    model, batches = _model_and_batches()
    settings = HessianSettings(top_k=2, trace_method="hutchinson", probes=50)

    def on_step(stage: str, _done: int) -> None:
        if stage == "trace":
            raise Stopped(stage=stage)

    with pytest.raises(Stopped) as stopped:
        analyse_batches(model, batches, settings, on_step=on_step)
    finished = stopped.value.finished
    full = analyse_batches(model, batches, settings)
    assert stopped.value.stage == "trace"
    assert finished is not None and finished.trace is None  # type: ignore[attr-defined]
    assert finished.spectrum.eigenvalues == full.spectrum.eigenvalues  # type: ignore[attr-defined]


def test_a_hook_that_stops_in_the_eigenvalues_keeps_nothing() -> None:
    model, batches = _model_and_batches()

    def on_step(stage: str, _done: int) -> None:
        raise Stopped(stage=stage)

    with pytest.raises(Stopped) as stopped:
        analyse_batches(model, batches, HessianSettings(top_k=2), on_step=on_step)
    assert stopped.value.finished is None


def test_ctrl_c_in_the_trace_writes_the_eigenvalues_with_status_interrupted(
    run_cli, digits_files: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint, data = digits_files
    out = tmp_path / "report.json"
    asked: list[str] = []

    def stop_requested() -> bool:  # Ctrl-C pressed once the trace has begun
        return bool(asked)

    import curvcal.pipeline.session as session

    real = session._measure

    def measure(*args, **kwargs):  # type: ignore[no-untyped-def]
        assert kwargs["keep_stages"] is True  # hessian asks to keep finished stages
        return real(*args, **kwargs)

    monkeypatch.setattr(session, "_measure", measure)
    monkeypatch.setattr(interrupt, "stop_requested", stop_requested)
    from curvcal.curvature import analysis as analysis_module

    real_trace = analysis_module.trace_estimate

    def trace_estimate(*args, **kwargs):  # type: ignore[no-untyped-def]
        asked.append("trace")
        return real_trace(*args, **kwargs)

    monkeypatch.setattr(analysis_module, "trace_estimate", trace_estimate)
    result = run_cli(
        "hessian", checkpoint, "--data", data, "--device", "cpu", "--top-k", "2",
        "--trace-method", "hutchinson", "--probes", "40", "-o", out,
    )  # fmt: skip
    assert result.code == 130, result.stderr
    assert result.stderr.rstrip().endswith("curvcal: interrupted")
    report = json.loads(out.read_text())  # whole JSON, written atomically
    assert report["status"] == "interrupted"
    assert len(report["results"]["spectrum"]["values"]) == 2
    assert report["results"]["trace"] is None
    assert any("interrupted (Ctrl-C) in the trace stage" in w for w in report["warnings"])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_ctrl_c_after_lambda_1_without_o_writes_nothing_and_shows_what_was_kept(
    run_cli, digits_files: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint, data = digits_files
    common = ("--data", data, "--device", "cpu", "--method", "power", "--no-trace")
    one = run_cli("hessian", checkpoint, *common, "--top-k", "1", "--json")
    assert one.code == 0, one.stderr
    lambda_1 = json.loads(one.stdout)["results"]["spectrum"]["values"][0]
    products = [0]

    def stop_requested() -> bool:  # Ctrl-C pressed two products into λ2's deflated pass
        return products[0] >= lambda_1["matvecs"] + 2

    import curvcal.curvature.analysis as analysis_module

    real_eigen = analysis_module._eigen

    def counting_eigen(operator, settings, k, which, budget, on_step, on_vectors=None, **rest):  # type: ignore[no-untyped-def]
        def count(done: int) -> None:
            products[0] += 1
            if on_step is not None:
                on_step(done)

        return real_eigen(operator, settings, k, which, budget, count, on_vectors, **rest)

    monkeypatch.setattr(analysis_module, "_eigen", counting_eigen)
    monkeypatch.setattr(interrupt, "stop_requested", stop_requested)
    monkeypatch.chdir(tmp_path)
    result = run_cli("hessian", checkpoint, *common, "--top-k", "3")
    assert result.code == 130, result.stderr
    assert list(tmp_path.iterdir()) == []  # no -o: nothing written
    assert result.stderr.rstrip().endswith("curvcal: interrupted")
    said = " ".join(result.stderr.split())
    assert "the results hold the 1 of 3 eigenvalues that converged" in said
    assert f"λ1 = {lambda_1['value']:.6g}" in said
    assert "Hessian eigenvalues" in result.stdout  # the table of what was kept


def test_the_warm_stage_reports_its_products_as_they_are_made() -> None:
    """Before: the warm stage's products were made on the sample's own operator while its
    reports read the full operator's count, so the count stood still (0) through the stage,
    and its end was reported as another stage (``warm_start``)."""
    from curvcal.curvature.forecast import planned_by_stage
    from curvcal.curvature.progress import WARM_STAGE

    model, batches = _model_and_batches()
    settings = HessianSettings(top_k=2, trace_method="hutchinson", probes=5, warm_start=0.5)
    counts: list[tuple[str, int]] = []
    analysis = analyse_batches(
        model, batches, settings, on_step=lambda stage, done: counts.append((stage, done))
    )
    warm_made = analysis.operator["warm_start"]["n_matvecs"]
    warm = [done for stage, done in counts if stage == WARM_STAGE]
    assert {stage for stage, _ in counts} == {WARM_STAGE, "eigenvalues", "trace"}
    assert [stage for stage, _ in counts[: len(warm)]] == [WARM_STAGE] * len(warm)  # first
    assert len(set(warm)) > 2 and warm == sorted(warm) and warm[0] > 0  # the count moves
    assert warm[-1] == warm_made == analysis.operator["warm_start"]["n_matvecs"]
    # one count over every product: the warm stage's, then the full operator's on top
    assert [done for _, done in counts] == sorted(done for _, done in counts)
    eigen_end = max(done for stage, done in counts if stage == "eigenvalues")
    assert eigen_end == warm_made + analysis.spectrum.matvecs
    assert counts[-1][1] == warm_made + analysis.operator["n_matvecs"]
    # the progress total plans the stage, and the stage is timed apart
    assert WARM_STAGE in planned_by_stage(settings, 100)
    assert WARM_STAGE not in planned_by_stage(HessianSettings(), 100)
    assert "warm_start" in analysis.timings
