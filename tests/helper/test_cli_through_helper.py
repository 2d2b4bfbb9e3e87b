"""`tuner` as a user, through the helper: commands work unchanged, a confirmed value stays, a user outside the group
reads but cannot write (exit 9), and a bisect through the helper recommends what it does in-process (issue 22)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.helper.conftest import as_user, needs_root
from tests.helper.test_machine_state import sim_card

pytestmark = needs_root


def tuner(account, *args: str, socket=None, env: dict | None = None, timeout_s: float = 120):
    full_env = {"TUNER_HELPER_SOCKET": str(socket)} if socket else {}
    proc = as_user(account, "tuner", *args, env={**full_env, **(env or {})})
    out, err = proc.communicate(timeout=timeout_s)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_member_sets_and_resets_through_the_helper_and_a_confirmed_value_stays(accounts, helpers):
    group = accounts.group()
    member = accounts.user(group)
    helper = helpers(group, fake_amd=False)
    listed = tuner(member, "--simulate", "list", socket=helper.socket)
    assert listed.returncode == 0 and "[SIMULATED]" in listed.stdout, listed.stderr
    done = tuner(member, "--simulate", "set", "--device", "sim0", "--offset", "-50", "--yes", socket=helper.socket)
    assert done.returncode == 0, done.stderr
    assert sim_card(helper).knob("sim0").current == -50  # kept: the client confirmed before it left
    assert tuner(member, "--simulate", "set", "--device", "sim0", "--offset", "-500", "--yes",
                 socket=helper.socket).returncode == 2
    assert tuner(member, "--simulate", "reset", socket=helper.socket).returncode == 0
    assert sim_card(helper).knob("sim0").current == 0
    # simulated options the helper was not started with: refused, not silently different cards
    other = tuner(member, "--simulate", "--sim-gpus", "2", "list", socket=helper.socket)
    assert other.returncode == 2 and "TUNER_HELPER_SOCKET" in other.stderr


def test_outside_the_group_reads_in_process_and_a_write_exits_9(accounts, helpers, world):
    group = accounts.group()
    helper = helpers(group)  # on a fake amdgpu tree, which any user can read
    home = world / "nobody"
    home.mkdir()
    os.chown(home, 65534, 65534)
    env = {"TUNER_SYSFS_ROOT": str(helper.sysroot), "HOME": str(home)}
    listed = tuner(None, "list", socket=helper.socket, env=env)
    assert listed.returncode == 0 and "0000:10:00.0" in listed.stdout, listed.stderr
    assert listed.stderr.count("\n") == 1 and "read-only" in listed.stderr and "usermod -aG" in listed.stderr
    refused = tuner(None, "set", "--device", "0000:10:00.0", "--offset", "-50", "--yes", socket=helper.socket,
                    env=env)
    assert refused.returncode == 9, refused.stderr
    assert "nothing was changed" in refused.stderr.splitlines()[-1]
    assert helper.knob("0000:10:00.0")["current"] == 0
    # no helper at all: reading still works; a write says how to install it, exit 9
    nobody = {**env, "TUNER_HELPER_SOCKET": str(helper.socket.parent / "missing.sock")}
    assert tuner(None, "list", env=nobody).returncode == 0
    missing = tuner(None, "set", "--device", "0000:10:00.0", "--offset", "-50", "--yes", env=nobody)
    assert missing.returncode == 9 and "docs/helper.md" in missing.stderr.splitlines()[-1], missing.stderr


@pytest.mark.heavy(seconds=24)
@pytest.mark.timeout(900)  # a loaded machine makes trials too short to count, and the bisect runs them again
def test_a_bisect_through_the_helper_recommends_what_it_does_in_process(accounts, helpers):
    """The card of tests/tuning/test_bisect_engine.py's in-process end-to-end test (limit -22 mV) with a coarser
    search, five trials (baseline, replay, -20 pass, -40 fail, confirm -20), so it recommends -10 mV confirmed at
    -20 as in-process; here the tuner runs as a member, the helper writes. -40 is 18 mV past the limit: a fault in
    about every other step, so even 3 s trials catch it."""
    group = accounts.group()
    member = accounts.user(group)
    helper = helpers(group, fake_amd=False, extra=("--sim-vmin", "-22"))
    proc = tuner(member, "--simulate", "--sim-vmin", "-22", "bisect", "--device", "sim0", "--trial", "3s",
                 "--confirm", "3s", "--preset", "tiny", "--step", "20", "--resolution", "20", "--margin", "10",
                 socket=helper.socket, timeout_s=850)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "recommendation for Simulated RDNA-class GPU [SIMULATED]: -10 mV (confirmed -20" in proc.stdout
    assert sim_card(helper).knob("sim0").current == 0  # every trial put the card back
    log = (helper.state_dir / "log.jsonl").read_text()
    assert f'"uid": {member.uid}' in log and '"value": -40' in log  # the writes went through the helper


def test_a_simulated_rig_with_one_limit_per_card_is_served_to_a_tuner_with_the_same_options(accounts, helpers):
    """`--sim-vmin -52,-67` (one limit per card): the helper refused it as "expected one argument" (its parser took
    the comma list for an option), so the remedy the tuner gives ("start the helper with the same --sim options")
    could not be followed for a simulated rig."""
    group = accounts.group()
    member = accounts.user(group)
    helper = helpers(group, fake_amd=False, extra=("--sim-gpus", "2", "--sim-vmin", "-52,-67"))
    listed = tuner(member, "--simulate", "--sim-gpus", "2", "--sim-vmin", "-52,-67", "list", socket=helper.socket)
    assert listed.returncode == 0 and "sim1" in listed.stdout, listed.stderr
