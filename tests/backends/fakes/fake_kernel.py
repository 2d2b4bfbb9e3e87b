"""A fake amdgpu kernel behind `pp_od_clk_voltage`: it parses each write the way `amdgpu_set_pp_od_clk_voltage`
does (one command per write, 1..127 bytes, integers via kstrtol, range checks, EINVAL/EPERM), stages edits, and
only `c` (or `r`, which falls through to commit) changes what a read shows.

Sources of each strictness (torvalds/linux, drivers/gpu/drm/amd/pm):
- `vc` on Navi1x/Vega20 range-checks the MHz before the mV of every point (`navi10_od_setting_check_range` in
  swsmu/smu11/navi10_ppt.c; `vega20_odn_edit_dpm_table` in powerplay/hwmgr/vega20_hwmgr.c), against the printed
  OD_RANGE, even when the stock table itself holds a point outside it (RX 5500 XT: point 0 at 500 MHz, range
  800-2200 MHz).
- `r` differs per generation (`variant`):
  * "smu13" (RDNA2 `sienna_cichlid_od_edit_dpm_table`, RDNA3/4 `smu_v13_0_0_od_edit_dpm_table` /
    `smu_v14_0_2_od_edit_dpm_table`): memcpy of the whole boot overdrive table, then fallthrough to commit: the
    user's memory clock and fan curve go back to stock too.
  * "navi10" (`navi10_od_edit_dpm_table`): memcpy of `boot_overdrive_table`; no commit until `c`.
  * "vega20" (`vega20_odn_edit_dpm_table`, PP_OD_RESTORE_DEFAULT_TABLE): re-reads the table the SMU firmware holds
    now (`smum_smc_table_manager(..., TABLE_OVERDRIVE, true)`), i.e. the current, possibly undervolted, values.
- EPERM on read and write while the GPU is in reset or suspended (`amdgpu_get_pp_od_clk_voltage` /
  `amdgpu_set_pp_od_clk_voltage`: `if (amdgpu_in_reset(adev)) return -EPERM; if (adev->in_suspend &&
  !adev->in_runpm) return -EPERM;`). `busy_for` counts accesses until it resumes.
- `m <0|1> <MHz>` on RDNA2/3/4 sets the memory clock limits, range-checked against MCLK.
"""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import replace
from pathlib import Path

from tuner.backends import amd_od_table as od
from tuner.backends.amd_sysfs import SysfsIO


def render_od_table(t: od.OdTable) -> str:
    """Text in the kernel's layout for `t.format`. parse_od_table(render_od_table(t)) == t for parsed tables."""
    out: list[str] = []

    def levels(header: str, items: tuple[od.Level, ...]) -> None:
        out.append(f"{header}:")
        for lv in items:
            cols = [f"{lv.index}:"]
            if lv.mhz is not None:
                cols.append(f"{lv.mhz:>10}Mhz")
            if lv.mv is not None:
                cols.append(f"{lv.mv:>10}mV")
            out.append(" ".join(cols))

    if t.sclk_offset_mhz is not None:
        out += ["OD_SCLK_OFFSET:", f"{t.sclk_offset_mhz}Mhz"]
    elif t.sclk_offset_limits_mhz is not None:
        out += [
            "OD_SCLK_OFFSET:",
            f"0: {t.sclk_offset_limits_mhz[0]}Mhz",
            f"1: {t.sclk_offset_limits_mhz[1]}Mhz",
        ]
    if t.sclk:
        levels("OD_SCLK", t.sclk)
    if t.mclk:
        levels("OD_MCLK", t.mclk)
    if t.vddc_curve:
        levels("OD_VDDC_CURVE", t.vddc_curve)
    if t.vddgfx_offset_mv is not None:
        out += ["OD_VDDGFX_OFFSET:", f"{t.vddgfx_offset_mv}mV"]
    if t.ranges:
        out.append("OD_RANGE:")
        out += [f"{r.name}: {r.lo:>7}{r.unit} {r.hi:>10}{r.unit}" for r in t.ranges]
    for name in t.other_sections:
        out.append(f"{name}:")
    return "\n".join(out) + "\n"


def _einval(why: str) -> OSError:
    e = OSError(errno.EINVAL, f"Invalid argument ({why})")
    return e


def _kstrtol(token: str) -> int:
    t = token
    neg = t.startswith("-")
    body = t[1:] if t[:1] in "+-" else t
    try:
        if body.lower().startswith("0x"):
            value = int(body[2:], 16)
        elif body.startswith("0") and len(body) > 1:
            value = int(body[1:], 8)
        else:
            if not body.isdigit():
                raise ValueError(token)
            value = int(body, 10)
    except ValueError:
        raise _einval(f"not an integer: {token!r}") from None
    return -value if neg else value


class FakeOdKernel:
    def __init__(self, text: str, *, variant: str | None = None):
        self.boot = od.parse_od_table(text)
        self.staged = self.committed = self.boot
        if variant is None:
            variant = {od.NAVI1X: "navi10", od.GCN: "smu7"}.get(self.boot.format, "smu13")
        self.variant = variant
        self.fan_curve = "stock"  # the OD fan curve (gpu_od/fan_ctrl), part of the SMU13/14 overdrive table
        self.busy_for = 0  # the next N reads/writes fail with EPERM (GPU resetting), then it answers again
        self.received: list[str] = []  # every write, decoded, as the kernel saw it
        self.in_reset = False  # EPERM on every write, like amdgpu_in_reset()
        self.reject_commits = 0  # the SMU refuses the next N uploads (EINVAL on `c`)
        self.clamp_vo_mv: int | None = None  # firmware silently clamps vo to this floor (read-back differs)
        # A write that never returns while set: `amdgpu_set_pp_od_clk_voltage` takes the same runtime-PM reference
        # (`amdgpu_pm_get_access`) and SMU mutex as a read, so a GPU wedged there blocks a store() as it blocks a
        # show() (kernel_files bounds the reads for that reason). Cleared, the blocked write goes on.
        self.wedged = threading.Event()
        self.unwedged = threading.Event()

    # --- reads ---------------------------------------------------------------------------------------------------
    def _busy(self) -> bool:
        if self.in_reset:
            return True
        if self.busy_for > 0:
            self.busy_for -= 1
            return True
        return False

    def read(self) -> str:
        if self._busy():
            raise OSError(errno.EPERM, "Operation not permitted")
        text = render_od_table(self.committed)
        return text.replace("OD_RANGE:", "\0" * 23 + "OD_RANGE:")  # NUL padding, as real kernels print

    # --- writes --------------------------------------------------------------------------------------------------
    def write(self, data: bytes) -> int:
        text = data.decode("ascii", errors="replace")
        self.received.append(text)
        if self.wedged.is_set():
            self.unwedged.wait()
        if self._busy():
            raise OSError(errno.EPERM, "Operation not permitted")
        if not 0 < len(data) <= 127:
            raise _einval("size")
        kind = {"s": "s", "p": "p", "m": "m", "r": "r", "c": "c"}.get(text[0])
        if kind is None:
            if text.startswith("vc"):
                kind = "vc"
            elif text.startswith("vo"):
                kind = "vo"
            else:
                raise _einval("unknown command")
        rest = text[len(kind) if kind in ("vc", "vo") else 1 :]
        params = [_kstrtol(tok) for tok in rest.replace("\n", " ").split(" ") if tok]
        if len(params) > 64:
            raise _einval("too many parameters")
        getattr(self, f"_cmd_{kind}")(params)
        return len(data)

    def _range(self, name: str) -> od.Range | None:
        return self.boot.range(name)

    def _in(self, name: str, value: int) -> None:
        r = self._range(name)
        if r is not None and not r.lo <= value <= r.hi:
            raise _einval(f"{name} {value} outside [{r.lo}, {r.hi}]")

    def _cmd_r(self, params: list[int]) -> None:
        if self.variant == "vega20":
            self.staged = self.committed  # the firmware's current table, not the boot one
        elif self.variant in ("navi10", "smu7"):
            self.staged = self.boot  # no commit until `c`
        else:
            self.staged = self.committed = self.boot  # whole table, then fallthrough to commit (smu13/14)
            self.fan_curve = "stock"

    def _cmd_c(self, params: list[int]) -> None:
        if self.reject_commits > 0:
            self.reject_commits -= 1
            raise _einval("commit refused")
        self.committed = self.staged

    def _cmd_p(self, params: list[int]) -> None:
        raise _einval("CCLK only on Van Gogh")

    def _cmd_vo(self, params: list[int]) -> None:
        if self.boot.format not in od.VO_FORMATS or self.boot.vddgfx_offset_mv is None:
            raise _einval("Gfx offset setting not supported")
        if len(params) != 1:
            raise _einval("invalid number of input parameters")
        self._in("VDDGFX_OFFSET", params[0])  # RDNA2 prints no range and checks none
        value = params[0] if self.clamp_vo_mv is None else max(params[0], self.clamp_vo_mv)
        self.staged = replace(self.staged, vddgfx_offset_mv=value)

    def _cmd_vc(self, params: list[int]) -> None:
        fmt = self.boot.format
        if fmt == od.NAVI1X:
            if len(params) != 3 or params[0] not in (0, 1, 2):
                raise _einval("invalid number of input parameters")
            pt, mhz, mv = params
            self._in(f"VDDC_CURVE_SCLK[{pt}]", mhz)
            self._in(f"VDDC_CURVE_VOLT[{pt}]", mv)
            curve = tuple(od.Level(p.index, mhz, mv) if p.index == pt else p for p in self.staged.vddc_curve)
            self.staged = replace(self.staged, vddc_curve=curve)
        elif fmt == od.RDNA3_EARLY:
            if len(params) != 2 or not 0 <= params[0] <= 5:
                raise _einval("invalid number of input parameters")
            self._in("VDDC_CURVE", params[1])
            curve = tuple(
                od.Level(p.index, None, params[1]) if p.index == params[0] else p
                for p in self.staged.vddc_curve
            )
            self.staged = replace(self.staged, vddc_curve=curve)
        else:
            raise _einval("vc not supported on this ASIC")

    def _cmd_s(self, params: list[int]) -> None:
        fmt = self.boot.format
        if fmt == od.RDNA4:
            if len(params) != 1:
                raise _einval("invalid number of input parameters")
            self._in("SCLK_OFFSET", params[0])
            self.staged = replace(self.staged, sclk_offset_mhz=params[0])
        elif fmt == od.GCN:
            if len(params) != 3 or params[0] not in {s.index for s in self.staged.sclk}:
                raise _einval("Invalid SCLK_VDDC_TABLE index")
            lvl, mhz, mv = params
            self._in("SCLK", mhz)
            self._in("VDDC", mv)
            sclk = tuple(od.Level(lvl, mhz, mv) if s.index == lvl else s for s in self.staged.sclk)
            self.staged = replace(self.staged, sclk=sclk)
        else:
            if len(params) != 2 or params[0] not in (0, 1):
                raise _einval("invalid number of input parameters")
            self._in("SCLK", params[1])
            sclk = tuple(
                od.Level(s.index, params[1], s.mv) if s.index == params[0] else s for s in self.staged.sclk
            )
            self.staged = replace(self.staged, sclk=sclk)

    def _cmd_m(self, params: list[int]) -> None:
        if self.boot.format not in od.VO_FORMATS:
            raise _einval("memory clock edits are modelled only on RDNA2/3/4 by this fake")
        if len(params) != 2 or params[0] not in {lv.index for lv in self.staged.mclk}:
            raise _einval("Invalid MCLK_VDDC_TABLE index")
        self._in("MCLK", params[1])
        mclk = tuple(
            od.Level(lv.index, params[1], lv.mv) if lv.index == params[0] else lv for lv in self.staged.mclk
        )
        self.staged = replace(self.staged, mclk=mclk)


class FakeKernelIO(SysfsIO):
    """SysfsIO with fake kernels behind chosen `pp_od_clk_voltage` paths; every other path is a plain file.

    `log` records (path, bytes) for every write through the seam, wherever it goes, so tests can check the
    allow-list; `kernels[path].received` shows what one card's kernel parsed.
    """

    def __init__(self, kernels: dict[Path, FakeOdKernel] | None = None):
        self.kernels = {Path(p): k for p, k in (kernels or {}).items()}
        self.log: list[tuple[Path, bytes]] = []
        self.missing: set[Path] = set()  # paths that raise ENOENT (Overdrive off)
        self.denied: set[Path] = set()  # paths that raise EACCES on open (not root)
        # path -> errno a read raises: a hwmon attribute whose read bits amdgpu cleared (EACCES, even as root:
        # a sysfs file without read permission cannot be opened for reading), or a read the driver refuses
        # (EPERM in reset, EOPNOTSUPP from the SMU)
        self.read_errors: dict[Path, int] = {}
        self._fds: dict[int, Path] = {}
        self.root = True  # the fake runs "as root" unless a test says otherwise
        self._next_fd = 1000

    def is_root(self) -> bool:
        return self.root

    def read_text(self, path: Path) -> str:
        path = Path(path)
        if path in self.missing:
            raise self._error(OSError(errno.ENOENT, "No such file"), path, None)
        if path in self.read_errors:
            code = self.read_errors[path]
            raise self._error(OSError(code, os.strerror(code)), path, None)
        if path in self.kernels:
            try:
                return self.kernels[path].read()
            except OSError as e:
                raise self._error(e, path, None) from None
        return super().read_text(path)

    def _open(self, path: Path) -> int:
        path = Path(path)
        if path in self.missing:
            raise OSError(errno.ENOENT, "No such file")
        if path in self.denied:
            raise OSError(errno.EACCES, "Permission denied")
        if path in self.kernels:
            self._next_fd += 1
            self._fds[self._next_fd] = path
            return self._next_fd
        fd = os.open(path, os.O_WRONLY)
        self._fds[fd] = path
        return fd

    def _write(self, fd: int, data: bytes) -> int:
        path = self._fds[fd]
        self.log.append((path, data))
        if path in self.kernels:
            return self.kernels[path].write(data)
        return os.write(fd, data)

    def _close(self, fd: int) -> None:
        path = self._fds.pop(fd)
        if path not in self.kernels:
            os.close(fd)

    def commands(self, path: Path | None = None) -> list[str]:
        """The commands written (newline stripped), to one path or to all."""
        return [d.decode().rstrip("\n") for p, d in self.log if path is None or p == Path(path)]
