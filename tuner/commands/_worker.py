"""A command's long job in a worker thread, the main thread deciding what a signal does (`tuner bisect`, `tuner
stress`): one rule in one place.

The job runs in a worker so that a signal in the main thread only asks it to stop (an exception inside
Thread.join can leave the thread looking finished; an Event does not). Fatal signals are only recorded
(signals.Inbox): this loop decides, asks the job to stop once, and a second or third signal (a terminal drop sends
SIGHUP, then SIGCONT/SIGTERM) changes nothing while the worker makes the cards safe and ends its engines (bounded:
an engine that does not stop is killed).

Ctrl-Z (issue 28.1): a stopped tuner must not leave its engines loading the cards unwatched (they run in sessions
of their own, so the terminal's SIGTSTP never reaches them; their watchdog and the kernel-log watcher are in the
stopped process). The job pauses: every running engine ends, its cards safe; then this process stops; on SIGCONT
the job resumes (a bisect runs its trial again; a stress run, whose engine ended, ends as stopped). A fatal signal
meanwhile ends the wait (the job is stopped).
"""

from __future__ import annotations

import threading
from typing import Protocol, TypeVar

from tuner.core import signals

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Job(Protocol[T_co]):
    def run(self) -> T_co: ...

    def stop(self) -> None:
        """Thread-safe: end every engine, cards safe; `run` returns soon."""

    def pause(self) -> None:
        """Thread-safe (Ctrl-Z): end every running engine, cards safe, before this process stops."""

    def paused_safely(self) -> bool:
        """Every engine the pause ended is gone and its cards are safe: the process may stop."""

    def resume(self) -> None:
        """Back from the stop (SIGCONT), or a fatal signal ended the wait."""


def run_in_worker(job: Job[T], name: str) -> tuple[T, bool]:
    """Run `job` in a worker thread named `name`; return (its outcome, whether a fatal signal interrupted it)."""
    box: dict = {}
    done = threading.Event()

    def work() -> None:
        try:
            box["outcome"] = job.run()
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            box["error"] = e
        finally:
            done.set()

    worker = threading.Thread(target=work, name=name, daemon=True)
    with signals.Inbox(stop_signals=True) as inbox:
        worker.start()
        stopping = False
        while not done.wait(0.2):
            if inbox.first is not None and not stopping:
                stopping = True
                job.stop()
            elif not stopping and inbox.take_stop():
                _pause_and_stop(job, inbox, done)
    if "error" in box:
        raise box["error"]
    return box["outcome"], inbox.first is not None


def _pause_and_stop(job: Job[T], inbox: signals.Inbox, done: threading.Event) -> None:
    """Ctrl-Z: the job pauses (its engines end, cards safe), then this process stops; on SIGCONT the job resumes.
    A fatal signal meanwhile ends the wait (the caller stops the job)."""
    job.pause()
    while not job.paused_safely() and not done.is_set() and inbox.first is None:
        done.wait(0.05)
    if inbox.first is None and not done.is_set():
        signals.stop_now()  # returns on SIGCONT
        inbox.take_stop()  # a second Ctrl-Z while stopping changes nothing
    job.resume()
