"""``torchrun --standalone --nproc-per-node 2 -m curvcal ...`` on the CPU (gloo), as the scale
tests launch it: the checkout first on the path, one thread per process; and the small text
classifier folder the text runs are launched on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
WORDS = ["good", "bad", "film", "very", "plot", "not"]
TEXTS = ["good film", "bad plot", "very good film", "not good", "very very bad", "plot", "film"] * 3


def torchrun(
    args: list[str],
    cwd: Path,
    *,
    path: tuple[Path, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 180,
) -> subprocess.CompletedProcess[str]:
    """``torchrun`` of two ranks of ``curvcal ARGS`` with ``path`` after the checkout on
    PYTHONPATH and ``env`` added to the environment; its exit code, stdout and stderr."""
    pythonpath = [str(ROOT), *map(str, path), os.environ.get("PYTHONPATH", "")]
    full_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, pythonpath)),
        "OMP_NUM_THREADS": "1",
        **(env or {}),
    }
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return subprocess.run(
        [*launcher, "--nproc-per-node", "2", "-m", "curvcal", *args],
        env=full_env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def worker_results(
    worker: Path, out: Path, ranks: int, *args: str, timeout: float = 600
) -> list[dict[str, torch.Tensor]]:
    """``torchrun`` of ``ranks`` ranks of the script ``worker OUT ARGS`` (the checkout first on
    the path, one thread per process); asserts it succeeded and loads what each rank saved as
    ``OUT/rank{r}.pt``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=env.get("GLOO_SOCKET_IFNAME", "lo"))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
        str(ranks), str(worker), str(out), *args,
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt") for r in range(ranks)]


def torchrun_json(args: list[str], cwd: Path, timeout: float = 180) -> dict[str, Any]:
    """The report two ranks of ``curvcal ARGS --json`` print; asserts the run succeeded and
    that only rank 0 printed."""
    completed = torchrun([*args, "--json"], cwd, timeout=timeout)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.count('"schema"') == 1  # rank 1 printed nothing
    return json.loads(completed.stdout)  # type: ignore[no-any-return]


def digits_problem(folder: Path, n_samples: int) -> tuple[Path, Path]:
    """A float64 DigitsCNN of 3 classes (width 1, seed 0) saved with its architecture in
    ``folder/model.safetensors``, and ``n_samples`` Gaussian 1×8×8 images with labels (seed 1)
    in ``folder/data.pt``: the checkpoint and the data the two-rank hessian runs take."""
    from safetensors.torch import save_file

    from curvcal.models import DigitsCNN

    torch.manual_seed(0)
    model = DigitsCNN(num_classes=3, width=1).double()
    checkpoint = folder / "model.safetensors"
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(checkpoint),
        {
            "curvcal.arch": "curvcal:DigitsCNN",
            "curvcal.arch_kwargs": '{"num_classes": 3, "width": 1}',
        },
    )
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(n_samples, 1, 8, 8, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (n_samples,), generator=generator)
    data = folder / "data.pt"
    torch.save({"x": x, "y": y}, data)
    return checkpoint, data


def text_classifier(folder: Path, layers: int) -> tuple[Path, Path]:
    """A BERT classifier of ``layers`` layers (a repeated block list) with its tokenizer in
    ``folder/model``, and ``folder/texts.jsonl``: the texts of :data:`TEXTS`, labels 0, 1 in
    turn. The model folder and the data file."""
    import transformers

    model_folder = folder / "model"
    torch.manual_seed(4)
    config = transformers.BertConfig(
        vocab_size=11, hidden_size=8, num_hidden_layers=layers, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=16, num_labels=2,
    )  # fmt: skip
    model = transformers.BertForSequenceClassification(config)
    with torch.no_grad():
        model.classifier.weight.normal_(0, 2.0)
    model.save_pretrained(model_folder)
    vocab = model_folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    transformers.BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(model_folder)
    data = folder / "texts.jsonl"
    data.write_text(
        "".join(json.dumps({"text": t, "label": i % 2}) + "\n" for i, t in enumerate(TEXTS))
    )
    return model_folder, data
