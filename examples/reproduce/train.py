"""Train the models of the seed papers' comparisons, for ``curvcal study``.

One architecture, one data split, one optimiser recipe and one initialisation (the same seed for
every run); only the training objective changes:

* ``ce``: cross-entropy;
* ``focal1``, ``focal2``, ``focal3``, ``focal5``: focal loss −(1 − p_y)^γ log p_y, γ = 1, 2, 3, 5;
* ``flsd53``: FLSD-53 (γ = 5 where p_y < 0.2, else 3; Mukhoti et al. 2020);
* ``ce_tr<λ>``: cross-entropy + λ·tr(H), tr(H) the Hessian trace of the batch's mean
  cross-entropy, estimated by ``--penalty-probes`` Rademacher probes per step on the batch's
  first ``--penalty-samples`` samples (an unbiased estimate of the same mean-Hessian trace, at a
  fraction of the cost of double backward through the whole batch) and differentiated by double
  backward (Kimura & Naganuma 2024), for each λ of ``--lambdas``.

The losses are :func:`curvcal.focal_loss` and :func:`curvcal.hutchinson_trace_penalty`. Each
model is written as ``<name>.safetensors`` with metadata ``curvcal.arch``,
``curvcal.arch_kwargs``, ``curvcal.loss`` (``ce``, ``focal`` or ``flsd53``), ``curvcal.gamma``
(ce and focal) and ``curvcal.trace_penalty`` (λ, penalty runs), so ``curvcal study --loss own``
knows each model's loss.

Default: ``DigitsCNN`` on scikit-learn's digits with the bundled model's data preparation and
recipe (``examples/digits/train.py``), deterministic on the CPU, a few seconds to a minute per
model (two minutes for a trace-penalty model on a busy machine); ``data/train.safetensors`` and
``data/test.safetensors`` (``x``, ``y``) are written under ``--out-dir`` too. ``--dataset tv:cifar10 --data-root DIR --arch tv:resnet18 --device cuda`` trains
on a torchvision dataset already on disk instead (needs the data and, in practice, a GPU; the
splits are then read by ``curvcal study --data tv:cifar10:test`` directly and not written)::

    python examples/reproduce/train.py --out-dir runs [--epochs 60] [--lambdas 0.01,0.1]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import torch
from safetensors.torch import save_file
from torch import nn

import curvcal
from curvcal.load.data import load_dataset
from curvcal.load.models.architecture import build_architecture
from curvcal.settings.data import DataSettings

DIGITS_TRAIN = Path(__file__).resolve().parents[1] / "digits" / "train.py"
FOCAL_GAMMAS = (1.0, 2.0, 3.0, 5.0)
DEFAULT_LAMBDAS = "0.001,0.01"

Objective = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def digits_trainer() -> ModuleType:
    """The bundled model's trainer, ``examples/digits/train.py``, imported as a module."""
    spec = importlib.util.spec_from_file_location("curvcal_digits_train", DIGITS_TRAIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def objectives(
    lambdas: list[float], penalty_probes: int, penalty_samples: int, seed: int
) -> dict[str, tuple[Objective, dict[str, str]]]:
    """Run name -> (objective(model, x, y), metadata describing the loss)."""

    def focal(gamma: float | str) -> Objective:
        return lambda model, x, y: curvcal.focal_loss(model(x), y, gamma)

    def ce(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(model(x), y)

    def penalised(lam: float) -> Objective:
        generator = torch.Generator().manual_seed(seed)

        def objective(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = ce(model, x, y)
            part = ce(model, x[:penalty_samples], y[:penalty_samples])
            penalty = curvcal.hutchinson_trace_penalty(
                model, part, penalty_probes, generator=generator
            )
            return loss + lam * penalty

        return objective

    runs: dict[str, tuple[Objective, dict[str, str]]] = {
        "ce": (ce, {"curvcal.loss": "ce", "curvcal.gamma": "0"})
    }
    for gamma in FOCAL_GAMMAS:
        runs[f"focal{gamma:g}"] = (
            focal(gamma),
            {"curvcal.loss": "focal", "curvcal.gamma": f"{gamma:g}"},
        )
    runs["flsd53"] = (focal("flsd53"), {"curvcal.loss": "flsd53"})
    for lam in lambdas:
        runs[f"ce_tr{lam:g}"] = (
            penalised(lam),
            {
                "curvcal.loss": "ce",
                "curvcal.gamma": "0",
                "curvcal.trace_penalty": f"{lam:g}",
                "curvcal.trace_penalty_probes": str(penalty_probes),
                "curvcal.trace_penalty_samples": str(penalty_samples),
            },
        )
    return runs


def torchvision_batches(
    dataset: torch.utils.data.Dataset[tuple[torch.Tensor, int]],
    batch_size: int,
    generator: torch.Generator,
) -> Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]:
    """A fresh shuffled epoch of a torchvision dataset per call."""
    from torch.utils.data import DataLoader

    def epoch() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        yield from DataLoader(
            dataset, batch_size=batch_size, shuffle=True, generator=generator, num_workers=2
        )

    return epoch


def train_torchvision(
    model: nn.Module,
    epochs: Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]],
    n_epochs: int,
    objective: Objective,
    lr: float,
    device: torch.device,
) -> list[float]:
    """Adam with the digits recipe's learning rate, on a device, for a torchvision dataset."""
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(n_epochs):
        total, count = 0.0, 0
        for x, y in epochs():
            x, y = x.to(device), y.to(device)
            optimiser.zero_grad()
            loss = objective(model, x, y)
            loss.backward()
            optimiser.step()
            total += loss.item() * len(y)
            count += len(y)
        losses.append(total / count)
    model.eval()
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Train CE, focal (γ = 1, 2, 3, 5), FLSD-53 and CE + λ·tr(H) models for "
        "curvcal study. The --dataset tv:NAME path needs the dataset under --data-root and, "
        "in practice, a GPU; it is not exercised by curvcal's tests."
    )
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--lambdas", default=DEFAULT_LAMBDAS, help="trace-penalty weights λ, comma-separated"
    )
    parser.add_argument("--penalty-probes", type=int, default=1, help="probes per step")
    parser.add_argument(
        "--penalty-samples", type=int, default=8, help="samples of each batch in the penalty"
    )
    parser.add_argument("--only", help="train only these runs (comma-separated names)")
    parser.add_argument(
        "--dataset", default="digits", help="digits (default) or tv:cifar10 / tv:cifar100 ..."
    )
    parser.add_argument("--data-root", type=Path, help="folder of the torchvision dataset")
    parser.add_argument("--arch", default="curvcal:DigitsCNN", help="architecture spec")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=128, help="(torchvision path)")
    parser.add_argument("--lr", type=float, default=3e-3, help="(torchvision path)")
    args = parser.parse_args()

    torch.use_deterministic_algorithms(args.device == "cpu")
    torch.set_num_threads(1)
    lambdas = [float(part) for part in args.lambdas.split(",") if part.strip()]
    runs = objectives(lambdas, args.penalty_probes, args.penalty_samples, args.seed)
    if args.only:
        wanted = [name.strip() for name in args.only.split(",")]
        unknown = sorted(set(wanted) - set(runs))
        if unknown:
            parser.error(f"unknown runs {unknown}; known: {', '.join(runs)}")
        runs = {name: runs[name] for name in wanted}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    arch_kwargs = {"num_classes": 10} if args.arch.startswith("tv:") else {}

    if args.dataset == "digits":
        digits = digits_trainer()
        x, y, train_idx, test_idx, mean, std = digits.prepare_digits(args.seed)
        split = json.dumps({"source": "sklearn.datasets.load_digits", "seed": args.seed})
        normalisation = json.dumps(
            {"scale": "pixels / 16", "mean": [mean], "std": [std], "from": "training split"}
        )
        (args.out_dir / "data").mkdir(exist_ok=True)
        for name, index in (("train", train_idx), ("test", test_idx)):
            save_file(
                {"x": x[index].contiguous(), "y": y[index].contiguous()},
                str(args.out_dir / "data" / f"{name}.safetensors"),
                metadata={
                    "curvcal.dataset": "sklearn-digits",
                    "curvcal.split": split,
                    "curvcal.normalisation": normalisation,
                    "curvcal.num_classes": "10",
                },
            )
    else:
        train_data = load_dataset(
            DataSettings(data=f"{args.dataset}:train", data_root=args.data_root)
        )
        arch_kwargs = {"num_classes": train_data.num_classes or 10}

    summary = {}
    for name, (objective, loss_metadata) in runs.items():
        torch.manual_seed(args.seed)  # the same initial weights for every run
        model = build_architecture(args.arch, arch_kwargs, trust=False).to(device)
        began = time.perf_counter()
        if args.dataset == "digits":
            losses = digits.train(
                model, x[train_idx], y[train_idx], args.epochs, args.seed, objective
            )
        else:
            epochs = torchvision_batches(
                train_data.dataset, args.batch_size, torch.Generator().manual_seed(args.seed)
            )
            losses = train_torchvision(model, epochs, args.epochs, objective, args.lr, device)
        seconds = time.perf_counter() - began
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(
            state,
            str(args.out_dir / f"{name}.safetensors"),
            metadata={
                "curvcal.arch": args.arch,
                "curvcal.arch_kwargs": json.dumps(arch_kwargs),
                **loss_metadata,
                "curvcal.dataset": args.dataset,
                "curvcal.training": json.dumps(
                    {"optimiser": "adam", "epochs": args.epochs, "seed": args.seed}
                ),
            },
        )
        summary[name] = {"final_loss": losses[-1], "seconds": round(seconds, 2)}
        print(f"{name}: final training objective {losses[-1]:.4g} in {seconds:.1f} s", flush=True)
    (args.out_dir / "runs.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
