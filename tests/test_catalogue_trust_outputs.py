"""Bad-input catalogue, hardening round three: code that ran without --trust-checkpoint, and inputs
that were overwritten or written into.

Each case builds its input in the test, runs the real command (in-process, or as a process where
the entry point or the terminal is what is tested), and checks the exit code, the one line naming
the file or option at fault, that every input is byte for byte unchanged, and that no payload's
marker file appeared. Payloads are real: the code they would run creates the marker.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from catalogue_inputs import digests, digit_images, digits_model
from safetensors.torch import save_file

from curvcal.models import DigitsCNN
from tests.console_text import shown

REPO = Path(__file__).resolve().parents[1]


def _one_error_line(stderr: str, *pieces: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("curvcal: error: "), stderr
    for piece in pieces:
        assert piece in lines[0], (piece, lines[0])
    assert "Traceback" not in stderr
    return lines[0]


def _env(**extra: str) -> dict[str, str]:
    """The environment of a curvcal process: this checkout importable through PYTHONPATH (the
    documented place for one's own modules), one thread, no network, a private HF cache."""
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        **extra,
    }


# =============================================================================================
# Code ran without --trust-checkpoint
# =============================================================================================

# --- transformers: a tokenizer folder with auto_map ------------------------------------------

WORDS = ["good", "bad", "movie", "film", "great", "awful"]
TEXTS = ["good movie", "bad film", "great film", "awful movie", "good", "bad"]
LABELS = [1, 0, 1, 0, 1, 0]


@pytest.fixture(scope="module")
def text_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny BERT classifier folder with its tokenizer (save_pretrained), and a JSONL table."""
    import transformers

    root = tmp_path_factory.mktemp("text")
    config = transformers.BertConfig(
        vocab_size=11,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=16,
        num_labels=2,
    )
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).save_pretrained(root / "model")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(vocab), model_max_length=12)
    tokenizer.save_pretrained(root / "model")
    table = root / "reviews.jsonl"
    table.write_text(
        "".join(
            json.dumps({"text": t, "label": y}) + "\n" for t, y in zip(TEXTS, LABELS, strict=True)
        )
    )
    return root / "model", table


def _plant_tokenizer_code(folder: Path, marker: Path, config_name: str) -> None:
    """Make ``folder``'s ``config_name`` name custom tokenizer code (auto_map) whose import
    creates ``marker``."""
    (folder / "payload_tokenizer.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from transformers import BertTokenizerFast\n\n\n"
        "class PayloadTokenizer(BertTokenizerFast):\n    pass\n"
    )
    path = folder / config_name
    config = json.loads(path.read_text()) if path.is_file() else {}
    config["tokenizer_class"] = "PayloadTokenizer"
    config["auto_map"] = {"AutoTokenizer": [None, "payload_tokenizer.PayloadTokenizer"]}
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("where", "config_name", "stdin"),
    [
        ("--tokenizer", "tokenizer_config.json", "y\n"),
        ("--tokenizer", "config.json", None),
        ("model folder", "tokenizer_config.json", "y\n"),
    ],
)
def test_a_tokenizer_with_auto_map_never_runs_and_nothing_prompts(
    text_model: tuple[Path, Path], tmp_path: Path, where: str, config_name: str, stdin: str | None
) -> None:
    """A real process, with ``y`` typed on its standard input (or none at all): transformers
    would ask whether to run the folder's code, and ``y`` would run it."""
    import shutil

    model, table = text_model
    marker = tmp_path / "MARKER"
    if where == "--tokenizer":
        tokenizer = tmp_path / "tokenizer"
        shutil.copytree(model, tokenizer, ignore=shutil.ignore_patterns("model.safetensors"))
        if config_name == "tokenizer_config.json":
            (tokenizer / "config.json").unlink()
        _plant_tokenizer_code(tokenizer, marker, config_name)
        extra = ["--tokenizer", str(tokenizer)]
        inputs = [model, table, tokenizer]
    else:
        tokenizer = tmp_path / "model"
        shutil.copytree(model, tokenizer)
        _plant_tokenizer_code(tokenizer, marker, config_name)
        model, extra, inputs = tokenizer, [], [tokenizer, table]
    before = digests(*inputs)
    command = [sys.executable, "-m", "curvcal", "hessian", str(model), "--data", str(table)]
    result = subprocess.run(
        [*command, *extra, "--device", "cpu", "--top-k", "1", "--no-trace"],
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(HF_HOME=str(tmp_path / "hf")),
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    _one_error_line(
        result.stderr, shown(tokenizer / config_name, ":"), "custom code", "--trust-checkpoint"
    )
    assert "[y/N]" not in result.stdout + result.stderr  # nothing asked
    assert not marker.exists()
    assert digests(*inputs) == before


def test_a_policy_tokenizer_setting_is_held_to_the_same_rule(
    run_cli, text_model: tuple[Path, Path], tmp_path: Path
) -> None:
    import shutil

    model, table = text_model
    marker = tmp_path / "MARKER"
    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(model, tokenizer, ignore=shutil.ignore_patterns("model.safetensors"))
    _plant_tokenizer_code(tokenizer, marker, "tokenizer_config.json")
    policy = tmp_path / "gate.toml"
    policy.write_text(
        f'[settings]\ndata = "{table}"\ntokenizer = "{tokenizer}"\ndevice = "cpu"\n'
        "[accuracy]\nmin = 0.0\n"
    )
    before = digests(model, table, tokenizer, policy)
    result = run_cli("check", model, "--policy", policy, input="y\n")
    assert result.code == 2, result.output
    _one_error_line(
        result.stderr,
        shown(tokenizer / "tokenizer_config.json", ":"),
        "custom code",
        "--trust-checkpoint",
    )
    assert not marker.exists()
    assert digests(model, table, tokenizer, policy) == before


# --- timm: config keys that make timm read another file --------------------------------------


def test_a_timm_folder_whose_model_args_name_a_checkpoint_is_refused(
    run_cli, tmp_path: Path
) -> None:
    timm = pytest.importorskip("timm")
    from test_malicious_checkpoints import _Reduce
    from timm.models import save_for_hf

    marker = tmp_path / "MARKER"
    evil = tmp_path / "evil.pt"
    torch.save(_Reduce(exec, f"open({str(marker)!r}, 'w').close()"), evil)
    torch.manual_seed(0)
    folder = tmp_path / "timm_model"
    save_for_hf(
        timm.create_model("test_resnet", num_classes=3), str(folder), safe_serialization=True
    )
    config = json.loads((folder / "config.json").read_text())
    config.setdefault("model_args", {})["checkpoint_path"] = str(evil)
    (folder / "config.json").write_text(json.dumps(config))
    data = tmp_path / "images.pt"
    torch.save({"x": torch.randn(4, 3, 32, 32), "y": torch.tensor([0, 1, 2, 0])}, data)
    before = digests(folder, evil, data)
    result = run_cli("hessian", folder, "--data", data, "--device", "cpu", "--no-trace")
    assert result.code == 2, result.output
    _one_error_line(
        result.stderr, shown(folder / "config.json"), "checkpoint_path", "read another file"
    )
    assert not marker.exists()
    assert digests(folder, evil, data) == before
    # the same key given with --arch-kwargs to a timm: architecture
    result = run_cli(
        "hessian", folder / "model.safetensors", "--arch", "timm:test_resnet", "--arch-kwargs",
        json.dumps({"num_classes": 3, "checkpoint_path": str(evil)}), "--data", data,
        "--device", "cpu", "--no-trace",
    )  # fmt: skip
    assert result.code == 2, result.output
    _one_error_line(result.stderr, "--arch-kwargs", "checkpoint_path")
    assert not marker.exists()


# --- --allow-global: no module with import-time effects is imported ---------------------------

PLANTED = "curvcal_planted_pkg"


@pytest.fixture
def planted_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package on the path whose import (and whose ``__main__``) creates the marker."""
    package = tmp_path / "site" / PLANTED
    package.mkdir(parents=True)
    marker = tmp_path / "MARKER"
    touch = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
    (package / "__init__.py").write_text(f"{touch}\n\nclass Config:\n    pass\n")
    (package / "__main__.py").write_text(f"{touch}\n\nclass Config:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield marker
    for name in [n for n in sys.modules if n.startswith(PLANTED)]:
        del sys.modules[name]


@pytest.mark.parametrize(
    ("name", "why"),
    [
        (f"{PLANTED}.Config", "is not imported, and importing a module runs its code"),
        (f"{PLANTED}.__main__.Config", "is a __main__ module, which runs its program"),
    ],
)
def test_allow_global_imports_no_module_with_effects(
    run_cli, planted_package: Path, tmp_path: Path, name: str, why: str
) -> None:
    model = digits_model(tmp_path)
    before = digests(model)
    result = run_cli("inspect", model, "--allow-global", name)
    assert result.code == 2, result.output
    _one_error_line(result.stderr, f"--allow-global {name}: ", why, "--trust-checkpoint")
    assert not planted_package.exists()
    assert digests(model) == before


def test_a_refusal_never_suggests_a_global_from_a_module_with_effects(
    run_cli, tmp_path: Path
) -> None:
    """A pickle that needs a class of a package's ``__main__`` (a program, run when imported):
    the refusal names --trust-checkpoint alone, never ``--allow-global`` for it."""
    import types

    package = "curvcal_absent_pkg"
    parent, module = types.ModuleType(package), types.ModuleType(f"{package}.__main__")

    class Config:
        pass

    Config.__module__, Config.__qualname__ = module.__name__, "Config"
    module.Config = Config  # type: ignore[attr-defined]
    # registered only while pickling (pickle finds the class by its name), then forgotten
    sys.modules[package], sys.modules[module.__name__] = parent, module
    try:
        path = tmp_path / "w.pt"
        torch.save({"state_dict": DigitsCNN(3, width=1).state_dict(), "cfg": Config()}, path)
    finally:
        del sys.modules[package], sys.modules[module.__name__]
    data = digit_images(tmp_path)
    before = digests(path, data)
    result = run_cli("hessian", path, "--arch", "curvcal:DigitsCNN", "--data", data, "--no-trace")
    assert result.code == 2, result.output
    line = _one_error_line(result.stderr, f"{package}.__main__.Config", "--trust-checkpoint")
    assert "--allow-global" not in line
    assert digests(path, data) == before


# --- entry points: nothing is imported from the working directory ----------------------------


def _planted_tomllib(folder: Path) -> tuple[Path, Path]:
    marker = folder / "MARKER"
    (folder / "tomllib.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
    )
    policy = folder / "gate.toml"
    policy.write_text("[ece]\nmax = 0.5\n")
    return marker, policy


def _torchrun() -> list[str]:
    script = Path(sys.executable).parent / "torchrun"
    if not script.exists():
        pytest.fail("torchrun is installed with torch next to this Python")
    return [str(script), "--standalone", "--nproc-per-node", "1"]


@pytest.mark.parametrize("launcher", ["python -m", "torchrun -m"])
def test_the_entry_points_import_nothing_from_the_working_directory(
    tmp_path: Path, launcher: str
) -> None:
    marker, policy = _planted_tomllib(tmp_path)
    model = digits_model(tmp_path)
    data = digit_images(tmp_path)
    before = digests(tmp_path)
    prefix = [sys.executable, "-m"] if launcher == "python -m" else [*_torchrun(), "-m"]
    result = subprocess.run(
        [*prefix, "curvcal", "check", str(model), "--policy", str(policy), "--data", str(data)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(),
        timeout=300,
    )
    assert not marker.exists(), result.stderr
    assert result.returncode in (0, 1), result.stderr  # the gate ran, with the real tomllib
    assert digests(tmp_path) == before


# =============================================================================================
# Inputs overwritten or written into
# =============================================================================================


def _text_table(folder: Path, suffix: str) -> Path:
    path = folder / f"reviews{suffix}"
    if suffix == ".csv":
        path.write_text("text,label\ngood movie,1\nbad film,0\n")
    else:
        path.write_text('{"text": "good movie", "label": 1}\n{"text": "bad film", "label": 0}\n')
    return path


def _saved_dataset(folder: Path) -> Path:
    """A ``save_to_disk`` folder's files (the refusal comes before anything is parsed)."""
    saved = folder / "saved"
    saved.mkdir()
    (saved / "state.json").write_text('{"_data_files": [{"filename": "data-00000.arrow"}]}')
    (saved / "dataset_info.json").write_text("{}")
    (saved / "data-00000.arrow").write_bytes(b"arrow")
    return saved


def _case(name: str, t: Path, model: Path) -> tuple[list[object], Path, str]:
    """(arguments, the input that must survive, what the message names)."""
    if name in ("jsonl", "csv"):
        table = _text_table(t, f".{name}")
        return ["calibrate", model, "--data", table, "-o", table], table, "--data"
    if name == "saved-state":
        saved = _saved_dataset(t)
        return ["hessian", model, "--data", saved, "-o", saved / "state.json"], saved, "--data"
    if name == "saved-plot":
        saved = _saved_dataset(t)
        args = ["hessian", model, "--data", saved, "--plot", saved / "spectrum.png"]
        return args, saved, "--data"
    if name == "tokenizer":
        table = _text_table(t, ".jsonl")
        tokenizer = t / "tokenizer"
        tokenizer.mkdir()
        (tokenizer / "tokenizer.json").write_text('{"version": "1.0"}')
        args = ["calibrate", model, "--data", table, "--tokenizer", tokenizer, "--save-calibrator"]
        return [*args, tokenizer / "tokenizer.json"], tokenizer, "--tokenizer"
    if name == "policy-tokenizer":
        table = _text_table(t, ".jsonl")
        tokenizer = t / "tokenizer"
        tokenizer.mkdir()
        (tokenizer / "tokenizer.json").write_text('{"version": "1.0"}')
        policy = t / "gate.toml"
        policy.write_text(
            f'[settings]\ndata = "{table}"\ntokenizer = "{tokenizer}"\n[ece]\nmax = 0.5\n'
        )
        args = ["check", model, "--policy", policy, "-o", tokenizer / "tokenizer.json"]
        return args, tokenizer, "tokenizer"
    if name == "tv-root":
        root = t / "datasets"
        raw = root / "cifar-10-batches-py"
        raw.mkdir(parents=True)
        (raw / "test_batch").write_bytes(b"raw cifar bytes")
        args = ["hessian", model, "--data", "tv:cifar10", "--data-root", root]
        return [*args, "-o", raw / "test_batch"], root, "--data-root"
    if name == "metadata-folder":
        folder = t / "hf_model"
        folder.mkdir()
        (folder / "config.json").write_text('{"architectures": ["BertForSequenceClassification"]}')
        state = {k: v.contiguous() for k, v in DigitsCNN(3, width=1).state_dict().items()}
        named = t / "named.safetensors"
        save_file(state, str(named), {"curvcal.arch": f"hf:{folder}"})
        data = digit_images(t)
        return (
            ["hessian", named, "--data", data, "-o", folder / "config.json"],
            folder,
            "CHECKPOINT's metadata curvcal.arch",
        )
    raise AssertionError(name)


CASES = [
    "jsonl",
    "csv",
    "saved-state",
    "saved-plot",
    "tokenizer",
    "policy-tokenizer",
    "tv-root",
    "metadata-folder",
]


@pytest.mark.parametrize("name", CASES)
def test_no_file_a_run_reads_is_written_even_with_force(run_cli, tmp_path: Path, name: str) -> None:
    model = digits_model(tmp_path)
    args, kept, option = _case(name, tmp_path, model)
    before = digests(model, kept)
    result = run_cli(*args, "--force")
    assert result.code == 2, result.output
    line = _one_error_line(result.stderr, "never writes over a file it reads")
    assert "would replace the input" in line or "lies inside the input folder" in line
    assert f"input {option}" in line or f"input folder {option}" in line, line
    assert digests(model, kept) == before
    assert not list(tmp_path.rglob("*.tmp"))


# --- exclusive creation ----------------------------------------------------------------------


def _logits(folder: Path) -> Path:
    import numpy as np

    rng = np.random.default_rng(0)
    path = folder / "logits.npz"
    np.savez(path, logits=rng.standard_normal((30, 3)), labels=rng.integers(0, 3, 30))
    return path


def test_a_file_created_while_the_run_works_is_not_replaced(
    run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --force, "already exists" holds at the end of the run as at its start: a file
    that took the -o name meanwhile (another run's report) is kept, and this run says so."""
    import curvcal.report.tables as tables

    logits = _logits(tmp_path)
    out = tmp_path / "report.json"
    original = tables.to_json_text

    def meanwhile(report: object) -> str:
        out.write_text("the other run's report")  # appears after the check at the start
        return original(report)  # type: ignore[arg-type]

    monkeypatch.setattr(tables, "to_json_text", meanwhile)
    result = run_cli("metrics", logits, "-o", out, "-q")
    assert result.code == 2, result.output
    _one_error_line(result.stderr, shown(out, ":"), "already exists", "--force")
    assert out.read_text() == "the other run's report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logits.npz", "report.json"]


def test_of_two_writers_without_force_exactly_one_creates_the_file(tmp_path: Path) -> None:
    """Two writers both pass the "does not exist" check, then both publish: one wins, the other
    is refused, and the winner's bytes are whole."""
    from curvcal.atomic import atomic_output, mark_output
    from curvcal.errors import InputError

    out = tmp_path / "report.json"
    mark_output(out, replace=False)
    both_written = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def write(name: str) -> None:
        try:
            with atomic_output(out) as stream:
                stream.write(name.encode() * 1000)
                both_written.wait(timeout=30)
            outcomes[name] = "created"
        except InputError as error:
            outcomes[name] = error.message

    threads = [threading.Thread(target=write, args=(n,)) for n in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert list(outcomes.values()).count("created") == 1, outcomes
    (winner,) = [n for n, outcome in outcomes.items() if outcome == "created"]
    (loser,) = [outcome for n, outcome in outcomes.items() if n != winner]
    assert "already exists" in loser
    assert out.read_bytes() == winner.encode() * 1000
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


# --- modes -----------------------------------------------------------------------------------


def test_force_keeps_the_mode_of_the_file_it_replaces(run_cli, tmp_path: Path) -> None:
    logits = _logits(tmp_path)
    out = tmp_path / "report.json"
    out.write_text("{}")
    out.chmod(0o600)
    result = run_cli("metrics", logits, "-o", out, "--force", "-q")
    assert result.code == 0, result.output
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert json.loads(out.read_text())["results"]


@pytest.mark.parametrize("umask", [0o077, 0o022])
def test_a_new_output_gets_the_users_umask(run_cli, tmp_path: Path, umask: int) -> None:
    logits = _logits(tmp_path)
    out = tmp_path / "report.json"
    previous = os.umask(umask)
    try:
        result = run_cli("metrics", logits, "-o", out, "-q")
    finally:
        os.umask(previous)
    assert result.code == 0, result.output
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask


# --- SIGTERM ---------------------------------------------------------------------------------

_TERMINATED_WHILE_WRITING = """
import os, signal, sys, time
from pathlib import Path
from curvcal.atomic import atomic_output
with atomic_output(Path(sys.argv[1])) as out:
    out.write(b"half a plot")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
"""


def test_sigterm_while_an_output_is_written_leaves_no_temporary_file(tmp_path: Path) -> None:
    out = tmp_path / "spectrum.png"
    result = subprocess.run(
        [sys.executable, "-c", _TERMINATED_WHILE_WRITING, str(out)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert result.returncode == -signal.SIGTERM, result.stderr  # still ended by the signal
    assert list(tmp_path.iterdir()) == []


_TERMINATED_WHILE_PLOTTING = """
import os, signal, sys, time
from matplotlib.figure import Figure

def savefig(self, stream, **_options):
    stream.write(b"half a plot")
    os.kill(os.getpid(), signal.SIGTERM)  # as a job scheduler or torchrun would
    time.sleep(30)

Figure.savefig = savefig
from curvcal.cli import run
sys.argv = ["curvcal", *sys.argv[1:]]
run()
"""


def test_sigterm_while_a_plot_is_written_leaves_no_temporary_file(tmp_path: Path) -> None:
    """The real command: ``curvcal metrics LOGITS --plot FILE`` gets SIGTERM while matplotlib
    writes the figure."""
    pytest.importorskip("matplotlib")
    logits = _logits(tmp_path)
    before = digests(logits)
    plot = tmp_path / "reliability.png"
    result = subprocess.run(
        [sys.executable, "-c", _TERMINATED_WHILE_PLOTTING, "metrics", str(logits), "--plot",
         str(plot), "-q"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )  # fmt: skip
    assert result.returncode == -signal.SIGTERM, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logits.npz"]
    assert digests(logits) == before


def test_sigterm_reaches_the_previous_handler_after_the_clean_up(tmp_path: Path) -> None:
    from curvcal.atomic import Terminated, atomic_output

    received: list[int] = []

    def previous(signum: int, _frame: object) -> None:
        received.append(signum)

    saved = signal.signal(signal.SIGTERM, previous)
    try:
        with pytest.raises(Terminated), atomic_output(tmp_path / "out.json") as stream:
            stream.write(b"{")
            os.kill(os.getpid(), signal.SIGTERM)
        assert received == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is previous
    finally:
        signal.signal(signal.SIGTERM, saved)
    assert list(tmp_path.iterdir()) == []


def test_a_transformers_timm_wrapper_config_is_held_to_the_same_rule(
    run_cli, tmp_path: Path
) -> None:
    """transformers' TimmWrapper hands its config's ``model_args`` to ``timm.create_model``."""
    pytest.importorskip("timm")
    import transformers
    from test_malicious_checkpoints import _Reduce

    marker = tmp_path / "MARKER"
    evil = tmp_path / "evil.pt"
    torch.save(_Reduce(exec, f"open({str(marker)!r}, 'w').close()"), evil)
    config = transformers.TimmWrapperConfig(architecture="test_resnet", num_labels=3)
    torch.manual_seed(0)
    folder = tmp_path / "wrapped"
    transformers.TimmWrapperForImageClassification(config).save_pretrained(folder)
    document = json.loads((folder / "config.json").read_text())
    document["model_args"] = {"checkpoint_path": str(evil)}
    (folder / "config.json").write_text(json.dumps(document))
    data = tmp_path / "images.pt"
    torch.save({"x": torch.randn(4, 3, 32, 32), "y": torch.tensor([0, 1, 2, 0])}, data)
    before = digests(folder, evil, data)
    result = run_cli("hessian", folder, "--data", data, "--device", "cpu", "--no-trace")
    assert result.code == 2, result.output
    _one_error_line(result.stderr, shown(folder / "config.json"), "checkpoint_path")
    assert not marker.exists()
    assert digests(folder, evil, data) == before
