"""`curvcal hessian` end to end on a tiny safetensors checkpoint and a tensor-file dataset, against
the dense float64 Hessian of the mean loss."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from console_text import times_said
from safetensors.torch import save_file
from torch import Tensor, nn

from curvcal.models import DigitsCNN

N_SAMPLES = 40
ARCH = {
    "curvcal.arch": "curvcal:DigitsCNN",
    "curvcal.arch_kwargs": '{"num_classes": 3, "width": 1}',
}


@dataclass(frozen=True)
class Files:
    model: nn.Module
    x: Tensor
    y: Tensor
    checkpoint: Path
    focal_checkpoint: Path
    nan_checkpoint: Path
    data: Path
    nan_data: Path


def _save(model: nn.Module, path: Path, metadata: dict[str, str]) -> Path:
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path), metadata)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    root = tmp_path_factory.mktemp("hessian")
    torch.manual_seed(0)
    model = DigitsCNN(num_classes=3, width=1).double().eval()  # 1,185 parameters
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(N_SAMPLES, 1, 8, 8, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (N_SAMPLES,), generator=generator)
    torch.save({"x": x, "y": y}, root / "data.pt")
    bad_x = x.clone()
    bad_x[3, 0, 1, 1] = math.nan
    torch.save({"x": bad_x, "y": y}, root / "nan.pt")
    broken = DigitsCNN(num_classes=3, width=1).double()
    broken.load_state_dict(model.state_dict())
    with torch.no_grad():
        broken.classifier[3].weight[0, 0] = math.inf
    return Files(
        model=model,
        x=x,
        y=y,
        checkpoint=_save(model, root / "model.safetensors", ARCH),
        focal_checkpoint=_save(
            model,
            root / "focal.safetensors",
            {**ARCH, "curvcal.loss": "focal", "curvcal.gamma": "2"},
        ),
        nan_checkpoint=_save(broken, root / "broken.safetensors", ARCH),
        data=root / "data.pt",
        nan_data=root / "nan.pt",
    )


@pytest.fixture(scope="module")
def dense(files: Files) -> Tensor:
    """∇² of the mean cross-entropy over all samples (eval mode), by torch.func.hessian."""
    model = files.model
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def loss(theta: Tensor) -> Tensor:
        pieces = theta.split([math.prod(s) for s in shapes])
        values = {n: p.reshape(s) for n, p, s in zip(names, pieces, shapes, strict=True)}
        logits = torch.func.functional_call(model, values, (files.x,))
        return nn.functional.cross_entropy(logits, files.y)

    return torch.func.hessian(loss)(flat)


def _base(files: Files, *extra: str) -> list[str]:
    dtype = [] if "--dtype" in extra else ["--dtype", "float64"]  # one --dtype: two are refused
    return ["hessian", str(files.checkpoint), "--data", str(files.data), *dtype,
            "--device", "cpu", *extra]  # fmt: skip


def test_json_matches_the_dense_hessian(run_cli, files: Files, dense: Tensor, tmp_path) -> None:
    out = tmp_path / "hessian.json"
    args = ["--top-k", "3", "--smallest", "--per-layer", "--probes", "40", "--tol", "1e-8"]
    result = run_cli(*_base(files, *args, "--batch-size", "16", "--json", "-o", str(out)))
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    assert json.loads(out.read_text()) == document
    assert document["command"] == "hessian" and document["status"] == "ok"
    results = document["results"]
    exact = torch.linalg.eigvalsh(dense)

    assert results["lambda_max"] == pytest.approx(float(exact[-1]), rel=1e-6)
    assert results["eigenvalues"] == pytest.approx(exact[-3:].flip(0).tolist(), rel=1e-6)
    assert results["lambda_min"] == pytest.approx(float(exact[0]), rel=1e-6)
    # a ReLU CNN is linear in each parameter tensor: --trace-method auto takes the exact
    # Gauss–Newton trace, with no product
    trace = results["trace"]
    assert trace["method"] == "gauss-newton" and trace["matvecs"] == 0
    assert trace["estimate"] == pytest.approx(float(torch.trace(dense)), rel=1e-12)
    assert trace["ci95"][0] <= float(torch.trace(dense)) <= trace["ci95"][1]
    assert "linear in each selected tensor" in results["operator"]["trace_choice"]

    offset = 0
    layers = {row["module"]: row for row in results["layers"]}
    assert list(layers) == ["features.0", "features.2", "classifier.1", "classifier.3"]
    for row in results["layers"]:
        size = row["n_params"]
        block = dense[offset : offset + size, offset : offset + size]
        offset += size
        assert row["lambda_max"]["value"] == pytest.approx(
            float(torch.linalg.eigvalsh(block)[-1]), rel=1e-3
        )
        # the Gauss–Newton trace gives every block its exact share, with no product
        assert row["trace"]["method"] == "gauss-newton"
        assert row["trace"]["estimate"] == pytest.approx(float(torch.trace(block)), rel=1e-10)
    assert offset == dense.shape[0] == results["operator"]["n_params"] == 1185

    operator = results["operator"]
    assert operator["n_samples"] == N_SAMPLES and operator["world_size"] == 1
    assert operator["loss"] == "ce" and operator["mode"] == "eval"
    with torch.no_grad():
        mean_loss = float(nn.functional.cross_entropy(files.model(files.x), files.y))
    assert operator["mean_loss"] == pytest.approx(mean_loss, rel=1e-12)
    settings = document["settings"]
    hessian = settings["hessian"]
    assert hessian["top_k"] == 3 and hessian["seed"] == 0 and hessian["loss"] == "ce"
    assert settings["data"]["data"] == str(files.data) and settings["data"]["batch_size"] == 16
    assert document["inputs"]["checkpoint"]["sha256"]
    assert document["inputs"]["data"]["n_samples"] == N_SAMPLES
    assert document["inputs"]["data"]["files"][0]["sha256"]


def test_default_lanczos_and_tables(run_cli, files: Files, dense: Tensor) -> None:
    result = run_cli(*_base(files, "--probes", "10", "--format", "markdown", "--explain"))
    assert result.code == 0, result.stderr
    for title in ("Hessian eigenvalues", "Hessian trace", "run"):
        assert f"### {title}" in result.stdout
    assert "| 1 |" in result.stdout and "| gauss-newton |" in result.stdout
    # an exact trace has no ± and no 95% interval: its bounds are labelled as rounding
    assert "Gauss–Newton, " in result.stdout and "exact, so no 95% interval" in result.stdout
    assert "rounding allowance (exact up to rounding" in result.stdout
    trace_row = next(line for line in result.stdout.splitlines() if "| gauss-newton |" in line)
    assert "(exact)" in trace_row and "| rounding [" in trace_row and "±" not in trace_row
    assert "chosen by --trace-method auto: the logits are linear" in result.stdout

    result = run_cli(
        *_base(files, "--probes", "10", "--trace-method", "hutchpp", "--format", "markdown",
               "--explain")
    )  # fmt: skip
    assert result.code == 0, result.stderr
    assert "| hutchpp |" in result.stdout and "chosen by" not in result.stdout
    assert "95% interval: Student-t over the probe values of the deflated remainder" in (
        result.stdout
    )

    result = run_cli(*_base(files, "--no-trace", "--hvp", "autograd", "--json"))
    assert result.code == 0, result.stderr
    results = json.loads(result.stdout)["results"]
    assert results["spectrum"]["method"] == "lanczos" and results["trace"] is None
    assert results["operator"]["engine"] == "autograd"
    assert results["lambda_max"] == pytest.approx(float(torch.linalg.eigvalsh(dense)[-1]), rel=1e-6)

    result = run_cli(*_base(files, "--no-trace", "--method", "power", "--json"))
    assert result.code == 0, result.stderr
    results = json.loads(result.stdout)["results"]
    assert results["spectrum"]["method"] == "power"
    assert results["lambda_max"] == pytest.approx(float(torch.linalg.eigvalsh(dense)[-1]), rel=1e-6)


def test_the_former_spelling_of_a_trace_method_is_read_with_a_warning(
    run_cli, files: Files
) -> None:
    """--trace-method hutch++ (the kernels' old spelling) runs as hutchpp, says so once on
    stderr, and every record spells it hutchpp."""
    args = ("--top-k", "1", "--probes", "12", "--json", "--trace-method")
    today = run_cli(*_base(files, *args, "hutchpp"))
    result = run_cli(*_base(files, *args, "hutch++"))
    assert result.code == today.code == 0, result.stderr
    assert times_said("--trace-method 'hutch++' is now spelled 'hutchpp'", result.stderr) == 1
    assert "spelled" not in today.stderr
    document = json.loads(result.stdout)
    assert document["settings"]["hessian"]["trace_method"] == "hutchpp"
    trace = document["results"]["trace"]
    assert trace["method"] == "hutchpp"
    assert trace["estimate"] == json.loads(today.stdout)["results"]["trace"]["estimate"]
    # a warning of the run like any other: the report keeps it (said while the options were
    # parsed, before the run's reporter existed)
    spelled = [w for w in document["warnings"] if "is now spelled" in w]
    assert len(spelled) == 1 and "--trace-method 'hutch++' is now spelled 'hutchpp'" in spelled[0]
    assert not any("spelled" in w for w in json.loads(today.stdout)["warnings"])


def test_own_loss_is_read_from_the_checkpoint(run_cli, files: Files) -> None:
    args = ["hessian", str(files.focal_checkpoint), "--data", str(files.data), "--loss", "own"]
    result = run_cli(*args, "--dtype", "float64", "--device", "cpu", "--no-trace", "--json")
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    operator = document["results"]["operator"]
    assert operator["loss"] == "focal" and operator["gamma"] == 2.0
    with torch.no_grad():
        log_p = torch.log_softmax(files.model(files.x), dim=1).gather(1, files.y[:, None])
    focal = float((-((1 - log_p.exp()) ** 2) * log_p).mean())
    assert operator["mean_loss"] == pytest.approx(focal, rel=1e-12)
    assert document["settings"]["hessian"]["loss"] == "own"
    assert document["results"]["operator"]["loss"] == "focal"


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["--data-missing"], 2, "Missing option '--data'"),
        (["--top-k", "2000"], 2, "--top-k: 2000 eigenvalues asked of a Hessian with 1185"),
        (["--hvp", "jax"], 2, "'jax' is not one of"),
        (["--loss", "own"], 2, "records no training loss"),
        (["--nan-data"], 2, "NaN"),
        # an infinite weight is the file's fault, said at load (it was exit 3, a NaN loss)
        (["--nan-weights"], 2, "parameter classifier.3.weight holds 1 NaN or infinite value"),
        (["--gamma", "2"], 2, "--gamma: 2.0 is only used by --loss focal"),
        (["--loss", "focal"], 2, "needs --gamma"),
        (["--trace-method", "hutchpp", "--trace-rtol", "0.1"], 2, "--trace-rtol"),
        (["--params", "head.*"], 2, "--params: 'head.*' matches no trainable parameter"),
        (["--probes", "1"], 2, "--probes"),
        (["--memory-budget", "lots"], 2, "--memory-budget: cannot read 'lots'"),
        (["--memory-budget", "150%"], 2, "--memory-budget: a share must be in"),
        (["--memory-budget", "4XB"], 2, "--memory-budget: unknown unit 'XB'"),
        (["--memory-budget", "0"], 2, "--memory-budget: must be at least 1 byte"),
        (["--keep-graphs", "sometimes"], 2, "--keep-graphs"),
        (["--max-basis", "2"], 2, "--max-basis"),
        (["--top-k", "3", "--max-basis", "4"], 2, "--max-basis: must be an integer ≥ 5, got 4"),
        (
            ["--trace-method", "gauss-newton+hutchpp", "--probes", "5"],
            2,
            "--trace-method: the split trace gauss-newton+hutchpp cannot run here: its exact "
            "part takes 2 gradient norms per sample, leaving 3 of --probes 5",
        ),
        (["--trace-method", "gauss-newton+xtrace", "--mode", "train"], 2, "train mode"),
        (
            ["--no-trace", "--probes", "50", "--trace-method", "hutchpp"],
            2,
            "--no-trace: no trace is computed, so --trace-method, --probes would do nothing",
        ),
        (
            ["--trace-method", "gauss-newton", "--probe-dist", "gaussian"],
            2,
            "--probe-dist: the gauss-newton trace is exact and draws no probe",
        ),
    ],
)
def test_bad_input_is_one_line_and_an_exit_code(
    run_cli, files: Files, args: list[str], code: int, needle: str
) -> None:
    checkpoint, data = files.checkpoint, files.data
    if args == ["--data-missing"]:
        command = ["hessian", str(checkpoint), "--dtype", "float64"]
    else:
        if args == ["--nan-data"]:
            data, args = files.nan_data, []
        if args == ["--nan-weights"]:
            checkpoint, args = files.nan_checkpoint, []
        command = ["hessian", str(checkpoint), "--data", str(data), "--dtype", "float64", *args]
    result = run_cli(*command, "--device", "cpu")
    assert result.code == code, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("curvcal: error: "), result.stderr
    assert needle in lines[0]


def test_the_split_trace_reports_its_parts(run_cli, files: Files, dense: Tensor) -> None:
    """On this ReLU CNN every diagonal block of the logits' Hessian is zero, so the exact
    Gauss–Newton part is the whole trace and the estimate of the rest straddles zero."""
    args = ["--trace-method", "gauss-newton+hutchpp", "--probes", "30", "--json"]
    result = run_cli(*_base(files, *args))
    assert result.code == 0, result.stderr
    trace = json.loads(result.stdout)["results"]["trace"]
    exact = float(torch.trace(dense))
    assert trace["method"] == "gauss-newton+hutchpp" and trace["matvecs"] == 28
    assert trace["parts"]["gauss_newton"] == pytest.approx(exact, rel=1e-12)
    assert trace["ci95"][0] <= exact <= trace["ci95"][1]
    assert trace["estimate"] == pytest.approx(exact + trace["parts"]["residual"], rel=1e-15)
    table = run_cli(*_base(files, *args[:-1], "--explain"))
    assert table.code == 0, table.stderr
    assert "Gauss–Newton part exact + Hutch++ on the rest, 28 products" in table.stdout
    assert "(Gauss–Newton part, exact)" in table.stdout


def test_a_small_memory_budget_splits_batches_and_keeps_the_numbers(
    run_cli, files: Files, dense: Tensor
) -> None:
    args = ["--top-k", "2", "--tol", "1e-8", "--no-trace", "--batch-size", "16", "--json"]
    result = run_cli(*_base(files, *args, "--memory-budget", "30KB"))
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    operator = document["results"]["operator"]
    assert operator["micro_batch"] is not None and 1 <= operator["micro_batch"] < 16
    assert operator["probe_batch"] == 1
    assert document["settings"]["hessian"]["memory_budget"] == "30KB"
    exact = torch.linalg.eigvalsh(dense)
    assert document["results"]["eigenvalues"] == pytest.approx(
        exact[-2:].flip(0).tolist(), rel=1e-6
    )


def test_a_bounded_lanczos_basis_restarts_and_keeps_the_numbers(
    run_cli, files: Files, dense: Tensor
) -> None:
    """--max-basis 6 for the top 2 of 1,185 parameters: more steps than the basis holds (so it
    restarted), the values of the dense Hessian, the bound recorded; without it, the default
    budget's bound (all 1,185: no restart)."""
    args = ["--top-k", "2", "--tol", "1e-8", "--no-trace", "--json"]
    result = run_cli(*_base(files, *args, "--max-basis", "6"))
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["settings"]["hessian"]["max_basis"] == 6
    assert document["results"]["operator"]["lanczos_basis"] == 6
    assert document["results"]["spectrum"]["values"][0]["iterations"] > 6
    exact = torch.linalg.eigvalsh(dense)
    assert document["results"]["eigenvalues"] == pytest.approx(
        exact[-2:].flip(0).tolist(), rel=1e-7
    )
    default = json.loads(run_cli(*_base(files, *args)).stdout)
    assert default["settings"]["hessian"]["max_basis"] is None
    assert default["results"]["operator"]["lanczos_basis"] == 1185


@pytest.mark.parametrize(("keep", "kept"), [("auto", True), ("never", False)])
def test_kept_graphs_are_reported_and_keep_the_numbers(
    run_cli, files: Files, dense: Tensor, keep: str, kept: bool
) -> None:
    args = ["--top-k", "2", "--tol", "1e-8", "--no-trace", "--batch-size", "16", "--json"]
    result = run_cli(*_base(files, *args, "--keep-graphs", keep))
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    operator = document["results"]["operator"]
    assert operator["graphs_kept"] is kept and operator["graphs_dropped"] is None
    assert document["settings"]["hessian"]["keep_graphs"] == keep
    # kept: the mean loss and the graphs read the data once each; else one pass per product
    passes = operator["n_data_passes"]
    assert passes == 2 if kept else passes > 10
    exact = torch.linalg.eigvalsh(dense)
    assert document["results"]["eigenvalues"] == pytest.approx(
        exact[-2:].flip(0).tolist(), rel=1e-6
    )


def test_strict_turns_non_convergence_into_exit_3(run_cli, files: Files) -> None:
    args = _base(files, "--method", "power", "--max-iter", "1", "--no-trace", "--json")
    relaxed = run_cli(*args)
    assert relaxed.code == 0, relaxed.stderr
    assert "warning" in relaxed.stderr and "did not meet tol" in relaxed.stderr
    document = json.loads(relaxed.stdout)
    assert document["status"] == "ok" and document["results"]["converged"] is False
    assert document["warnings"]

    strict = run_cli(*args, "--strict")
    assert strict.code == 3
    assert json.loads(strict.stdout)["status"] == "error"
    lines = strict.stderr.strip().splitlines()
    assert len(lines) == 1 and "eigenvalue 1" in lines[0] and "did not converge" in lines[0]


def test_unconverged_messages_name_the_limit(run_cli, files: Files) -> None:
    """max_iter when the step budget ran out; the float32 floor when rounding did."""
    budget = run_cli(*_base(files, "--method", "power", "--max-iter", "1", "--no-trace"))
    said = " ".join(budget.stderr.split())  # the console wraps long lines
    assert budget.code == 0 and "stopped by max_iter" in said and "precision floor" not in said
    args = _base(files, "--dtype", "float32", "--tol", "1e-10", "--no-trace", "--json")
    floor = run_cli(*args)
    assert floor.code == 0, floor.stderr
    said = " ".join(floor.stderr.split())
    assert "float32 precision floor" in said and "raise max_iter" not in said
    spectrum = json.loads(floor.stdout)["results"]["spectrum"]
    assert spectrum["stopped_by"] == "precision" and spectrum["values"][0]["iterations"] < 100
    strict = run_cli(*args, "--strict")
    said = " ".join(strict.stderr.split())
    assert strict.code == 3 and "loosen --tol" in said and "--max-iter" not in said
