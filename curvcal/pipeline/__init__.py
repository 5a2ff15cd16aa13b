"""The only place that strings the steps of a run together.

Each module serves one command family: a frozen request (what the command parsed) goes in, a
result holding the analysis and its report envelope comes out. Every run follows one order:
load the checkpoint and the data, check that the model takes the data
(:func:`~curvcal.pipeline.compatibility.check_compatible`), shard under torchrun
(:func:`~curvcal.pipeline.runtime.distributed_run`), predict (gathered on rank 0) or build the
Hessian operator, split, analyse. Nothing here prints except through the
:class:`~curvcal.console.Reporter` a command hands in; no module imports torch at load time, so
a command can build its request without paying for torch.
"""
