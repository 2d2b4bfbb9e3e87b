"""One writer per card, machine-wide, through the helper (issue 22): a bisect holds its card between trials too
(Backend.holding: the helper's claim), and `tuner reset --force` puts a card back that another user holds."""

from __future__ import annotations

import json

from tests.helper.conftest import HELLO, as_user, needs_root, wait_until
from tests.helper.test_cli_through_helper import tuner
from tests.helper.test_machine_state import sim_card
from tests.tuning.fake_engine import FakeEngine
from tuner.backends.helper_client import HelperBackend
from tuner.core.card_lock import CardBusy
from tuner.core.errors import TunerError
from tuner.tuning.events import TrialFinished
from tuner.tuning.job import BisectJob, BisectParams

pytestmark = needs_root


def test_between_a_bisects_trials_another_client_is_busy(accounts, helpers, tmp_path, monkeypatch):
    """At each TrialFinished the trial has ended and the card is at stock: only the bisect's claim still holds
    it. Another client's `set` then is busy, naming the bisect."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    group = accounts.group()
    helper = helpers(group, fake_amd=False, extra=("--sim-vmin", "-30"))
    mine = HelperBackend.connect(helper.socket, client="test bisect")
    other = HelperBackend.connect(helper.socket, client="test other")
    answers: list[object] = []

    def on_event(event: object) -> None:
        if isinstance(event, TrialFinished) and len(answers) < 2:
            try:
                answers.append(other.apply("sim0", -10))
                other.reset("sim0")
            except TunerError as e:
                answers.append(e)

    try:
        job = BisectJob(mine, "sim0", BisectParams(trial_s=1, confirm_s=2, step=20, resolution=10), on_event,
                        engine_factory=FakeEngine())
        job.run()
        assert len(answers) == 2 and all(isinstance(a, CardBusy) for a in answers), answers
        assert all("auto-bisect of sim0" in a.message for a in answers)  # type: ignore[union-attr]
        # released when the bisect ends: the other client may write now
        assert other.apply("sim0", -10).current == -10
        other.reset("sim0")
    finally:
        mine.close()
        other.close()


def test_reset_force_puts_back_a_card_another_user_holds(accounts, helpers):
    group = accounts.group()
    first, second = accounts.user(group), accounts.user(group)
    helper = helpers(group, fake_amd=False)
    holder = as_user(first, "tests.helper.client", str(helper.socket), json.dumps(HELLO),
                     json.dumps({"op": "set", "card": "sim0", "value": -50, "lease_s": 600}), "@hold")
    assert holder.stdout is not None
    assert json.loads(holder.stdout.readline())["ok"] and json.loads(holder.stdout.readline())["ok"]
    assert holder.stdout.readline().strip() == "HOLDING"
    wait_until(lambda: sim_card(helper).knob("sim0").current == -50, 10, "the holder's value")
    busy = tuner(second, "--simulate", "reset", "--device", "sim0", socket=helper.socket)
    assert busy.returncode != 0 and "busy" in busy.stderr, busy.stderr
    forced = tuner(second, "--simulate", "reset", "--device", "sim0", "--force", socket=helper.socket)
    assert forced.returncode == 0, forced.stderr
    assert sim_card(helper).knob("sim0").current == 0
