"""Logits files: formats, key names, and the validation rules of references.md."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from curvcal.errors import InputError
from curvcal.load.scores.logits import load_logits, save_logits, validate_scores

LOGITS = torch.tensor([[2.0, -1.0, 0.5], [0.0, 0.0, 0.0], [-3.0, 4.0, 1.0], [1.0, 2.0, 3.0]])
LABELS = torch.tensor([0, 2, 1, 2])


@pytest.mark.parametrize("suffix", [".npz", ".pt", ".safetensors"])
def test_save_load_round_trip(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"scores{suffix}"
    save_logits(path, LOGITS, LABELS)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind
    data = load_logits(path)
    assert data.scores.dtype == torch.float64 and data.labels.dtype == torch.int64
    assert torch.equal(data.scores, LOGITS.double())
    assert torch.equal(data.labels, LABELS)
    assert data.kind == "logits" and data.path == path


def test_save_unknown_extension_and_shape(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"s\.csv.*unknown file type"):
        save_logits(tmp_path / "s.csv", LOGITS, LABELS)
    with pytest.raises(InputError, match="do not match"):
        save_logits(tmp_path / "s.npz", LOGITS, LABELS[:3])


def test_probs_with_key_override(tmp_path: Path) -> None:
    probs = torch.softmax(LOGITS.double(), dim=1)
    path = tmp_path / "p.npz"
    np.savez(path, probs=probs.numpy(), y=LABELS.numpy())
    with pytest.raises(InputError, match=r"p\.npz.*--input-kind probs and --scores-key probs"):
        load_logits(path, labels_key="y")
    data = load_logits(path, kind="probs", scores_key="probs", labels_key="y")
    assert torch.allclose(data.scores, probs)
    with pytest.raises(InputError, match=r"p\.npz.*no tensor named 'labels'.*--labels-key"):
        load_logits(path, kind="probs", scores_key="probs")


def test_logprobs_accepted(tmp_path: Path) -> None:
    logprobs = torch.log_softmax(LOGITS.double(), dim=1)
    path = tmp_path / "lp.pt"
    torch.save({"logprobs": logprobs, "labels": LABELS}, path)
    data = load_logits(path, kind="logprobs", scores_key="logprobs")
    assert torch.equal(data.scores, logprobs)


def test_missing_unknown_truncated(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"absent\.npz: no such file"):
        load_logits(tmp_path / "absent.npz")
    (tmp_path / "s.json").write_text("{}")
    with pytest.raises(InputError, match=r"s\.json: unknown file type"):
        load_logits(tmp_path / "s.json")
    path = tmp_path / "t.safetensors"
    save_logits(path, LOGITS, LABELS)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(InputError, match=r"t\.safetensors: cannot be read"):
        load_logits(path)
    with pytest.raises(InputError, match="--input-kind"):
        load_logits(tmp_path / "x.npz", kind="softmax")


def _probs() -> torch.Tensor:
    return torch.tensor([[0.5, 0.25, 0.25], [0.2, 0.3, 0.5], [1.0, 0.0, 0.0]], dtype=torch.float64)


Y3 = torch.tensor([0, 2, 1])


def test_valid_probabilities_pass() -> None:
    validate_scores(_probs(), Y3, "probs", "f.npz")
    probs = _probs()
    probs[1, 2] += 0.9e-4  # within tolerance
    validate_scores(probs, Y3, "probs", "f.npz")


def test_probabilities_not_summing_to_one() -> None:
    probs = _probs()
    probs[1] = torch.tensor([0.2, 0.3, 0.4], dtype=torch.float64)
    with pytest.raises(InputError, match=r"f\.npz: row 1 sums to 0\.9 \(probabilities must sum"):
        validate_scores(probs, Y3, "probs", "f.npz")
    probs = _probs()
    probs[2, 0] += 2e-4  # just outside tolerance
    with pytest.raises(InputError, match=r"row 2 sums to 1\.0002"):
        validate_scores(probs, Y3, "probs", "f.npz")


def test_negative_probability() -> None:
    probs = _probs()
    probs[0] = torch.tensor([1.1, -0.1, 0.0], dtype=torch.float64)
    with pytest.raises(InputError, match=r"f\.npz: row 0 has a negative probability \(-0\.1\)"):
        validate_scores(probs, Y3, "probs", "f.npz")


def test_logprobs_rules() -> None:
    logprobs = _probs()[:2].log()
    y2 = Y3[:2]
    validate_scores(logprobs, y2, "logprobs", "f.pt")
    # log 0 = -inf is rejected: log-probabilities must be finite (references.md)
    with pytest.raises(InputError, match="row 2 has a NaN or infinite log-probability"):
        validate_scores(_probs().log(), Y3, "logprobs", "f.pt")
    bad = logprobs.clone()
    bad[0, 0] = 0.1
    with pytest.raises(InputError, match="row 0 has a log-probability above 0"):
        validate_scores(bad, y2, "logprobs", "f.pt")
    bad = logprobs.clone()
    bad[1, 1] = math.log(0.2)
    with pytest.raises(InputError, match=r"row 1 sums to 0\.9 \(exp of log-prob"):
        validate_scores(bad, y2, "logprobs", "f.pt")


def test_non_finite_scores() -> None:
    logits = LOGITS.double().clone()
    logits[2, 1] = float("nan")
    with pytest.raises(InputError, match=r"f\.npz: row 2 has a NaN or infinite logit"):
        validate_scores(logits, LABELS, "logits", "f.npz")
    logits[2, 1] = float("inf")
    with pytest.raises(InputError, match="row 2"):
        validate_scores(logits, LABELS, "logits", "f.npz")
    probs = _probs()
    probs[0, 0] = float("nan")
    with pytest.raises(InputError, match="NaN or infinite probability"):
        validate_scores(probs, Y3, "probs", "f.npz")


def test_shapes_and_labels() -> None:
    with pytest.raises(InputError, match="2-D"):
        validate_scores(LOGITS.double().flatten(), LABELS, "logits", "f")
    with pytest.raises(InputError, match="4 rows of scores but labels of shape"):
        validate_scores(LOGITS.double(), LABELS[:3], "logits", "f")
    with pytest.raises(InputError, match=r"label 3 in row 1 is out of range for K = 3"):
        validate_scores(LOGITS.double(), torch.tensor([0, 3, 1, 2]), "logits", "f")
    with pytest.raises(InputError, match="label 0 is -1"):
        validate_scores(LOGITS.double(), torch.tensor([-1, 0, 1, 2]), "logits", "f")
    with pytest.raises(InputError, match="no samples"):
        validate_scores(torch.zeros(0, 3), torch.zeros(0, dtype=torch.int64), "logits", "f")
    with pytest.raises(InputError, match="K = 0"):
        validate_scores(torch.zeros(2, 0), torch.zeros(2, dtype=torch.int64), "logits", "f")


def test_border_one_sample_one_class(tmp_path: Path) -> None:
    path = tmp_path / "one.npz"
    save_logits(path, torch.tensor([[0.3]]), torch.tensor([0]))
    data = load_logits(path)
    assert data.scores.shape == (1, 1)
    validate_scores(torch.tensor([[1.0]], dtype=torch.float64), torch.tensor([0]), "probs", "f")


def test_float_labels_in_file(tmp_path: Path) -> None:
    path = tmp_path / "fl.npz"
    np.savez(path, logits=LOGITS.numpy(), labels=LABELS.numpy().astype(np.float32))
    assert torch.equal(load_logits(path).labels, LABELS)
    np.savez(path, logits=LOGITS.numpy(), labels=np.array([0, 2.5, 1, 2]))
    with pytest.raises(InputError, match=r"fl\.npz: label 1 is 2\.5"):
        load_logits(path)
    np.savez(path, logits=LOGITS.numpy().astype(np.int64), labels=LABELS.numpy())
    with pytest.raises(InputError, match="scores must be floats"):
        load_logits(path)
