"""How close the Hessian run's forecast comes to the time it took, on three models.

For each model the analysis runs with a progress hook on the real clock; after the first five
products the forecast of the time left is (products planned − products done) × (seconds per
product since the first report), :class:`curvcal.pace.Pace` exactly as the progress bar
computes it. The table compares it with the time the run then took, and the whole-run
forecast (planned × seconds per product) with the analysis's measured time after its first
product. Models: the bundled digits CNN on 200 digits, a torchvision ResNet-18 with random
weights on 64 random 3×64×64 images, and a two-layer transformer encoder on 128 random token
sequences.

    python benchmarks/bench_forecast.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from curvcal.curvature.analysis import HessianSettings, analyse_hessian
from curvcal.curvature.forecast import FORECAST_PRODUCTS, planned_by_stage
from curvcal.curvature.plan import selected_parameter_count
from curvcal.pace import Pace


def _digits() -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    from safetensors.torch import load_file

    from curvcal.assets import _asset
    from curvcal.models import DigitsCNN

    model = DigitsCNN().eval()
    model.load_state_dict(load_file(str(_asset("digits_cnn.safetensors"))))
    data = load_file(str(_asset("digits_test.safetensors")))
    x = (data["x"][:200] / 16 - 0.3047) / 0.3758  # the checkpoint's recorded normalisation
    y = data["y"][:200]
    return model, [(x[:100], y[:100]), (x[100:], y[100:])]


def _resnet18() -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    from torchvision.models import resnet18

    torch.manual_seed(0)
    model = resnet18(num_classes=10).eval()
    x = torch.randn(64, 3, 64, 64)
    y = torch.randint(0, 10, (64,))
    return model, [(x, y)]


class _Encoder(nn.Module):
    def __init__(self, vocab: int = 100, width: int = 64, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, 4, 128, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def _transformer() -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = _Encoder().eval()
    x = torch.randint(0, 100, (128, 16))
    y = torch.randint(0, 4, (128,))
    return model, [(x[:64], y[:64]), (x[64:], y[64:])]


MODELS: dict[str, tuple[Callable[[], tuple[nn.Module, list]], HessianSettings]] = {
    "digits CNN": (
        _digits,
        HessianSettings(
            top_k=3,
            trace_method="hutchinson",
            probes=30,
            density=True,
            density_runs=2,
            density_steps=20,
        ),
    ),
    "ResNet-18 (random, 64 × 3×64×64)": (
        _resnet18,
        HessianSettings(top_k=1, trace_method="hutchinson", probes=20),
    ),
    "transformer (2 layers, 128 × 16 tokens)": (
        _transformer,
        HessianSettings(top_k=2, trace_method="hutchinson", probes=20, per_layer=True),
    ),
}


def measure(
    model: nn.Module, batches: list, settings: HessianSettings
) -> tuple[int, int, float, float, float, float]:
    """Planned and made products, the forecast of the time left at the fifth product and the
    time it took, the whole-run forecast and the time after the first product."""
    n_params = selected_parameter_count(model, settings.params)
    blocks = {n.rpartition(".")[0] for n, p in model.named_parameters() if p.requires_grad}
    pace = Pace(sum(planned_by_stage(settings, n_params, len(blocks)).values()), time.monotonic)
    at_five: list[tuple[float, float, float]] = []  # (time, forecast left, whole forecast)
    first: list[float] = []

    def on_step(_stage: str, done: int) -> None:
        pace.update(done)
        if not first:
            first.append(time.monotonic())
        if not at_five and done >= FORECAST_PRODUCTS:
            per = pace.seconds_per_unit()
            if per is not None:
                at_five.append((time.monotonic(), pace.remaining() or 0.0, pace.total * per))

    def on_plan(resolved: HessianSettings) -> None:
        pace.plan(sum(planned_by_stage(resolved, n_params, len(blocks)).values()))

    analysis = analyse_hessian(model, batches, settings, on_step=on_step, on_plan=on_plan)
    end = time.monotonic()
    when, left, whole = at_five[0]
    return (
        pace.total or 0,
        int(analysis.operator["n_matvecs"]),
        left,
        end - when,
        whole,
        end - first[0],
    )


def main() -> None:
    torch.set_num_threads(1)
    print(
        "| model | planned | made | left at 5: forecast | took | ratio | whole: forecast | took | ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, (build, settings) in MODELS.items():
        model, batches = build()
        planned, made, left, took, whole, whole_took = measure(model, batches, settings)
        print(
            f"| {name} | {planned} | {made} | {left:.1f} s | {took:.1f} s | {left / took:.2f} "
            f"| {whole:.1f} s | {whole_took:.1f} s | {whole / whole_took:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
