"""A max_samples subset that the validation split then divides again is said, with both sizes
(the issue: 32 evaluation samples without a word), on the command line and from a policy; a
run whose split is not cut from the subset says nothing."""

from __future__ import annotations

import json
from pathlib import Path

from curvcal.assets import demo_checkpoint
from tests.console_text import said

DIGITS = ("--data", "curvcal:digits", "--device", "cpu")  # 797 held-out digits


def _warnings(result) -> list[str]:  # type: ignore[no-untyped-def]
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)["warnings"]


def test_calibrate_with_max_samples_names_the_subset_and_both_split_sizes(run_cli) -> None:
    result = run_cli("calibrate", demo_checkpoint(), *DIGITS, "--max-samples", "64",
                     "--val-split", "0.25", "--method", "ts", "--json", "-q")  # fmt: skip
    (warning,) = [w for w in _warnings(result) if "max-samples" in w]
    split = json.loads(result.stdout)["results"]["split"]
    assert (split["n_fit"], split["n_eval"]) == (16, 48)  # a quarter of 64 fits, the rest measure
    assert warning == (
        "--max-samples 64 (of the data's 797 samples) also shrinks the calibration split: the "
        "maps are fitted on 16 samples and every stage is measured on 48"
    )
    assert said("fitted on 16 samples and every stage is measured on 48", result.stderr)  # -q


def test_a_policy_max_samples_is_named_as_the_policy_names_it(run_cli, tmp_path: Path) -> None:
    policy = tmp_path / "gate.toml"
    policy.write_text(
        '[settings]\ndata = "curvcal:digits"\nmax_samples = 64\n\n[ts.ece]\nmax = 1\n'
    )
    result = run_cli("check", demo_checkpoint(), "--policy", policy, "--device", "cpu", "--json")
    (warning,) = [w for w in _warnings(result) if "shrinks the calibration split" in w]
    assert warning.startswith("max_samples 64 (of the data's 797 samples)")
    assert "fitted on 32 samples and every stage is measured on 32" in warning


def test_no_subset_or_a_subset_larger_than_the_data_says_nothing(run_cli) -> None:
    for extra in ((), ("--max-samples", "5000")):  # border: the subset is the whole data
        result = run_cli("calibrate", demo_checkpoint(), *DIGITS, *extra, "--method", "ts",
                         "--json")  # fmt: skip
        assert not any("shrinks" in w for w in _warnings(result))
