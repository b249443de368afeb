"""One interface for running independent searches: local processes or a Ray cluster.

`make_executor(jobs, ray_address, retries)` returns an executor whose `map(fn, items, keys)`
runs `fn(item)` for every item and returns one `TaskResult` per item, in input order, whatever
finished first. `fn` must be a module-level function and items/results picklable; results are
whatever `fn` returns (plan bytes for `regen`), so they are byte-identical whichever executor
ran them.

Failures: a task that raises, or whose worker dies (a lost task), is retried up to `retries`
more times; if it still fails, its result carries the error and the other tasks' results are
kept. Locally a retry runs in a fresh single-worker process, so one crashing task cannot take
others down twice. On Ray, retries are Ray's own (`max_retries` for lost workers,
`retry_exceptions` for raised errors). Ray is optional (`pip install 'opweave-planner[ray]'`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Protocol

from opweave_planner.errors import UserError
from opweave_planner.procs import process_pool

LOST = "worker process died (lost task)"


@dataclass
class TaskResult:
    index: int
    key: str
    ok: bool
    value: Any = None
    error: str | None = None
    attempts: int = 1


class Executor(Protocol):
    name: str

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any],
            keys: Sequence[str] | None = None,
            on_result: Callable[[TaskResult], None] | None = None) -> list[TaskResult]: ...


def _describe(exc: BaseException) -> str:
    if isinstance(exc, UserError):
        return str(exc)
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class LocalExecutor:
    """`jobs` worker processes (jobs=1: in this process, no pool)."""

    def __init__(self, jobs: int = 1, retries: int = 1) -> None:
        if jobs < 1:
            raise UserError("--jobs: expected a positive integer")
        if retries < 0:
            raise UserError("--retries: expected a non-negative integer")
        self.jobs, self.retries = jobs, retries
        self.name = "in-process" if jobs == 1 else f"{jobs} local processes"

    def map(self, fn, items, keys=None, on_result=None) -> list[TaskResult]:
        """`on_result(TaskResult)` runs here, in the calling process, as each task ends (for
        progress lines); a failed task is reported once its retries are spent."""
        keys = list(keys) if keys is not None else [str(i) for i in range(len(items))]
        results: list[TaskResult | None] = [None] * len(items)
        done = on_result or (lambda _r: None)
        if self.jobs == 1:
            for i, item in enumerate(items):
                for attempt in range(1, self.retries + 2):
                    try:
                        results[i] = TaskResult(i, keys[i], True, fn(item), attempts=attempt)
                        break
                    except Exception as exc:  # a task's failure is reported, not raised
                        results[i] = TaskResult(i, keys[i], False, error=_describe(exc), attempts=attempt)
                done(results[i])
            return results  # type: ignore[return-value]
        failed: list[int] = []
        with process_pool(min(self.jobs, max(1, len(items)))) as pool:
            futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
            for fut in as_completed(futures):
                i = futures[fut]
                try:
                    results[i] = TaskResult(i, keys[i], True, fut.result())
                    done(results[i])
                except BrokenProcessPool:
                    results[i] = TaskResult(i, keys[i], False, error=LOST)
                    failed.append(i)
                except Exception as exc:
                    results[i] = TaskResult(i, keys[i], False, error=_describe(exc))
                    failed.append(i)
        for i in sorted(failed):
            self._retry(fn, items, keys, results, i)
            done(results[i])
        return results  # type: ignore[return-value]

    def _retry(self, fn, items, keys, results, i) -> None:
        for attempt in range(2, self.retries + 2):
            with process_pool(1) as pool:
                try:
                    results[i] = TaskResult(i, keys[i], True, pool.submit(fn, items[i]).result(),
                                            attempts=attempt)
                    return
                except BrokenProcessPool:
                    results[i] = TaskResult(i, keys[i], False, error=LOST, attempts=attempt)
                except Exception as exc:
                    results[i] = TaskResult(i, keys[i], False, error=_describe(exc), attempts=attempt)


class RayExecutor:
    """Tasks on a Ray cluster: `address` as for `ray.init` ('auto', 'host:port', 'ray://host:10001'),
    or 'local' to start a private local instance. An already initialised Ray in this process is used
    as it is (and left running)."""

    def __init__(self, address: str, retries: int = 1) -> None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise UserError("--ray: Ray is not installed; pip install 'opweave-planner[ray]'") from None
        if retries < 0:
            raise UserError("--retries: expected a non-negative integer")
        self.address, self.retries = address, retries
        self.name = f"Ray ({address})"

    def map(self, fn, items, keys=None, on_result=None) -> list[TaskResult]:
        import logging

        import ray
        from ray import exceptions as rex

        keys = list(keys) if keys is not None else [str(i) for i in range(len(items))]
        started = False
        if not ray.is_initialized():
            try:
                ray.init(address=None if self.address == "local" else self.address,
                         logging_level=logging.WARNING, log_to_driver=False, include_dashboard=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise UserError(f"--ray: cannot connect to Ray at '{self.address}': {_describe(exc)}") from None
            started = True
        try:
            remote = ray.remote(fn).options(num_cpus=1, max_retries=self.retries, retry_exceptions=True)
            refs = [remote.remote(item) for item in items]
            results = []
            for i, ref in enumerate(refs):
                try:
                    results.append(TaskResult(i, keys[i], True, ray.get(ref)))
                except rex.RayTaskError as exc:
                    cause = getattr(exc, "cause", None)
                    results.append(TaskResult(i, keys[i], False, error=_describe(cause) if cause else
                                              str(exc).splitlines()[0], attempts=self.retries + 1))
                except rex.RayError as exc:  # worker crashed, node died, object lost
                    results.append(TaskResult(i, keys[i], False, error=f"{LOST}: {type(exc).__name__}",
                                              attempts=self.retries + 1))
                if on_result:
                    on_result(results[-1])
            return results
        finally:
            if started:
                ray.shutdown()


def make_executor(jobs: int = 1, ray_address: str | None = None, retries: int = 1) -> Executor:
    if ray_address:
        return RayExecutor(ray_address, retries)
    return LocalExecutor(jobs, retries)
