"""torch.distributed helpers: who am I, which samples are mine, and exact sums across ranks.

Launched by ``torchrun --nproc-per-node N -m curvcal ...``, every rank takes the samples
``r, r + W, r + 2W, ...`` of the dataset (no padding: ``DistributedSampler`` repeats samples to
even out shards, which would make an all-reduced Hessian-vector product wrong) and sums of
per-rank partial results are all-reduced. Without torchrun everything degrades to one process.

Failures are agreed, not waited out:

* every collective has a timeout (``CURVCAL_DIST_TIMEOUT`` seconds, default 600), the process
  group's, so a rank that never arrives ends the run with an error instead of gloo's 30 minutes;
* a rank that fails (:func:`announce_failure`, called by the pipeline's ``distributed_run``)
  writes its cause to torchrun's key-value store, waits a few seconds for the others to take
  note, and exits with its own exit code and one line ``curvcal: error: rank R: <cause>``;
* every rank runs a watcher thread that polls the store: on another rank's failure it removes
  what its run wrote, prints ``curvcal: error: rank R failed, so rank S stopped: <cause>`` and
  exits with the failing rank's code, whatever collective its main thread is blocked in;
* Ctrl-C on one rank (:mod:`curvcal.interrupt`) is announced the same way: that rank exits 130
  with ``curvcal: interrupted``, the others with 130 and ``... stopped: interrupted``;
* at the end every rank meets at a barrier with the same timeout: a rank that died without a
  word (killed, out of memory) is named there and the run fails instead of reporting success.

Ranks agree before they add up (:func:`agree`): the run session gathers every rank's
fingerprint of its settings, checkpoint and data, and a rank whose fingerprint differs from rank
0's stops every rank with the same line naming that rank and what differs (exit 2), found by
all of them at the same collective, so nothing is announced through the store.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from curvcal import interrupt
from curvcal.errors import EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, CurvcalError, InputError

#: environment variable: seconds any collective (and the final barrier) may wait for the others
TIMEOUT_VARIABLE = "CURVCAL_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
#: how often each rank's watcher looks for another rank's failure, and how long a failing rank
#: waits for the others to take note before it exits
_POLL_S = 0.2
_STORE_TIMEOUT_S = 30.0  # the failure watcher's store client: one call waits at most this
_ACK_WAIT_S = 10.0
_INTERRUPT_WAIT_S = 1.5  # Ctrl-C is answered within 2 s


@dataclass(frozen=True)
class DistContext:
    """Rank and world size of this process (``rank = 0, world_size = 1`` when not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def launched_by_torchrun() -> bool:
    """True when torchrun (or ``torch.distributed.run``) set the rendezvous variables."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def collective_timeout() -> timedelta:
    """How long a collective may wait for the other ranks: ``CURVCAL_DIST_TIMEOUT`` seconds
    (a positive number), default :data:`DEFAULT_TIMEOUT_S`."""
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return timedelta(seconds=DEFAULT_TIMEOUT_S)
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < 10**9:  # NaN fails too
        raise InputError(
            f"{TIMEOUT_VARIABLE}={text}", "is not a positive number of seconds", "e.g. 600"
        )
    return timedelta(seconds=seconds)


def init_from_env(device: torch.device | None = None) -> DistContext:
    """Join the process group torchrun describes; one-process context otherwise.

    Backend: NCCL when the device is CUDA, gloo otherwise (CPU, or the tests); every collective
    times out after :func:`collective_timeout`. Starts this rank's failure watcher.
    """
    if not launched_by_torchrun():
        return DistContext()
    timeout = collective_timeout()
    if not dist.is_initialized():
        backend = "nccl" if device is not None and device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=timeout)
    context = current()
    _WATCH.start(context)
    return context


def local_device(device: torch.device) -> torch.device:
    """Under torchrun, a CUDA device given without an index becomes ``cuda:LOCAL_RANK`` (one GPU
    per process on a machine); anything else is returned unchanged."""
    if not launched_by_torchrun() or device.type != "cuda":
        return device
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def current() -> DistContext:
    """The context of an already initialised process group (or the one-process context)."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistContext()
    return DistContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        backend=str(dist.get_backend()),
    )


def shard_indices(n_samples: int, rank: int, world_size: int) -> list[int]:
    """Indices of rank ``rank``: ``rank, rank + W, ...`` below ``n_samples``; shards are disjoint,
    cover every index once, and are never padded (a rank may get one sample fewer, or none)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside a world of size {world_size}")
    return list(range(rank, n_samples, world_size))


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum of ``tensor`` over all ranks (a new tensor; the argument is not modified).

    In one process this is a copy. Pass it as the ``all_reduce`` hook of the curvature operator.
    """
    total = tensor.clone()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def gather_rows(local: torch.Tensor, n_samples: int) -> torch.Tensor | None:
    """Put every rank's shard of rows back together, in dataset order, on rank 0.

    Rank ``r`` holds the rows of the samples :func:`shard_indices` gives it (in that order);
    rank 0 gets the ``(n_samples, ...)`` tensor, the other ranks ``None``. Shards are padded to
    the longest one for one ``all_gather`` and the padding is dropped. Every rank needs at least
    one row (so that the trailing shape and dtype agree). In one process this returns ``local``.
    """
    context = current()
    if not context.active:
        return local
    world = context.world_size
    longest = -(-n_samples // world)
    if local.shape[0] != len(shard_indices(n_samples, context.rank, world)) or n_samples < world:
        raise ValueError(f"rank {context.rank}: {local.shape[0]} rows for a shard of {n_samples}")
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if context.backend == "nccl"
        else torch.device("cpu")
    )
    padded = torch.zeros((longest, *local.shape[1:]), dtype=local.dtype, device=device)
    padded[: local.shape[0]] = local.to(device)
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    if not context.is_main:
        return None
    out = torch.empty((n_samples, *local.shape[1:]), dtype=local.dtype)
    for rank, part in enumerate(parts):
        rows = shard_indices(n_samples, rank, world)
        out[rows] = part[: len(rows)].cpu()
    return out


def shutdown(timeout_s: float | None = None) -> None:
    """Leave the process group if this process joined one, after the other ranks get here.

    Tearing the group down while another rank is still using it can abort that rank ("terminate
    called without an active exception" from gloo), so every rank first waits at a barrier
    (under gloo a monitored one) of ``timeout_s`` seconds (default: :func:`collective_timeout`).
    A rank that does not arrive in time (it died without announcing a failure) is an error
    naming it: the run must not report success without it.
    """
    if not (dist.is_available() and dist.is_initialized()):
        _WATCH.stop()
        return
    seconds = collective_timeout().total_seconds() if timeout_s is None else timeout_s
    rank = dist.get_rank()
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=timedelta(seconds=seconds))
        else:
            dist.barrier()
    except Exception as exc:
        leave()
        cause = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise DistributedError(
            f"rank {rank}",
            f"not every rank reached the end of the run within {seconds:g} s ({cause})",
            f"see the other ranks' messages; {TIMEOUT_VARIABLE} sets the wait",
        ) from exc
    leave()


def leave() -> None:
    """Stop the failure watcher and destroy the process group, without waiting for anyone."""
    _WATCH.stop()
    if dist.is_available() and dist.is_initialized():
        # a sharded model's hooks form reference cycles that may hold gloo work objects (and
        # their tensors): freed by the collector at interpreter exit, their destructors take
        # the GIL of a dying interpreter and abort the rank ("terminate called without an
        # active exception") after a successful run. Free them while the group is alive.
        gc.collect()
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


class DistributedError(CurvcalError):
    """A rank failed, or did not arrive: the run is void on every rank (exit 70 unless the
    failing rank's own error said otherwise)."""

    exit_code = EXIT_INTERNAL
    #: every rank raised this same error at the same collective (nothing to announce)
    agreed = False

    def __init__(
        self, what: str, why: str, hint: str | None = None, exit_code: int | None = None
    ) -> None:
        super().__init__(what, why, hint)
        if exit_code is not None:
            self.exit_code = exit_code


class RanksDisagree(DistributedError):
    """A rank was given other settings, another checkpoint or other data than rank 0: the run
    would add up the products of different models, so every rank stops (exit 2)."""

    exit_code = EXIT_INPUT
    agreed = True


#: what a rank must be given alike, said in the error
_SAME = "every rank must run the same command on the same checkpoint and data"


def agree(what: str, fingerprint: Callable[[], Mapping[str, object]]) -> None:
    """Gather every rank's ``fingerprint()`` of ``what`` (``settings``, ``checkpoint``, ``data``:
    names to JSON-ready values) and raise :class:`RanksDisagree` on every rank alike when one
    differs from rank 0's, naming the lowest such rank, the first name that differs (in
    sorted order) and both values. Values are compared as JSON text (a NaN equals a NaN). In
    one process this does nothing (``fingerprint`` is not even called: digests cost a read of
    the files); under torchrun every rank must call it at the same point.
    """
    context = current()
    if not context.active:
        return
    mine = {
        key: json.dumps(value, sort_keys=True, default=str) for key, value in fingerprint().items()
    }
    everyone: list[dict[str, str] | None] = [None] * context.world_size
    dist.all_gather_object(everyone, mine)
    first = everyone[0] or {}
    for rank, theirs in enumerate(everyone[1:], start=1):
        theirs = theirs or {}
        for key in sorted(set(first) | set(theirs)):
            if first.get(key) != theirs.get(key):
                raise RanksDisagree(
                    f"rank {rank}",
                    f"differs from rank 0 in its {what}: {key} {_shown(theirs.get(key))} on "
                    f"rank {rank}, {_shown(first.get(key))} on rank 0",
                    _SAME,
                )


def _shown(text: str | None) -> str:
    """A fingerprint value as the error says it: each SHA-256 in it by its first 12 digits."""
    if text is None:
        return "(none)"

    def short(value: object) -> object:
        if isinstance(value, list):
            return [short(item) for item in value]
        if isinstance(value, str) and len(value) == 64 and set(value) <= set("0123456789abcdef"):
            return value[:12] + "..."
        return value

    value = short(json.loads(text))
    return value if isinstance(value, str) else json.dumps(value)


def rank_error(error: BaseException, rank: int) -> DistributedError:
    """``error`` of rank ``rank`` as one line naming the rank, with the same exit code (an
    unexpected exception is an internal error, 70)."""
    if isinstance(error, DistributedError):
        return error
    if isinstance(error, CurvcalError):
        return DistributedError(f"rank {rank}", error.message, exit_code=error.exit_code)
    text = " ".join(str(error).split())[:300] or type(error).__name__
    return DistributedError(
        f"rank {rank}",
        f"internal error: {type(error).__name__}: {text}",
        "rerun with --debug for a traceback and please report it",
    )


def announce_failure(error: DistributedError) -> None:
    """Tell the other ranks this one failed with ``error``, print its line, give the others a
    few seconds to print theirs (each stops as soon as its watcher sees the failure; see the
    module docstring) and end the process with ``error.exit_code``. Returns, for the caller to
    raise ``error``, only when this rank has no store to announce through."""
    _WATCH.announce(error)


@dataclass
class _Watch:
    """This process's failure watcher: a key-value store client of its own and a thread."""

    store: dist.Store | None = None
    rank: int = 0
    world_size: int = 1
    lock: threading.Lock = field(default_factory=threading.Lock)
    halt: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    failing: bool = False

    def start(self, context: DistContext) -> None:
        if self.thread is not None or not context.active:
            return
        store = _store_client()
        if store is None:  # no store to watch (not torchrun's variables): timeouts still hold
            return
        self.store, self.rank, self.world_size = store, context.rank, context.world_size
        self.failing = False
        self.halt.clear()
        self.thread = threading.Thread(target=self._run, name="curvcal-rank-watch", daemon=True)
        self.thread.start()
        interrupt.on_stop(self._interrupted)

    def _interrupted(self) -> None:
        """Ctrl-C is ending this rank: the others stop too (exit 130), not wait in a collective
        for it until the timeout."""
        store = self.store
        if store is None or self.failing:
            return
        self.failing = True
        everyone = [f"ack/{rank}" for rank in range(self.world_size)]
        with contextlib.suppress(Exception):
            with self.lock:
                store.compare_set("failed", "", f"{EXIT_INTERRUPTED}\n{self.rank}\ninterrupted")
                store.set(f"ack/{self.rank}", "1")
            # briefly: this rank may host the store, which the others must still reach
            store.wait(everyone, timedelta(seconds=_INTERRUPT_WAIT_S))

    def stop(self) -> None:
        interrupt.on_stop(None)
        self.halt.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            # until it has left any store call: a daemon thread still inside C++ when the
            # interpreter exits is ended while taking the GIL, which aborts the process
            self.thread.join(timeout=_STORE_TIMEOUT_S + 1.0)
        self.thread = None
        self.store = None

    def announce(self, error: DistributedError) -> None:
        """Publish ``error``, say it, wait for every rank to take note, and end the process with
        its exit code (every rank's line is out before any rank exits, so torchrun's stopping
        the survivors cannot cut one off). Returns only when there is no store to publish to."""
        self.failing = True
        store = self.store
        if store is None:
            return
        if not error.agreed:  # every rank found an agreed error itself: nothing to tell
            with contextlib.suppress(Exception), self.lock:  # the store may be gone with rank 0
                store.compare_set("failed", "", f"{error.exit_code}\n{self.rank}\n{error.why}")
        self._stop_with(f"curvcal: error: {error.message}\n", error.exit_code)

    def _stop_with(self, line: str, code: int) -> None:
        """Remove what this rank wrote, print ``line``, wait (a few seconds at most) until every
        rank has printed its own, and exit with ``code``."""
        interrupt.discard()
        with contextlib.suppress(OSError):
            # the real stderr, also while a tokenizer holds descriptor 2 (curvcal.load.texts.text)
            os.write(interrupt.stderr_fd(), line.encode())
            # this rank's one line is out: what the C++ side may still print while the ranks
            # part (a store or gloo peer that left first: "Connection reset by peer") is not
            # the cause, and would bury it
            quiet = os.open(os.devnull, os.O_WRONLY)
            os.dup2(quiet, 2)
            os.close(quiet)
        store = self.store
        if store is not None:
            everyone = [f"ack/{rank}" for rank in range(self.world_size)]
            with contextlib.suppress(Exception):
                with self.lock:
                    store.set(f"ack/{self.rank}", "1")
                # answered by the store as the last rank takes note (rank 0 may host the store
                # and leave right after; a poll could come too late)
                store.wait(everyone, timedelta(seconds=_ACK_WAIT_S))
        os._exit(code)

    def _run(self) -> None:
        store = self.store
        assert store is not None
        while not self.halt.wait(_POLL_S):
            try:
                with self.lock:
                    if self.failing or not store.check(["failed"]):
                        continue
                    code, rank, cause = store.get("failed").decode().split("\n", 2)
            except Exception:  # the store went away: the run is ending one way or another
                return
            if self.halt.is_set() or self.failing:
                return
            self.failing = True
            self._stop_with(
                f"curvcal: error: rank {rank} failed, so rank {self.rank} stopped: {cause}\n",
                int(code) if code.isdigit() else EXIT_INTERNAL,
            )


_WATCH = _Watch()


def _store_client() -> dist.Store | None:
    """A client of torchrun's key-value store (``MASTER_ADDR``/``MASTER_PORT``), under a prefix
    of this run and restart; None when it cannot be reached."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if not host or not port.isdigit():
        return None
    try:
        client = dist.TCPStore(
            host,
            int(port),
            is_master=False,
            timeout=timedelta(seconds=_STORE_TIMEOUT_S),
            wait_for_workers=False,
        )
    except Exception:
        return None
    run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"curvcal/{run}/{attempt}/", client)
