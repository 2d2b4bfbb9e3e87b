"""`tuner-helper` as a real process over a fake amdgpu kernel (tests/backends/fakes): the card's
`pp_od_clk_voltage` behaves as `amdgpu_set_pp_od_clk_voltage` does (one command per write, range checks, EINVAL),
which a plain file cannot. Usage: `python -m tests.helper.fake_amd_helper ROOT [tuner-helper options]`; the tree
is built under ROOT on first use (an RDNA4 card at 0000:10:00.0, OD_RANGE -200..0 mV) and kept across restarts;
the fake kernel's state lives in this process (a restart starts at stock, as a reboot would)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.backends.fakes.fake_kernel import FakeKernelIO, FakeOdKernel
from tests.backends.fakes.trees import OD_TEXT, make_tree
from tuner.backends import amd
from tuner.backends.amd_sysfs import amd_card_dirs
from tuner.helper.cli import main

if __name__ == "__main__":
    root = Path(sys.argv[1])
    if not (root / "sys").exists():
        make_tree(root, ["rdna4"])
    io = FakeKernelIO({d / "pp_od_clk_voltage": FakeOdKernel(OD_TEXT["rdna4"]) for d in amd_card_dirs(root)})
    sys.exit(main(sys.argv[2:], backend=amd.discover(root=root, sysfs=io)))
