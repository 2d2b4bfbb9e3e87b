"""`tuner apply --boot --resume` (the unit after the sleep targets): a card back at stock, or at another value,
is put back to the installed value and read back; the record says it was a resume run."""

from __future__ import annotations

from tests.profiles.helpers import sim, sim_profile, tuner
from tuner.actions.boot_apply import read_last_run
from tuner.profiles import save_profile


def test_a_card_that_comes_back_at_another_setting_is_put_back_to_the_installed_one(capsys, boot):
    save_profile(sim_profile("mine", value=-45), system=True)
    sim().apply("sim0", -30)  # what the card reads after resume: set by something else, or an older value
    code, _out, err = tuner(capsys, "--simulate", "--sim-gpus", "2", "apply", "--boot", "--resume")
    assert code == 0, err
    assert ("tuner: boot: sim0 reads -30 mV, not stock and not the installed -45 mV (set by something else since); "
            "applying 'mine' again") in err
    assert "applied 'mine' to sim0" in err and sim().knob("sim0").current == -45
    assert read_last_run(simulated=True)["mode"] == "resume"
    sim().reset("sim0")  # back at stock after resume (the common case)
    code, _out, err = tuner(capsys, "--simulate", "--sim-gpus", "2", "apply", "--boot", "--resume")
    assert code == 0 and sim().knob("sim0").current == -45 and "not stock" not in err


def test_resume_is_a_mode_of_boot(capsys):
    code, _out, err = tuner(capsys, "--simulate", "apply", "mine", "--resume")
    assert code == 2 and "--resume is a mode of --boot" in err
