"""Bad-input catalogue, hardening round three: what was accepted silently, and what misled.

Each case builds its input in the test, runs the real command in-process, and checks the exit
code, the one line naming the option or file at fault, that every input is byte for byte
unchanged, and that no output file appeared.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from catalogue_inputs import digests, digit_images, digits_model
from safetensors.torch import save_file

from curvcal.models import DigitsCNN


def _one_error_line(stderr: str, *pieces: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("curvcal: error: "), stderr
    for piece in pieces:
        assert piece in lines[0], (piece, lines[0])
    assert "Traceback" not in stderr
    return lines[0]


def _logits_file(path: Path, seed: int = 0, n: int = 60) -> Path:
    rng = np.random.default_rng(seed)
    np.savez(path, logits=rng.normal(size=(n, 3)) * 3, labels=rng.integers(0, 3, n))
    return path


# =============================================================================================
# An option given twice with two different values: click kept the last one, unannounced.
# =============================================================================================


@pytest.mark.parametrize(
    ("args", "option", "values"),
    [
        (
            ["metrics", "{logits}", "--seed", "1", "--seed", "2", "--val-split", "0.5"],
            "--seed",
            ("'1'", "'2'"),
        ),
        (
            ["metrics", "{logits}", "-o", "{tmp}/a.json", "--out", "{tmp}/b.json"],
            "-o/--output",
            ("a.json", "b.json"),
        ),
        (["metrics", "{logits}", "--bins", "10", "--bins=15"], "--bins", ("'10'", "'15'")),
        (
            ["hessian", "{model}", "--data", "{data}", "--data", "{logits}"],
            "--data",
            ("data.pt", "logits.npz"),
        ),
        (
            ["hessian", "{model}", "--data", "{data}", "--trace", "--no-trace"],
            "--trace/--no-trace",
            ("--trace", "--no-trace"),
        ),
        (
            ["-o", "{tmp}/a.json", "-o", "{tmp}/b.json", "version"],
            "-o/--output",
            ("a.json", "b.json"),
        ),
    ],
    ids=["seed", "output", "bins-equals", "data", "flag-both-ways", "group-output"],
)
def test_option_given_twice_with_different_values_is_refused(
    run_cli, tmp_path: Path, args: list[str], option: str, values: tuple[str, str]
) -> None:
    logits = _logits_file(tmp_path / "logits.npz")
    model, data = digits_model(tmp_path), digit_images(tmp_path)
    before = digests(tmp_path)
    names = {"logits": logits, "model": model, "data": data, "tmp": tmp_path}
    result = run_cli(*[a.format(**names) for a in args])
    assert result.code == 2, result.output
    line = _one_error_line(result.stderr, option, "different values", *values)
    assert "give it once" in line
    assert digests(tmp_path) == before
    assert not (tmp_path / "a.json").exists() and not (tmp_path / "b.json").exists()


def test_every_command_refuses_a_repeated_option() -> None:
    """A command added later without ``cls=Command`` would let the last value win again."""
    from curvcal.cli import cli
    from curvcal.commands import COMMANDS, load_command
    from curvcal.commands.repeats import RefuseRepeats

    assert isinstance(cli, RefuseRepeats)
    assert [n for n in COMMANDS if not isinstance(load_command(n), RefuseRepeats)] == []


def test_option_given_twice_with_the_same_value_is_accepted(run_cli, tmp_path: Path) -> None:
    logits = _logits_file(tmp_path / "logits.npz")
    result = run_cli("metrics", logits, "--bins", "10", "--bins", "10", "--json", "--json")
    assert result.code == 0, result.output
    assert '"n_bins": 10' in result.stdout or '"bins": 10' in result.stdout


def test_multiple_options_still_collect_every_value(run_cli, tmp_path: Path) -> None:
    """``--params`` is a multiple option: two different patterns are two selections."""
    model, data = digits_model(tmp_path), digit_images(tmp_path)
    result = run_cli(
        "hessian", model, "--data", data, "--device", "cpu", "--no-trace", "--top-k", "1",
        "--params", "features.*", "--params", "classifier.*", "--json",
    )  # fmt: skip
    assert result.code == 0, result.output


# =============================================================================================
# --state-dict-key with a file that has no keys above its weights: it was ignored.
# =============================================================================================


def test_state_dict_key_with_safetensors_is_refused(run_cli, tmp_path: Path) -> None:
    model, data = digits_model(tmp_path), digit_images(tmp_path)
    before = digests(tmp_path)
    result = run_cli(
        "hessian", model, "--data", data, "--device", "cpu", "--no-trace",
        "--state-dict-key", "model",
    )  # fmt: skip
    assert result.code == 2, result.output
    _one_error_line(result.stderr, "--state-dict-key", str(model), "safetensors")
    assert digests(tmp_path) == before


def test_state_dict_key_with_a_pickled_module_is_refused(run_cli, tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = tmp_path / "whole.pt"
    torch.save(DigitsCNN(num_classes=3, width=1), path)
    data = digit_images(tmp_path)
    before = digests(tmp_path)
    result = run_cli(
        "hessian", path, "--data", data, "--device", "cpu", "--no-trace",
        "--trust-checkpoint", "--state-dict-key", "model",
    )  # fmt: skip
    assert result.code == 2, result.output
    _one_error_line(result.stderr, "--state-dict-key", str(path), "pickled module")
    assert digests(tmp_path) == before


def test_state_dict_key_with_a_pickled_dict_still_selects(run_cli, tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = tmp_path / "ckpt.pt"
    state = DigitsCNN(num_classes=3, width=1).state_dict()
    torch.save({"ema": state, "other": {"step": 3}}, path)
    data = digit_images(tmp_path)
    result = run_cli(
        "hessian", path, "--arch", "curvcal:DigitsCNN", "--arch-kwargs",
        '{"num_classes": 3, "width": 1}', "--data", data, "--device", "cpu", "--no-trace",
        "--top-k", "1", "--state-dict-key", "ema", "--json",
    )  # fmt: skip
    assert result.code == 0, result.output


# =============================================================================================
# metrics --fit naming the evaluation file itself: fitted and measured on the same rows.
# =============================================================================================


@pytest.mark.parametrize("how", ["same-path", "other-spelling", "copy"])
def test_fit_on_the_evaluation_file_is_refused(run_cli, tmp_path: Path, how: str) -> None:
    logits = _logits_file(tmp_path / "logits.npz")
    if how == "same-path":
        fit = logits
    elif how == "other-spelling":
        (tmp_path / "sub").mkdir()
        fit = tmp_path / "sub" / ".." / "logits.npz"
    else:
        fit = tmp_path / "copy.npz"
        fit.write_bytes(logits.read_bytes())
    before = digests(tmp_path)
    result = run_cli("metrics", logits, "--fit", fit, "-o", tmp_path / "out.json")
    assert result.code == 2, result.output
    _one_error_line(result.stderr, "--fit", str(fit), "same rows", "--val-split")
    assert digests(tmp_path) == before
    assert not (tmp_path / "out.json").exists()


def test_fit_on_a_different_file_still_runs(run_cli, tmp_path: Path) -> None:
    logits = _logits_file(tmp_path / "logits.npz")
    fit = _logits_file(tmp_path / "fit.npz", seed=1)
    result = run_cli("metrics", logits, "--fit", fit, "--method", "ts", "--json")
    assert result.code == 0, result.output


# =============================================================================================
# A pickle that takes its global's names from the memo: inspect named a decoy, not posix.system.
# =============================================================================================


def _short(text: str) -> bytes:
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data  # SHORT_BINUNICODE


def _memo_trick_pickle(marker: Path) -> bytes:
    """``posix.system('touch MARKER')`` whose names are stashed in the memo (MEMOIZE, POP),
    then a harmless pair of literal strings is pushed and popped as a decoy, and the real
    names are fetched back (BINGET) just before STACK_GLOBAL."""
    return (
        b"\x80\x04"  # PROTO 4
        + _short("posix") + b"\x94" + b"0"  # MEMOIZE (0), POP
        + _short("system") + b"\x94" + b"0"  # MEMOIZE (1), POP
        + _short("collections") + _short("OrderedDict") + b"0" + b"0"  # the decoy
        + b"h\x00" + b"h\x01" + b"\x93"  # BINGET 0, BINGET 1, STACK_GLOBAL
        + _short(f"touch {marker}") + b"\x85" + b"R" + b"."  # TUPLE1, REDUCE, STOP
    )  # fmt: skip


def _torch_zip_with_pickle(path: Path, payload: bytes) -> Path:
    """A torch zip checkpoint whose main pickle is ``payload``."""
    import zipfile

    torch.save({"a": torch.zeros(2)}, path)
    with zipfile.ZipFile(path) as archive:
        members = [(info, archive.read(info.filename)) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w") as archive:
        for info, data in members:
            archive.writestr(info, payload if info.filename.endswith("/data.pkl") else data)
    return path


def test_inspect_names_the_global_a_memo_trick_pickle_would_call(run_cli, tmp_path: Path) -> None:
    import json

    marker = tmp_path / "pwned"
    path = _torch_zip_with_pickle(tmp_path / "model.pt", _memo_trick_pickle(marker))
    before = digests(tmp_path)
    result = run_cli("inspect", path, "--json")
    assert result.code == 0, result.output
    info = json.loads(result.stdout)["results"]
    assert info["unsafe_globals"] == ["posix.system"] and info["needs_trust"]
    assert not marker.exists()
    assert digests(tmp_path) == before


def test_loading_a_memo_trick_pickle_is_refused_naming_its_global(run_cli, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = _torch_zip_with_pickle(tmp_path / "model.pt", _memo_trick_pickle(marker))
    data = digit_images(tmp_path)
    before = digests(tmp_path)
    result = run_cli("hessian", path, "--arch", "curvcal:DigitsCNN", "--data", data)
    assert result.code == 2, result.output
    _one_error_line(result.stderr, str(path), "posix.system", "--trust-checkpoint")
    assert not marker.exists()
    assert digests(tmp_path) == before


def test_memo_scan_follows_put_and_get_by_index() -> None:
    """Protocol 2 memo opcodes (BINPUT n / BINGET n, explicit indices) are followed too."""
    import io

    from curvcal.load.files.formats import pickle_globals

    payload = (
        b"\x80\x02"
        + b"X\x05\x00\x00\x00posixq\x070"  # BINUNICODE, BINPUT 7, POP
        + b"X\x06\x00\x00\x00systemq\x090"  # BINUNICODE, BINPUT 9, POP
        + b"X\x01\x00\x00\x00aX\x01\x00\x00\x00b00"  # a decoy pair, popped
        + b"h\x07h\x09\x93"  # BINGET 7, BINGET 9, STACK_GLOBAL
        + b"X\x04\x00\x00\x00true\x85R."
    )
    assert pickle_globals(io.BytesIO(payload)).names == ("posix.system",)


# =============================================================================================
# Plans beyond what can help: more trace probes than make the trace exact ran for ever.
# =============================================================================================


@pytest.mark.parametrize("method", ["hutchinson", "hutchpp", "xtrace"])
@pytest.mark.parametrize("absurd", [False, True], ids=["3P+1", "1e12"])
def test_probes_beyond_three_times_the_parameters_are_refused(
    run_cli, tmp_path: Path, method: str, absurd: bool
) -> None:
    """Refused before any product; 10^12 probes ran for ever (3P + 1 ran, a needless product)."""
    model, data = digits_model(tmp_path), digit_images(tmp_path)
    n_params = sum(p.numel() for p in DigitsCNN(num_classes=3, width=1).parameters())
    probes = str(10**12 if absurd else 3 * n_params + 1)
    before = digests(tmp_path)
    result = run_cli(
        "hessian", model, "--data", data, "--device", "cpu", "--trace-method", method,
        "--probes", probes, "-o", tmp_path / "out.json",
    )  # fmt: skip
    assert result.code == 2, result.output
    _one_error_line(result.stderr, "--probes", probes, f"{n_params} parameters",
                    f"--probes {3 * n_params} or fewer")  # fmt: skip
    assert digests(tmp_path) == before
    assert not (tmp_path / "out.json").exists()


def test_probes_at_three_times_the_parameters_give_the_exact_trace(run_cli, tmp_path: Path) -> None:
    """The bound's claim, against the dense float64 Hessian: Hutch++ with 3P products is exact
    up to rounding."""
    import json

    from torch.func import functional_call, hessian

    model_path, data = digits_model(tmp_path), digit_images(tmp_path)
    net = DigitsCNN(num_classes=3, width=1).double().eval()
    from safetensors.torch import load_file

    net.load_state_dict({k: v.double() for k, v in load_file(str(model_path)).items()})
    names = [n for n, _ in net.named_parameters()]
    shapes = [p.shape for _, p in net.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for _, p in net.named_parameters()])
    batch = torch.load(data)

    def loss(vector: torch.Tensor) -> torch.Tensor:
        parts, start = {}, 0
        for name, shape in zip(names, shapes, strict=True):
            size = int(torch.Size(shape).numel())
            parts[name] = vector[start : start + size].reshape(shape)
            start += size
        logits = functional_call(net, parts, (batch["x"].double(),))
        return torch.nn.functional.cross_entropy(logits, batch["y"])

    truth = float(torch.trace(hessian(loss)(flat)))
    n_params = flat.numel()
    result = run_cli(
        "hessian", model_path, "--data", data, "--device", "cpu", "--dtype", "float64",
        "--trace-method", "hutchpp", "--probes", str(3 * n_params), "--json",
    )  # fmt: skip
    assert result.code == 0, result.output
    estimate = json.loads(result.stdout)["results"]["trace"]["estimate"]
    assert estimate == pytest.approx(truth, rel=1e-6, abs=1e-9)


# =============================================================================================
# Booleans as logits in a parquet file: read as 0.0 and 1.0 (CSV and tensor files refuse them).
# =============================================================================================


@pytest.mark.parametrize("layout", ["list-column", "per-class-columns"])
def test_parquet_boolean_scores_are_refused(run_cli, tmp_path: Path, layout: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    flags, labels = rng.random((20, 3)) > 0.5, rng.integers(0, 3, 20)
    if layout == "list-column":
        table = pa.table({"logits": [list(map(bool, row)) for row in flags], "labels": labels})
        column = "logits"
    else:
        table = pa.table({**{f"logits_{k}": flags[:, k] for k in range(3)}, "labels": labels})
        column = "logits_0"
    path = tmp_path / "scores.parquet"
    pq.write_table(table, path)
    before = digests(tmp_path)
    result = run_cli("metrics", path, "--json")
    assert result.code == 2, result.output
    _one_error_line(result.stderr, str(path), f"of '{column}'", "boolean, not a score")
    assert result.stdout == ""
    assert digests(tmp_path) == before


@pytest.mark.parametrize("suffix", [".npz", ".safetensors", ".pt"])
def test_tensor_file_boolean_scores_are_refused(run_cli, tmp_path: Path, suffix: str) -> None:
    rng = np.random.default_rng(0)
    flags, labels = rng.random((20, 3)) > 0.5, rng.integers(0, 3, 20)
    path = tmp_path / f"scores{suffix}"
    if suffix == ".npz":
        np.savez(path, logits=flags, labels=labels)
    elif suffix == ".safetensors":
        save_file({"logits": torch.tensor(flags), "labels": torch.tensor(labels)}, str(path))
    else:
        torch.save({"logits": torch.tensor(flags), "labels": torch.tensor(labels)}, path)
    before = digests(tmp_path)
    result = run_cli("metrics", path, "--json")
    assert result.code == 2, result.output
    _one_error_line(result.stderr, str(path), "bool", "floats")
    assert digests(tmp_path) == before


@pytest.mark.parametrize("how", ["same-spec", "copy"])
def test_calibrate_fit_data_that_is_the_data_is_refused(run_cli, tmp_path: Path, how: str) -> None:
    model, data = digits_model(tmp_path), digit_images(tmp_path)
    fit = data
    if how == "copy":
        fit = tmp_path / "copy.pt"
        fit.write_bytes(data.read_bytes())
    before = digests(tmp_path)
    result = run_cli(
        "calibrate", model, "--data", data, "--fit-data", fit, "--device", "cpu",
        "-o", tmp_path / "out.json",
    )  # fmt: skip
    assert result.code == 2, result.output
    _one_error_line(result.stderr, "--fit-data", str(fit), "same rows")
    assert digests(tmp_path) == before
    assert not (tmp_path / "out.json").exists()


def test_calibrate_fit_data_that_differs_still_runs(run_cli, tmp_path: Path) -> None:
    model, data = digits_model(tmp_path), digit_images(tmp_path)
    fit = tmp_path / "fit.pt"
    generator = torch.Generator().manual_seed(2)
    torch.save({"x": torch.randn(12, 1, 8, 8, generator=generator), "y": torch.arange(12) % 3}, fit)
    result = run_cli(
        "calibrate", model, "--data", data, "--fit-data", fit, "--device", "cpu",
        "--method", "ts", "--json",
    )  # fmt: skip
    assert result.code == 0, result.output
