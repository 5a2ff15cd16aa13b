"""Which parameter tensors a forward pass's output is linear in, read off its autograd graph.

The output z is affine in a tensor t (with every other tensor held fixed) when every node of the
autograd graph between z and t's leaf is affine in its inputs that depend on t: a composition
of affine maps is affine. It is affine almost everywhere — with the pattern of which piece is
active held fixed, as autograd differentiates it, so that ∇²_{tt} z = 0 — when some of those
nodes are piecewise linear (ReLU, max-pooling, clamp, ``abs``, ``where``). A node is affine in
its t-dependent inputs when it is

* linear in each input (views, reshapes, indexing, ``cat``, sums, means, additions, average
  pooling, a scaling by a constant);
* a product (``mul``, matrix products, convolutions, eval BatchNorm's ``x·γ``) where exactly one
  of the factors depends on t — two factors depending on t (weights tied in series, attention's
  q·k) make it quadratic;
* a division whose divisor does not depend on t;
* piecewise linear (above).

Anything else — tanh, sigmoid, softmax, exp, log, GELU, a normalisation over a t-dependent
input (LayerNorm, BatchNorm in train mode), a custom autograd Function, a node type not listed
— leaves t not proven linear: :func:`proven_linear` is a sufficient condition, never a
necessary one, and the caller decides the rest numerically. The graph is the one batch's
forward pass: Python control flow may build another graph for other rows, so a proof holds for
the rows that built it.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

#: nodes linear in every input (every input enters additively or through a linear map)
LINEAR = frozenset(
    {
        "AccumulateGrad",
        "AddBackward0",
        "AddBackward1",
        "SubBackward0",
        "SubBackward1",
        "RsubBackward0",
        "RsubBackward1",
        "NegBackward0",
        "MulBackward1",  # by a Python scalar
        "DivBackward1",  # by a Python scalar
        "SumBackward0",
        "SumBackward1",
        "MeanBackward0",
        "MeanBackward1",
        "ViewBackward0",
        "UnsafeViewBackward0",
        "ReshapeAliasBackward0",
        "AliasBackward0",
        "AsStridedBackward0",
        "TBackward0",
        "TransposeBackward0",
        "PermuteBackward0",
        "ExpandBackward0",
        "SqueezeBackward0",
        "SqueezeBackward1",
        "SqueezeBackward2",
        "UnsqueezeBackward0",
        "CloneBackward0",
        "ToCopyBackward0",
        "SelectBackward0",
        "SliceBackward0",
        "IndexBackward0",
        "IndexSelectBackward0",
        "GatherBackward0",
        "NarrowBackward0",
        "CatBackward0",
        "StackBackward0",
        "SplitBackward0",
        "SplitWithSizesBackward0",
        "UnbindBackward0",
        "RepeatBackward0",
        "FlipBackward0",
        "RollBackward0",
        "ConstantPadNdBackward0",
        "AvgPool1DBackward0",
        "AvgPool2DBackward0",
        "AvgPool3DBackward0",
        "AdaptiveAvgPool2DBackward0",
        "AdaptiveAvgPool3DBackward0",
        "BackwardHookFunctionBackward",
        "NativeDropoutBackward0",  # a fixed mask times a constant
    }
)
#: nodes piecewise linear in every input: affine with the active piece held fixed
PIECEWISE = frozenset(
    {
        "ReluBackward0",
        "LeakyReluBackward0",
        "LeakyReluBackward1",
        "HardtanhBackward0",
        "ClampBackward0",
        "ClampBackward1",
        "ClampMinBackward0",
        "ClampMaxBackward0",
        "AbsBackward0",
        "WhereBackward0",
        "MaximumBackward0",
        "MinimumBackward0",
        "MaxBackward0",
        "MaxBackward1",
        "MinBackward0",
        "MinBackward1",
        "AmaxBackward0",
        "AminBackward0",
        "MaxPool1DWithIndicesBackward0",
        "MaxPool2DWithIndicesBackward0",
        "MaxPool3DWithIndicesBackward0",
        "AdaptiveMaxPool2DBackward0",
        "AdaptiveMaxPool3DBackward0",
    }
)
#: products: the input positions that are factors, and those that enter additively (a bias);
#: a tensor reaching any other input (BatchNorm's running statistics, say) is not proven
PRODUCTS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "MulBackward0": ((0, 1), ()),
    "MmBackward0": ((0, 1), ()),
    "BmmBackward0": ((0, 1), ()),
    "MvBackward0": ((0, 1), ()),
    "DotBackward0": ((0, 1), ()),
    "MatmulBackward0": ((0, 1), ()),
    "AddmmBackward0": ((1, 2), (0,)),
    "AddmvBackward0": ((1, 2), (0,)),
    "BaddbmmBackward0": ((1, 2), (0,)),
    "AddbmmBackward0": ((1, 2), (0,)),
    "ConvolutionBackward0": ((0, 1), (2,)),
    "NativeBatchNormLegitNoTrainingBackward0": ((0, 1), (2,)),
}
#: BatchNorm in eval mode (running statistics): (x − μ)/σ·γ + β, a product x·γ plus β
EVAL_BATCH_NORM = ((0, 1), (2,))
#: nodes affine in some inputs only: the positions where a t-dependent input is fine
PARTLY_LINEAR: dict[str, tuple[int, ...]] = {
    "DivBackward0": (0,),  # x / y: linear in x, not in y
    "NativeLayerNormBackward0": (1, 2),  # γ and β, not the normalised input
}
#: BatchNorm nodes: a product in eval mode, not linear in x in train mode (batch statistics)
BATCH_NORMS = frozenset({"NativeBatchNormBackward0", "CudnnBatchNormBackward0"})


def _leaves(params: Sequence[Tensor]) -> dict[int, int]:
    """id of each tensor → the bit mask of its positions in ``params``."""
    leaves: dict[int, int] = {}
    for index, param in enumerate(params):
        leaves[id(param)] = leaves.get(id(param), 0) | 1 << index
    return leaves


def proven_linear(output: Tensor, params: Sequence[Tensor]) -> tuple[bool, ...]:
    """For each tensor of ``params``, whether ``output``'s autograd graph shows ``output``
    affine (almost everywhere) in it by the rules of the module's docstring; ``False`` also for a
    tensor the graph does not reach (the caller's numerical check then says whether it is
    reached). One walk of the graph, no backward pass."""
    if output.grad_fn is None:
        return tuple(False for _ in params)
    leaves = _leaves(params)
    depends: dict[object, int] = {}  # node → bit mask of the params it depends on
    order: list[object] = []  # nodes, inputs before the nodes that use them
    stack: list[tuple[object, bool]] = [(output.grad_fn, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if node in depends:
            continue
        depends[node] = 0
        stack.append((node, True))
        stack.extend((child, False) for child, _ in node.next_functions if child is not None)  # type: ignore[attr-defined]
    unproven = 0
    for node in order:
        inputs = [0 if child is None else depends[child] for child, _ in node.next_functions]  # type: ignore[attr-defined]
        mask = 0
        for bits in inputs:
            mask |= bits
        name = type(node).__name__
        if name == "AccumulateGrad":
            mask |= leaves.get(id(node.variable), 0)  # type: ignore[attr-defined]
        depends[node] = mask
        unproven |= _nonlinear(node, name, inputs, mask)
    return tuple(not (1 << index & unproven) for index in range(len(params)))


def _nonlinear(node: object, name: str, inputs: Sequence[int], mask: int) -> int:
    """The bits of the tensors ``node`` is not shown affine in (``inputs``: its inputs' bit
    masks; ``mask``: their union)."""
    if not mask or name in LINEAR or name in PIECEWISE:
        return 0
    if name in BATCH_NORMS and getattr(node, "_saved_training", True) is False:
        return _product(inputs, *EVAL_BATCH_NORM)
    if name in PRODUCTS:
        return _product(inputs, *PRODUCTS[name])
    if name in PARTLY_LINEAR:
        fine = PARTLY_LINEAR[name]
        bad = 0
        for position, bits in enumerate(inputs):
            if position not in fine:
                bad |= bits
        return bad
    return mask


def _product(inputs: Sequence[int], factors: tuple[int, ...], additive: tuple[int, ...]) -> int:
    """The tensors on which two or more of the ``factors`` positions depend, or any position
    that is neither a factor nor ``additive``."""
    seen, bad = 0, 0
    for position, bits in enumerate(inputs):
        if position in factors:
            bad |= seen & bits
            seen |= bits
        elif position not in additive:
            bad |= bits
    return bad
