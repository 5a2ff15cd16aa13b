"""Library settings bounded before the library runs them: a LoRA adapter saved by peft over a
tiny Llama classifier (and a tiny BERT one for the pad token), its ``adapter_config.json`` or the
base's ``config.json`` rewritten as an attacker would. Each is refused with exit 2, one line
naming the file and the key, before transformers or peft runs it (the iteration counts, the
backtracking pattern and the 100,000 ranges hung at load; the pad token was an AssertionError,
exit 70; ``lora_alpha: NaN`` was exit 3 blaming the data)."""

from __future__ import annotations

import json
import math
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from hf_decoder_builders import copy_adapter

from curvcal.errors import InputError
from curvcal.load.models.library_limits import (
    MAX_INIT_ITERATIONS,
    MAX_LISTED,
    MAX_LORA_ALPHA,
    MAX_RANK,
    MAX_REPLICATION,
    _forward_constants,
    check_against,
    check_config,
    check_config_against_weights,
)
from tests.console_text import said, shown, times_said
from tests.load.test_decoder_adapter_bad_inputs import Files, llama_adapter_files

NAN = float("nan")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    return llama_adapter_files(tmp_path_factory.mktemp("library_limits"))


def _refused(run_cli: Any, args: list[object], file: Path, key: str, *needles: str) -> str:
    """Run ``args`` on the CPU: exit 2, no traceback, nothing printed before the one error
    line, which names ``file`` and ``key`` and holds ``needles``; the line."""
    result = run_cli(*args, "--device", "cpu", "--quiet")
    assert result.code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr  # no library warning before it
    line = lines[0]
    assert line.startswith(f"curvcal: error: {shown(file)} ({key}): "), line
    for needle in needles:
        assert needle in line, (needle, line)
    return str(line)


ADAPTER_CASES: dict[str, tuple[dict[str, Any], str, tuple[str, ...]]] = {
    "PiSSA with a billion iterations": (
        {"init_lora_weights": "pissa_niter_1000000000"},
        "init_lora_weights",
        ("1000000000 PiSSA iterations", f"1..{MAX_INIT_ITERATIONS}"),
    ),
    "LoftQ with a billion iterations": (
        {"init_lora_weights": "loftq", "loftq_config": {"loftq_bits": 4, "loftq_iter": 10**9}},
        "loftq_config",
        ("loftq_iter 1000000000",),
    ),
    "an unknown initialisation": (
        {"init_lora_weights": "svd_forever"},
        "init_lora_weights",
        ("'svd_forever' is none of",),
    ),
    "lora_alpha NaN": ({"lora_alpha": NAN}, "lora_alpha", ("nan is not a finite positive",)),
    "lora_alpha infinite": ({"lora_alpha": float("inf")}, "lora_alpha", ("inf is not",)),
    "lora_alpha zero": ({"lora_alpha": 0}, "lora_alpha", ("0 is not a finite positive",)),
    # finite, but the adapter's every output overflowed: exit 3 on the logits, blaming the data
    "lora_alpha 1e308": ({"lora_alpha": 1e308}, "lora_alpha", ("1e+308 is not", "at most 1e+06")),
    "r zero": ({"r": 0}, "r", (f"0 is not a whole number in 1..{MAX_RANK:,}",)),
    "r NaN": ({"r": NAN}, "r", ("nan is not a whole number",)),
    "r beyond any layer": ({"r": MAX_RANK + 1}, "r", ("65537 is not",)),
    "alpha_pattern NaN": (
        {"alpha_pattern": {"q_proj": NAN}},
        "alpha_pattern",
        ("entry 'q_proj': nan",),
    ),
    "rank_pattern negative": (
        {"rank_pattern": {"v_proj": -2}},
        "rank_pattern",
        ("entry 'v_proj': -2",),
    ),
    "dropout above one": ({"lora_dropout": 3.0}, "lora_dropout", ("not a probability",)),
    "r above every layer's rank": (
        {"r": 17},
        "r",
        ("rank 17 is above 16, the largest rank a layer of the base has",),
    ),
    "rank_pattern above every layer's rank": (
        {"rank_pattern": {"q_proj": 40}},
        "rank_pattern",
        ("rank 40 for 'q_proj' is above 16",),
    ),
    "backtracking target_modules": (
        {"target_modules": "(.|.)*(q|v)_projZ"},
        "target_modules",
        ("longer than 2 s", "module names", "list the module names instead"),
    ),
    "backtracking modules_to_save": (
        {"modules_to_save": ["(.|.)*scoreZ"]},
        "modules_to_save",
        ("longer than 2 s",),
    ),
    "target_modules not a pattern": (
        {"target_modules": "(q_proj"},
        "target_modules",
        ("not a regular expression", "missing )"),
    ),
    "100,000 replicated ranges": (
        {"layer_replication": [[0, 1]] * 100_000},
        "layer_replication",
        ("100,000 ranges for a base of 1 layers", f"at most {MAX_REPLICATION}"),
    ),
    "a list of target_modules longer than any base's": (
        {"target_modules": [f"x{i}" for i in range(MAX_LISTED)] + ["q_proj", "v_proj"]},
        "target_modules",
        (f"{MAX_LISTED + 2:,} entries (at most {MAX_LISTED:,})",),
    ),
    "a list of layers_to_transform longer than any base's": (
        {"layers_to_transform": [0] * (MAX_LISTED + 1)},
        "layers_to_transform",
        (f"{MAX_LISTED + 1:,} entries",),
    ),
    "a replicated range past the last layer": (
        {"layer_replication": [[0, 5]]},
        "layer_replication",
        ("[0, 5] is not a [start, end] pair with 0 <= start < end <= 1",),
    ),
    "a replicated range backwards": (
        {"layer_replication": [[1, 0]]},
        "layer_replication",
        ("[1, 0] is not a [start, end] pair",),
    ),
}


@pytest.mark.parametrize("name", list(ADAPTER_CASES))
def test_an_unbounded_adapter_setting_is_refused_before_peft_runs_it(
    run_cli: Any, files: Files, tmp_path: Path, name: str
) -> None:
    changes, key, needles = ADAPTER_CASES[name]
    folder = copy_adapter(files.adapter, tmp_path, **changes)
    before = sorted(p.relative_to(files.root) for p in files.root.rglob("*"))
    _refused(
        run_cli,
        ["calibrate", folder, "--data", files.jsonl, "-o", tmp_path / "out.json"],
        folder / "adapter_config.json",
        key,
        *needles,
    )
    assert not (tmp_path / "out.json").exists()
    assert sorted(p.relative_to(files.root) for p in files.root.rglob("*")) == before


def test_peft_documented_patterns_still_load(run_cli: Any, files: Files, tmp_path: Path) -> None:
    """The timed check lets the patterns peft's documentation shows through, and they select
    the same modules as the list they replace: the same logits."""
    listed = run_cli("calibrate", files.adapter, "--data", files.jsonl, "--device", "cpu",
                     "--method", "none", "--json")  # fmt: skip
    folder = copy_adapter(
        files.adapter,
        tmp_path,
        target_modules=r".*layers.*(q|v)_proj$",
        rank_pattern={r"layers\.0\.self_attn\.q_proj": 2},
        alpha_pattern={"v_proj": 4},
    )
    pattern = run_cli("calibrate", folder, "--data", files.jsonl, "--device", "cpu",
                      "--method", "none", "--json")  # fmt: skip
    assert listed.code == pattern.code == 0, pattern.stderr
    first, second = json.loads(listed.stdout), json.loads(pattern.stdout)
    assert first["results"]["evaluation"] == second["results"]["evaluation"]


def _base_with(files: Files, tmp_path: Path, **changes: object) -> Path:
    folder = tmp_path / "base"
    shutil.copytree(files.base, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("pad", [10**12, 320, -1, 2.5])
def test_a_pad_token_outside_the_vocabulary_is_refused(
    run_cli: Any, files: Files, tmp_path: Path, pad: object
) -> None:
    base = _base_with(files, tmp_path, pad_token_id=pad)
    _refused(
        run_cli,
        ["calibrate", base, "--data", files.jsonl],
        base / "config.json",
        "pad_token_id",
        f"{pad!r} is outside the vocabulary (token ids 0..319)",
    )
    # the same base config under an adapter (--base-model) is refused the same way
    _refused(
        run_cli,
        ["hessian", files.adapter, "--base-model", base, "--data", files.jsonl],
        base / "config.json",
        "pad_token_id",
    )


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("num_hidden_layers", 200_000, "200,000 is more than the weights can fill (the weights "
         "hold 12 tensors)"),
        ("hidden_size", 10**9, "1,000,000,000 is more than the weights can fill (the weights' "
         "largest tensor holds 5,120 numbers)"),
        ("vocab_size", 10**7, "10,000,000 is more"),
    ],
)  # fmt: skip
def test_a_config_larger_than_its_weights_is_refused_before_transformers_builds_it(
    run_cli: Any, files: Files, tmp_path: Path, key: str, value: int, needle: str
) -> None:
    """Before, transformers built 200,000 Llama layers (past 60 s) before reading a weight.
    The tiny Llama's weights: 12 tensors, the largest its 320 x 16 embedding."""
    base = _base_with(files, tmp_path, **{key: value})
    _refused(run_cli, ["calibrate", base, "--data", files.jsonl], base / "config.json", key,
             needle)  # fmt: skip
    # the same base config under an adapter (--base-model) is refused the same way
    _refused(run_cli, ["hessian", files.adapter, "--base-model", base, "--data", files.jsonl],
             base / "config.json", key, needle)  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value", "shown", "needle"),
    [
        ("rms_norm_eps", -1.0, "rms_norm_eps", "-1.0 is not positive"),
        ("rms_norm_eps", 0.0, "rms_norm_eps", "0.0 is not positive"),
        ("rms_norm_eps", float("nan"), "rms_norm_eps", "nan is not a finite number"),
        ("rope_parameters", {"rope_type": "default", "rope_theta": 0.0},
         "rope_parameters.rope_theta", "0.0 is not positive"),
        ("rope_parameters", {"rope_type": "default", "rope_theta": float("inf")},
         "rope_parameters.rope_theta", "inf is not a finite number"),
        ("rope_parameters", {"rope_type": "linear", "rope_theta": 1e4, "factor": 0.0},
         "rope_parameters.factor", "0.0 is not positive"),
        ("attention_dropout", 2.0, "attention_dropout", "2.0 is not a probability in [0, 1]"),
    ],
)  # fmt: skip
def test_a_forward_constant_that_makes_every_logit_nan_is_refused_naming_the_key(
    run_cli: Any, files: Files, tmp_path: Path, key: str, value: object, shown: str, needle: str
) -> None:
    """Before: a negative or zero norm epsilon, a zero rotary base or scaling factor, or a NaN
    in the tiny Llama's config was exit 3 blaming ``--data`` ("the model's logits are NaN or
    Inf for 11 of 11 samples"); an infinite rotary base or a dropout of 2 ran to exit 0."""
    base = _base_with(files, tmp_path, **{key: value})
    _refused(run_cli, ["calibrate", base, "--data", files.jsonl], base / "config.json", shown,
             needle)  # fmt: skip


def test_a_bert_pad_token_past_the_table_was_an_internal_error(
    run_cli: Any, files: Files, tmp_path: Path
) -> None:
    """BERT builds its embedding with ``padding_idx = pad_token_id``: past the table, torch's
    assertion (exit 70) before."""
    import transformers

    config = transformers.BertConfig(
        vocab_size=12, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=16, num_labels=2,
    )  # fmt: skip
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path / "bert")
    saved = json.loads((tmp_path / "bert" / "config.json").read_text())
    saved["pad_token_id"] = 10**12
    (tmp_path / "bert" / "config.json").write_text(json.dumps(saved))
    _refused(run_cli, ["hessian", tmp_path / "bert", "--data", files.jsonl],
             tmp_path / "bert" / "config.json", "pad_token_id",
             "outside the vocabulary (token ids 0..11)")  # fmt: skip


# -- the table's borders, without a run ------------------------------------------------------


def _config_check(changes: dict[str, Any]) -> Callable[[], None]:
    return lambda: check_config(Path("a") / "adapter_config.json", {"r": 2, **changes})


@pytest.mark.parametrize(
    "accepted",
    [
        {"r": 1},
        {"r": MAX_RANK},
        {"lora_alpha": 1e-6},
        {"lora_alpha": MAX_LORA_ALPHA},
        {"alpha_pattern": {"q_proj": MAX_LORA_ALPHA}},
        {"lora_dropout": 0.0},
        {"lora_dropout": 1.0},
        {"init_lora_weights": True},
        {"init_lora_weights": False},
        {"init_lora_weights": "pissa"},
        {"init_lora_weights": f"pissa_niter_{MAX_INIT_ITERATIONS}"},
        {"loftq_config": {"loftq_bits": 2, "loftq_iter": MAX_INIT_ITERATIONS}},
        {"loftq_config": {}},
        {"layer_replication": [[0, 2], [1, 3]]},
        {"lora_alpha": None},  # peft's default
    ],
)
def test_values_at_the_borders_pass(accepted: dict[str, Any]) -> None:
    _config_check(accepted)()


@pytest.mark.parametrize(
    "refused",
    [
        {"r": True},
        {"r": 2.0},
        {"lora_alpha": "4"},
        {"lora_alpha": -1e-300},
        {"lora_alpha": MAX_LORA_ALPHA * (1 + 1e-15)},
        {"alpha_pattern": {"q_proj": 1e308}},
        {"lora_dropout": -0.1},
        {"init_lora_weights": f"pissa_niter_{MAX_INIT_ITERATIONS + 1}"},
        {"init_lora_weights": "pissa_niter_0"},
        {"init_lora_weights": "pissa_niter_-3"},
        {"loftq_config": {"loftq_iter": MAX_INIT_ITERATIONS + 1}},
        {"loftq_config": {"loftq_bits": 3}},
        {"layer_replication": [[0, 2], [2]]},
        {"layer_replication": "0-2"},
    ],
)
def test_values_past_the_borders_are_refused(refused: dict[str, Any]) -> None:
    (key,) = refused
    with pytest.raises(InputError, match=rf"adapter_config.json \({key}\): "):
        _config_check(refused)()


def test_replication_is_bounded_by_the_base_layers() -> None:
    config = Path("a") / "adapter_config.json"
    fourfold = [[0, 3]] * MAX_REPLICATION
    check_against(config, {"layer_replication": fourfold}, ["model"], 3)
    with pytest.raises(InputError, match=r"builds a stack of 15 layers from 3 \(at most 12"):
        check_against(config, {"layer_replication": [*fourfold, [0, 3]]}, ["model"], 3)
    with pytest.raises(InputError, match="does not say how many layers"):
        check_against(config, {"layer_replication": [[0, 1]]}, ["model"], None)


def test_lists_and_model_sizes_at_their_borders() -> None:
    listed = ["q_proj"] * MAX_LISTED
    for key in ("target_modules", "exclude_modules", "modules_to_save", "layers_to_transform"):
        _config_check({key: listed})()
        with pytest.raises(InputError, match=rf"\({key}\): {MAX_LISTED + 1:,} entries"):
            _config_check({key: [*listed, "x"]})()
    _config_check({"target_modules": "q" * (MAX_LISTED + 1)})()  # a pattern: timed on the base
    config = Path("m") / "config.json"
    shapes = [(320, 16), (16,), (2, 16)]
    check_config_against_weights(config, {"num_hidden_layers": 3, "hidden_size": 5120}, shapes)
    check_config_against_weights(config, {"num_hidden_layers": 10**6}, [])  # weights elsewhere
    with pytest.raises(InputError, match=r"\(num_hidden_layers\): 4 is more .* 3 tensors"):
        check_config_against_weights(config, {"num_hidden_layers": 4}, shapes)
    with pytest.raises(InputError, match=r"\(intermediate_size\): 5,121 is more .* 5,120"):
        check_config_against_weights(config, {"intermediate_size": 5121}, shapes)


def test_forward_constants_at_their_borders() -> None:
    """Positive constants may be as small or as large as a finite number goes (a 1e308 rotary
    base or epsilon overflows nothing: the forward takes its inverse powers or its root); a
    dropout probability may be 0 or 1; the rules reach nested configs and lists of them, and
    leave other keys, booleans and nulls to transformers. A bare ``eps`` (ProphetNet's label
    smoothing) and a loss's scaling factor may be 0: every default config of transformers
    passes (802 families, checked when the rule was written)."""
    config = Path("m") / "config.json"
    accepted = {
        "rms_norm_eps": 5e-324, "layer_norm_epsilon": 1e308, "rope_theta": 1e308,
        "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0},
        "attention_dropout": 0.0, "hidden_dropout_prob": 1.0, "classifier_dropout": None,
        "text_config": {"layer_norm_eps": 1e-12}, "use_dropout": True, "bias": -3.0,
        "eps": 0.0, "mtp_loss_scaling_factor": 0.0, "partial_rotary_factor": 0.5,
    }  # fmt: skip
    check_config(config, accepted)
    refused = [
        ({"text_config": {"layer_norm_eps": -1e-300}}, r"\(text_config.layer_norm_eps\)"),
        ({"layers": [{"norm_eps": 0}]}, r"\(layers\[0\].norm_eps\): 0 is not positive"),
        ({"mixer_rms_eps": -1e-6}, r"\(mixer_rms_eps\): -1e-06 is not positive"),
        (
            {"rope_parameters": {"sliding_attention": {"factor": 0.0}}},
            r"\(rope_parameters.sliding_attention.factor\): 0.0 is not positive",
        ),
        ({"compress_rope_theta": -1.0}, r"\(compress_rope_theta\)"),
        ({"scales": [1.0, float("-inf")]}, r"\(scales\[1\]\): -inf is not a finite"),
        ({"bias": float("nan")}, r"\(bias\): nan is not a finite number"),
        ({"hidden_dropout_prob": -0.0001}, r"not a probability in \[0, 1\]"),
    ]
    for changes, pattern in refused:
        with pytest.raises(InputError, match=pattern):
            check_config(config, changes)
    # adapter and tokenizer configs have rules of their own
    check_config(Path("tokenizer_config.json"), {"model_max_length": 1e30, "eps": -1.0})


def test_other_files_and_other_keys_are_left_to_their_readers() -> None:
    check_config(Path("tokenizer_config.json"), {"pad_token_id": 10**12, "vocab_size": 3})
    check_config(Path("config.json"), {"pad_token_id": 5})  # no vocabulary to bound it by
    check_config(Path("config.json"), {"eos_token_id": 50256, "vocab_size": 30})  # GPT-2's
    check_config(Path("adapter_config.json"), ["not", "an", "object"])
    with pytest.raises(InputError, match=r"config.json \(vocab_size\): 0 is not"):
        check_config(Path("config.json"), {"pad_token_id": 0, "vocab_size": 0})


def test_a_peft_warning_is_said_once_in_curvcal_words(
    run_cli: Any, files: Files, tmp_path: Path
) -> None:
    """peft corrects ``fan_in_fan_out`` on a ``torch.nn.Linear`` with a ``UserWarning`` that it
    printed, file, line and source, before curvcal's lines: now one curvcal warning naming the
    adapter."""
    folder = copy_adapter(files.adapter, tmp_path, fan_in_fan_out=True)
    result = run_cli("calibrate", folder, "--data", files.jsonl, "--device", "cpu",
                     "--method", "none", "--json")  # fmt: skip
    assert result.code == 0, result.stderr
    assert "UserWarning" not in result.stderr and "warnings.warn" not in result.stderr
    # said once, in curvcal's words, whatever width the console wrapped it at
    assert times_said("fan_in_fan_out is set to True", result.stderr) == 1
    assert said(
        f"curvcal: warning: {folder}: peft: fan_in_fan_out is set to True but the target "
        "module is `torch.nn.Linear`. Setting fan_in_fan_out to False.",
        result.stderr,
    )
    notes = json.loads(result.stdout)["inputs"]["checkpoint"]["metadata"]["library_notes"]
    assert notes.startswith("peft: fan_in_fan_out is set to True")


def _edited(base: Path, parent: Path, drop_head: bool) -> Path:
    """A copy of the classifier folder ``base`` whose weights hold one tensor no parameter
    takes and, with ``drop_head``, lack the head's matrix: transformers loads either, heads
    the second at random and logs its load report (a table, printed around curvcal's lines
    before)."""
    import torch
    from safetensors.torch import load_file, save_file

    folder = parent / ("headless" if drop_head else "spare")
    shutil.copytree(base, folder)
    weights = load_file(folder / "model.safetensors")
    if drop_head:
        (head,) = [name for name in weights if name.startswith("score.")]
        del weights[head]
    weights["spare.bias"] = torch.zeros(2)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_a_transformers_load_report_is_said_once_in_curvcal_words(
    run_cli: Any, files: Files, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """transformers logs (rather than warns) what a load leaves over: before, its
    ``[transformers] ... LOAD REPORT`` table printed on stderr around curvcal's own lines and
    the report's JSON kept nothing of it."""
    folder = _edited(files.base, tmp_path, drop_head=False)
    result = run_cli("calibrate", folder, "--data", files.jsonl, "--device", "cpu",
                     "--method", "none", "--json")  # fmt: skip
    assert result.code == 0, result.stderr
    assert "LOAD REPORT" not in result.stderr and "[transformers]" not in result.stderr
    assert "|" not in result.stderr and "UNEXPECTED" not in result.stderr
    # the library's handler writes to the process's stderr, not the one the runner captures
    assert "LOAD REPORT" not in capfd.readouterr().err
    ignored = (
        f"curvcal: warning: {folder}: transformers: the model takes none of 1 of the "
        "checkpoint's tensors, ignored: spare.bias"
    )
    assert times_said(ignored, result.stderr) == 1, result.stderr
    report = json.loads(result.stdout)
    kept = [w for w in report["warnings"] if "transformers:" in w]
    assert kept == [ignored.removeprefix("curvcal: warning: ")]


def test_a_folder_lacking_weights_is_refused_not_headed_at_random(
    run_cli: Any, files: Files, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A folder whose weights lack the head's matrix: transformers initialises it at random,
    and curvcal measured that random classifier with exit 0 (a timm folder lacking a weight
    was already refused). Now exit 2, one line naming the folder and the tensor."""
    folder = _edited(files.base, tmp_path, drop_head=True)
    result = run_cli("calibrate", folder, "--data", files.jsonl, "--device", "cpu",
                     "--method", "none", "--json")  # fmt: skip
    assert result.code == 2 and result.stdout == "", result.stderr
    assert said(f"curvcal: error: {folder}: its weights lack 1 of the", result.stderr)
    assert said("(score.weight), which transformers would initialise at random", result.stderr)
    assert "LOAD REPORT" not in result.stderr + capfd.readouterr().err


def test_an_adapter_supplies_the_head_its_base_lacks(
    run_cli: Any, files: Files, tmp_path: Path
) -> None:
    """The usual LoRA classifier: a base saved without its head and an adapter whose
    ``modules_to_save`` holds the trained head. The base's missing head is the adapter's, so
    it loads without a refusal or a warning about random weights, and measures the same model
    as the adapter on the whole base."""
    headless = _edited(files.base, tmp_path, drop_head=True)
    common = ("--data", files.jsonl, "--device", "cpu", "--method", "none", "--json")
    whole = run_cli("calibrate", files.adapter, "--base-model", files.base, *common)
    lacking = run_cli("calibrate", files.adapter, "--base-model", headless, *common)
    assert whole.code == 0 and lacking.code == 0, whole.stderr + lacking.stderr
    assert "random" not in lacking.stderr
    one, two = json.loads(whole.stdout)["results"], json.loads(lacking.stdout)["results"]
    assert two == one


def test_library_log_records_are_held_and_dropped_on_failure(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A transformers logger record at warning level becomes one note on one line; an info
    record (``Model config ...`` at info verbosity) and everything when the block raises are
    dropped; nothing reaches the terminal; the loggers are left as they were."""
    import logging

    import transformers

    from curvcal.load.models.library_limits import library_warnings

    library = transformers.utils.logging
    library.set_verbosity_info()  # as TRANSFORMERS_VERBOSITY=info does
    root = logging.getLogger("transformers")
    before = (root.handlers[:], root.level, root.propagate)
    logger = logging.getLogger("transformers.modeling_utils")
    notes: list[str] = []
    try:
        with library_warnings("transformers", notes):
            logger.warning("Some weights of \x1b[1mX\x1b[0m were not initialized\nfrom the file")
            logger.warning("Some weights of \x1b[1mX\x1b[0m were not initialized\nfrom the file")
            logger.info("Model config XConfig {...}")
        with pytest.raises(ValueError), library_warnings("transformers", notes):
            logger.warning("about to fail")
            raise ValueError("the load failed")
    finally:
        after = (root.handlers[:], root.level, root.propagate)
        library.set_verbosity_warning()
    assert notes == ["transformers: Some weights of X were not initialized from the file"]
    assert capfd.readouterr().err == ""
    assert after == before


def _resaved(base: Path, parent: Path, form: str, **config: Any) -> Path:
    """A copy of the classifier folder ``base`` with its weights in ``form`` (``bin``: a
    zip ``pytorch_model.bin``; ``legacy``: the pre-1.6 ``torch.save`` format; ``shards``: two
    safetensors shards and their index) and ``config`` over its ``config.json``."""
    import torch
    from safetensors.torch import load_file, save_file

    folder = parent / form
    shutil.copytree(base, folder)
    weights = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    if form == "shards":
        names = sorted(weights)
        halves = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
        for shard, keys in halves.items():
            save_file({k: weights[k] for k in keys}, folder / shard, metadata={"format": "pt"})
        size = sum(t.numel() * t.element_size() for t in weights.values())
        index = {"metadata": {"total_size": size},
                 "weight_map": {k: s for s, keys in halves.items() for k in keys}}  # fmt: skip
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        zipped = form == "bin"
        torch.save(weights, folder / "pytorch_model.bin", _use_new_zipfile_serialization=zipped)
    saved = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**saved, **config}))
    return folder


@pytest.mark.parametrize("form", ["bin", "legacy", "shards"])
def test_every_weight_format_bounds_the_layers_and_widths(
    run_cli: Any, files: Files, tmp_path: Path, form: str
) -> None:
    """The layer and width bound read the tensors of a ``pytorch_model.bin`` (zip or legacy)
    and of every shard, none of them loaded: before, only a single ``model.safetensors`` was
    read, and a ``.bin`` folder's config could ask transformers for any number of layers
    (200,000 ran past 60 s)."""
    from safetensors.torch import load_file

    from curvcal.load.models.hf import weight_shapes

    truth = sorted(tuple(t.shape) for t in load_file(files.base / "model.safetensors").values())
    folder = _resaved(files.base, tmp_path, form)
    weights = tuple(p for p in folder.iterdir() if p.suffix in (".bin", ".safetensors"))
    assert sorted(weight_shapes(weights)) == truth
    result = run_cli("calibrate", folder, "--data", files.jsonl, "--device", "cpu",
                     "--method", "none", "--json")  # fmt: skip
    assert result.code == 0, result.stderr  # the folder loads as it is
    folder = _resaved(files.base, tmp_path / "many", form, num_hidden_layers=len(truth) + 1)
    _refused(run_cli, ["calibrate", folder, "--data", files.jsonl], folder / "config.json",
             "num_hidden_layers", f"{len(truth) + 1:,} is more than the weights can fill",
             f"the weights hold {len(truth):,} tensors")  # fmt: skip
    widest = max(math.prod(shape) for shape in truth)
    folder = _resaved(files.base, tmp_path / "wide", form, intermediate_size=widest + 1)
    _refused(run_cli, ["calibrate", folder, "--data", files.jsonl], folder / "config.json",
             "intermediate_size", f"largest tensor holds {widest:,} numbers")  # fmt: skip


def test_a_config_alone_is_bounded_by_the_memory() -> None:
    """Weights elsewhere (``--arch hf:FOLDER``): the least a config's model holds,
    ``L·h² + V·h`` float32 numbers, against the memory available, at the border."""
    from curvcal.load.models.library_limits import check_config_alone, least_numbers

    config = {"num_hidden_layers": 3, "hidden_size": 16, "vocab_size": 40}
    numbers = 3 * 16 * 16 + 40 * 16
    assert least_numbers(config) == (numbers, ("num_hidden_layers", "hidden_size", "vocab_size"))
    assert least_numbers({"n_layer": 2, "n_embd": 4}) == (32, ("n_layer", "n_embd"))
    assert least_numbers({"architectures": ["X"]}) == (0, ())
    file = Path("m") / "config.json"
    check_config_alone(file, config, 4 * numbers)
    check_config_alone(file, {**config, "hidden_size": 10**9}, None)  # memory unknown
    with pytest.raises(
        InputError,
        match=rf"config.json \(num_hidden_layers, hidden_size, vocab_size\): asks for a model "
        rf"of at least {numbers:,} numbers .* more than the 0.0 GiB",
    ):
        check_config_alone(file, config, 4 * numbers - 1)


def test_an_arch_folder_asking_for_more_than_the_memory_is_refused(
    run_cli: Any, files: Files, tmp_path: Path
) -> None:
    """``--arch hf:FOLDER`` with a config of 10⁶ layers of width 10⁵ (4·10¹⁶ bytes): exit 2
    naming the config and its keys, before transformers allocates anything."""
    import torch
    from safetensors.torch import load_file

    folder = tmp_path / "huge"
    shutil.copytree(files.base, folder)
    weights = load_file(folder / "model.safetensors")
    torch.save(weights, tmp_path / "w.pt")
    saved = json.loads((folder / "config.json").read_text())
    huge = {**saved, "num_hidden_layers": 10**6, "hidden_size": 10**5}
    (folder / "config.json").write_text(json.dumps(huge))
    _refused(run_cli, ["calibrate", tmp_path / "w.pt", "--arch", f"hf:{folder}", "--data",
                       files.jsonl, "--tokenizer", files.base], folder / "config.json",
             "num_hidden_layers, hidden_size, vocab_size", "more than the")  # fmt: skip


def test_a_library_set_up_inside_the_hold_keeps_its_handler() -> None:
    """A library imported for the first time inside the hold adds its own handler then (as
    transformers does on import): the hold leaves that set-up in place rather than removing
    it with its own, so the library's later records outside any hold still have a handler."""
    import logging

    from curvcal.load.models.library_limits import LIBRARY_LOGGERS, library_warnings

    logger = logging.getLogger(LIBRARY_LOGGERS[-1])
    before = logger.handlers[:]
    own = logging.NullHandler()
    try:
        with library_warnings("x", []):
            logger.addHandler(own)  # the library's import configures its logger
        assert logger.handlers == [*before, own]
    finally:
        logger.removeHandler(own)


def test_every_default_config_of_transformers_passes_the_constant_rules() -> None:
    """The rules are matched by name: none may refuse a family's own defaults, over about 800
    configuration classes each built with its defaults (a bare ``eps`` is ProphetNet's label
    smoothing, a ``*_scaling_factor`` can be a loss weight of 0)."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    built, refused = 0, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()
        try:
            for family in list(CONFIG_MAPPING.keys()):
                try:
                    config = json.loads(CONFIG_MAPPING[family]().to_json_string(use_diff=False))
                except Exception:  # a family whose defaults need an extra package or argument
                    continue
                built += 1
                found = list(_forward_constants(config))
                if found:
                    refused[family] = found
        finally:
            transformers.logging.set_verbosity(verbosity)
    assert built > 500
    assert refused == {}
