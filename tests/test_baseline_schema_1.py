"""A baseline written by schema 1.x (settings flat in hessian reports, nested with older names
elsewhere) is still read, and its settings line up with today's groups and names."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from curvcal.policy.baseline import flat_settings, load_report, setting_differences

ROOT = Path(__file__).resolve().parent.parent


def _v1_hessian_golden() -> dict:
    """The hessian golden as schema 1.0 wrote it (the last commit before 2.0)."""
    text = subprocess.run(
        ["git", "show", "81b77be:tests/golden/hessian_float32.json"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    if text:
        return json.loads(text)
    return {  # a checkout without history: the same keys, as 1.0 laid them out
        "schema": "1.0",
        "command": "hessian",
        "results": {},
        "settings": {
            "arch": None, "trust_checkpoint": False, "allow_globals": [], "device": "cpu",
            "dtype": "float32", "data": "curvcal:digits", "max_samples": 90, "batch_size": 40,
            "loss": "ce", "top_k": 3, "seed": 0, "probe_dist": "rademacher", "hvp": "auto",
            "criterion": "ce", "params": [], "world_size": 1,
        },
    }  # fmt: skip


def test_a_v1_hessian_report_reads_with_todays_groups(tmp_path: Path) -> None:
    old = _v1_hessian_golden()
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    assert load_report(path)["schema"].startswith("1.")
    flat = flat_settings(old)
    seed = old["settings"]["seed"]
    assert flat["hessian.top_k"] == 3 and flat["hessian.seed"] == seed
    assert flat["checkpoint.allow_global"] == [] and flat["checkpoint.dtype"] == "float32"
    assert flat["data.data"] == "curvcal:digits" and flat["data.batch_size"] == 40
    assert not any(key.endswith(("criterion", "world_size")) for key in flat)
    new = {
        "schema": "2.0",
        "settings": {
            "checkpoint": {"allow_global": [], "dtype": "float64"},
            "data": {"data": "curvcal:digits", "batch_size": 40},
            "hessian": {"top_k": 3, "seed": seed + 1},
        },
    }
    assert setting_differences(new, old) == [
        "--dtype: float32 → float64",
        f"--seed: {seed} → {seed + 1}",
    ]


def test_a_v1_nested_report_renames_its_keys() -> None:
    old = {
        "schema": "1.0",
        "command": "study",
        "settings": {
            "checkpoint": {"trust": False, "allow_globals": ["a.B"]},
            "data": {"spec": "d.pt", "root": None},
            "val_split": 0.5,
        },
    }
    assert flat_settings(old) == {
        "checkpoint.trust_checkpoint": False,
        "checkpoint.allow_global": ["a.B"],
        "data.data": "d.pt",
        "data.data_root": None,
        "val_split": 0.5,
    }
