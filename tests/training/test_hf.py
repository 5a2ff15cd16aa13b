"""CurvatureTrainerCallback inside the real Hugging Face Trainer (CPU, a tiny BERT built from a
config, dropout on): the logged λmax of the classifier head's Hessian at each epoch equals the
dense float64 one of the model as it was then, the values reach ``state.log_history`` through
``Trainer.log``, and training gives identical weights with and without the callback."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
from curvcal.training import CurvatureTrainerCallback  # noqa: E402

VOCAB, LENGTH = 20, 6


def _model() -> Any:
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=12,
        max_position_embeddings=LENGTH,
        num_labels=3,
        hidden_dropout_prob=0.2,
    )
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config)


def _data() -> tuple[
    list[dict[str, torch.Tensor]], list[tuple[dict[str, torch.Tensor], torch.Tensor]]
]:
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(VOCAB, (60, LENGTH), generator=generator)
    labels = ids[:, 0] % 3  # learnable from the first token
    train = [{"input_ids": ids[i], "labels": labels[i]} for i in range(40)]
    held_out = [
        ({"input_ids": ids[s : s + 7]}, labels[s : s + 7]) for s in range(40, 60, 7)
    ]  # batches of 7, 7, 6
    return train, held_out


class Snapshot(transformers.TrainerCallback):  # type: ignore[misc,name-defined]
    def __init__(self) -> None:
        self.states: list[dict[str, torch.Tensor]] = []

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.states.append(copy.deepcopy(kwargs["model"].state_dict()))


def _train(tmp_path: Path, callback: Any = None, snapshot: Any = None) -> Any:
    train, _ = _data()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        num_train_epochs=3,
        per_device_train_batch_size=8,
        learning_rate=5e-2,
        seed=7,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(model=_model(), args=args, train_dataset=train)
    if callback is not None:
        callback.attach(trainer)
    if snapshot is not None:
        trainer.add_callback(snapshot)
    trainer.train()
    return trainer


def _dense_head_lambda_max(state: dict[str, torch.Tensor]) -> float:
    model = _model().double().eval()
    model.load_state_dict(state)
    _, held_out = _data()
    ids = torch.cat([x["input_ids"] for x, _ in held_out])
    y = torch.cat([label for _, label in held_out])
    with torch.no_grad():
        pooled = model.bert(input_ids=ids).pooler_output  # the head's input, fixed
    weight, bias = model.classifier.weight.detach(), model.classifier.bias.detach()

    def loss(theta: torch.Tensor) -> torch.Tensor:
        w, b = theta[: weight.numel()].reshape(weight.shape), theta[weight.numel() :]
        return nn.functional.cross_entropy(pooled @ w.T + b, y)

    flat = torch.cat([weight.reshape(-1), bias])
    return float(torch.linalg.eigvalsh(torch.func.hessian(loss)(flat))[-1])


def test_logged_lambda_max_is_the_dense_one_and_training_is_undisturbed(tmp_path: Path) -> None:
    _, held_out = _data()
    callback = CurvatureTrainerCallback(
        held_out, every_n_epochs=1, quantities=("lambda_max", "ece"), params="classifier.*"
    )
    snapshot = Snapshot()
    measured = _train(tmp_path / "a", callback, snapshot)
    plain = _train(tmp_path / "b")
    for a, b in zip(
        measured.model.state_dict().values(), plain.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)
    logged = [row for row in measured.state.log_history if "curvcal/lambda_max" in row]
    assert [row["epoch"] for row in logged] == [1.0, 2.0, 3.0]
    assert len(snapshot.states) == 3
    for row, state in zip(logged, snapshot.states, strict=True):
        assert row["curvcal/lambda_max"] == pytest.approx(_dense_head_lambda_max(state), rel=1e-4)
        assert 0 <= row["curvcal/ece"] <= 1


def test_every_n_steps_without_attach_writes_the_log_history(tmp_path: Path) -> None:
    _, held_out = _data()
    callback = CurvatureTrainerCallback(
        held_out, every_n_steps=5, every_n_epochs=None, quantities=("accuracy",)
    )
    train, _ = _data()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        num_train_epochs=2,
        per_device_train_batch_size=8,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=_model(), args=args, train_dataset=train, callbacks=[callback]
    )
    trainer.train()
    rows = [row for row in trainer.state.log_history if "curvcal/accuracy" in row]
    assert [row["step"] for row in rows] == [5, 10]


def test_bad_requests_are_refused_when_the_callback_is_built() -> None:
    """The same checks as the Lightning callback's, each naming what is wrong."""
    from curvcal.errors import InputError

    with pytest.raises(InputError, match="lamda_max"):
        CurvatureTrainerCallback([], quantities=("lamda_max",))
    with pytest.raises(InputError, match="top_kk"):
        CurvatureTrainerCallback([], top_kk=2)
    with pytest.raises(InputError, match="every_n_steps"):
        CurvatureTrainerCallback([], every_n_steps=0)
    with pytest.raises(InputError, match="every_n_epochs"):
        CurvatureTrainerCallback([], every_n_epochs=True)
