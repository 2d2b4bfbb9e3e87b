"""`tuner doctor` names the group the engine's account lacks to open the GPU's device nodes, and the helper's
state (issue 22)."""

from __future__ import annotations

import grp
import json
import os

from tests.cli_helpers import run_tuner
from tests.helper.conftest import needs_root
from tuner.actions.doctor import FAIL, OK, check_device_groups


def device_nodes(root, gid: int) -> None:
    for node in ("dev/kfd", "dev/dri/renderD128", "dev/dri/renderD129"):
        path = root / node
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        os.chown(path, 0, gid)
        path.chmod(0o660)


def test_a_missing_group_is_named_with_the_command_that_adds_it(tmp_path):
    device_nodes(tmp_path, os.getegid())
    group = grp.getgrgid(os.getegid()).gr_name
    [lacking] = check_device_groups(tmp_path, 1000, {1000}, "ann")
    assert lacking.status == FAIL and f"group {group}" in lacking.detail and "/dev/kfd" in lacking.detail
    assert f"usermod -aG {group} ann" in lacking.remedy
    [ok] = check_device_groups(tmp_path, 1000, {1000, os.getegid()}, "ann")
    assert ok.status == OK and "/dev/dri/renderD128" in ok.detail
    assert check_device_groups(tmp_path / "no-gpu", 1000, {1000}, "ann") == []


@needs_root
def test_doctor_under_sudo_checks_the_sudo_users_groups(accounts, tmp_path):
    render = accounts.group()
    ann = accounts.user()
    device_nodes(tmp_path, grp.getgrnam(render).gr_gid)
    proc = run_tuner("doctor", "--json", env={"TUNER_SYSFS_ROOT": str(tmp_path), "SUDO_UID": str(ann.uid),
                                              "SUDO_GID": str(ann.gid)})
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    nodes = checks["gpu device nodes"]
    assert nodes["status"] == FAIL and ann.name in nodes["detail"] and f"-aG {render} {ann.name}" in nodes["remedy"]
    assert checks["helper"]["status"] in ("info", "warn")
