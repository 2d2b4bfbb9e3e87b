"""AMD behaviours the first fakes were kinder than the real kernel about (issue 13, items 1-4 and the small ones).

Each test runs against the strict fake kernel (tests/backends/fakes/fake_kernel.py cites the kernel functions).
"""

from __future__ import annotations

import pytest

from tuner.backends import amd
from tuner.backends import amd_od_table as od
from tuner.backends.amd_sysfs import amd_card_dirs
from tuner.core.errors import DeviceLost, NotApplied, PermissionDenied

from .fakes.fake_kernel import FakeKernelIO, FakeOdKernel
from .fakes.trees import NAVI1X_OUT_OF_RANGE, OD_TEXT, make_card, make_tree


def _backend(root, text, *, variant=None, device="0x7550", **kw):
    make_tree(root, [])
    make_card(root, 0, None, od_text=text, device=device)
    (d,) = amd_card_dirs(root)
    kernel = FakeOdKernel(text, variant=variant)
    fio = FakeKernelIO({d / "pp_od_clk_voltage": kernel})
    sleeps: list[float] = []
    backend = amd.AmdBackend([d], root=root, sysfs=fio, sleep=sleeps.append, warn=kw.get("warn"))
    return backend, fio, kernel, sleeps


def _in_range(kernel: FakeOdKernel, command: str) -> bool:
    _, pt, mhz, mv = command.split()
    sclk = kernel.boot.range(f"VDDC_CURVE_SCLK[{pt}]")
    volt = kernel.boot.range(f"VDDC_CURVE_VOLT[{pt}]")
    return sclk.lo <= int(mhz) <= sclk.hi and volt.lo <= int(mv) <= volt.hi


# --- item 1: Navi1x points outside the printed range ------------------------------------------------------------


@pytest.mark.parametrize("offset_mv", [-30, -50, -100])
def test_navi1x_point_outside_od_range_is_moved_into_it_and_reported(tmp_path, offset_mv):
    backend, fio, kernel, _ = _backend(tmp_path, NAVI1X_OUT_OF_RANGE)
    dev = backend.devices()[0].id
    knob = backend.apply(dev, offset_mv)
    assert knob.current == offset_mv
    vc = [c for c in fio.commands() if c.startswith("vc")]
    assert vc and all(_in_range(kernel, c) for c in vc)  # the kernel would EINVAL anything else
    if any(c.startswith("vc 0 ") for c in vc):
        assert any(line.startswith("point 0: clock 600->800 MHz") for line in knob.clamped)
    backend.reset(dev)
    assert backend.knob(dev).current == 0 and backend.knob(dev).clamped == ()


def test_navi1x_achieved_offset_per_point_is_reported_when_a_floor_clamps_it(tmp_path):
    backend, _, _, _ = _backend(tmp_path, NAVI1X_OUT_OF_RANGE)
    knob = backend.apply(backend.devices()[0].id, -100)
    assert "point 1: -90 mV of -100 mV asked" in knob.clamped  # 790 -> floor 700


# --- item 2: Vega20's `r` is not stock ----------------------------------------------------------------------------


@pytest.mark.parametrize("points", [
    [[0, 700, 720], [1, 1400, 820], [2, 2000, float("inf")]],  # json writes Infinity, int() cannot take it
    {"012": 0},  # a dict: iterating gives "012", which unpacks into three one-digit "points"
])
def test_a_damaged_stock_record_is_ignored_and_the_table_read(tmp_path, points):
    # The stock record is a JSON file in the user's state directory; damaged or hand-edited, it is no record (as
    # _stock_points says): the table as read now is stock. Never a traceback, never a made-up offset.
    import json

    from tuner.backends import card_records

    text = OD_TEXT["vega20-navi1x"]
    backend, _, _, _ = _backend(tmp_path, text)
    dev = backend.devices()[0].id
    path = card_records._path(card_records.STOCK, dev)
    record = json.loads(path.read_text())
    record["points"] = points
    path.write_text(json.dumps(record))
    again, _, _, _ = _backend(tmp_path / "again", text)
    assert again.knob(dev).current == 0


def test_vega20_reset_writes_the_recorded_stock_points_not_r(tmp_path):
    backend, fio, kernel, _ = _backend(tmp_path, OD_TEXT["vega20-navi1x"], variant="vega20", device="0x66af")
    dev = backend.devices()[0].id
    backend.apply(dev, -60)
    # a later run (new process) meets the undervolted card: the stock record from first contact still holds
    again = amd.AmdBackend(amd_card_dirs(tmp_path), root=tmp_path, sysfs=fio)
    assert again.knob(dev).current == -60
    fio.log.clear()
    again.reset(dev)
    assert "r" not in fio.commands()
    assert kernel.committed.vddc_curve == kernel.boot.vddc_curve


def test_a_stock_record_of_another_card_in_the_same_slot_is_not_its_stock(tmp_path):
    """The stock record was looked up by PCI slot alone: another card in that slot in the same boot (an eGPU
    swapped, PCIe hot plug) was measured against the first card's points, and its reset wrote them (here 1150 mV
    on a card whose stock is 1100 mV: an overvolt nobody asked for). A record names the card it belongs to."""
    first = OD_TEXT["vega20-navi1x"]
    backend, _, _, _ = _backend(tmp_path, first, variant="vega20", device="0x66af")
    dev = backend.devices()[0].id
    other_text = first.replace("2000MHz 1150mV", "2000MHz 1100mV")
    make_tree(tmp_path / "swapped", [])
    make_card(tmp_path / "swapped", 0, None, od_text=other_text, device="0x66af")
    (d,) = amd_card_dirs(tmp_path / "swapped")
    (d / "serial_number").write_text("0x0badc0de\n")  # amdgpu's unique_id-backed serial: another card
    kernel = FakeOdKernel(other_text, variant="vega20")
    swapped = amd.AmdBackend([d], root=tmp_path / "swapped", sysfs=FakeKernelIO({d / "pp_od_clk_voltage": kernel}))
    assert swapped.devices()[0].id == dev
    assert swapped.knob(dev).current == 0
    swapped.apply(dev, -20)
    swapped.reset(dev)
    assert kernel.committed.vddc_curve == kernel.boot.vddc_curve


def test_vega20_r_really_keeps_the_firmware_table(tmp_path):
    """The fake is as strict as vega20_odn_edit_dpm_table: `r` then `c` leaves an undervolt in place."""
    kernel = FakeOdKernel(OD_TEXT["vega20-navi1x"], variant="vega20")
    for cmd in (b"vc 2 2000 1090\n", b"c\n", b"r\n", b"c\n"):
        kernel.write(cmd)
    assert kernel.committed.vddc_curve[2].mv == 1090


def test_navi1x_is_told_from_vega20_by_pci_id():
    assert amd.is_vega20("1002:66af") and not amd.is_vega20("1002:731f")


# --- item 3: a reset keeps the user's other settings --------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["rdna2", "rdna3", "rdna4"])
def test_fan_curve_and_memory_clock_survive_apply_reset_and_a_failed_apply(tmp_path, fmt):
    warnings: list[str] = []
    backend, fio, kernel, _ = _backend(tmp_path, OD_TEXT[fmt], warn=warnings.append)
    dev = backend.devices()[0].id
    mclk_range = kernel.boot.range("MCLK")
    user_mclk = mclk_range.hi - 10
    for cmd in (f"m 1 {user_mclk}\n".encode(), b"c\n"):  # set by the user before the tuner ran
        kernel.write(cmd)
    kernel.fan_curve = "user"
    backend.apply(dev, -30)
    backend.reset(dev)
    kernel.reject_commits = 1
    with pytest.raises(NotApplied):
        backend.apply(dev, -40)
    assert backend.knob(dev).current == 0
    assert kernel.committed.mclk[-1].mhz == user_mclk and kernel.fan_curve == "user"
    assert "r" not in fio.commands() and warnings == []


def test_r_is_the_last_resort_with_a_warning(tmp_path):
    warnings: list[str] = []
    backend, fio, kernel, _ = _backend(tmp_path, OD_TEXT["rdna3"], warn=warnings.append)
    dev = backend.devices()[0].id
    backend.apply(dev, -30)
    real = kernel._cmd_vo
    kernel._cmd_vo = lambda params: None if params == [0] else real(params)  # firmware ignores `vo 0`
    assert backend.reset(dev).current == 0
    assert fio.commands()[-2:] == ["r", "c"] and "fan curve" in warnings[0]


# --- item 4: EPERM as root is "busy or resetting" -----------------------------------------------------------------


def test_eperm_as_root_is_retried_within_a_bound(tmp_path):
    backend, _, kernel, sleeps = _backend(tmp_path, OD_TEXT["rdna3"])
    dev = backend.devices()[0].id
    kernel.busy_for = 2  # e.g. right after a GPU reset
    assert backend.apply(dev, -20).current == -20
    assert len(sleeps) == 2


def test_eperm_as_root_that_persists_is_device_lost_not_needs_root(tmp_path):
    backend, _, kernel, sleeps = _backend(tmp_path, OD_TEXT["rdna3"])
    kernel.in_reset = True
    with pytest.raises(DeviceLost) as e:
        backend.knob(backend.devices()[0].id)
    assert "busy" in e.value.message and "root" not in (e.value.remedy or "")
    assert len(sleeps) == amd.BUSY_RETRIES - 1


def test_eperm_when_not_root_still_says_run_as_root(tmp_path):
    backend, fio, kernel, _ = _backend(tmp_path, OD_TEXT["rdna3"])
    fio.root = False
    kernel.in_reset = True
    with pytest.raises(PermissionDenied) as e:
        backend.knob(backend.devices()[0].id)
    assert "root" in e.value.remedy


# --- item 10 (AMD side) and the small ones ------------------------------------------------------------------------


def test_foreign_offset_is_reported_and_the_tuners_own_is_not(tmp_path):
    backend, _, kernel, _ = _backend(tmp_path, OD_TEXT["rdna3"])
    dev = backend.devices()[0].id
    assert backend.foreign_state(dev) is None
    backend.apply(dev, -25)
    assert backend.foreign_state(dev) is None  # the tuner recorded it
    backend.reset(dev)
    for cmd in (b"vo -35\n", b"c\n"):  # another tool
        kernel.write(cmd)
    assert "-35 mV" in backend.foreign_state(dev)


def test_an_applied_record_of_another_card_in_the_same_slot_does_not_vouch_for_this_one(tmp_path):
    """The applied record was looked up by PCI slot alone (the stock record was made per card in 19ec281): another
    card in that slot in the same boot (an eGPU swapped, PCIe hot plug) carrying the value another tool set was
    judged "set by the tuner", so a bisect started from that unknown state. A record names the card it belongs to."""

    def card(name, serial):
        make_tree(tmp_path / name, [])
        make_card(tmp_path / name, 0, None, od_text=OD_TEXT["rdna3"])
        (d,) = amd_card_dirs(tmp_path / name)
        (d / "serial_number").write_text(f"{serial}\n")
        kernel = FakeOdKernel(OD_TEXT["rdna3"])
        return amd.AmdBackend([d], root=tmp_path / name, sysfs=FakeKernelIO({d / "pp_od_clk_voltage": kernel})), kernel

    first, _ = card("first", "0x1111aaaa")
    dev = first.devices()[0].id
    first.apply(dev, -25)
    assert first.foreign_state(dev) is None  # the tuner's own
    swapped, kernel = card("swapped", "0x2222bbbb")
    assert swapped.devices()[0].id == dev
    for cmd in (b"vo -25\n", b"c\n"):  # another tool, on the card now in that slot
        kernel.write(cmd)
    assert "-25 mV" in (swapped.foreign_state(dev) or "")


@pytest.mark.parametrize("key", ["energy_accumulator", "power"])
def test_amdsmi_energy_key_differs_by_version(key):
    assert amd.energy_joules({key: 1_000_000, "counter_resolution": 15.3}) == 15.3


def test_a_table_that_is_only_a_newline_is_unsupported_not_empty(tmp_path):
    make_tree(tmp_path, [])
    make_card(tmp_path, 0, None, od_text="\n")  # a plain file: what the kernel prints without an OD table
    backend = amd.AmdBackend(amd_card_dirs(tmp_path), root=tmp_path, sysfs=FakeKernelIO())
    with pytest.raises(od.OdParseError) as e:
        backend.knob(backend.devices()[0].id)
    assert "no overdrive table" in e.value.message


def test_a_write_the_gpu_never_answers_is_a_lost_device_not_a_hung_tuner(tmp_path):
    """Reads of pp_od_clk_voltage are given up after a bound (kernel_files); its writes were not: a store() blocked
    in a wedged driver hung `set`, and then its revert on exit, for good. The write and the restore after it are
    each given up after the same kind of bound, and the card counts as lost (exit 5)."""
    import threading

    from tests.polling import wait_until

    backend, fio, kernel, _ = _backend(tmp_path, OD_TEXT["rdna3"])
    fio.write_timeout_s = 0.2  # the bound itself is not what is tested: that it exists
    kernel.wedged.set()
    box: dict[str, BaseException] = {}

    def apply() -> None:
        try:
            backend.apply(backend.devices()[0].id, -30)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            box["error"] = e

    worker = threading.Thread(target=apply, daemon=True)
    worker.start()
    try:
        wait_until(lambda: not worker.is_alive(), what="apply to give up on a write the GPU never answers")
    finally:
        kernel.unwedged.set()
    error = box.get("error")
    assert isinstance(error, DeviceLost) and error.exit_code == 5, error
    assert "did not answer" in error.message and "restoring" in error.message, error.message
