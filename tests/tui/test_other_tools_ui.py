"""The Tune screen's apply asks tuner.actions.other_tools as `tuner set` does: a running lactd is named in a
warning (in the UI's words) and the change still goes to keep-or-revert (a person is there to confirm it)."""

from __future__ import annotations

from tests.backends.fakes.fake_kernel import FakeKernelIO, FakeOdKernel
from tests.backends.fakes.trees import OD_TEXT, SLOTS, make_tree
from tests.fake_other_tools import fake_lactd  # noqa: F401 - a fixture
from tests.tui.helpers import make_app
from tuner.actions.profile_apply import plan_rig_apply
from tuner.backends import amd
from tuner.backends.amd_sysfs import amd_card_dirs
from tuner.profiles.build import RigPart, build_rig_profile
from tuner.screens.dialogs import KeepOrRevertDialog


def _amd(tmp_path):
    """A real AMD card on a fake sysfs tree that takes writes as the kernel does (FakeKernelIO)."""
    make_tree(tmp_path, ["rdna4"])
    dirs = amd_card_dirs(tmp_path)
    io = FakeKernelIO({d / "pp_od_clk_voltage": FakeOdKernel(OD_TEXT["rdna4"]) for d in dirs})
    return amd.AmdBackend(dirs, root=tmp_path, sysfs=io)


async def test_tune_apply_beside_a_running_lactd_warns_naming_it_and_goes_on(tmp_path, fake_lactd):  # noqa: F811
    backend = _amd(tmp_path)
    slot = SLOTS["rdna4"]
    app = make_app(tmp_path, backend=backend)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.press("2")
        await pilot.pause()
        await pilot.press("left", "a")
        await app.workers.wait_for_complete()
        await pilot.pause()
        said = [n.message for n in app._notifications if n.severity == "warning"]
        assert isinstance(app.screen, KeepOrRevertDialog), [n.message for n in app._notifications]
        assert any(f"lactd (LACT; process {fake_lactd.pid}) is running and may change {slot}" in m
                   and "pp_od_clk_voltage" in m for m in said), said
        await pilot.press("enter")  # revert
        await app.workers.wait_for_complete()
        await pilot.pause()
    assert backend.knob(slot).current == 0


def test_a_rig_profile_apply_warns_of_a_running_lactd_too(tmp_path, fake_lactd):  # noqa: F811
    backend = _amd(tmp_path)
    slot = SLOTS["rdna4"]
    profile = build_rig_profile("rig", [RigPart(backend.device(slot), backend.knob(slot), -20)],
                                kernel="6.14.0-fake")
    plan = plan_rig_apply(backend, profile, kernel="6.14.0-fake")
    assert any(w.startswith(f"lactd (LACT; process {fake_lactd.pid}) is running and may change {slot}")
               for w in plan.warnings), plan.warnings
