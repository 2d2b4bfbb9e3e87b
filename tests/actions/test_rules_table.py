"""The safety rules as one table, run through every front end: the actions directly, the CLI (`tuner.cli.main`,
in-process, its backend factory pointed at the case's simulated card) and the App (Textual's pilot). Each case is
a card, an unsafe list and a request; all three front ends must reach the same decision (applied value, refusal
with the same message and exit code, a verify required, or a bisect started with the core's defaults).

Cases marked "regression" failed on the App before the rules moved into tuner.actions: the Tune screen applied a
value beyond one on the unsafe list, the Profiles screen did too, and the Bisect form always sent 10/5/10, which a
15 MHz card refuses.

A rig profile's apply (one part per card, one keep-or-revert for the whole rig) has its own table in
test_rig_rules_table.py, which also checks that every card write comes from tuner.actions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from tests.actions.fakes import ClockOffsetSim
from tests.tui.helpers import FakeClock
from tuner import cli
from tuner.actions.bisect import prepare_bisect
from tuner.actions.profile_apply import plan_profile_apply
from tuner.actions.setting import SetRequest, prepare_setting
from tuner.app.tuner_app import TunerApp
from tuner.app.words import BISECT, for_people
from tuner.backends.simulated import SimulatedBackend
from tuner.core.errors import TunerError
from tuner.core.models import Knob, KnobKind
from tuner.profiles import build_profile, save_profile
from tuner.screens.dialogs import ConfirmDialog, KeepOrRevertDialog
from tuner.tuning import journal
from tuner.tuning.job import BisectJob, BisectParams, search_plan_params

DEVICE = "sim0"


# --- the table ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SetValue:
    value: int


@dataclass(frozen=True)
class ApplyProfile:
    value: int
    proven_on: str = "same card"  # same card | same model | other model | other knob
    lock_clock_mhz: int | None = None


@dataclass(frozen=True)
class StartBisect:
    step: int | None = None  # None: the form's field left blank, the CLI's option left out


@dataclass(frozen=True)
class Case:
    id: str
    card: str  # "mV" (the simulated AMD-style card) or "MHz" (a 15 MHz clock-offset card)
    unsafe: tuple[int, ...]
    request: SetValue | ApplyProfile | StartBisect
    expect: tuple  # ("applied", value) | ("refused", exit code) | ("verify",) | ("started", step, res, margin)


CASES = [
    Case("set below the unsafe value", "mV", (-60,), SetValue(-50), ("applied", -50)),
    Case("set beyond the unsafe value (regression)", "mV", (-60,), SetValue(-70), ("refused", 2)),
    Case("set at the unsafe value", "mV", (-60,), SetValue(-60), ("refused", 2)),
    Case("set an overvolt", "mV", (), SetValue(10), ("refused", 2)),
    Case("set off the step", "mV", (), SetValue(-33), ("refused", 2)),
    Case("set outside the range", "mV", (), SetValue(-500), ("refused", 2)),
    Case("set MHz below the unsafe value", "MHz", (135,), SetValue(90), ("applied", 90)),
    Case("set MHz beyond the unsafe value", "MHz", (135,), SetValue(150), ("refused", 2)),
    Case("set MHz off the 15 MHz step", "MHz", (), SetValue(100), ("refused", 2)),
    Case("profile on its own card", "mV", (), ApplyProfile(-25), ("applied", -25)),
    Case("profile beyond the unsafe value (regression)", "mV", (-60,), ApplyProfile(-70), ("refused", 2)),
    Case("profile from another card of the model", "mV", (), ApplyProfile(-25, "same model"), ("verify",)),
    Case("profile from another model", "mV", (), ApplyProfile(-25, "other model"), ("refused", 2)),
    Case("profile for another knob kind", "mV", (), ApplyProfile(90, "other knob"), ("refused", 2)),
    Case("MHz profile with its lock clock", "MHz", (), ApplyProfile(90, lock_clock_mhz=2400), ("applied", 90, 2400)),
    Case("bisect defaults on a mV card", "mV", (), StartBisect(), ("started", 10, 5, 10)),
    Case("bisect defaults on a 15 MHz card (regression)", "MHz", (), StartBisect(), ("started", 30, 15, 30)),
    Case("bisect step off a 15 MHz card's grid", "MHz", (), StartBisect(step=10), ("refused", 2)),
]


# --- setting up a case --------------------------------------------------------------------------------------------
class Started(TunerError):
    """Raised by the patched BisectJob.run: the bisect got past every check (nothing is run)."""

    exit_code = 99


@pytest.fixture
def started(monkeypatch) -> list:
    """Every bisect that starts records its plan parameters here instead of running trials."""
    seen: list = []

    def run(job: BisectJob):
        knob = job.backend.knob(job.device_ids[0])
        plan = search_plan_params(knob, job.params.search())
        seen.append((plan.step, plan.resolution, plan.margin))
        raise Started("bisect started")

    monkeypatch.setattr(BisectJob, "run", run)
    return seen


def make_card(case: Case) -> SimulatedBackend:
    backend = ClockOffsetSim(gpus=1) if case.card == "MHz" else SimulatedBackend(gpus=1, vmin_mv=-52)
    for value in case.unsafe:
        journal.add_unsafe(DEVICE, value, unit=case.card, kind="hang", reason="froze in an earlier trial", edge=True)
    return backend


def make_profile(backend, request: ApplyProfile):
    device, knob = backend.device(DEVICE), backend.knob(DEVICE)
    if request.proven_on == "same model":
        device = replace(device, serial="SIM-9999-99")
    elif request.proven_on == "other model":
        device = replace(device, pci_id="1002:7550")
    elif request.proven_on == "other knob":
        knob = Knob(KnobKind.CLOCK_OFFSET, "MHz", stock=0, current=0, min=0, max=300, step=15,
                    aggressive_direction=1, lock_clock_mhz=2500)
    profile = build_profile("case", device, knob, request.value, kernel="6.14.0-test")
    if request.lock_clock_mhz is not None:
        profile = replace(profile, setting=replace(profile.setting, lock_clock_mhz=request.lock_clock_mhz))
    save_profile(profile, overwrite=True)
    return profile


def applied(backend) -> tuple:
    """What the card holds: the value and the lock clock it is defined at (None on a mV card)."""
    knob = backend.knob(DEVICE)
    return ("applied", knob.current, knob.lock_clock_mhz)


def refused(error: TunerError, *, exit_code: int | None = None) -> tuple:
    return ("refused", error.exit_code if exit_code is None else exit_code, error.one_line())


# --- the three front ends -----------------------------------------------------------------------------------------
def through_actions(case: Case, backend, started) -> tuple:
    request = case.request
    try:
        if isinstance(request, SetValue):
            change = prepare_setting(backend, SetRequest(DEVICE, request.value))
            change.apply()
            change.keep()
        elif isinstance(request, ApplyProfile):
            plan = plan_profile_apply(backend, make_profile(backend, request), DEVICE, verify=True)
            if plan.verify_required:
                return ("verify",)
            change = prepare_setting(backend, plan.set_request())  # the lock clock with the value, as the UI does
            change.apply()
            change.keep()
        else:
            prepare_bisect(backend, DEVICE, BisectParams(step=request.step, trial_s=1.0, confirm_s=1.0)).run()
    except Started:
        return ("started", *started[-1])
    except TunerError as e:
        return refused(e)
    return applied(backend)


def through_cli(case: Case, backend, started, monkeypatch, capsys) -> tuple:
    monkeypatch.setattr("tuner.actions.context.open_backend", lambda **_kw: backend)
    request = case.request
    if isinstance(request, SetValue):
        argv = ["set", "--device", DEVICE, "--offset", str(request.value), "--yes"]
    elif isinstance(request, ApplyProfile):
        make_profile(backend, request)
        argv = ["apply", "case", "--device", DEVICE, "--yes"]
    else:
        argv = ["bisect", "--device", DEVICE, "--trial", "1s", "--confirm", "1s"]
        argv += [] if request.step is None else ["--step", str(request.step)]
    capsys.readouterr()
    code = cli.main(["--simulate", *argv])
    err = capsys.readouterr().err
    if code == Started.exit_code:
        return ("started", *started[-1])
    if code == 0:
        return applied(backend)
    [line] = [x for x in err.splitlines() if x.startswith("tuner: error: ")]
    message = line.removeprefix("tuner: error: ")
    if isinstance(request, ApplyProfile) and "--verify" in message and "another card" in message:
        return ("verify",)  # the CLI asks for --verify where the App offers the trial
    return ("refused", code, message)


async def through_app(case: Case, backend, started) -> tuple:
    app = TunerApp(backend=backend, clock=FakeClock(), sample_interval_s=None, doctor=list)
    request = case.request
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause()
        if isinstance(request, SetValue):
            app.apply_setting(DEVICE, request.value)
        elif isinstance(request, ApplyProfile):
            app.apply_profile(make_profile(backend, request), DEVICE)
        else:
            await pilot.press("3")
            await pilot.pause()
            if request.step is not None:
                app.screen.query_one("#in-step").value = str(request.step)
            app.screen.query_one("#in-trial").value = "1s"
            app.screen.query_one("#in-confirm").value = "1s"
            await pilot.press("b")
        for _ in range(3):
            await app.workers.wait_for_complete()
            await pilot.pause()
        if isinstance(app.screen, KeepOrRevertDialog):
            await pilot.press("k")
            await app.workers.wait_for_complete()
            await pilot.pause()
            return applied(backend)
        if isinstance(app.screen, ConfirmDialog):
            return ("verify",)
        if started:
            return ("started", *started[-1])
        errors = [n.message for n in app._notifications if n.severity == "error"]
        assert errors, "the App neither applied, asked, started nor refused"
        return ("refused", None, errors[-1])


# --- the tests ----------------------------------------------------------------------------------------------------
def _expected(case: Case, decision: tuple) -> None:
    assert decision[: len(case.expect)] == case.expect, decision


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request) -> Case:
    return request.param


async def test_all_front_ends_decide_the_same(case, started, monkeypatch, capsys):
    by_actions = through_actions(case, make_card(case), started)
    _expected(case, by_actions)
    # each front end starts from the same card state (the actions above may have changed the card)
    backend = make_card(case)
    backend.reset(DEVICE)
    by_cli = through_cli(case, backend, started, monkeypatch, capsys)
    assert by_cli == by_actions
    backend.reset(DEVICE)
    by_app = await through_app(case, backend, started)
    if by_actions[0] == "refused":
        # the same one line, in a toast, in the UI's words (tuner.app.words: a CLI flag becomes what the UI offers)
        said = {for_people(by_actions[2], here=here) for here in (None, BISECT)}
        assert by_app[0] == "refused" and any(line in by_app[2] for line in said), by_app
    else:
        assert by_app == by_actions
