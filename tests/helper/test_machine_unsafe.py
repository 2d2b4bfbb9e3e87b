"""One unsafe list per machine (issue 22): a value that hung a trial for one user is refused for another, whose
home never saw it, by `tuner set` and by a bisect, because the journal routes through the helper (docs/helper.md,
"The safety state through the backend")."""

from __future__ import annotations

import json

from tests.helper.conftest import as_user, needs_root
from tests.helper.test_cli_through_helper import tuner
from tests.helper.test_machine_state import sim_card

pytestmark = needs_root


def bisect_as(account, socket, step: int, resolution: int) -> dict:
    proc = as_user(account, "tests.helper.bisect_as_user", str(socket), str(step), str(resolution))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out.splitlines()[-1])


def test_a_value_that_hung_a_bisect_for_one_user_is_refused_for_another(accounts, helpers):
    """The card of tests/tuning/test_job.py's hang test (limit -30 mV): a first step of 70 jumps straight to
    -70, at or below vmin - 40, where the simulated card hangs (HANG_DEPTH_MV, tuner.backends.simulated)."""
    group = accounts.group()
    a, b = accounts.user(group), accounts.user(group)
    helper = helpers(group, fake_amd=False, extra=("--sim-vmin", "-30"))
    first = bisect_as(a, helper.socket, 70, 5)
    assert -70 in first["tried"] and first["own_unsafe"] == [-70]
    machine = helper.ask({"op": "unsafe_list", "card": "sim0"})[0]["result"]
    assert [(e["setting"], e["kind"], e["uid"]) for e in machine] == [(-70, "hang", a.uid)]
    assert helper.ask({"op": "read_trials", "card": "sim0"})[0]["result"]["open"] is None  # every trial ended
    # B: a home that never saw the hang; refused at -70 and beyond, by the rule, before anything is written
    for value in ("-70", "-75"):
        refused = tuner(b, "--simulate", "--sim-vmin", "-30", "set", "--device", "sim0", "--offset", value, "--yes",
                        socket=helper.socket)
        assert refused.returncode == 2 and "failed hard on sim0" in refused.stderr, refused.stderr
    assert sim_card(helper).knob("sim0").current == 0
    listed = tuner(b, "--simulate", "--sim-vmin", "-30", "unsafe", "list", "--json", socket=helper.socket)
    assert [e["setting"] for e in json.loads(listed.stdout)["unsafe"][0]["entries"]] == [-70]
    # B's bisect, same search: the plan never proposes -70 (the machine's list is its skip list)
    second = bisect_as(b, helper.socket, 70, 5)
    assert -70 not in second["tried"] and second["own_unsafe"] == []
    log = [json.loads(line) for line in (helper.state_dir / "log.jsonl").read_text().splitlines()]
    assert not [e for e in log if e.get("uid") == b.uid and e.get("value") == -70]


def test_unsafe_clear_through_the_helper_clears_the_machine_list(accounts, helpers):
    group = accounts.group()
    a, b = accounts.user(group), accounts.user(group)
    helper = helpers(group, fake_amd=False, extra=("--sim-vmin", "-30"))
    assert bisect_as(a, helper.socket, 70, 5)["own_unsafe"] == [-70]
    cleared = tuner(b, "--simulate", "--sim-vmin", "-30", "unsafe", "clear", "--device", "sim0", "--yes",
                    socket=helper.socket)
    assert cleared.returncode == 0, cleared.stderr
    assert helper.ask({"op": "unsafe_list", "card": "sim0"})[0]["result"] == []
    done = tuner(b, "--simulate", "--sim-vmin", "-30", "set", "--device", "sim0", "--offset", "-70", "--yes",
                 socket=helper.socket)
    assert done.returncode == 0, done.stderr


def test_a_hard_failure_with_a_long_kernel_log_still_reaches_the_machine_list(accounts, helpers):
    """`journal.unsafe_mark` keeps a mark within the schema's limits (a reason and 20 kernel lines of 500
    characters), but the helper refuses any request line over 4096 bytes unread: twenty long GPU-failure lines
    (journalctl's prefix, a page fault naming its process) made `trial_end` fail with line-too-long, so the
    setting that hung the card never reached the machine's list (the trial was then recorded as a tool death)."""
    from tuner.backends.helper_client import HelperBackend
    from tuner.tuning.journal import unsafe_mark

    group = accounts.group()
    helper = helpers(group, fake_amd=False, extra=("--sim-vmin", "-30"))
    lines = [f"[ {1234 + n}.567890] workstation kernel: amdgpu 0000:03:00.0: amdgpu: [gfxhub] page fault (src_id:0 "
             f"ring:24 vmid:3 pasid:32774, for process python3 pid 4321 thread python3:cs0 pid 4330) in page starting "
             f"at address 0x00008001{n:08x} from client 0x1b (UTCL2)" for n in range(30)]
    backend = HelperBackend.connect(helper.socket, client="test")
    try:
        backend.trial_begin("sim0", -70, "coarse", session="s")
        backend.trial_end("sim0", unsafe=unsafe_mark("hang", "the engine stopped answering at -70 mV " * 12, lines))
    finally:
        backend.close()
    [entry] = helper.ask({"op": "unsafe_list", "card": "sim0"})[0]["result"]
    assert (entry["setting"], entry["kind"]) == (-70, "hang")
    assert entry["kernel_log"] and entry["kernel_log"][-1] == lines[-1]  # the newest lines are the ones kept
