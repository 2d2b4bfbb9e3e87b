"""`tuner screen --profile NAME`: each card checked against the profile as `tuner apply` checks it, screened at the
profile's setting (applied for the screen only) and always put back to its own setting; the refusals (one line, a
code, the card untouched); the reference bundled with the profile. Engine runs are faked (test_card_screen.py's
`Engines`), except one short end-to-end run through the real entry point."""

from __future__ import annotations

import json
import platform
import threading
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest

from tests.cli_helpers import run_tuner
from tests.profiles.helpers import tuner
from tests.screen.helpers import LOAD, bundle, state
from tests.screen.test_card_screen import Engines
from tuner.actions.screen import verdict as v
from tuner.actions.screen.attribution import TIERS
from tuner.actions.screen.fleet import Screen
from tuner.actions.screen.profile_setting import ProfileRefused
from tuner.backends.simulated import SimulatedBackend
from tuner.core import exit_codes
from tuner.core.card_lock import CardLock
from tuner.core.errors import TunerError
from tuner.profiles import build_profile, save_profile
from tuner.profiles import reference_bundle as rb
from tuner.tuning import journal
from tuner.tuning.kernel_log import NullWatcher

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / v.SCHEMA_FILE).read_text())
OWN_MV = -10  # the card's own setting before every screen here
PROFILE_MV = -30


@pytest.fixture
def backend(tmp_path):
    backend = SimulatedBackend(state_path=tmp_path / "sim")
    backend.apply("sim0", OWN_MV)
    return backend


def profile_for(backend, value=PROFILE_MV, name="p", **device):
    d = replace(backend.device("sim0"), **device)
    return build_profile(name, d, backend.knob("sim0"), value, kernel=platform.release())


def screen(tmp_path, backend, profile, engines, **kw):
    return Screen(backend, ["sim0"], bundle(tmp_path), tmp_path / "A.ref", TIERS["quick"], engine_factory=engines,
                  kernel_watcher_factory=NullWatcher, profile=profile, **kw)


def watch(backend, engines_plans, monkeypatch):
    """Engines whose every run records the card's setting when it starts; every `keep` records what it kept."""
    seen, kept = [], []
    plans = [{**p, "on_start": lambda run: seen.append(backend.knob("sim0").current)} for p in engines_plans]
    monkeypatch.setattr(backend, "keep", lambda device_id: kept.append(backend.knob(device_id).current))
    return Engines(*plans), seen, kept


def test_screened_at_the_profile_setting_and_put_back(tmp_path, backend, monkeypatch):
    engines, seen, kept = watch(backend, [{}], monkeypatch)
    lines = []
    report = screen(tmp_path, backend, profile_for(backend), engines,
                    on_event=lambda device, event: lines.append(event) if isinstance(event, str) else None).run()
    [card] = report.verdicts
    assert seen == [PROFILE_MV]  # the engine ran at the profile's setting
    assert backend.knob("sim0").current == OWN_MV  # and the card is back at its own
    assert card.verdict == "pass"
    assert (card.setting.value, card.setting.source, card.setting.left_at) == (PROFILE_MV, "profile p", OWN_MV)
    assert "applied for this screen only" in card.reason and "`tuner apply p`" in card.reason
    assert kept == [OWN_MV]  # only the card's own setting is ever kept (through a helper it would be put back)
    assert any("for this screen only: -10 -> -30 mV" in line for line in lines)
    jsonschema.validate(json.loads(v.encode(report)), SCHEMA)


def test_a_fault_at_the_profile_setting_goes_to_stock_then_back_to_the_card_own(tmp_path, backend, monkeypatch):
    engines, seen, kept = watch(backend, [{"fail_at": 4}, {"fail_at": 2}, {}], monkeypatch)
    [card] = screen(tmp_path, backend, profile_for(backend), engines).run().verdicts
    assert seen == [PROFILE_MV, PROFILE_MV, 0]  # screen and repeat at the profile's, the stock run at stock
    assert (card.verdict, card.attribution, card.action) == ("fail", "persistent at this setting", "raise voltage")
    assert "back to -30 mV" in card.reason  # the stock run returned to the setting screened...
    assert backend.knob("sim0").current == OWN_MV and card.setting.left_at == OWN_MV  # ...the screen to the card's
    assert PROFILE_MV not in kept and kept == [OWN_MV]  # the profile's value is never confirmed to a helper


def test_a_stopped_screen_puts_the_card_back(tmp_path, backend):
    engines = Engines({"block": True})
    s = screen(tmp_path, backend, profile_for(backend), engines)
    out = {}
    worker = threading.Thread(target=lambda: out.update(report=s.run()))
    worker.start()
    while not engines.runs:
        worker.join(0.05)
    assert backend.knob("sim0").current == PROFILE_MV
    s.stop()  # what Ctrl-C, SIGTERM and SIGHUP do (fleet.Screen.run on the main thread's exception)
    worker.join(30)
    [card] = out["report"].verdicts
    assert card.verdict == "retest" and backend.knob("sim0").current == OWN_MV


def test_another_card_of_the_model_is_screened_with_apply_warning(tmp_path, backend):
    lines = []
    report = screen(tmp_path, backend, profile_for(backend, serial="SIM-9999-99"), Engines({}),
                    on_event=lambda device, event: lines.append(event) if isinstance(event, str) else None).run()
    assert report.verdicts[0].verdict == "pass" and backend.knob("sim0").current == OWN_MV
    assert any(line.startswith("warning: ") and "SIM-9999-99" in line for line in lines)


def test_an_incomparable_card_is_never_written(tmp_path, monkeypatch):
    backend = SimulatedBackend(state_path=tmp_path / "sim", driver="999.1")
    backend.apply("sim0", OWN_MV)
    writes = []
    real_apply = backend.apply
    monkeypatch.setattr(backend, "apply", lambda *a, **k: writes.append(a) or real_apply(*a, **k))
    engines = Engines()
    [card] = screen(tmp_path, backend, profile_for(backend), engines).run().verdicts
    assert card.verdict == "incomparable" and engines.runs == [] and writes == []
    assert card.setting.value == card.setting.left_at == OWN_MV


@pytest.mark.parametrize("make, words", [
    (lambda b: profile_for(b, pci_id="1002:7550"), "another model"),
    (lambda b: profile_for(b, vendor="nvidia"), "vendor mismatch"),
    (lambda b: profile_for(b, value=-205), "-205"),
])
def test_refusals_change_nothing(tmp_path, backend, monkeypatch, make, words):
    profile = make(backend)
    writes = []
    monkeypatch.setattr(backend, "apply", lambda *a, **k: writes.append(a))
    engines = Engines()
    with pytest.raises(TunerError) as e:
        screen(tmp_path, backend, profile, engines).run()
    assert e.value.exit_code == exit_codes.USAGE and words in e.value.message
    assert e.value.message.startswith("refusing to screen sim0 at 'p'") and "apply" not in (e.value.remedy or "")
    assert engines.runs == [] and writes == [] and backend.knob("sim0").current == OWN_MV


def test_a_value_on_the_unsafe_list_is_refused(tmp_path, backend):
    journal.add_unsafe("sim0", -25, unit="mV", kind="hang", reason="froze in a trial", edge=True)
    engines = Engines()
    with pytest.raises(ProfileRefused) as e:
        screen(tmp_path, backend, profile_for(backend), engines).run()
    assert e.value.exit_code == exit_codes.USAGE and "failed hard on sim0" in e.value.message
    assert "--ignore-unsafe" not in (e.value.remedy or "")  # a screen never overrides the unsafe list
    assert engines.runs == [] and backend.knob("sim0").current == OWN_MV


def test_every_card_is_checked_before_any_is_written(tmp_path, monkeypatch):
    backend = SimulatedBackend(gpus=2, state_path=tmp_path / "sim")
    journal.add_unsafe("sim1", -30, unit="mV", kind="hang", reason="froze", edge=True)
    writes = []
    monkeypatch.setattr(backend, "apply", lambda *a, **k: writes.append(a))
    with pytest.raises(ProfileRefused, match="sim1"):
        Screen(backend, ["sim0", "sim1"], bundle(tmp_path), tmp_path / "A.ref", TIERS["quick"],
               engine_factory=Engines(), kernel_watcher_factory=NullWatcher, profile=profile_for(backend)).run()
    assert writes == []


# --- through the entry point ---------------------------------------------------------------------------------------


def saved_with_reference(tmp_path, capsys, *, ref: bool = True, driver: str | None = None):
    """A profile `p` in this test's store (its card at -10 mV), with a reference bundled beside it."""
    assert tuner(capsys, "--simulate", "set", "--device", "sim0", "--offset", str(OWN_MV), "--yes")[0] == 0
    backend = SimulatedBackend(state_path=tmp_path / "other")
    path = save_profile(profile_for(backend), overwrite=True)
    if ref:
        rb.write_beside(bundle(tmp_path, driver=driver), path)
    return path


def card_setting(capsys) -> int:
    code, out, _ = tuner(capsys, "--simulate", "status", "--device", "sim0", "--json")
    assert code == 0
    return json.loads(out)["knob"]["current"]


def test_the_bundled_reference_is_used_and_said(tmp_path, capsys):
    """No --reference: the profile's NAME.ref. The card reports another driver, so the verdict is incomparable and
    no engine runs (nothing written either)."""
    saved_with_reference(tmp_path, capsys)
    code, out, err = tuner(capsys, "--simulate", "--sim-driver", "999.1", "screen", "--profile", "p", "--device",
                           "sim0", *LOAD, "--json")
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    assert code == exit_codes.SCREEN_INCOMPARABLE
    assert doc["reference"]["bundled_with"] == "p" and doc["reference"]["path"].endswith("p.ref")
    assert "using the reference bundled with profile 'p'" in err
    assert card_setting(capsys) == OWN_MV


@pytest.mark.parametrize("argv, words", [
    (("--profile", "p"), "no bundled reference"),
    ((), "--reference FILE is required"),
    (("--profile", "nope"), "no profile named 'nope'"),
])
def test_missing_inputs_are_one_line_exit_2(tmp_path, capsys, argv, words):
    saved_with_reference(tmp_path, capsys, ref=False)
    code, out, err = tuner(capsys, "--simulate", "screen", *argv, "--device", "sim0", *LOAD)
    assert code == exit_codes.USAGE and out == ""
    errors = [line for line in err.splitlines() if line.startswith("tuner: error:")]
    assert len(errors) == 1 and words in errors[0] and "Traceback" not in err
    assert card_setting(capsys) == OWN_MV


def test_a_busy_card_is_refused_untouched(tmp_path, capsys):
    saved_with_reference(tmp_path, capsys)
    with CardLock("sim0", "tuner screen (another one)"):
        code, _out, err = tuner(capsys, "--simulate", "screen", "--profile", "p", "--device", "sim0", *LOAD)
    assert code == exit_codes.BUSY and "tuner screen (another one)" in err
    assert card_setting(capsys) == OWN_MV


def test_end_to_end_at_a_profile_setting(tmp_path, reference):
    """The real engine: the issue's screen at a profile's setting, its bundled reference (recorded at stock on
    another machine), the card back at its own setting afterwards."""
    env = state(tmp_path, "node")
    node = ("--simulate", "--sim-seed", "1")  # another machine than the recorder's (and than the profile's card)
    assert run_tuner(*node, "set", "--device", "sim0", "--offset", str(OWN_MV), "--yes", env=env).returncode == 0
    profile = profile_for(SimulatedBackend(state_path=tmp_path / "other"))  # proven on another card of the model
    path = tmp_path / "p.toml"
    path.write_text(profile.to_toml())
    (tmp_path / "p.ref").write_bytes(reference.read_bytes())
    r = run_tuner(*node, "screen", "--profile", str(path), "--device", "sim0", *LOAD, "--json", env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    [card] = doc["verdicts"]
    assert card["verdict"] == "pass" and card["evidence"]["steps_compared"] > 0
    setting = card["setting"]
    assert (setting["value"], setting["source"], setting["left_at"]) == (PROFILE_MV, "profile p", OWN_MV)
    assert "using the reference bundled with profile 'p'" in r.stderr and "applied for this screen only" in r.stderr
    status = run_tuner(*node, "status", "--device", "sim0", "--json", env=env)
    assert json.loads(status.stdout)["knob"]["current"] == OWN_MV


SIGNALLED = """
import os, platform, signal, sys, threading
from pathlib import Path
from tests.screen.helpers import bundle
from tests.screen.test_card_screen import Engines
from tuner.actions.screen.attribution import TIERS
from tuner.actions.screen.fleet import Screen
from tuner.backends.simulated import SimulatedBackend
from tuner.core import signals
from tuner.profiles import build_profile
from tuner.tuning.kernel_log import NullWatcher

tmp = Path(sys.argv[1])
signals.install(ends_process=True)  # as the `tuner` command: a fatal signal raises in the main thread
backend = SimulatedBackend(state_path=tmp / "sim")
backend.apply("sim0", -10)
profile = build_profile("p", backend.device("sim0"), backend.knob("sim0"), -30, kernel=platform.release())
signum = getattr(signal, sys.argv[2])
started = lambda run: threading.Timer(0.5, os.kill, (os.getpid(), signum)).start()  # the main thread is waiting
try:
    Screen(backend, ["sim0"], bundle(tmp), tmp / "A.ref", TIERS["quick"], engine_factory=Engines(
        {"block": True, "on_start": started}), kernel_watcher_factory=NullWatcher, profile=profile).run()
except (KeyboardInterrupt, signals.Terminated):
    print("interrupted at", backend.knob("sim0").current)
"""


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_fatal_signal_puts_the_card_back_before_the_screen_ends(tmp_path, signame):
    """The signal reaches the main thread while it waits for the card's thread: every card is put back before the
    exception leaves the screen. (Python 3.11's Thread.join, interrupted by a signal's exception, marks a running
    thread as ended, so the screen waits on its own events instead.) A process of its own: signals and fakes."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", SIGNALLED, str(tmp_path), signame], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.stdout.strip() == f"interrupted at {OWN_MV}", r.stderr
