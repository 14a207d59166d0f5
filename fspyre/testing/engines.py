"""Where a batch of independent checks runs -- in this process, in a pool of processes on this
host, or on a Ray cluster -- and which share of it one job of a batch scheduler runs.

A batch is a sequence of items (the campaign's seeds, the zoo's family names) and a function
giving each item its verdict. ``run_batch`` yields the verdicts as they complete, so a caller
can show progress and write each one as it arrives; on workers they come in completion order,
and callers key them by item.

- Shards (``--shard i/N``) cut the batch into N contiguous blocks, the same blocks on every
  machine and without Ray: a Kubernetes indexed job (or any array job) runs share i in job i,
  and the shards' verdicts together are the verdicts of one process over the whole batch.
- On Ray (an optional extra, ``pip install 'fspyre[ray]'``), a local cluster of ``workers``
  CPUs is started for the batch, or the cluster at ``address`` is joined (every node needs
  fspyre installed). Items travel in chunks of ``chunk``. A chunk whose worker process died
  (killed, out of memory, a crash in native code) is run again item by item, so an item that
  kills its worker is found; an item whose worker died ``attempts`` times gets the verdict
  ``lost(item, why)`` and the batch goes on. A chunk's verdicts are taken only from the task
  that completed it, so no item is lost and none is counted twice.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fspyre.errors import BatchError

__all__ = ["Engine", "Shard", "run_batch"]

Item = TypeVar("Item")
Verdict = TypeVar("Verdict")
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Shard:
    """Share ``index`` of ``count``: items ``[index * n // count, (index + 1) * n // count)`` of a
    batch of n. The shares of one ``count`` partition every batch, whatever n."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise BatchError(f"--shard {self.index}/{self.count}: give i/N with N >= 1 and 0 <= i < N "
                             f"(share i of N, counted from 0)")

    @classmethod
    def parse(cls, text: str) -> Shard:
        index, slash, count = text.partition("/")
        if not (slash and index.strip().isdigit() and count.strip().isdigit()):
            raise BatchError(f"--shard {text!r}: give i/N, e.g. 0/4 for the first of four shares")
        return cls(index=int(index), count=int(count))

    def span(self, n: int) -> slice:
        """This share's positions in a batch of ``n``."""
        return slice(self.index * n // self.count, (self.index + 1) * n // self.count)

    def of(self, items: Sequence[Item]) -> Sequence[Item]:
        return items[self.span(len(items))]

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Engine:
    """Where a batch runs. Without Ray: this process (``workers`` 1) or ``workers`` forked
    processes. With ``ray`` (or an ``address``): Ray tasks, at most ``workers`` at a time
    (default: every CPU of the cluster). ``fresh``: every item in a new process (the model zoo:
    torch's compile caches and the front end's names do not carry from one model to the next)."""

    workers: int | None = None
    ray: bool = False
    address: str | None = None
    chunk: int = 4  # items per task: fewer round trips; a lost worker costs one chunk's rerun
    attempts: int = 3  # runs of one item whose worker died before it is reported lost
    fresh: bool = False

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise BatchError(f"--workers {self.workers}: give at least 1")
        if self.chunk < 1 or self.attempts < 1:
            raise BatchError(f"chunk {self.chunk}, attempts {self.attempts}: both must be at least 1")

    @property
    def on_ray(self) -> bool:
        return self.ray or self.address is not None


def run_batch(check: Callable[[Item], Verdict], items: Sequence[Item], engine: Engine,
              lost: Callable[[Item, str], Verdict]) -> Generator[Verdict, None, None]:
    """Every item's verdict exactly once, as it completes. ``check`` must be picklable (a module
    function) off this process; closing the iterator early stops the workers."""
    size = 1 if engine.fresh else engine.chunk
    chunks = [tuple(items[i:i + size]) for i in range(0, len(items), size)]
    if engine.on_ray:
        yield from _on_ray(check, chunks, engine, lost)
    elif (engine.workers or 1) == 1 and not engine.fresh:
        for item in items:
            yield check(item)
    else:
        yield from _on_processes(check, chunks, engine.workers or 1, engine.fresh)


def _run_chunk(check: Callable[[Item], Verdict], chunk: tuple[Item, ...]) -> list[Verdict]:
    return [check(item) for item in chunk]


def _on_processes(check: Callable[[Item], Verdict], chunks: list[tuple[Item, ...]], workers: int,
                  fresh: bool) -> Iterator[Verdict]:
    # fork is cheap and shares what is imported; a fresh process per item is spawned instead (a
    # forked copy of a process that ran torch would carry its state, and its threads' locks)
    context = multiprocessing.get_context("spawn" if fresh else "fork")
    with context.Pool(workers, maxtasksperchild=1 if fresh else None) as pool:  # leaving it terminates it
        for verdicts in pool.imap_unordered(_Chunk(check), chunks):
            yield from verdicts


@dataclass(frozen=True, slots=True)
class _Chunk:
    """``_run_chunk`` with its check bound, picklable for a pool."""

    check: Callable[[Any], Any]

    def __call__(self, chunk: tuple[Any, ...]) -> list[Any]:
        return _run_chunk(self.check, chunk)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise BatchError("--ray and --address need Ray, an optional extra: pip install 'fspyre[ray]' (or run "
                         "without Ray: --workers N on this host, --shard i/N in a batch scheduler)") from None
    return ray


def _on_ray(check: Callable[[Item], Verdict], chunks: list[tuple[Item, ...]], engine: Engine,
            lost: Callable[[Item, str], Verdict]) -> Iterator[Verdict]:
    ray = _ray()
    # the losses retried here: the worker process or its node died; any other exception in a task
    # is a bug of the check and is raised
    lost_worker = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                   ray.exceptions.LocalRayletDiedError)
    started = not ray.is_initialized()
    if started:
        local = engine.address is None
        try:  # "local": a new cluster for this batch, even where RAY_ADDRESS names a running one
            ray.init(address=engine.address or "local", num_cpus=(engine.workers or os.cpu_count()) if local else None,
                     include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        except ConnectionError as err:
            raise BatchError(f"--address {engine.address}: cannot join a Ray cluster there ({err}); start one "
                             f"with `ray start --head`, or leave --address out for a local cluster") from None
    pending: dict[Any, tuple[tuple[Item, ...], int]] = {}
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        in_flight = 2 * (engine.workers or cpus)  # a queued task per worker: none waits for the driver
        # max_retries=0: a lost task comes back here, where its items are rerun one by one and counted;
        # max_calls=1 retires a worker after one task (a fresh process per item)
        task = ray.remote(num_cpus=1, max_retries=0, max_calls=1 if engine.fresh else 0)(_run_chunk)
        shared_check = ray.put(check)
        queue = deque((chunk, 1) for chunk in chunks)
        while queue or pending:
            while queue and len(pending) < in_flight:
                chunk, attempt = queue.popleft()
                pending[task.remote(shared_check, chunk)] = (chunk, attempt)
            [ref], _ = ray.wait(list(pending), num_returns=1)
            chunk, attempt = pending.pop(ref)
            try:
                verdicts = ray.get(ref)
            except lost_worker as err:
                why = f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"
                log.warning("a worker died running %d item(s) (attempt %d): %s", len(chunk), attempt, why)
                if len(chunk) > 1:  # one by one: an item that kills its worker is found
                    queue.extend(((item,), attempt + 1) for item in chunk)
                elif attempt < engine.attempts:
                    queue.append((chunk, attempt + 1))
                else:
                    yield lost(chunk[0], f"its worker died {attempt} times; last: {why}")
                continue
            except ray.exceptions.RayTaskError as err:
                raise err.as_instanceof_cause() from None
            yield from verdicts
    finally:
        for ref in pending:  # closed early (a time limit, an error): nothing keeps running for us
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()
