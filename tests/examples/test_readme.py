"""Every command README.md shows is run, so the documentation cannot drift from the CLI; the
placeholder machinery here also runs the pages of ``docs/`` (:mod:`test_docs`).

The fenced ``console``/``bash``/``sh`` blocks are read in order; every line that starts with
``curvcal`` (or ``$ curvcal``, continuation lines joined) is run in-process, each block in a fresh
folder where the files the README names are put under those names. :data:`FILES` says what each
named file is made from (the bundled digits checkpoint and data); :data:`ARGUMENTS` replaces the
specs that need a user's own model or a downloaded dataset. A name in a command that is in
neither table fails the test, so a new README example needs a new entry here.
"""

from __future__ import annotations

import itertools
import re
import runpy
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from curvcal.assets import demo_checkpoint, demo_data

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
POLICY_PAGE = ROOT / "docs" / "guide" / "check.md"  # its policy example is gate.toml

# Specs that name a user's model or a dataset to download -> the bundled stand-in.
ARGUMENTS = {
    "tv:resnet18": "curvcal:DigitsCNN",  # the README's ResNet: the bundled CNN's class
    "tv:cifar10": "digits256.pt",  # the first 256 bundled digits (no download in tests)
    "tv:cifar10:test": "digits256.pt",
}

# Files a command reads, as the README names them -> how the test makes them in the block's folder.
Maker = Callable[[Path], None]


def _digits(first: int, last: int) -> Maker:
    def make(path: Path) -> None:
        data = load_file(str(demo_data()))
        torch.save({"x": data["x"][first:last], "y": data["y"][first:last]}, path)

    return make


def _state_dict(path: Path) -> None:
    torch.save(load_file(str(demo_checkpoint())), path)


def _checkpoint(path: Path) -> None:
    path.write_bytes(demo_checkpoint().read_bytes())


def _logits(first: int, last: int, key: str = "logits") -> Maker:
    def make(path: Path) -> None:
        from curvcal.models import DigitsCNN

        data = load_file(str(demo_data()))
        model = DigitsCNN(num_classes=10)
        model.load_state_dict(load_file(str(demo_checkpoint())))
        with torch.no_grad():
            scores = model.eval()(data["x"][first:last]).double()
        if key == "probs":
            scores = scores.softmax(dim=1)
        np.savez(path, **{key: scores.numpy(), "labels": data["y"][first:last].numpy()})

    return make


def _readme_policy(path: Path) -> None:
    path.write_text(toml_blocks(POLICY_PAGE)[0])


def _bad_policy(path: Path) -> None:
    """The policy of the README's error example: line 6 is a min above its max."""
    path.write_text("[ece]\nmax = 0.1\n\n[ts.ece]\nmax = 0.1\nmin = 0.5\n")


def _ci_policy(path: Path) -> None:
    """examples/ci's policy, with the architecture a state dict needs in its settings."""
    text = (ROOT / "examples" / "ci" / "curvcal.toml").read_text()
    path.write_text(text.replace("[settings]\n", '[settings]\narch = "curvcal:DigitsCNN"\n', 1))


def _hf_folder(path: Path) -> None:
    """A tiny ViT for the digits' 1×8×8 images, saved by transformers' save_pretrained."""
    import transformers

    torch.manual_seed(0)
    config = transformers.ViTConfig(
        image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32, num_labels=10,
        id2label={i: str(i) for i in range(10)}, label2id={str(i): i for i in range(10)},
    )  # fmt: skip
    transformers.ViTForImageClassification(config).save_pretrained(path)


def _text_folder(path: Path) -> None:
    """A tiny BERT review classifier and its WordPiece tokenizer, saved by save_pretrained."""
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=12, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=64, num_labels=2,
        id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1},
    )  # fmt: skip
    transformers.BertForSequenceClassification(config).save_pretrained(path)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film", "very", "plot"]
    (path / "vocab.txt").write_text("\n".join(words) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(path / "vocab.txt")).save_pretrained(path)


_REVIEWS = [("good film", 1), ("bad plot", 0), ("very good", 1), ("very bad film", 0)] * 3


def _reviews_jsonl(path: Path) -> None:
    import json

    path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in _REVIEWS))


def _reviews_csv(path: Path) -> None:
    lines = ["review,label"] + [f"{t},{['negative', 'positive'][y]}" for t, y in _REVIEWS]
    path.write_text("\n".join(lines) + "\n")


def _timm_checkpoint(path: Path) -> None:
    """What timm's train.py writes: the model name under 'arch', the weights under 'state_dict'."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("resnet18", num_classes=10)
    torch.save({"epoch": 1, "arch": "resnet18", "state_dict": model.state_dict()}, path)


def _images(path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(48, 3, 32, 32, generator=generator)
    torch.save({"x": x, "y": torch.arange(48) % 10}, path)


def _table(suffix: str) -> Maker:
    """The first 400 digits' logits as a parquet list column, or as probabilities in a CSV
    column per class with a 'label' column."""

    def make(path: Path) -> None:
        import csv

        npz = path.with_suffix(".npz")
        _logits(0, 400)(npz)
        with np.load(npz) as saved:
            logits, labels = saved["logits"], saved["labels"]
        npz.unlink()
        if suffix == ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({"logits": list(logits), "labels": labels}), path)
            return
        probs = torch.from_numpy(logits).softmax(dim=1).numpy()
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow([*(f"probs_{k}" for k in range(10)), "label"])
            for row, label in zip(probs, labels, strict=True):
                writer.writerow([*(repr(float(v)) for v in row), int(label)])

    return make


FILES: dict[str, Maker] = {
    "model.pt": _state_dict,
    "ckpt.pt": _state_dict,
    "model.safetensors": _checkpoint,
    "digits256.pt": _digits(0, 256),
    "test.pt": _digits(0, 200),
    "val.pt": _digits(200, 400),
    "logits.npz": _logits(0, 400),
    "test.npz": _logits(0, 400),
    "val.npz": _logits(400, 797),
    "new_logits.npz": _logits(0, 797),
    "probs.npz": _logits(0, 400, key="probs"),
    "curvcal.toml": _ci_policy,
    "gate.toml": _readme_policy,
    "readme-gate.toml": _readme_policy,
    "vit-cifar10": _hf_folder,
    "bert-reviews": _text_folder,
    "reviews.jsonl": _reviews_jsonl,
    "reviews.csv": _reviews_csv,
    "model_best.pth.tar": _timm_checkpoint,
    "images.pt": _images,
    "predictions.parquet": _table(".parquet"),
    "predictions.csv": _table(".csv"),
}

# Files a command reads that an earlier command of the README writes: made by running that command.
REPORTS = {
    "last-release.json": ["check", "model.pt", "--policy", "curvcal.toml", "-q", "-o"],
    "release.json": ["check", "model.safetensors", "--policy", "readme-gate.toml", "-q", "-o"],
    "new.json": ["check", "model.safetensors", "--policy", "readme-gate.toml", "-q", "-o"],
    "old.json": ["check", "model.safetensors", "--policy", "readme-gate.toml", "-q", "-o"],
    "report.json": ["check", "model.safetensors", "--policy", "readme-gate.toml", "-q", "-o"],
}

# What a command writes (checked to exist afterwards).
OUTPUTS = {
    "-o",
    "--plot",
    "--save-calibrator",
    "--plot-dir",
    "--save-logits",
    "--save-eigenvectors",
}


@dataclass(frozen=True)
class Command:
    line: int  # README line number
    argv: list[str]  # without the program name
    expected_error: str | None  # the `curvcal: error:` line shown under it, if any
    stdout_to: str | None  # `>> FILE` redirect, removed


def toml_blocks(page: Path = README) -> list[str]:
    return re.findall(r"^```toml\n(.*?)^```", page.read_text(), re.MULTILINE | re.DOTALL)


def console_blocks(page: Path = README) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of every console/bash/sh block of ``page``."""
    blocks, current, start = [], None, 0
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if current is None and re.fullmatch(r"```(console|bash|sh|shell)", line):
            current, start = [], number + 1
        elif current is not None and line.startswith("```"):
            blocks.append((start, current))
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def block_commands(start: int, lines: list[str]) -> list[tuple[int, str, str | None]]:
    """(line number, command text, expected error line) with continuations joined."""
    commands: list[tuple[int, str, str | None]] = []
    i = 0
    while i < len(lines):
        text = lines[i].removeprefix("$ ")
        number = start + i
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + " " + lines[i].strip()
        if text.startswith("curvcal: error:") and commands:
            commands[-1] = (commands[-1][0], commands[-1][1], text)
        elif text.strip() and not text.strip().startswith("#"):
            commands.append((number, text, None))
        i += 1
    return commands


def parse(number: int, text: str, expected: str | None) -> tuple[str, Command]:
    """(program, command) of one README line."""
    stdout_to = None
    redirect = re.search(r'\s>>?\s*("?\$?\w+"?)\s*$', text)
    if redirect:
        stdout_to = redirect.group(1).strip('"')
        text = text[: redirect.start()]
    words = shlex.split(text, comments=True)
    return words[0], Command(number, words[1:], expected, stdout_to)


def all_commands(page: Path = README) -> list[tuple[str, Command, int]]:
    found = []
    for index, (start, lines) in enumerate(console_blocks(page)):
        for number, text, expected in block_commands(start, lines):
            program, command = parse(number, text, expected)
            found.append((program, command, index))
    return found


def test_the_readme_shows_the_commands_this_test_runs() -> None:
    """README is the quick start: `make` targets; every other command is on a docs page."""
    programs = {program for program, _, _ in all_commands()}
    assert programs == {"make"}, programs


def test_readme_links_lead_to_files_that_exist() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    assert len(links) >= 20
    for link in links:
        assert not link.startswith(("http", "/")), link
        assert (ROOT / link).is_file(), link


def test_readme_names_every_command_and_links_its_page() -> None:
    from curvcal.commands import COMMANDS

    text = README.read_text()
    for name in COMMANDS:
        assert f"| `curvcal {name}" in text, name
        assert f"(docs/commands/{name}.md)" in text, name


def test_make_targets_exist() -> None:
    """`make demo` and `make test` are run by CI itself; here: the targets exist and `demo` runs
    the command the README says it does."""
    makefile = (ROOT / "Makefile").read_text()
    targets = [c.argv for p, c, _ in all_commands() if p == "make"]
    assert targets
    for argv in targets:
        assert re.search(rf"^{argv[0]}:", makefile, re.MULTILINE), argv
    assert "curvcal demo --plot-dir build/demo" in makefile


def _substitute(
    argv: list[str], folder: Path, run_cli, arguments: dict[str, str] = ARGUMENTS
) -> list[str]:
    out: list[str] = []
    writes_next = False
    for word in argv:
        word = arguments.get(word, word)
        if writes_next:
            writes_next = False
        elif word in FILES or word in REPORTS:
            _provide(word, folder, run_cli)
        elif "*" in word and out[-1:] != ["--params"]:  # a parameter-name glob is no file glob
            assert list(folder.glob(word)), f"README's glob {word!r} matches nothing"
        elif (
            re.search(r"\.(pt|npz|safetensors|json|jsonl|toml|parquet|csv|tar)$", word)
            and not (folder / word).exists()
        ):
            pytest.fail(f"README names {word!r}: add it to FILES or REPORTS")
        writes_next = word in OUTPUTS
        out.append(word)
    return out


def _provide(name: str, folder: Path, run_cli) -> None:
    path = folder / name
    if path.exists():
        return
    if name in FILES:
        FILES[name](path)
        return
    argv = REPORTS[name]
    for word in argv:
        if word in FILES:
            _provide(word, folder, run_cli)
    result = run_cli(*argv, path)
    assert result.code in (0, 1) and path.exists(), result.output


def _run_block(
    commands: list[tuple[str, Command, int]],
    folder: Path,
    run_cli,
    monkeypatch,
    page: str = "README.md",
    arguments: dict[str, str] = ARGUMENTS,
) -> None:
    """Run one block's commands in ``folder``; ``arguments`` replaces specs before they run (a
    page whose own Python makes every file it names runs with none)."""
    monkeypatch.chdir(folder)
    for program, command, _ in commands:
        if program == "python":
            _run_script(command, folder, monkeypatch)
            continue
        argv = command.argv
        if program == "torchrun":  # one process: the options after -m curvcal are checked
            argv = argv[argv.index("curvcal") + 1 :]
        if program in ("make", "pip"):  # make: see test_make_targets_exist; pip: test_docs
            continue
        argv = _substitute(argv, folder, run_cli, arguments)
        result = run_cli(*argv)
        where = f"{page}:{command.line}: curvcal {' '.join(command.argv)}"
        if command.expected_error is not None:
            assert result.code == 2, f"{where}\n{result.output}"
            assert result.stderr.strip() == command.expected_error, where
            continue
        assert result.code in (0, 1), f"{where}\n{result.output}"
        assert "Traceback" not in result.stderr, where
        if command.stdout_to:
            assert result.stdout.strip(), where
            if "--format" in argv and argv[argv.index("--format") + 1] == "markdown":
                assert "| metric |" in result.stdout, where
        for option, value in itertools.pairwise(argv):
            if option in OUTPUTS:
                assert (folder / value).exists(), f"{where}: {value} not written"


def _run_script(command: Command, folder: Path, monkeypatch) -> None:
    """examples/reproduce/train.py, with one epoch and three of its runs: the full training is
    what the README's table took; the options and the files it writes are what is checked."""
    script, *argv = command.argv
    assert script == "examples/reproduce/train.py", script
    argv = [*argv, "--epochs", "1", "--only", "ce,focal1,focal2"]
    monkeypatch.setattr(sys, "argv", [str(ROOT / script), *argv])
    runpy.run_path(str(ROOT / script), run_name="__main__")
    assert len(list((folder / "runs").glob("*.safetensors"))) == 3


def _blocks(page: Path = README) -> dict[int, list[tuple[str, Command, int]]]:
    blocks: dict[int, list[tuple[str, Command, int]]] = {}
    for entry in all_commands(page):
        blocks.setdefault(entry[2], []).append(entry)
    return blocks


@pytest.mark.slow
@pytest.mark.parametrize("block", sorted(_blocks()))
def test_readme_block(block: int, tmp_path: Path, run_cli, monkeypatch) -> None:
    commands = _blocks()[block]
    if any(c.expected_error for _, c, _ in commands):
        _bad_policy(tmp_path / "gate.toml")
    _run_block(commands, tmp_path, run_cli, monkeypatch)


@pytest.mark.parametrize("script", ["examples/digits/train.py", "examples/reproduce/train.py"])
def test_example_scripts_take_the_options_their_docstrings_show(
    script: str, monkeypatch, capsys
) -> None:
    """The usage line of each example script names only options its parser has (the training
    runs themselves take minutes; the study block of docs/guide/papers.md runs
    reproduce/train.py for one epoch)."""
    text = (ROOT / script).read_text()
    usage = re.search(rf"^\s*python {re.escape(script)} (.*)$", text, re.MULTILINE)
    assert usage, script
    shown = set(re.findall(r"--[a-z][a-z-]*", usage.group(1)))
    assert shown
    monkeypatch.setattr(sys, "argv", [str(ROOT / script), "--help"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / script), run_name="__main__")
    assert exit_info.value.code == 0
    helped = capsys.readouterr().out
    assert all(option in helped for option in shown), (shown, helped)
