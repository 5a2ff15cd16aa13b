"""The model's side of ``--method laplace``: the inputs of its last ``nn.Linear`` (the features
φ(x)), caught by a forward hook during the one inference pass, and the check that this layer
really produces the logits.

The head is the last ``nn.Linear`` the model registers
(:func:`~curvcal.calibration.laplace.last_linear`); its output must be the model's output, bit
for bit, once per sample (a head followed by a softmax, a scaling or another layer, or one
applied twice per input, is refused naming the layer).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from curvcal.errors import InputError

if TYPE_CHECKING:
    import torch

    from curvcal.calibration.laplace import HeadFeatures
    from curvcal.load.checkpoints.loaded_model import LoadedModel
    from curvcal.load.datasets.loaded_data import LoadedData

_REMEDY = "--method laplace needs a model whose logits are the output of its final nn.Linear"


@dataclass
class HeadCapture:
    """The head's ``name`` and module, and what the hook saw: its inputs and outputs per
    forward call, on the CPU."""

    name: str
    layer: Any
    where: str
    inputs: list[torch.Tensor] = field(default_factory=list)
    outputs: list[torch.Tensor] = field(default_factory=list)


@contextmanager
def capture_head(loaded: LoadedModel) -> Iterator[HeadCapture]:
    """Hook the last ``nn.Linear`` of ``loaded`` for the duration of the block (the hook is
    removed after it, however it ends)."""
    from curvcal.calibration.laplace import WHOLE_MODEL, last_linear

    where = str(loaded.path)
    name, layer = last_linear(loaded.module, where)
    capture = HeadCapture(name or WHOLE_MODEL, layer, where)

    def hook(module: Any, args: tuple[Any, ...], output: Any) -> None:
        capture.inputs.append(args[0].detach().cpu())
        capture.outputs.append(output.detach().cpu())

    handle = layer.register_forward_hook(hook)
    try:
        yield capture
    finally:
        handle.remove()


def head_features(
    capture: HeadCapture, data: LoadedData, local_rows: int, logits: torch.Tensor | None
) -> HeadFeatures | None:
    """The features of every sample of ``data`` whose logits were kept (rows of the head's
    output with a NaN or Inf were left out by ``--nan-policy drop`` alike), gathered on rank 0
    (``None`` elsewhere); ``local_rows``: the samples this rank predicted. Refuses a head that
    did not run once per sample or whose output is not ``logits``."""
    import torch

    from curvcal.calibration.laplace import HeadFeatures
    from curvcal.distributed import gather_rows
    from curvcal.load.scores.logits import nonfinite_rows

    layer = f"the last nn.Linear ({capture.name})"
    count = sum(int(x.shape[0]) for x in capture.inputs if x.ndim == 2)
    if any(x.ndim != 2 for x in capture.inputs) or count != local_rows:
        raise InputError(
            capture.where,
            f"{layer} is not applied once per sample to a (batch, features) input",
            _REMEDY,
        )
    features = gather_rows(torch.cat(capture.inputs), data.n_samples)
    outputs = gather_rows(torch.cat(capture.outputs), data.n_samples)
    if features is None or outputs is None or logits is None:
        return None
    keep = torch.ones(outputs.shape[0], dtype=torch.bool)
    keep[nonfinite_rows(outputs)] = False
    if outputs[keep].shape != logits.shape or not torch.equal(outputs[keep], logits):
        raise InputError(
            capture.where,
            f"{layer} does not produce the model's logits (something follows it)",
            _REMEDY,
        )
    weight = capture.layer.weight.detach().cpu()
    bias = None if capture.layer.bias is None else capture.layer.bias.detach().cpu()
    return HeadFeatures(features[keep], weight, bias, capture.name)
