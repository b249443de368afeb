"""Signals and worker processes: clean exits on SIGTERM, prompt Ctrl-C, no orphans.

* `install_sigterm_handler` turns SIGTERM into `Terminated` (exit 143), so `finally`
  blocks run and process pools are shut down instead of the process vanishing.
* `deferred_interrupts` + `check_interrupt`: while numba kernels run, SIGINT/SIGTERM only
  set a flag that the caller checks between kernel calls; an exception raised inside a
  numba frame surfaces as ``SystemError: CPUDispatcher(...)`` instead of a clean stop.
* `process_pool` / `pool_kwargs` / `worker_initializer`: workers die with their parent
  (``prctl(PR_SET_PDEATHSIG)`` on Linux, a watchdog thread polling the parent elsewhere)
  and leave Ctrl-C to the parent; on an exception the pool is killed, not waited for.

Rank 0: imports nothing of ours but `errors`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from opweave_planner.errors import Terminated

PR_SET_PDEATHSIG = 1
_WATCHDOG_PERIOD_S = 0.5


# --------------------------------------------------------------------------- #
# SIGTERM in the parent
# --------------------------------------------------------------------------- #

def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def install_sigterm_handler() -> bool:
    """SIGTERM raises `Terminated` in the main thread; False (nothing done) off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, _raise_terminated)
    return True


# --------------------------------------------------------------------------- #
# Cooperative interrupts around numba kernels
# --------------------------------------------------------------------------- #

class _Pending:
    signum: int | None = None


_pending = _Pending()


def _defer(signum, frame) -> None:
    if _pending.signum is not None and signum == signal.SIGINT:
        raise KeyboardInterrupt  # a second Ctrl-C: the user insists, stop right here
    _pending.signum = signum


def interrupt_requested() -> bool:
    """True once SIGINT/SIGTERM arrived inside `deferred_interrupts`."""
    return _pending.signum is not None


def check_interrupt() -> None:
    """Raise KeyboardInterrupt/Terminated if a signal arrived; call between kernel calls."""
    signum = _pending.signum
    if signum is None:
        return
    _pending.signum = None
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[Callable[[], None]]:
    """SIGINT/SIGTERM set a flag instead of raising; yields `check_interrupt`.

    On leaving, a pending signal is raised (so it is never lost) and the previous
    handlers are restored. Off the main thread it changes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield check_interrupt
        return
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    if old[signal.SIGINT] is not _defer:  # outermost: start clean; nested: keep what is pending
        _pending.signum = None
    for s in old:
        signal.signal(s, _defer)
    try:
        yield check_interrupt
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    check_interrupt()


# --------------------------------------------------------------------------- #
# Workers that die with their parent
# --------------------------------------------------------------------------- #

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _prctl_pdeathsig(sig: int) -> bool:
    """Linux: the kernel sends ``sig`` when the parent exits. False where unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watchdog(parent_pid: int, ppid: int, sig: int) -> None:
    event = threading.Event()
    while not event.wait(_WATCHDOG_PERIOD_S):
        if os.getppid() != ppid or not _alive(parent_pid):
            os.kill(os.getpid(), sig)
            os._exit(128 + int(sig))


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGKILL,
                    use_prctl: bool = True) -> str:
    """Make this (worker) process exit when its parent does; returns the mechanism used.

    ``parent_pid`` is the process that owns the pool (pass ``os.getpid()`` from it); it
    closes the race where the parent died before this ran, and covers start methods
    where the direct parent is a fork server. SIGKILL by default: a worker stuck in a
    numba kernel cannot run Python handlers anyway.
    """
    ppid = os.getppid()
    parent_pid = ppid if parent_pid is None else parent_pid
    how = "prctl" if use_prctl and _prctl_pdeathsig(sig) else "watchdog"
    if how == "watchdog" or parent_pid != ppid:
        threading.Thread(target=_watchdog, args=(parent_pid, ppid, sig), daemon=True,
                         name="opweave-parent-watchdog").start()
    if not _alive(parent_pid) or os.getppid() != ppid:
        os._exit(128 + int(sig))  # the parent is already gone
    return how


def worker_initializer(parent_pid: int, then: Callable[..., Any] | None = None,
                       then_args: tuple = ()) -> None:
    """Pool initializer: default SIGTERM, ignore SIGINT (the parent decides), die with the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked worker inherits the parent's handler
    die_with_parent(parent_pid)
    if then is not None:
        then(*then_args)


def pool_kwargs(initializer: Callable[..., Any] | None = None, initargs: tuple = ()) -> dict:
    """``ProcessPoolExecutor(**pool_kwargs())``: workers tied to this process (chains ``initializer``)."""
    return {"initializer": worker_initializer, "initargs": (os.getpid(), initializer, tuple(initargs))}


def kill_pool(executor: ProcessPoolExecutor, timeout_s: float = 2.0) -> None:
    """Cancel pending work and kill the workers now (waiting would finish running tasks).

    Reads CPython internals (the executor's `_processes` and `_executor_manager_thread`,
    `concurrent.futures.process._threads_wakeups`); where one is missing the step is skipped."""
    procs = list((getattr(executor, "_processes", None) or {}).values())
    manager = getattr(executor, "_executor_manager_thread", None)  # shutdown() drops the reference
    executor.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        with contextlib.suppress(Exception):
            p.kill()
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(timeout_s)
    # let the pool's manager thread finish closing its wakeup pipe now: at exit, Python 3.11's
    # concurrent.futures would otherwise write to that pipe while the thread closes it, and
    # print an 'Exception ignored ... Bad file descriptor' traceback after our one line
    if manager is not None:
        with contextlib.suppress(Exception):
            manager.join(timeout_s)
        if manager.is_alive():
            # still closing after the timeout (a loaded machine): take it off the list that
            # exit-time hook wakes. shutdown() above has woken it already and its workers are
            # dead, so it ends on its own, and the interpreter still joins it (non-daemon).
            # (Until session 18 the thread was read after shutdown(), which drops it: the join
            # never ran, and a CI run under -n auto printed the traceback once.)
            from concurrent.futures import process as cf_process

            with contextlib.suppress(Exception):
                cf_process._threads_wakeups.pop(manager, None)


@contextlib.contextmanager
def process_pool(max_workers: int, **kw: Any) -> Iterator[ProcessPoolExecutor]:
    """A ProcessPoolExecutor whose workers die with us; any exception kills it instead of waiting."""
    init = kw.pop("initializer", None)
    args = kw.pop("initargs", ())
    ex = ProcessPoolExecutor(max_workers=max_workers, **pool_kwargs(init, args), **kw)
    try:
        yield ex
    except BaseException:
        kill_pool(ex)
        raise
    ex.shutdown(wait=True)
