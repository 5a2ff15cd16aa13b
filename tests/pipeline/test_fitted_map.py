"""Every calibration map of the registry, one way: fit -> save -> load gives the same
probabilities, and a file whose body breaks any declared field (of any kind) is refused with
exit 2 naming the file.

The numbers of each map against its peers and hand-worked cases live in the map's own tests;
this file checks what every map shares: the saved form (calibration/saved.py) and the Python
API (curvcal.fit_map, curvcal.load_map)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import curvcal
from curvcal.calibration.laplace import HeadFeatures
from curvcal.calibration.registry import MAPS
from curvcal.calibration.saved import Field, SavedMap
from curvcal.errors import InputError
from tests.commands.test_calibrate import one_line_error

N_FIT, N_TEST = 120, 50


def _scores(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, k, (n,), generator=generator)
    logits = torch.randn(n, k, generator=generator, dtype=torch.float64)
    logits[torch.arange(n), labels] += 1.5  # informative scores, as a classifier's are
    return 2.5 * logits, labels


def _head(n: int, seed: int) -> HeadFeatures:
    """Last-layer inputs (N×4) of a 3-class linear head, float32 weights as a checkpoint's."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(3, 4, generator=generator).double()
    bias = torch.randn(3, generator=generator).double()
    return HeadFeatures(torch.randn(n, 4, generator=generator).double(), weight, bias, "head")


def _inputs(stage: str, n: int, seed: int) -> tuple[object, torch.Tensor]:
    if MAPS[stage].input == "features":
        head = _head(n, seed)
        logits = head.features @ head.weight.T + head.bias
        generator = torch.Generator().manual_seed(seed + 100)
        return head, torch.multinomial(logits.softmax(1), 1, generator=generator)[:, 0]
    k = 2 if MAPS[stage].skip_reason(3, True) else 3
    return _scores(n, k, seed)


@pytest.fixture(scope="module", params=list(MAPS))
def saved(request, tmp_path_factory) -> tuple[str, curvcal.FittedMap, Path, object]:
    """Each map fitted and saved once: (stage, fitted map, its file, evaluation inputs)."""
    stage = request.param
    scores, labels = _inputs(stage, N_FIT, 0)
    options = {"laplace_structure": "full"} if stage == "laplace" else {}
    fitted = curvcal.fit_map(MAPS[stage].option, scores, labels, **options)
    path = tmp_path_factory.mktemp(stage) / "map.json"
    fitted.save(path)
    test_scores, _ = _inputs(stage, N_TEST, 1)
    return stage, fitted, path, test_scores


def test_saved_and_loaded_maps_give_the_same_probabilities(saved) -> None:
    stage, fitted, path, test_scores = saved
    loaded = curvcal.load_map(path)
    assert loaded.stage == stage and loaded.method == fitted.method
    assert isinstance(loaded.map, SavedMap) and type(loaded.map) is type(fitted.map)
    assert loaded.map.to_dict() == fitted.map.to_dict()  # every number read back exactly
    before = fitted.probabilities(test_scores)
    after = loaded.probabilities(test_scores)
    assert before.dtype == after.dtype == torch.float64
    torch.testing.assert_close(after, before, rtol=0, atol=1e-12)
    # the probabilities are a distribution on every row: the map did act
    torch.testing.assert_close(after.sum(1), torch.ones(N_TEST, dtype=torch.float64))


def test_saving_over_an_existing_file_is_refused(saved) -> None:
    _, fitted, path, _ = saved
    before = path.read_bytes()
    with pytest.raises(InputError, match="exists already"):
        fitted.save(path)
    assert path.read_bytes() == before


def _tamperings(spec: Field, value: object) -> list[tuple[object, str]]:
    """Values that break ``spec`` (one per way a field of its kind can be wrong), each with a
    word of the refusal."""
    wrong_type = "__import__('os').system('true')"
    if spec.kind == "text":
        return [(12, spec.name), ("x" * 5000, "at most")]
    if spec.kind == "digest":
        # a number, a boolean, an object, one digit short, upper case, a non-hex digit
        return [(5, spec.name), (True, spec.name), ({}, spec.name)] + [
            (bad, "64 lowercase hex digits") for bad in ("ab" * 31 + "a", "AB" * 32, "g" * 64)
        ]
    out: list[tuple[object, str]] = [(wrong_type, spec.name), (True, spec.name)]
    if spec.kind == "choice":
        out.append(("nope", "'nope'"))
    if spec.kind in ("number", "integer") and math.isfinite(spec.high):
        out.append((spec.high * 2 if spec.high > 0 else 1e308, "is outside"))
    if spec.kind == "integer" and math.isfinite(spec.low):
        out.append((int(spec.low) - 1, spec.name))
    if spec.kind == "array":
        out.append(([], "non-empty"))
        if math.isfinite(spec.high):
            bad = json.loads(json.dumps(value))
            row = bad
            while isinstance(row[0], list):
                row = row[0]
            row[0] = spec.high * 2 + 1
            out.append((bad, "is outside"))
    return out


def test_every_declared_field_refuses_a_tampered_value(saved, tmp_path: Path) -> None:
    stage, fitted, path, _ = saved
    document = json.loads(path.read_text())
    body = document[stage]
    fields = type(fitted.map).saved_fields(body)
    assert {spec.name for spec in fields} >= set(body)  # every saved key is declared
    tried = 0
    for spec in fields:
        if spec.name not in body or body[spec.name] is None:
            continue
        for value, word in _tamperings(spec, body[spec.name]):
            bad = tmp_path / f"t{tried}.json"  # short: a long path is shown shortened
            bad.write_text(json.dumps({**document, stage: {**body, spec.name: value}}))
            with pytest.raises(InputError) as caught:
                curvcal.load_map(bad)
            assert str(bad) in str(caught.value) and word in str(caught.value), (spec, value)
            assert caught.value.exit_code == 2
            tried += 1
    assert tried >= len([s for s in fields if s.name in body])


def test_every_provenance_record_field_refuses_a_tampered_value(tmp_path: Path) -> None:
    """The provenance's ``fit_data`` and ``model`` are read by the same schema reader as a map's
    body: each declared field, broken each way its kind can be, is refused naming the file."""
    from curvcal.pipeline.calibrator import (
        RECORD_FIELDS,
        CalibratorProvenance,
        calibrators_json,
    )

    scores, labels = _scores(80, 3, 3)
    records = {
        "fit_data": {"source": "--fit v.npz", "path": "v.npz", "sha256": "ab" * 32,
                     "size_bytes": 9, "n_samples": 80},
        "model": {"path": "m.safetensors", "sha256": "cd" * 32},
    }  # fmt: skip
    provenance = CalibratorProvenance(3, "logits", fit_data=records["fit_data"])
    document = json.loads(
        calibrators_json({"ts": curvcal.fit_map("ts", scores, labels).map}, provenance)
    )
    document["provenance"]["model"] = records["model"]
    good = tmp_path / "good.json"
    good.write_text(json.dumps(document))
    assert curvcal.load_map(good).provenance.model == records["model"]  # the fields read back
    assert set(RECORD_FIELDS) == set(records)
    tried = 0
    for record, fields in RECORD_FIELDS.items():
        assert {spec.name for spec in fields} == set(records[record])
        for spec in fields:
            for value, word in _tamperings(spec, records[record][spec.name]):
                body = {**records[record], spec.name: value}
                bad = tmp_path / f"p{tried}.json"  # short: a long path is shown shortened
                bad.write_text(json.dumps({**document, "provenance": {
                    **document["provenance"], record: body}}))  # fmt: skip
                with pytest.raises(InputError) as caught:
                    curvcal.load_map(bad)
                message = str(caught.value)
                assert str(bad) in message and f"provenance {record}" in message, message
                assert word in message and caught.value.exit_code == 2, (spec, value, message)
                tried += 1
    assert tried >= 20


def test_a_missing_and_an_unknown_key_are_refused(saved, tmp_path: Path) -> None:
    stage, _, path, _ = saved
    document = json.loads(path.read_text())
    body = document[stage]
    fields = type(curvcal.load_map(path).map).saved_fields(body)
    last = [spec.name for spec in fields if not spec.optional and spec.name in body][-1]
    for changed, word in (
        ({k: v for k, v in body.items() if k != last}, f"missing keys ['{last}']"),
        ({**body, "code": "print(1)"}, "unknown calibrator keys ['code']"),
    ):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({**document, stage: changed}))
        with pytest.raises(InputError, match=word.replace("[", r"\[").replace("]", r"\]")):
            curvcal.load_map(bad)


def test_a_tampered_map_is_exit_2_naming_the_file_from_the_cli(run_cli, saved, tmp_path) -> None:
    """The CLI's reader is the one load_map uses: a key given twice (the JSON decoder would keep
    the last) and a method given a number are one line, exit 2, naming the file."""
    stage, _, path, _ = saved
    text = path.read_text()
    scores = tmp_path / "s.npz"
    k = 2 if MAPS[stage].skip_reason(3, True) else 3
    np.savez(scores, logits=np.zeros((10, k)), labels=np.arange(10) % k)
    twice = tmp_path / "twice.json"
    twice.write_text(text.replace('"method":', '"method": 1, "method":', 1))
    result = run_cli("metrics", scores, "--apply", twice)
    one_line_error(result, str(twice), "'method' appears more than once")


def test_fit_map_takes_the_method_spelling_and_the_stage() -> None:
    scores, labels = _scores(80, 3, 2)
    by_option = curvcal.fit_map("focal-ts", scores, labels, gammas=(0.0, 1.0))
    by_stage = curvcal.fit_map("focal_ts", scores, labels, gammas=(0.0, 1.0))
    assert by_option.map == by_stage.map and by_option.stage == "focal_ts"
    # settings are checked as the options are
    with pytest.raises(InputError, match="objective"):
        curvcal.fit_map("ts", scores, labels, objective="mse")
    with pytest.raises(InputError, match="unknown calibration map 'tz'"):
        curvcal.fit_map("tz", scores, labels)
    # an unknown keyword is named with the settings there are, as an option would be
    with pytest.raises(InputError) as unknown:
        curvcal.fit_map("ts", scores, labels, bogus=1, gamas=(0.0,))
    assert unknown.value.what == "fit_map" and "unknown settings bogus, gamas" in unknown.value.why
    assert "kind, method, objective" in str(unknown.value) and "gammas" in str(unknown.value)


def test_fit_map_temperature_is_the_closed_form_optimum() -> None:
    """Hand-worked: two samples, K = 2, logits (1, 0) labelled 0 and (1, 0) labelled 1. The
    NLL of softmax(z/T) is −log σ(1/T) − log σ(−1/T), falling as T grows: the fit sits on the
    upper end of its bracket, T = 100, where p_0 = σ(1/100) = 0.50249997916..."""
    logits = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    fitted = curvcal.fit_map("ts", logits, torch.tensor([0, 1]))
    assert fitted.map.temperature == pytest.approx(100.0, rel=1e-9)
    p0 = 1.0 / (1.0 + math.exp(-0.01))
    expected = torch.tensor([[p0, 1 - p0], [p0, 1 - p0]], dtype=torch.float64)
    torch.testing.assert_close(fitted.probabilities(logits), expected, atol=1e-9, rtol=0)


def test_a_file_with_two_maps_needs_the_stage(tmp_path: Path) -> None:
    from curvcal.pipeline.calibrator import CalibratorProvenance, calibrators_json

    scores, labels = _scores(80, 3, 3)
    ts = curvcal.fit_map("ts", scores, labels)
    vector = curvcal.fit_map("vector", scores, labels)
    path = tmp_path / "two.json"
    path.write_text(
        calibrators_json({"ts": ts.map, "vector": vector.map}, CalibratorProvenance(3, "logits"))
    )
    with pytest.raises(InputError, match=r"holds 2 maps \(ts, vector\)"):
        curvcal.load_map(path)
    with pytest.raises(InputError, match="unknown calibration map 'nope'") as unknown:
        curvcal.load_map(path, stage="nope")
    assert unknown.value.what == "stage"  # the argument that named it
    torch.testing.assert_close(
        curvcal.load_map(path, "vector").probabilities(scores),
        vector.probabilities(scores),
        rtol=0,
        atol=1e-12,
    )


def test_the_method_option_lists_the_registry_maps() -> None:
    """``--method`` (and so the policy key and study's maps) offers the registry's maps, each
    once, and the three words that name sets of them."""
    from curvcal.settings.calibration import METHODS

    options = [entry.option for entry in MAPS.values()]
    assert len(set(options)) == len(options) == 16
    assert sorted(METHODS) == sorted([*options, "both", "all", "none"])


#: A calibrator file written by release 0.1.0 (``metrics --method all`` on binary scores): every
#: score map of the registry, as that release saved it.
RELEASED = (
    Path(__file__).resolve().parents[1] / "golden" / "calibrators" / "calibrator_0.1.0_binary.json"
)


def test_a_file_the_release_wrote_still_loads_and_applies() -> None:
    from curvcal.pipeline.calibrator import load_calibrator_file

    read = load_calibrator_file(RELEASED)
    assert set(read.calibrators) == set(MAPS) - {"laplace"}
    assert read.provenance is not None and read.provenance.n_classes == 2
    logits, _ = _scores(30, 2, 5)
    for stage in read.calibrators:
        probs = curvcal.load_map(RELEASED, stage).probabilities(logits)
        assert probs.shape == (30, 2) and bool(((probs >= 0) & (probs <= 1)).all()), stage
        torch.testing.assert_close(probs.sum(1), torch.ones(30, dtype=torch.float64))
    # TS by hand: softmax(z / T) with the T the file holds
    temperature = json.loads(RELEASED.read_text())["ts"]["temperature"]
    torch.testing.assert_close(
        curvcal.load_map(RELEASED, "ts").probabilities(logits),
        torch.softmax(logits / temperature, 1),
        rtol=0,
        atol=1e-12,
    )
