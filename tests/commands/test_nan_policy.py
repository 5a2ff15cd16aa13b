"""`--nan-policy error|drop` for rows of logits in `curvcal metrics` and `curvcal calibrate`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from curvcal.models import DigitsCNN

LOGITS = np.array(
    [[2.0, 0.0, -1.0], [0.0, math.nan, 0.0], [0.5, 0.5, 3.0], [1.0, 2.0, 0.0], [math.inf, 0, 0]]
)
LABELS = np.array([0, 1, 2, 0, 1])


def test_metrics_error_names_the_file_first_row_and_count(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "l.npz"
    np.savez(path, logits=LOGITS, labels=LABELS)
    result = run_cli("metrics", path, "--json")
    assert result.code == 2 and result.stdout == ""
    assert result.stderr.strip() == (
        f"curvcal: error: {path}: row 1 has a NaN or infinite logit (2 of 5 rows do) "
        "(--nan-policy drop leaves such rows out)"
    )


def test_metrics_drop_measures_the_finite_rows_and_reports_the_count(run_cli, tmp_path) -> None:
    path, finite = tmp_path / "l.npz", tmp_path / "finite.npz"
    np.savez(path, logits=LOGITS, labels=LABELS)
    keep = [0, 2, 3]
    np.savez(finite, logits=LOGITS[keep], labels=LABELS[keep])
    dropped = run_cli("metrics", path, "--nan-policy", "drop", "--json")
    reference = run_cli("metrics", finite, "--json")
    assert dropped.code == 0 and reference.code == 0, dropped.stderr
    document = json.loads(dropped.stdout)
    assert document["inputs"]["logits"]["dropped_rows"] == 2
    assert document["inputs"]["logits"]["n_samples"] == 3
    assert document["settings"]["calibration"]["nan_policy"] == "drop"
    message = f"{path}: left out 2 of 5 rows with a NaN or Inf (--nan-policy drop)"
    # the three rows left hold labels 0 and 2 only: class 1 is missing, said too
    missing = f"{path}: the labels hold 2 of the model's 3 classes (1 missing: 1)"
    assert len(document["warnings"]) == 2 and message in document["warnings"]
    assert any(w.startswith(missing) for w in document["warnings"])
    assert "curvcal: warning:" in dropped.stderr and "left out 2 of 5 rows" in dropped.stderr
    expected = json.loads(reference.stdout)["results"]["evaluation"]
    assert document["results"]["evaluation"] == expected


def test_calibrate_nan_logits_error_then_drop(run_cli, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = DigitsCNN(num_classes=3, width=1)
    with torch.no_grad():  # positive convolutions: a huge positive input overflows to inf
        model.features[0].weight.fill_(1.0)
        model.features[2].weight.fill_(1.0)
    arch = {
        "curvcal.arch": "curvcal:DigitsCNN",
        "curvcal.arch_kwargs": '{"num_classes": 3, "width": 1}',
    }
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(tmp_path / "m.safetensors"),
        arch,
    )
    x = torch.randn(12, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    x[[4, 9]] = 3e38  # finite inputs whose activations overflow: those logits are NaN/Inf
    y = torch.arange(12) % 3
    torch.save({"x": x, "y": y}, tmp_path / "d.pt")
    with torch.no_grad():
        logits = model.eval()(x)
    bad = (~torch.isfinite(logits)).any(dim=1).nonzero().reshape(-1).tolist()
    assert bad == [4, 9]  # the premise of this test

    args = ("calibrate", tmp_path / "m.safetensors", "--data", tmp_path / "d.pt", "--device", "cpu",
            "--method", "none", "--json")  # fmt: skip
    failed = run_cli(*args)
    assert failed.code == 3 and failed.stdout == ""
    assert failed.stderr.startswith(
        f"curvcal: error: --data {tmp_path / 'd.pt'}: the model's logits are NaN or Inf for 2 of "
        "12 samples, the first being sample 4"
    )
    dropped = run_cli(*args, "--nan-policy", "drop")
    assert dropped.code == 0, dropped.stderr
    document = json.loads(dropped.stdout)
    assert document["inputs"]["data"]["dropped_rows"] == 2
    assert document["results"]["evaluation"]["uncalibrated"]["n_samples"] == 10
    assert len(document["warnings"]) == 1 and "left out 2 of 12 rows" in document["warnings"][0]
