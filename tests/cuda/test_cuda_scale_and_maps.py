"""The paths built after the first GPU run, on ``--device cuda`` against the CPU.

* a model sharded with FSDP2 over a process group of one rank (NCCL on CUDA): products by
  central differences on the rank's slices of every vector, with and without activation
  checkpointing, give the double-backward λ1, λ2 and product of one CPU process;
* a bfloat16 model's λmax lies within the precision floor curvcal states for it, measured
  against the float64 λmax on the CPU;
* every calibration map (``--method all``) and the last-layer Laplace map (full by the marginal
  likelihood, Kronecker-factored by held-out NLL) give the CPU's numbers.

Skipped without a CUDA device; ``conftest.py`` runs them with the CPU standing in (gloo in
place of NCCL), at the smaller sizes of :data:`~tests.cuda.sizes.STAND_IN_SIZES`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.cuda.sizes import Sizes
from tests.cuda.test_cuda_matches_cpu import (
    CALIBRATION_ATOL,
    CALIBRATION_KEYS,
    CHECKPOINT,
    DATA,
    numbers,
    run_json,
)

pytestmark = pytest.mark.cuda

#: numbers of a Laplace fit compared between devices (besides the metrics)
LAPLACE_KEYS = {"prior_precision", "log_marginal_likelihood", "log_likelihood", "heldout_nll"}


def differences(
    got: dict[str, float], expected: dict[str, float], rel: float = 0.0, abs: float = 0.0
) -> dict[str, tuple[float, float]]:
    """The paths whose numbers differ beyond the tolerance: (device, CPU)."""
    assert expected, "nothing to compare"
    assert got.keys() == expected.keys()
    return {
        path: (got[path], value)
        for path, value in expected.items()
        if got[path] != pytest.approx(value, rel=rel, abs=abs)
    }


@pytest.mark.parametrize("checkpoint", [False, True], ids=["plain", "checkpoint-activations"])
def test_sharded_model_on_the_device_matches_one_cpu_process(device: str, checkpoint: bool) -> None:
    """FSDP2 over a process group of one rank (NCCL on CUDA; the command line refuses one rank,
    so the library is driven here): central differences on sliced vectors give the top two
    eigenvalues and a product of the double-backward operator on the CPU."""
    import torch.distributed as dist

    from curvcal.curvature import build_operator, eigenvalues
    from curvcal.curvature.operator import HessianOperator
    from curvcal.curvature.vectors import space_of
    from curvcal.distributed import all_reduce_sum
    from curvcal.losses import loss_from_name
    from curvcal.sharding import shard_model
    from tests.scale.sharded_worker import BATCH, TOLERANCE, make_problem

    model, x, y = make_problem(torch.float64)
    batches = [(x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, len(y), BATCH)]
    reference = HessianOperator(model, batches)
    expected = [e.value for e in eigenvalues(reference, 2, tol=1e-10).values]
    vector = torch.randn(reference.shape[0], generator=torch.Generator().manual_seed(3),
                         dtype=torch.float64)  # fmt: skip
    expected_product = reference.matvec(vector)

    on_device = torch.device(device)
    moved = [(xb.to(on_device), yb.to(on_device)) for xb, yb in batches]
    backend = "nccl" if on_device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        sharded = model.to(on_device)
        shard_model(sharded, "blocks", on_device, checkpoint_activations=checkpoint)
        operator = build_operator(sharded, loss_from_name("ce", 0.0), moved,
                                all_reduce=all_reduce_sum)  # fmt: skip
        assert space_of(operator).sliced
        got = [e.value for e in eigenvalues(operator, 2, tol=1e-8).values]
        product = operator.matvec(vector.to(on_device)).cpu()
    finally:
        dist.destroy_process_group()
    assert got == pytest.approx(expected, rel=TOLERANCE[torch.float64])
    error = float((product - expected_product).norm() / expected_product.norm())
    assert error < TOLERANCE[torch.float64], error


def test_bfloat16_lambda_max_lies_within_its_stated_floor(
    run_cli: Callable[..., Any], device: str, sizes: Sizes
) -> None:
    common = ["hessian", CHECKPOINT, "--data", DATA, *sizes.subset(), "--batch-size",
              str(sizes.batch_size), "--no-trace", "--tol", "1e-3"]  # fmt: skip
    reference = run_json(run_cli, *common, "--dtype", "float64", "--device", "cpu")["results"]
    got = run_json(run_cli, *common, "--dtype", "bfloat16", "--device", device)["results"]
    floor = got["operator"]["precision_floor"]
    assert floor is not None and 1e-3 < floor < 0.1  # bfloat16's: eps 2^-8 times a few
    error = abs(got["lambda_max"] - reference["lambda_max"]) / abs(reference["lambda_max"])
    assert error <= floor, (got["lambda_max"], reference["lambda_max"], floor)


def test_every_calibration_map_matches_cpu(
    run_cli: Callable[..., Any], device: str, sizes: Sizes
) -> None:
    args = ["calibrate", CHECKPOINT, "--data", DATA, *sizes.subset(), "--dtype", "float64",
            "--val-split", "0.5", "--method", "all"]  # fmt: skip
    got = run_json(run_cli, *args, "--device", device)["results"]
    expected = run_json(run_cli, *args, "--device", "cpu")["results"]
    assert got["ranking"]["best"] == expected["ranking"]["best"]
    keys = CALIBRATION_KEYS | LAPLACE_KEYS
    wrong = differences(numbers(got, keys), numbers(expected, keys), abs=CALIBRATION_ATOL)
    assert not wrong, f"device and CPU differ (device, CPU): {wrong}"


def test_kronecker_laplace_by_heldout_nll_matches_cpu(
    run_cli: Callable[..., Any], device: str, sizes: Sizes
) -> None:
    args = ["calibrate", CHECKPOINT, "--data", DATA, *sizes.subset(), "--dtype", "float64",
            "--val-split", "0.5", "--method", "laplace", "--laplace-structure", "kron",
            "--laplace-prior", "nll"]  # fmt: skip
    got = run_json(run_cli, *args, "--device", device)["results"]
    expected = run_json(run_cli, *args, "--device", "cpu")["results"]
    assert got["fits"]["laplace"]["structure"] == "kron"
    prior = got["fits"]["laplace"]["prior_precision"]
    assert prior == pytest.approx(expected["fits"]["laplace"]["prior_precision"], rel=1e-6)
    wrong = differences(
        numbers(got["evaluation"], CALIBRATION_KEYS),
        numbers(expected["evaluation"], CALIBRATION_KEYS),
        abs=CALIBRATION_ATOL,
    )
    assert not wrong, f"device and CPU differ (device, CPU): {wrong}"
