"""Train the bundled demo model: ``DigitsCNN`` on scikit-learn's 8×8 digits.

Deterministic (fixed seeds, deterministic algorithms, one thread): the same seed and epochs give
the same weights on the same machine. Steps:

1. ``load_digits()`` pixels (0..16) are scaled to ``[0, 1]``, shaped ``(N, 1, 8, 8)``;
2. a stratified split puts about 1000 samples in training and keeps the rest held out;
3. inputs are standardised with the mean and std of the training pixels (one channel);
4. cross-entropy, Adam, a fixed number of epochs — trained well past the best held-out loss
   on purpose, so the model is over-confident and calibration has something to fix.

Writes ``digits_cnn.safetensors`` (state dict; metadata ``curvcal.arch`` and friends) and
``digits_test.safetensors`` (held-out ``x``, ``y``; metadata on the split and the
normalisation) to ``--out-dir`` (by default the package's assets folder)::

    python examples/digits/train.py [--out-dir DIR] [--epochs 60] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from curvcal.load.datasets.labels import stratified_split
from curvcal.models import DigitsCNN

ASSETS = Path(__file__).resolve().parents[2] / "curvcal" / "assets"
N_TRAIN = 1000

#: A training objective: ``objective(model, x_batch, y_batch) -> scalar loss``.
Objective = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1797 digits as float32 ``(N, 1, 8, 8)`` in ``[0, 1]`` and int64 labels."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.int64)
    return x, y


def prepare_digits(
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float, float]:
    """``(x, y, train_idx, test_idx, mean, std)``: the stratified split of about ``N_TRAIN``
    training samples (drawn with ``seed``) and ``x`` standardised with the training pixels'
    mean and std."""
    x, y = digits_tensors()
    train_idx, test_idx = stratified_split(y, N_TRAIN / len(y), seed)
    mean = float(x[train_idx].mean())
    std = float(x[train_idx].std())
    return (x - mean) / std, y, train_idx, test_idx, mean, std


def cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of the batch (the bundled model's objective)."""
    return nn.functional.cross_entropy(model(x), y)


def train(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int,
    seed: int,
    objective: Objective = cross_entropy,
) -> list[float]:
    """Full-data-order shuffled minibatch Adam on ``objective`` (default cross-entropy);
    returns the epoch losses."""
    generator = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        total = 0.0
        for start in range(0, len(y), 32):
            batch = order[start : start + 32]
            optimiser.zero_grad()
            loss = objective(model, x[batch], y[batch])
            loss.backward()
            optimiser.step()
            total += loss.item() * len(batch)
        losses.append(total / len(y))
    model.eval()
    return losses


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float, float]:
    """Accuracy, mean confidence (max softmax) and NLL of ``model`` on ``(x, y)``."""
    with torch.no_grad():
        logits = model(x).double()
    log_probs = torch.log_softmax(logits, dim=1)
    accuracy = float((logits.argmax(dim=1) == y).double().mean())
    confidence = float(log_probs.max(dim=1).values.exp().mean())
    nll = float(-log_probs.gather(1, y[:, None]).mean())
    return accuracy, confidence, nll


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=ASSETS)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    x, y, train_idx, test_idx, mean, std = prepare_digits(args.seed)
    fraction = N_TRAIN / len(y)

    model = DigitsCNN()
    losses = train(model, x[train_idx], y[train_idx], args.epochs, args.seed)
    train_acc, _, _ = evaluate(model, x[train_idx], y[train_idx])
    test_acc, test_conf, test_nll = evaluate(model, x[test_idx], y[test_idx])
    print(
        f"final train loss {losses[-1]:.4g}, train accuracy {train_acc:.4f}; held-out accuracy "
        f"{test_acc:.4f}, mean confidence {test_conf:.4f}, NLL {test_nll:.4f}"
    )

    normalisation = json.dumps(
        {"scale": "pixels / 16", "mean": [mean], "std": [std], "from": "training split"}
    )
    split = json.dumps(
        {
            "source": "sklearn.datasets.load_digits",
            "method": "stratified",
            "fraction_train": fraction,
            "seed": args.seed,
            "n_train": len(train_idx),
            "n_held_out": len(test_idx),
        }
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(
        state,
        str(args.out_dir / "digits_cnn.safetensors"),
        metadata={
            "curvcal.arch": "curvcal:DigitsCNN",
            "curvcal.arch_kwargs": "{}",
            "curvcal.loss": "ce",
            "curvcal.gamma": "0",
            "curvcal.dataset": "sklearn-digits",
            "curvcal.normalisation": normalisation,
            "curvcal.split": split,
            "curvcal.training": json.dumps(
                {"optimiser": "adam", "lr": 3e-3, "batch_size": 32, "epochs": args.epochs}
            ),
        },
    )
    save_file(
        {"x": x[test_idx].contiguous(), "y": y[test_idx].contiguous()},
        str(args.out_dir / "digits_test.safetensors"),
        metadata={
            "curvcal.dataset": "sklearn-digits",
            "curvcal.split": split,
            "curvcal.normalisation": normalisation,
            "curvcal.num_classes": "10",
        },
    )


if __name__ == "__main__":
    main()
