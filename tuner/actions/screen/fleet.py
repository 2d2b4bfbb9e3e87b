"""Every selected card screened at once against a portable reference, one verdict per card (docs/screen.md).

`Screen.run()` takes every selected card's writer lock first (a screen already running on one, or any other writer,
refuses the whole screen before anything starts: exit 6); with a profile it then checks the profile against every
card as `tuner apply` does (`profile_setting.plan_profile_screen`: a refusal ends the screen before anything is
written to any card); it writes the bundled trajectory out once for the engines,
then screens the cards concurrently, one engine per card (`card.CardScreen`, a thread each), and gathers the
verdicts into one report (`verdict.ScreenReport`). A stop (Ctrl-C, SIGTERM) stops every card's engine and waits
for each to put its card back; the cards that did not finish are `retest`, never `pass`.
"""

from __future__ import annotations

import socket
import tempfile
import threading
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

from tuner import __version__
from tuner.actions.screen import verdict as v
from tuner.actions.screen.attribution import Tier, reference_tier
from tuner.actions.screen.card import CardScreen, Emit, ScreenPlan
from tuner.actions.screen.profile_setting import plan_profile_screen
from tuner.actions.screen.tolerance import DEFAULT_MARGIN_NATS
from tuner.actions.stress import EngineFactory
from tuner.backends.base import Backend
from tuner.core.card_lock import CardLock
from tuner.profiles import Profile
from tuner.profiles import reference_bundle as rb
from tuner.profiles.schema import format_created, utc_now
from tuner.tuning import kernel_log

JOIN_POLL_S = 0.2  # the main thread waits in short slices, so Ctrl-C and SIGTERM reach it
# It waits on an Event each card's thread sets when it is done (its card put back), never on Thread.join: in
# Python 3.11 a join interrupted by a signal handler's exception marks a thread that is still running as ended
# (threading._wait_for_tstate_lock releases the thread's own lock when `lock.locked()`), and a later join returns
# at once, before that card was put back (tests/screen/test_screen_profile.py::test_a_fatal_signal_...).


class Screen:
    """A screen of `device_ids` against `bundle`: `run()` blocks in the caller's thread; `stop()` may come from
    another thread (or a signal handler's exception in the caller's). `profile`: screen every card at its setting
    (applied for the screen only), not at the card's own; `bundled_with`: the profile whose bundled reference
    `bundle` is (said in the verdict)."""

    def __init__(self, backend: Backend, device_ids: list[str], bundle: rb.Bundle, bundle_path: Path, tier: Tier,
                 *, tolerance: bool = False, margin_nats: float = DEFAULT_MARGIN_NATS, on_event: Emit | None = None,
                 engine_factory: EngineFactory | None = None,
                 kernel_watcher_factory: Callable[[], kernel_log.KernelLogWatcher] | None = None,
                 profile: Profile | None = None, bundled_with: str | None = None):
        self.backend, self.device_ids, self.bundle, self.bundle_path = backend, device_ids, bundle, bundle_path
        self.profile, self.bundled_with = profile, bundled_with
        if tolerance:  # each run is the reference's steps: the tier said is the reference's, never the one asked
            tier = reference_tier(bundle.recording.tier, bundle.recording.load_s)
        self.tier, self.tolerance, self.margin_nats = tier, tolerance, margin_nats
        self._emit = on_event or (lambda device_id, event: None)
        self._engine_factory, self._watcher_factory = engine_factory, kernel_watcher_factory
        self._cards: list[CardScreen] = []
        self._stopped = threading.Event()
        self.interrupted = False

    def stop(self) -> None:
        self._stopped.set()
        for card in list(self._cards):
            card.stop()

    def run(self) -> v.ScreenReport:
        host = socket.gethostname()
        verdicts: dict[str, v.CardVerdict] = {}
        errors: dict[str, BaseException] = {}
        with (tempfile.TemporaryDirectory(prefix="tuner-screen-", ignore_cleanup_errors=True) as work,
              ExitStack() as locks):
            for device_id in self.device_ids:  # every card first: a busy one refuses the screen, nothing run
                locks.enter_context(CardLock(device_id, "tuner screen"))
            settings = {} if self.profile is None else plan_profile_screen(self.backend, self.profile,
                                                                            self.device_ids)
            for device_id, setting in settings.items():
                for warning in setting.warnings:
                    self._emit(device_id, f"warning: {warning}")
            trajectory = rb.materialize(self.bundle, Path(work))
            plan = ScreenPlan(self.bundle, trajectory, self.tier, self.tolerance, self.margin_nats, host)
            self._cards = [CardScreen(self.backend, d, plan, on_event=self._emit,
                                      engine_factory=self._engine_factory,
                                      kernel_watcher_factory=self._watcher_factory, profile=settings.get(d))
                           for d in self.device_ids]
            done = [threading.Event() for _ in self._cards]
            threads = [threading.Thread(target=self._work, args=(card, verdicts, errors, finished),
                                        name=f"screen-{card.device_id}", daemon=True)
                       for card, finished in zip(self._cards, done, strict=True)]
            for thread in threads:
                thread.start()
            try:
                for finished in done:
                    while not finished.wait(JOIN_POLL_S):
                        pass
            except BaseException:  # Ctrl-C, SIGTERM: every engine stopped, every card put back, then raise
                self.interrupted = True
                self.stop()
                for finished in done:
                    finished.wait()
                raise
        if errors:  # a card's own failure (a TunerError: its one line and code)
            raise next(iter(errors.values()))
        return self.report([verdicts[d] for d in self.device_ids], host)

    def _work(self, card: CardScreen, verdicts: dict[str, v.CardVerdict], errors: dict[str, BaseException],
              finished: threading.Event) -> None:
        try:
            verdicts[card.device_id] = card.run()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which raises it
            errors[card.device_id] = e
            self.stop()  # one card's failure ends the screen: the others are stopped and put back
        finally:
            finished.set()  # the card is back where it was (or its failure recorded)

    def report(self, verdicts: list[v.CardVerdict], host: str) -> v.ScreenReport:
        names = [c.verdict for c in verdicts]
        code = v.overall_exit(names)
        counts = {name: names.count(name) for name in v.EXIT_ORDER if name in names}
        summary = ", ".join(f"{n} {name}" for name, n in counts.items())
        stamp = format_created(utc_now())
        reference = v.ReferenceDoc(path=str(self.bundle_path), bundled_with=self.bundled_with, **self.bundle.summary())
        return v.ScreenReport(schema=v.SCHEMA_ID, tuner_version=__version__, host=host, created=stamp,
                              tier=v.TierDoc(**asdict(self.tier)), reference=reference, verdicts=verdicts,
                              exit_code=code,
                              summary=f"{len(verdicts)} card{'s' * (len(verdicts) != 1)}: {summary}")


__all__ = ["Screen", "ScreenPlan", "Tier"]
