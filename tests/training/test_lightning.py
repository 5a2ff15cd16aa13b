"""CurvatureCallback inside the real Lightning Trainer (CPU, float64, a tiny MLP with dropout,
shuffled loaders): the logged λmax of each epoch equals the largest eigenvalue of the dense
Hessian of the model as it was at that moment, the ECE equals curvcal's of its logits, and
training gives bit-identical weights with and without the callback."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from curvcal.calibration.metrics import calibration_metrics
from curvcal.errors import InputError

pl = pytest.importorskip("lightning.pytorch")
from curvcal.training import CurvatureCallback  # noqa: E402


class Classifier(pl.LightningModule):  # type: ignore[misc,name-defined]
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Dropout(0.3), nn.Linear(6, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.5)


def _loaders() -> tuple[Any, Any, tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(90, 5, generator=generator, dtype=torch.float64)
    y = torch.randint(3, (90,), generator=generator)
    train = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x[:60], y[:60]), batch_size=16, shuffle=True
    )
    held_out = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x[60:], y[60:]), batch_size=7, shuffle=True
    )
    return train, held_out, (x[60:], y[60:])


class Snapshot(pl.Callback):  # type: ignore[misc,name-defined]
    """A copy of the network at each epoch's end (runs after the curvcal callback)."""

    def __init__(self) -> None:
        self.states: list[dict[str, torch.Tensor]] = []

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.states.append(copy.deepcopy(pl_module.net.state_dict()))


class Recorder(pl.loggers.Logger):  # type: ignore[misc,name-defined]
    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logged.append((step, dict(metrics)))


def _train(callbacks: list[Any], logger: Any = False) -> nn.Module:
    pl.seed_everything(7, verbose=False)
    train, _, _ = _loaders()
    module = Classifier().double()
    trainer = pl.Trainer(
        max_epochs=3,
        accelerator="cpu",
        devices=1,
        precision="64-true",
        logger=logger,
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    trainer.fit(module, train)
    return module


def _dense_lambda_max(state: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> float:
    net = Classifier().double().net
    net.load_state_dict(state)
    net.eval()
    names = [name for name, _ in net.named_parameters()]
    shapes = [p.shape for _, p in net.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])

    def loss(theta: torch.Tensor) -> torch.Tensor:
        pieces = theta.split([s.numel() for s in shapes])
        values = {n: p.reshape(s) for n, p, s in zip(names, pieces, shapes, strict=True)}
        return nn.functional.cross_entropy(torch.func.functional_call(net, values, (x,)), y)

    return float(torch.linalg.eigvalsh(torch.func.hessian(loss)(flat))[-1])


def test_logged_lambda_max_is_the_dense_one_and_training_is_undisturbed() -> None:
    _, held_out, (x, y) = _loaders()
    callback = CurvatureCallback(held_out, every_n_epochs=1, quantities=("lambda_max", "ece"))
    snapshot, recorder = Snapshot(), Recorder()
    measured = _train([callback, snapshot], logger=recorder)
    plain = _train([])
    for a, b in zip(measured.state_dict().values(), plain.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert measured.training  # the callback left train mode as it found it
    assert [epoch for epoch, _, _ in callback.history] == [0, 1, 2]
    logged = [m for _, m in recorder.logged if "curvcal/lambda_max" in m]
    assert len(logged) == 3
    for (_, _, values), state, row in zip(callback.history, snapshot.states, logged, strict=True):
        exact = _dense_lambda_max(state, x, y)
        assert values["lambda_max"] == pytest.approx(exact, rel=1e-6)
        assert row["curvcal/lambda_max"] == pytest.approx(values["lambda_max"], rel=1e-12)
        net = Classifier().double().net
        net.load_state_dict(state)
        with torch.no_grad():
            ece = calibration_metrics(net.eval()(x), y).ece
        assert row["curvcal/ece"] == pytest.approx(ece, abs=1e-12)
    assert len({v["lambda_max"] for _, _, v in callback.history}) == 3  # it changed


def test_every_n_train_steps_and_settings_overrides() -> None:
    _, held_out, (_x, _y) = _loaders()
    callback = CurvatureCallback(
        held_out,
        every_n_epochs=None,
        every_n_train_steps=4,
        quantities=("top_k", "trace", "nll"),
        top_k=2,
        trace_method="gauss-newton+hutchpp",
        probes=30,
    )
    _train([callback])
    steps = [step for _, step, _ in callback.history]
    assert steps == [4, 8, 12]  # 4 steps an epoch, 3 epochs
    assert set(callback.history[0][2]) == {
        "eigenvalue_1",
        "eigenvalue_2",
        "trace",
        "trace_se",
        "nll",
    }


def test_bad_requests_are_refused_before_training() -> None:
    _, held_out, _ = _loaders()
    with pytest.raises(InputError, match="lamda_max"):
        CurvatureCallback(held_out, quantities=("lamda_max",))
    with pytest.raises(InputError, match="top_kk"):
        CurvatureCallback(held_out, top_kk=2)
    with pytest.raises(InputError, match="top"):
        CurvatureCallback(held_out, top_k=0)
    with pytest.raises(InputError, match="every_n_epochs"):
        CurvatureCallback(held_out, every_n_epochs=0)
