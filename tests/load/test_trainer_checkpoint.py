"""A Hugging Face Trainer ``checkpoint-N`` folder, written by the real ``transformers.Trainer``
after two steps on a tiny Llama classifier: it loads as the model it holds, ``inspect`` names
the Trainer step, and the Trainer's pickles (optimizer.pt, scheduler.pt, rng_state.pth,
training_args.bin) are never opened."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from hf_decoder_builders import TEXTS, save_decoder, write_reviews  # noqa: E402

from curvcal.load.checkpoint import load_model  # noqa: E402
from curvcal.load.checkpoints.inspect import inspect_checkpoint  # noqa: E402
from curvcal.settings.checkpoint import CheckpointSettings  # noqa: E402

TRAINER_PICKLES = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin")


class _Trap:
    """Unpickling this writes a marker file: proof that something unpickled it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (Path.write_text, (self.marker, "unpickled"))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("trainer")
    base = save_decoder(root / "base", "llama", seed=6)
    tokenizer = transformers.AutoTokenizer.from_pretrained(base)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(base)
    encoded = tokenizer(list(TEXTS))
    train = [
        {"input_ids": ids, "attention_mask": mask, "labels": i % 2}
        for i, (ids, mask) in enumerate(
            zip(encoded["input_ids"], encoded["attention_mask"], strict=True)
        )
    ]
    args = transformers.TrainingArguments(
        output_dir=str(root / "run"), max_steps=2, per_device_train_batch_size=4,
        save_steps=2, save_strategy="steps", report_to=[], use_cpu=True, logging_steps=1,
        disable_tqdm=True, learning_rate=1e-2,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        data_collator=transformers.DataCollatorWithPadding(tokenizer),
    )
    trainer.train()
    folder = root / "run" / "checkpoint-2"
    assert {"trainer_state.json", *TRAINER_PICKLES} <= set(os.listdir(folder))
    return folder, write_reviews(root / "reviews.jsonl")


def _dense_head_hessian(folder: Path) -> torch.Tensor:
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        folder, attn_implementation="eager"
    )
    model = model.double().eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    inputs = dict(tokenizer(list(TEXTS), padding=True, return_tensors="pt"))
    labels = torch.tensor([i % 2 for i in range(len(TEXTS))])
    shape = model.score.weight.shape

    def loss(flat: torch.Tensor) -> torch.Tensor:
        params = {"score.weight": flat.reshape(shape)}
        out = torch.func.functional_call(model, params, args=(), kwargs=inputs)
        return torch.nn.functional.cross_entropy(out.logits, labels)

    return torch.func.hessian(loss)(model.score.weight.detach().reshape(-1))


def test_a_trainer_checkpoint_is_the_model_it_holds(run_cli, checkpoint: tuple[Path, Path]) -> None:
    folder, jsonl = checkpoint
    info = inspect_checkpoint(folder)
    assert info.format == "hf_folder" and not info.needs_trust
    assert info.metadata["trainer_checkpoint"] == "step 2"
    assert info.architecture == "LlamaForSequenceClassification"
    table = run_cli("inspect", folder)
    assert table.code == 0, table.stderr
    assert "trainer_checkpoint" in table.stdout and "step 2" in table.stdout
    loaded = load_model(folder, CheckpointSettings(device="cpu"))
    assert loaded.metadata["trainer_checkpoint"] == "step 2"
    exact = torch.linalg.eigvalsh(_dense_head_hessian(folder))
    result = run_cli(
        "hessian", folder, "--data", jsonl, "--dtype", "float64", "--device", "cpu",
        "--params", "score.*", "--top-k", "2", "--tol", "1e-10", "--no-trace", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["results"]["eigenvalues"] == pytest.approx(
        exact[-2:].flip(0).tolist(), rel=1e-6
    )
    assert document["inputs"]["checkpoint"]["metadata"]["trainer_checkpoint"] == "step 2"


def test_the_trainer_pickles_are_never_opened(
    run_cli, checkpoint: tuple[Path, Path], tmp_path: Path
) -> None:
    import shutil

    folder = tmp_path / "checkpoint-2"
    shutil.copytree(checkpoint[0], folder)
    marker = tmp_path / "unpickled.txt"
    for name in TRAINER_PICKLES:  # the same names, now pickles that act when loaded
        (folder / name).write_bytes(pickle.dumps(_Trap(marker)))
    assert run_cli("inspect", folder).code == 0
    result = run_cli(
        "calibrate", folder, "--data", checkpoint[1], "--device", "cpu", "--method", "ts",
        "--val-split", "0.5",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    assert not marker.exists()
    # the trap works: a pickle load of the file would have written the marker
    with open(folder / "training_args.bin", "rb") as handle:
        pickle.load(handle)
    assert marker.read_text() == "unpickled"
