"""The rig apply's safety rules as one table (the rig half of test_rules_table.py), run through every front end:
the core directly (tuner.actions.profile_apply: plan_rig_apply, prepare_rig_apply, one RigChange), the CLI
(`tuner apply RIG`, in-process, its backend factory pointed at the case's simulated rig) and the App (the Profiles
screen's `a`, and the Bisect screen's `a` on the result of a bisect of every card; keep-or-revert answered with
the dialog's keys).

The rules: every part is checked before any card is written (so each refusal below is on the LAST parts, where a
front end that checked as it wrote would already have written the first cards); a missing card, or another card in
a part's slot, is refused unless --force (the App offers no --force, so it must refuse as the core does without
it); a part that fails puts back the cards already applied; a keep nobody confirms reverts every card; a signal
reverts every card.

"Only through the core, no second implementation" is checked three ways: each front end's decision must equal the
core's, down to the exact sequence of card writes; every write must come from tuner.actions code (the recording
backend looks at who called it); and a deliberately changed core rule changes what every front end does.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.tui.helpers import FakeClock
from tuner import cli
from tuner.actions.profile_apply import plan_rig_apply, prepare_rig_apply
from tuner.app.state import BisectState
from tuner.app.tuner_app import TunerApp
from tuner.app.words import for_people
from tuner.backends.simulated import SimulatedBackend
from tuner.core import exit_codes
from tuner.core.errors import NotApplied, TunerError
from tuner.core.signals import FATAL as FATAL_SIGNALS
from tuner.profiles import RigPart, build_rig_profile, save_profile
from tuner.screens.dialogs import KeepOrRevertDialog, TextInputDialog
from tuner.tuning import journal

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "tuner" / "actions"
BACKENDS = REPO / "tuner" / "backends"
VALUES = (-40, -55, -30)  # the rig profile's parts, proven on sim0, sim1, sim2
NAME = "rig"


# --- the table ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RigCase:
    id: str
    expect: tuple  # ("kept",) | ("reverted", "not confirmed" | "interrupted") | ("refused", exit code)
    settings: tuple[int, ...]  # what every card in the machine holds afterwards
    gpus: int = 3  # cards in the machine (the profile has three parts)
    values: tuple[int, ...] = VALUES
    replaced: int | None = None  # this part's slot now holds another card of the same model (another serial)
    unsafe: tuple[tuple[str, int], ...] = ()  # (card, value) on its unsafe list
    before: tuple[int, ...] | None = None  # what the cards hold before (default: stock)
    fail_on: str | None = None  # this card does not take its part's value (read back differs)
    force: bool = False  # --force (the core's force=True); the App has no such option
    answer: str = "keep"  # keep | no (not confirmed) | signal (SIGTERM while every card waits for keep)


CASES = [
    RigCase("every card applied with one keep", ("kept",), VALUES),
    RigCase("a part out of its card's range: no card written", ("refused", exit_codes.USAGE), (0, 0, 0),
            values=(-40, -55, -205)),
    RigCase("a part beyond its card's unsafe value: no card written", ("refused", exit_codes.USAGE), (0, 0, 0),
            unsafe=(("sim2", -25),)),
    RigCase("a missing card is refused: no card written", ("refused", exit_codes.USAGE), (0, 0), gpus=2),
    RigCase("a missing card with --force: the others applied", ("kept",), (-40, -55), gpus=2, force=True),
    RigCase("another card in a part's slot is refused: no card written", ("refused", exit_codes.USAGE), (0, 0, 0),
            replaced=2),
    RigCase("another card in a part's slot with --force", ("kept",), VALUES, replaced=2, force=True),
    RigCase("a failed part puts back the cards already applied", ("refused", exit_codes.HARDWARE), (-10, 0, 0),
            before=(-10, 0, 0), fail_on="sim1"),
    RigCase("an unconfirmed keep reverts every card", ("reverted", "not confirmed"), (-10, 0, 0),
            before=(-10, 0, 0), answer="no"),
    RigCase("a signal reverts every card", ("reverted", "interrupted"), (0, 0, 0), answer="signal"),
]


# --- the rig: simulated cards in PCI slots that record every write and who made it -------------------------------
class RecordingRig(SimulatedBackend):
    """Simulated cards in slots 0000:03..05:00.0 (so a replaced card is found by its slot) that log every write
    (apply, reset, lock clock) and every write not made by tuner.actions code."""

    def __init__(self, case: RigCase, *, signal_on_last: bool = False):
        super().__init__(gpus=case.gpus)
        self.case, self.signal_on_last = case, signal_on_last
        self.writes: list[tuple] = []
        self.outside_core: list[str] = []
        self.recording = False  # on once the test has set the cards up

    def devices(self):
        return [replace(d, pci_slot=f"0000:0{i + 3}:00.0") for i, d in enumerate(super().devices())]

    def _record(self, *write) -> None:
        if not self.recording:
            return
        self.writes.append(write)
        caller = next((Path(f.filename) for f in reversed(traceback.extract_stack()[:-2])
                       if Path(f.filename).is_relative_to(REPO / "tuner")
                       and not Path(f.filename).is_relative_to(BACKENDS)), None)
        if caller is None or not caller.is_relative_to(CORE):
            self.outside_core.append(f"{write} written from {caller}")

    def apply(self, device_id: str, value: int, *, allow_overvolt: bool = False):
        self._record("apply", device_id, value)
        if device_id == self.case.fail_on and value == VALUES[int(device_id[-1])]:
            raise NotApplied(f"{device_id}: wrote {value:+d} mV, read back +0 mV", "the driver refused the value")
        knob = super().apply(device_id, value, allow_overvolt=allow_overvolt)
        if self.signal_on_last and value == VALUES[self.case.gpus - 1] and device_id == f"sim{self.case.gpus - 1}":
            # every card is applied: a SIGTERM now, as from `kill` while the keep-or-revert waits
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, "nothing guards the applied cards"
            signal.raise_signal(signal.SIGTERM)
        return knob

    def reset(self, device_id: str):
        self._record("reset", device_id)
        recording, self.recording = self.recording, False  # the simulated reset's own inner write is not another
        try:
            return super().reset(device_id)
        finally:
            self.recording = recording

    def set_lock_clock(self, device_id: str, mhz: int) -> None:
        self._record("lock", device_id, mhz)
        super().set_lock_clock(device_id, mhz)  # type: ignore[misc]

    def settings(self) -> tuple[int, ...]:
        return tuple(self.knob(f"sim{i}").current for i in range(self.case.gpus))


def make_rig(case: RigCase, **kw) -> RecordingRig:
    """The machine as the case has it, the profile saved from the three-card rig it was proven on."""
    proven_on = RecordingRig(replace(case, gpus=3))
    devices = proven_on.devices()
    if case.replaced is not None:  # the card it was proven on was sold; another of the model sits in its slot
        devices[case.replaced] = replace(devices[case.replaced], serial="SOLD-AND-REPLACED")
    parts = [RigPart(d, proven_on.knob(d.id), v) for d, v in zip(devices, case.values, strict=True)]
    save_profile(build_rig_profile(NAME, parts, rig={"backend": "gloo", "attempts": 1}, kernel="6.14.0-test"),
                 overwrite=True)
    backend = RecordingRig(case, **kw)
    for i in range(case.gpus):  # the cards share their state with the previous front end's: start afresh
        SimulatedBackend.reset(backend, f"sim{i}")
    for i, value in enumerate(case.before or ()):
        SimulatedBackend.apply(backend, f"sim{i}", value)
    for device_id, value in case.unsafe:
        journal.add_unsafe(device_id, value, unit="mV", kind="hang", reason="froze in an earlier trial", edge=True)
    backend.recording = True
    return backend


def decision(backend: RecordingRig, outcome: tuple) -> tuple:
    """What a front end decided, what every card holds after it, and every write it made, in order. Every write
    must have been made by tuner.actions code (RigChange and the PendingChanges it holds), never by a front end's
    own loop."""
    assert backend.outside_core == [], backend.outside_core
    return (*outcome, backend.settings(), tuple(backend.writes))


# --- the three front ends -----------------------------------------------------------------------------------------
class Interrupted(Exception):
    """The core's view of a signal: the front end leaves the change unkept (and the `with` reverts it)."""


def through_core(case: RigCase, *, force: bool | None = None) -> tuple:
    from tuner.profiles import load_profile

    backend = make_rig(case)
    try:
        plan = plan_rig_apply(backend, load_profile(NAME), force=case.force if force is None else force)
        change = prepare_rig_apply(backend, plan, timeout_s=15)
        try:
            with change:  # applies every card; a part that fails has put the others back and raised
                if case.answer == "signal":
                    raise Interrupted
                if case.answer == "keep":
                    change.keep()
        except Interrupted:
            return decision(backend, ("reverted", "interrupted"))
    except TunerError as e:
        return decision(backend, ("refused", e.exit_code, e.one_line()))
    return decision(backend, ("kept",) if change.kept else ("reverted", "not confirmed"))


def through_cli(case: RigCase, monkeypatch, capsys) -> tuple:
    backend = make_rig(case, signal_on_last=case.answer == "signal")
    monkeypatch.setattr("tuner.actions.context.open_backend", lambda **_kw: backend)
    argv = ["--simulate", "apply", NAME] + (["--force"] if case.force else []) + (
        ["--yes"] if case.answer == "keep" else [])
    read_fd, write_fd = os.pipe()  # the prompt reads a real file descriptor: answer "n", or nothing (a signal)
    os.write(write_fd, b"n\n" if case.answer == "no" else b"")
    stdin = io.TextIOWrapper(io.FileIO(read_fd, "r"))
    monkeypatch.setattr(sys, "stdin", stdin)
    capsys.readouterr()
    try:
        code = cli.main(argv)
    finally:
        stdin.close()
        os.close(write_fd)
    err = capsys.readouterr().err
    if code == exit_codes.OK:
        return decision(backend, ("kept",))
    if code in (exit_codes.NOT_CONFIRMED, exit_codes.INTERRUPTED):
        return decision(backend, ("reverted", "not confirmed" if code == exit_codes.NOT_CONFIRMED else "interrupted"))
    [line] = [x for x in err.splitlines() if x.startswith("tuner: error: ")]
    return decision(backend, ("refused", code, line.removeprefix("tuner: error: ")))


def bisect_screen_applies(case: RigCase) -> bool:
    """The Bisect screen applies the rig it has just bisected: every card here, each its own (no --force)."""
    return case.gpus == 3 and case.replaced is None and not case.force


def finished_rig_bisect(case: RigCase) -> BisectState:
    """The App's state after a bisect of every card that confirmed the case's values together."""
    from tuner.tuning.job import BisectOutcome, CardOutcome

    ids = tuple(f"sim{i}" for i in range(3))
    settings = dict(zip(ids, case.values, strict=True))
    outcome = BisectOutcome(status="recommended", exit_code=0, settings=settings,
                            per_card={d: CardOutcome(status="recommended", exit_code=0, session=None) for d in ids})
    return BisectState(device_ids=ids, running=False, settings=settings, outcome=outcome)


async def through_app(case: RigCase, screen: str = "profiles") -> tuple:
    """The Profiles screen's `a` on the rig profile, or the Bisect screen's `a` on the result of a bisect of every
    card; keep-or-revert answered with `k` / `r`; a signal delivered to the handler run_app installs for every
    fatal signal, then run_app's make_safe (what runs after the App)."""
    backend = make_rig(case)
    app = TunerApp(backend=backend, clock=FakeClock(), sample_interval_s=None, doctor=list)
    outcome: tuple | None = None
    previous = {}
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        if screen == "bisect":
            app.bisect_all, app.bisect = True, finished_rig_bisect(case)
        await pilot.press("4" if screen == "profiles" else "3")
        await pilot.pause()
        await pilot.press("a")
        await app.workers.wait_for_complete()
        await pilot.pause()
        if not isinstance(app.screen, KeepOrRevertDialog):
            errors = [n.message for n in app._notifications if n.severity == "error"]
            assert errors, "the App neither applied nor refused"
            outcome = ("refused", None, errors[-1].replace("'bisect-result'", repr(NAME)))  # the result's name
        elif case.answer == "signal":
            for sig in FATAL_SIGNALS:  # as run_app does
                previous[sig] = signal.signal(sig, app.signal_safe_hang_up)
            try:
                signal.raise_signal(signal.SIGTERM)
                await pilot.pause()
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        else:
            await pilot.press("k" if case.answer == "keep" else "r")
            await app.workers.wait_for_complete()
            await pilot.pause()
            outcome = ("kept",) if app.pending is None and case.answer == "keep" else ("reverted", "not confirmed")
            if screen == "bisect" and case.answer == "keep":
                assert isinstance(app.screen, TextInputDialog)  # kept: the screen offers to save the rig profile
    if case.answer == "signal" and outcome is None:
        assert app.hung_up, "the signal did not end the App"
        app.make_safe()
        outcome = ("reverted", "interrupted")
    return decision(backend, outcome)


# --- the tests ----------------------------------------------------------------------------------------------------
@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request) -> RigCase:
    return request.param


def _check(case: RigCase, by_core: tuple) -> None:
    assert by_core[: len(case.expect)] == case.expect, by_core
    assert by_core[-2] == case.settings, by_core
    if case.expect == ("refused", exit_codes.USAGE):
        assert by_core[-1] == (), "a refused rig wrote to a card"


def _same(by_app: tuple, by_core: tuple) -> None:
    """The App's decision is the core's: the same outcome, cards and writes; a refusal's one line in a toast."""
    if by_core[0] == "refused":
        assert by_app[0] == "refused" and for_people(by_core[2]) in by_app[2], by_app
        assert by_app[-2:] == by_core[-2:], by_app
    else:
        assert by_app == by_core


async def test_every_front_end_decides_as_the_core(case, monkeypatch, capsys):
    by_core = through_core(case)
    _check(case, by_core)
    by_cli = through_cli(case, monkeypatch, capsys)
    assert by_cli == by_core
    by_app = await through_app(case)
    # the App offers no --force: it must decide as the core does without it
    _same(by_app, through_core(case, force=False) if case.force else by_core)
    if bisect_screen_applies(case):
        _same(await through_app(case, "bisect"), by_core)


# --- a changed core rule changes every front end ------------------------------------------------------------------
@pytest.fixture
def stricter_core(monkeypatch):
    """The core's card finder, changed: card[1]'s card is never found. A front end with its own copy of the rule
    would still apply the rig."""
    from tuner.actions import profile_apply

    original = profile_apply.find_part_card

    def find_part_card(part, devices):
        if part.device.serial and part.device.serial.endswith("-01"):
            return None, "missing"
        return original(part, devices)

    monkeypatch.setattr(profile_apply, "find_part_card", find_part_card)


async def test_every_front_end_follows_a_changed_core_rule(stricter_core, monkeypatch, capsys):
    case = CASES[0]  # applies on the real core
    by_core = through_core(case)
    assert by_core[:2] == ("refused", exit_codes.USAGE) and "card[1]" in by_core[2] and by_core[-1] == ()
    assert through_cli(case, monkeypatch, capsys) == by_core
    _same(await through_app(case), by_core)
