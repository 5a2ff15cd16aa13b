"""The model sharded over torchrun's ranks with FSDP2 (``--shard-model blocks|modules``).

:func:`shard_model` wraps a module with ``torch.distributed.fsdp.fully_shard`` on a one-dimensional
mesh of every rank: each rank keeps 1/W of every parameter (its rows along dimension 0, as
``torch.chunk`` splits them) and a forward gathers one unit's parameters at a time.

- ``blocks``: every element of a repeated block list (an ``nn.ModuleList`` whose elements all have
  one class, such as the layers of a transformer encoder or decoder) is one unit, the rest of the
  model the root unit; a model without such a list is sharded per top-level module.
- ``modules``: every top-level child that holds parameters is one unit (the elements of a
  top-level ``nn.ModuleList`` or ``nn.ModuleDict``, which has no forward), the rest the root unit.

Gradients are reduce-scattered as *sums* over the ranks (the divide factor is set to 1), so a
backward of each rank's summed loss leaves on each rank its shard of Σ over every sample.

Every FSDP forward and backward is a collective: every rank must run the same number of them.
:func:`agreed_count` gives the largest count among the ranks and :func:`pad_forwards` runs the
missing forwards on a rank with fewer batches (their outputs are dropped).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

#: ``--shard-model``: the model whole on every rank, or sharded per block or per top-level module
SHARD_MODES = ("none", "blocks", "modules")


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` holds parameters sharded by ``fully_shard`` (DTensors)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The elements of every ``nn.ModuleList`` of ``model`` whose elements (at least two) share
    one class and hold parameters: the blocks of a transformer (outermost lists only)."""
    found: list[nn.Module] = []
    taken: set[str] = set()
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in taken):
            continue
        if not isinstance(module, nn.ModuleList) or len(module) < 2:
            continue
        kinds = {type(child) for child in module}
        if len(kinds) == 1 and any(True for _ in module[0].parameters()):
            found.extend(module)
            taken.add(name)
    return found


def shard_units(model: nn.Module, how: str) -> list[nn.Module]:
    """The modules :func:`shard_model` shards on their own before the root (see the module
    docstring); ``blocks`` without repeated blocks falls back to the top-level modules."""
    if how not in SHARD_MODES[1:]:
        raise ValueError(f"unknown sharding {how!r}")
    units = repeated_blocks(model) if how == "blocks" else []
    if not units:  # a container has no forward of its own: its elements are the units
        for child in model.children():
            members = child.values() if isinstance(child, nn.ModuleDict) else [child]
            if isinstance(child, nn.ModuleList):
                members = list(child)
            units.extend(m for m in members if any(True for _ in m.parameters()))
    return units


def shard_model(
    model: nn.Module, how: str, device: torch.device, checkpoint_activations: bool = False
) -> int:
    """Shard ``model`` in place over every rank of the process group (``how``: ``blocks`` or
    ``modules``) and return how many units it was cut into (the root included). Gradients are
    reduce-scattered as sums over the ranks.

    ``checkpoint_activations``: each unit but the root keeps only its inputs in a forward and
    recomputes its activations when the backward reaches it (non-reentrant activation
    checkpointing, applied by hooks: parameter names and outputs do not change). A gradient pass
    then holds one unit's activations at a time, for one more forward."""
    from torch.distributed._composable import checkpoint
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    units = shard_units(model, how)
    for unit in units:
        if checkpoint_activations:
            checkpoint(unit)  # before fully_shard: the recompute gathers the unit's parameters
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            # a plain sum (gloo has no pre-multiplied sum, which FSDP would use in float32)
            module.set_force_sum_reduction_for_comms(True)
    return len(units) + 1


def reshard(model: nn.Module) -> None:
    """Free every gathered parameter of ``model``, so that the next forward gathers them again
    from the shards. FSDP2 keeps the root unit gathered after a forward that no backward
    follows (a no-grad forward): written shards would not be seen without this."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def local_shard(full: torch.Tensor, parameter: torch.Tensor) -> torch.Tensor:
    """This rank's rows of ``full`` (a tensor of ``parameter``'s global shape) as FSDP2 holds
    ``parameter`` (a DTensor sharded along dimension 0, ``torch.chunk``'s split); a view."""
    from torch.distributed.tensor import DTensor

    if not isinstance(parameter, DTensor):
        return full
    local = parameter.to_local()
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = -(-full.shape[0] // world) if full.ndim else 0
    piece = full[rank * rows : (rank + 1) * rows] if full.ndim else full
    if tuple(piece.shape) != tuple(local.shape):
        raise RuntimeError(
            f"rank {rank}: a shard of shape {tuple(local.shape)} is not rows "
            f"{rank * rows}..{(rank + 1) * rows} of {tuple(full.shape)}"
        )
    return piece


def local_tensor(parameter: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds of ``parameter`` (its shard; the tensor itself when whole),
    sharing its storage: writing into it changes the parameter."""
    from torch.distributed.tensor import DTensor

    return parameter.to_local() if isinstance(parameter, DTensor) else parameter


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole of a sharded tensor on every rank (an all-gather); a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def gather_whole(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The whole of each tensor (DTensors sharded along dimension 0 by FSDP2, all of one dtype
    and device) on every rank, by ONE all-gather of the concatenated shards (a gather per tensor
    costs a collective each); plain tensors are returned as they are."""
    from torch.distributed.tensor import DTensor, Shard

    if not tensors or not all(
        isinstance(t, DTensor) and tuple(t.placements) == (Shard(0),) for t in tensors
    ):
        return [full_tensor(t) for t in tensors]
    world = dist.get_world_size()

    def sizes(shape: torch.Size) -> list[int]:
        """Rows of each rank's shard of a tensor of ``shape`` (``torch.chunk``'s split)."""
        rows = -(-shape[0] // world)
        return [max(0, min(shape[0], (r + 1) * rows) - r * rows) for r in range(world)]

    shapes = [t.shape for t in tensors]
    per_row = [math.prod(shape[1:]) for shape in shapes]
    lengths = [
        sum(sizes(shape)[r] * row for shape, row in zip(shapes, per_row, strict=True))
        for r in range(world)
    ]
    local = torch.cat([t.to_local().reshape(-1) for t in tensors])  # type: ignore[attr-defined]
    padded = local.new_zeros(max(lengths))
    padded[: local.numel()] = local
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    offsets = [0] * world
    whole = []
    for shape, row in zip(shapes, per_row, strict=True):
        pieces = []
        for r, count in enumerate(sizes(shape)):
            size = count * row
            pieces.append(parts[r][offsets[r] : offsets[r] + size].view(count, *shape[1:]))
            offsets[r] += size
        whole.append(torch.cat(pieces))
    return whole


def local_range(parameter: torch.Tensor) -> tuple[int, int, int] | None:
    """(numel, start, stop): this rank's shard of ``parameter`` as the entries [start, stop) of
    the flattened whole tensor (rows along dimension 0, ``torch.chunk``'s split, are contiguous
    there), or None when ``parameter`` is not a DTensor sharded along dimension 0."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(parameter, DTensor) or tuple(parameter.placements) != (Shard(0),):
        return None
    shape = parameter.shape
    if len(shape) == 0:
        return None
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = -(-shape[0] // world)
    per_row = math.prod(shape[1:])
    start, stop = min(shape[0], rank * rows) * per_row, min(shape[0], (rank + 1) * rows) * per_row
    if stop - start != parameter.to_local().numel():
        raise RuntimeError(
            f"rank {rank}: a shard of {parameter.to_local().numel()} values is not rows "
            f"{rank * rows}..{(rank + 1) * rows} of {tuple(shape)}"
        )
    return parameter.numel(), start, stop


def gather_slices(block: torch.Tensor, parameters: list[torch.Tensor]) -> torch.Tensor:
    """The whole columns of ``block`` (local slices × m: each parameter's local shard, flattened,
    in order) on every rank, one all-gather per column (:func:`gather_whole`)."""
    from torch.distributed.tensor import DTensor

    sizes = [local_tensor(p).numel() for p in parameters]
    columns = []
    for column in block.t():
        shards: list[torch.Tensor] = [
            DTensor.from_local(
                piece.reshape(local_tensor(p).shape).contiguous(),
                p.device_mesh,  # type: ignore[attr-defined]
                p.placements,  # type: ignore[attr-defined]
                shape=p.shape,
                stride=p.stride(),
            )
            for piece, p in zip(column.split(sizes), parameters, strict=True)
        ]
        columns.append(torch.cat([t.reshape(-1) for t in gather_whole(shards)]))
    return torch.stack(columns, dim=1)


def collect_rows(piece: torch.Tensor, numel: int) -> torch.Tensor | None:
    """The ``numel`` × m whole rows of one parameter's block on rank 0 (None on the others),
    from every rank's contiguous run of them (``piece``, FSDP2's split of the parameter along
    dimension 0, flattened: rank r holds the r-th run). One all-gather of the runs' lengths
    and one gather of the runs, padded to the longest: rank 0 holds W runs of one parameter,
    never a P-long vector."""
    world, rank = dist.get_world_size(), dist.get_rank()
    length = torch.tensor([piece.shape[0]], dtype=torch.int64, device=piece.device)
    lengths = [torch.empty_like(length) for _ in range(world)]
    dist.all_gather(lengths, length)
    counts = [int(n) for n in lengths]
    padded = piece.new_zeros((max(counts), *piece.shape[1:]))
    padded[: piece.shape[0]] = piece
    parts = [torch.empty_like(padded) for _ in range(world)] if rank == 0 else None
    dist.gather(padded, parts, dst=0)
    if parts is None:
        return None
    rows = torch.cat([part[:count] for part, count in zip(parts, counts, strict=True)])
    if rows.shape[0] != numel:
        raise RuntimeError(f"the ranks' runs hold {rows.shape[0]} values of a parameter of {numel}")
    return rows


def agreed_count(count: int) -> int:
    """The largest ``count`` among the ranks (``count`` itself in one process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return count
    value = torch.tensor([count], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        value = value.cuda()
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value.item())


def pad_forwards(forward: Callable[[], object], count: int) -> None:
    """Run ``forward`` ``count`` times without gradients, its outputs dropped: the collectives
    a rank with fewer batches owes the others."""
    with torch.no_grad():
        for _ in range(count):
            forward()
