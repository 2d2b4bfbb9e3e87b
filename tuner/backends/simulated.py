"""A simulated GPU, so the whole workflow can be tried and tested on a machine without one.

Two kinds (`--sim-kind`): "amd" (default), a voltage offset in mV where lower undervolts harder; and "nvidia", a
positive graphics-clock offset in MHz (15 MHz steps) applied at a locked max clock, where higher undervolts harder
(the card runs each clock at a lower voltage). Each card has a hidden stable limit in its knob's unit (`--sim-vmin`:
mV, or MHz). Past it the stress engine is told to inject silent bit flips at a per-step rate that makes a fault
within 50 steps near certain; far past it the card "hangs". Telemetry responds to load and to the setting (dynamic
power ~ V^2, temperature lags power). Everything is deterministic from the seed. Applied settings persist in
`paths.simulated_dir()` (a directory per kind and seed, a file per card, each changed under its own lock:
tuner.backends.simulated_card_files) so separate `tuner` invocations see the same cards and never undo each other.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tuner.backends.base import Backend, check_lock_mhz, no_lock_clock, warn_on_stderr
from tuner.backends.simulated_card_files import CardFile
from tuner.core import paths
from tuner.core.errors import UsageError
from tuner.core.models import Capabilities, DeviceInfo, Knob, KnobKind, StressTarget, Telemetry
from tuner.core.processes import pid_alive

VMIN_RANGE_MV = (-120, -30)
KNOB_MIN_MV, KNOB_MAX_MV, KNOB_STEP_MV = -200, 0, 5
HANG_DEPTH_MV = 40  # at or below vmin - 40 mV the card stops responding
MAX_SIM_GPUS = 16
SIM_KINDS = ("amd", "nvidia")


@dataclass(frozen=True)
class SimKind:
    """What one kind of simulated card looks like: its knob (at stock), the range its hidden limit is drawn from,
    and how its knob's unit maps onto the mV fault model (`units_per_mv`: on the NVIDIA-style card 15 MHz of
    offset at a locked clock is worth about 5 mV less voltage, so 3 MHz a mV)."""

    name: str
    card_name: str
    knob: Knob
    limit_range: tuple[int, int]
    units_per_mv: int
    lock_clocks_mhz: tuple[int, int] | None = None  # lowest and stock max graphics clock (NVIDIA-style only)
    pci_id: str = "0000:0000"

    @property
    def state_key(self) -> str:
        return f"offset_{self.knob.unit.lower()}"

    def depth_mv(self, setting: int, limit: int) -> float:
        """How far past the limit `setting` is, in mV of the fault model (<= 0: at or inside the limit)."""
        return (setting - limit) * self.knob.aggressive_direction / self.units_per_mv


AMD = SimKind("amd", "Simulated RDNA-class GPU",
              Knob(KnobKind.VOLTAGE_OFFSET, "mV", 0, 0, KNOB_MIN_MV, KNOB_MAX_MV, KNOB_STEP_MV, -1), VMIN_RANGE_MV, 1)
# Clock offsets as NVML offers them on Ada/Blackwell cards: 15 MHz steps (tuner.backends.nvml_offsets), a
# negative side that is the less efficient one, a stock max boost to lock at.
NVIDIA = SimKind("nvidia", "Simulated Ada-class GPU (NVIDIA-style)",
                 Knob(KnobKind.CLOCK_OFFSET, "MHz", 0, 0, -300, 600, 15, +1), (60, 240), 3,
                 lock_clocks_mhz=(210, 2505), pci_id="10de:0000")
KINDS = {k.name: k for k in (AMD, NVIDIA)}
SIM_NVIDIA_PSTATES = (0, 2)  # the states an offset covers; the card works in P2 and idles in P8

# Electrical model of an imaginary 300 W card; the figures only need to be plausible and monotone. Power is an
# exact function of the setting, the lock and the load (no noise): the same card at the same setting under the
# same load draws the same power, so efficiency differences between settings are the model's, never chance.
STOCK_LOAD_MV, IDLE_MV = 1100.0, 800.0
IDLE_POWER_W, DYNAMIC_POWER_W = 15.0, 285.0
POWER_CAP_W = 300.0  # the simulated board's power limit (AMD-style load power stays just under it at stock)
VRAM_TOTAL_MIB, VRAM_IDLE_MIB, VRAM_LOAD_MIB = 32_768.0, 420.0, 6_200.0
LOAD_CLOCK_MHZ, IDLE_CLOCK_MHZ, MEM_CLOCK_MHZ = 2900.0, 500.0, 1250.0
THERMAL_TAU_S = 15.0
# The NVIDIA-style card under a training load is power-limited, as real cards are: at its V/F table top it would
# draw NV_TOP_POWER_W, more than POWER_CAP_W, so the driver holds it at the highest clock whose power fits the cap
# (about 2.3 GHz at stock, below the 2505 MHz top). Its voltage at each clock follows a straight V/F line from
# NV_CURVE_MV[0] at the lowest clock to NV_CURVE_MV[1] at the top; a clock offset of X MHz runs every clock
# X / units_per_mv mV lower (the fault model's own exchange rate), so the same cap allows a higher clock, and at
# a locked clock the same work takes less power.
NV_CURVE_MV = (700.0, 1100.0)
NV_TOP_POWER_W = 340.0
WORK_RATE_TOK_S = 30_000.0  # the card's training throughput at LOAD_CLOCK_MHZ (work_rate_tok_s)


def fault_rate_per_step(offset_mv: int, vmin_mv: int) -> float:
    """Per-step probability of a silent computation error at `offset_mv` on a card whose limit is `vmin_mv`.

    Zero at or above the limit; 0.15 just below it, rising 2 % per mV. P(no fault in 50 steps) = 0.85**50 < 0.03 %;
    the engine's reference trajectory catches about 88 % of single flips on their own step (bench/engine_detection),
    so P(no *detected* fault in 50 steps) is about (1 - 0.15 * 0.88)**50 < 0.1 %.

    >>> fault_rate_per_step(-50, -52), fault_rate_per_step(-55, -52), fault_rate_per_step(-200, -52)
    (0.0, 0.21, 1.0)
    """
    return fault_rate_at_depth(vmin_mv - offset_mv)


def fault_rate_at_depth(depth_mv: float) -> float:
    """The fault rate `depth_mv` past the limit (either kind of card, through `SimKind.depth_mv`)."""
    if depth_mv <= 0:
        return 0.0
    return round(min(1.0, 0.15 + 0.02 * depth_mv), 6)


def combined_rate(*rates: float) -> float:
    """The per-step fault rate of independent causes (the setting's depth, a bad card's own rate).

    >>> combined_rate(0.0, 0.01), combined_rate(0.5, 0.5)
    (0.01, 0.75)
    """
    clean = 1.0
    for rate in rates:
        clean *= 1.0 - rate
    return round(1.0 - clean, 9)


def _per_card_rates(given: float | tuple[float, ...] | list[float] | None, gpus: int) -> list[float]:
    """`--sim-sdc-rate`: one value is sim0's, a sequence one per card in card order; the rest are good cards."""
    rates = [] if given is None else [given] if isinstance(given, int | float) else list(given)
    if len(rates) > gpus:
        raise UsageError(f"--sim-sdc-rate gives {len(rates)} rates but there are {gpus} simulated cards",
                         f"give at most one rate per card, or pass --sim-gpus {len(rates)}")
    for rate in rates:
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 <= rate <= 1.0:
            raise UsageError(f"--sim-sdc-rate must be a per-step probability between 0 and 1, got {rate}",
                             "e.g. --sim-sdc-rate 0.001")
    return [float(r) for r in rates] + [0.0] * (gpus - len(rates))


def draw_vmin_mv(seed: int, index: int) -> int:
    """The hidden limit of card `index` for `seed`, in VMIN_RANGE_MV."""
    return draw_limit(AMD, seed, index)


def draw_limit(kind: SimKind, seed: int, index: int) -> int:
    """The hidden limit of card `index` for `seed`, in the kind's range and unit (the AMD draw is unchanged)."""
    prefix = "tuner-sim" if kind is AMD else f"tuner-sim-{kind.name}"
    return random.Random(f"{prefix}:{seed}:{index}").randint(*kind.limit_range)


class SimulatedBackend(Backend):
    name = "simulated"
    simulated = True

    def __init__(
        self,
        gpus: int = 1,
        seed: int = 0,
        vmin_mv: int | tuple[int, ...] | list[int] | None = None,
        state_path: Path | None = None,
        clock: Callable[[], float] = time.time,
        warn: Callable[[str], None] | None = None,
        kind: str = "amd",
        nondeterministic: bool = False,
        contention_after_s: float | None = None,
        sdc_rate: float | tuple[float, ...] | list[float] | None = None,
        driver: str | None = None,
    ):
        """`vmin_mv` is the hidden limit in the knob's own unit, as `--sim-vmin` gives it (MHz for kind
        "nvidia"): one value is sim0's, a sequence is one per card in card order (sim0, sim1, ...; the cards
        it leaves out keep the seed's draw). `sdc_rate` (`--sim-sdc-rate`, the same per-card rule): a bad card,
        one that corrupts silently at this per-step rate at every setting, stock included. `driver`
        (`--sim-driver`): the driver version the cards report (default "simulated")."""
        if kind not in KINDS:
            raise UsageError(f"--sim-kind must be one of {', '.join(SIM_KINDS)}, got {kind!r}",
                             "e.g. --sim-kind nvidia")
        self.kind = KINDS[kind]
        k = self.kind
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= MAX_SIM_GPUS:
            raise UsageError(f"--sim-gpus must be 1..{MAX_SIM_GPUS}, got {gpus}", "e.g. --sim-gpus 2")
        # the limit lies between stock (always stable) and the knob's aggressive end
        lo, hi = sorted((0, k.knob.min if k.knob.aggressive_direction < 0 else k.knob.max))
        given = [] if vmin_mv is None else [vmin_mv] if isinstance(vmin_mv, int) else list(vmin_mv)
        if len(given) > gpus:
            raise UsageError(f"--sim-vmin gives {len(given)} limits but there are {gpus} simulated cards",
                             f"give at most one value per card, or pass --sim-gpus {len(given)}")
        for value in given:
            if isinstance(value, bool) or not isinstance(value, int) or not lo < value < hi:
                example = (k.limit_range[0] + k.limit_range[1]) // 2
                raise UsageError(
                    f"--sim-vmin must be between {lo} and {hi} {k.knob.unit} (exclusive) on a simulated {k.name} "
                    f"card, got {value}",
                    f"e.g. --sim-vmin {example}",
                )
        self.gpus, self.seed = gpus, seed
        self._sdc_rates = _per_card_rates(sdc_rate, gpus)
        self.driver = driver or "simulated"
        self._limits = [draw_limit(k, seed, i) for i in range(gpus)]
        self._limits[:len(given)] = given
        name = f"seed-{seed}" if k is AMD else f"{k.name}-seed-{seed}"
        # the rig's directory, one file per card (tuner.backends.simulated_card_files)
        self.state_path = state_path or paths.simulated_dir() / name
        self._clock = clock
        # simulated platform flaws, carried out by the engine's fault-injection module (tuner/engine/faults.py)
        self.nondeterministic = nondeterministic
        self.contention_at = None if contention_after_s is None else time.time() + contention_after_s
        self._warn = warn or warn_on_stderr
        self._thermal: dict[str, tuple[float, float, float]] = {}  # id -> (time_s, temp_c, energy_j)
        self._samples = 0
        self._lock_mhz: dict[str, int] = {}
        self._files = {f"sim{i}": CardFile(self.state_path / f"sim{i}.json", k.state_key, self._warn)
                       for i in range(gpus)}

    # --- the cards' files -------------------------------------------------------------------------------------
    def _file(self, device_id: str) -> CardFile:
        self.device(device_id)  # UnknownDevice for a bad id
        return self._files[device_id]

    def _stored(self, device_id: str) -> dict:
        """The card's record as stored now (a copy: change it with `_write_setting` or `note_load`)."""
        return self._file(device_id).read()

    def _setting(self, device_id: str) -> int:
        return int(self._stored(device_id).get(self.kind.state_key, 0))

    def _write_setting(self, device_id: str, value: int) -> None:
        """Store `value` as the card's setting, unchecked (`apply` validates first; a test plays another tool)."""
        key = self.kind.state_key

        def put(card: dict) -> None:
            if value:
                card[key] = value
            else:
                card.pop(key, None)

        self._file(device_id).update(put)

    # --- hidden truth (tests and the benchmark read it; the UI never shows it) ---------------------------------
    def limit(self, device_id: str) -> int:
        """The most aggressive stable setting, in the knob's unit."""
        return self._limits[self._index(device_id)]

    def sdc_rate(self, device_id: str) -> float:
        """The card's own per-step corruption rate at any setting (0: a good card)."""
        return self._sdc_rates[self._index(device_id)]

    def _index(self, device_id: str) -> int:
        self.device(device_id)
        return int(device_id.removeprefix("sim"))

    # --- Backend ------------------------------------------------------------------------------------------------
    def devices(self) -> list[DeviceInfo]:
        return [
            DeviceInfo(
                id=f"sim{i}",
                vendor="simulated",
                name=self.kind.card_name,
                pci_id=self.kind.pci_id,
                subsystem_id="0000:0000",
                vbios="SIM.000.000",
                driver_version=self.driver,
                serial=f"SIM-{self.seed:04d}-{i:02d}",
                od_format="simulated" if self.kind is AMD else f"simulated-{self.kind.name}",
                simulated=True,
            )
            for i in range(self.gpus)
        ]

    def knob(self, device_id: str) -> Knob:
        return replace(self.kind.knob, current=self._setting(device_id), lock_clock_mhz=self.lock_clock_mhz(device_id))

    def apply(self, device_id: str, value: int, *, allow_overvolt: bool = False) -> Knob:
        self.knob(device_id).validate(value, allow_overvolt=allow_overvolt)
        self._write_setting(device_id, value)
        return self.knob(device_id)

    def reset(self, device_id: str, *, force: bool = False) -> Knob:
        return self.apply(device_id, 0)

    # --- the NVIDIA-style lock clock: tuner.backends.nvidia's interface and behaviour (`lock_clock_mhz`,
    # `set_lock_clock`): the lock is the clock the next `apply` locks to, held by this process only; every new
    # process starts at the stock max boost, whatever an earlier one locked.
    def lock_clock_mhz(self, device_id: str) -> int | None:
        """The max graphics clock offsets apply at (default: the stock max boost); None on the AMD-style card."""
        clocks = self.kind.lock_clocks_mhz
        if clocks is None:
            return None
        self.device(device_id)
        return self._lock_mhz.get(device_id, clocks[1])

    def set_lock_clock(self, device_id: str, mhz: int) -> None:
        clocks = self.kind.lock_clocks_mhz
        if clocks is None:
            raise no_lock_clock()
        self.device(device_id)
        check_lock_mhz(mhz, *clocks)
        self._lock_mhz[device_id] = mhz

    def lock_at_measured_clock(self, device_id: str, clock_mhz: float) -> int | None:
        """As tuner.backends.nvidia: lock at the clock sustained under the stock baseline, snapped down to a
        supported clock (here every 15 MHz from the lowest)."""
        clocks = self.kind.lock_clocks_mhz
        if clocks is None:
            return None
        lo, hi = clocks
        mhz = max(lo, min(hi, lo + int((clock_mhz - lo) // self.kind.knob.step) * self.kind.knob.step))
        self.set_lock_clock(device_id, mhz)
        return mhz

    def applied_pstates(self, device_id: str) -> tuple[int, ...] | None:
        """NVIDIA-style: offsets are applied at P0 and P2 (CUDA work runs in P2), as on the current NVML API."""
        self.device(device_id)
        return None if self.kind.lock_clocks_mhz is None else SIM_NVIDIA_PSTATES

    def capabilities(self, device_id: str) -> Capabilities:
        self.device(device_id)
        return Capabilities(
            can_apply=True,
            can_read_voltage=self.kind.lock_clocks_mhz is None,  # NVML reports no core voltage
            can_read_energy=True,
            needs_root=False,
            notes=("SIMULATED: no hardware is touched",),
        )

    def stress_target(self, device_id: str) -> StressTarget:
        depth_mv = self.kind.depth_mv(self._setting(device_id), self.limit(device_id))
        return StressTarget(
            torch_device="cpu",
            pci_bus_id=None,
            fault_rate=combined_rate(fault_rate_at_depth(depth_mv), self.sdc_rate(device_id)),
            hang=depth_mv >= HANG_DEPTH_MV,
            simulated=True,
            engine_options=self._flaw_options(),
        )

    def _flaw_options(self) -> tuple[tuple[str, object], ...]:
        """The platform flaws this card simulates, for every engine run on it (trials and `tuner stress`)."""
        options: tuple[tuple[str, object], ...] = (("sim_nondeterministic", True),) if self.nondeterministic else ()
        if self.contention_at is not None:
            options += (("sim_contention_at", round(self.contention_at, 3)),)
        return options

    def note_load(self, device_id: str, active: bool) -> None:
        def mark(card: dict) -> None:
            if active:
                card["load_pid"] = os.getpid()
            else:
                card.pop("load_pid", None)

        self._file(device_id).update(mark)

    def _loaded(self, device_id: str) -> bool:
        return pid_alive(self._stored(device_id).get("load_pid"))

    def telemetry(self, device_id: str) -> Telemetry:
        now = self._clock()
        load = 1.0 if self._loaded(device_id) else 0.0
        setting = self._setting(device_id)
        rng = random.Random(f"tuner-sim-telemetry:{self.seed}:{device_id}:{self._samples}")
        self._samples += 1
        if self.kind.lock_clocks_mhz is None:
            clock_mhz = LOAD_CLOCK_MHZ
            voltage_mv = amd_voltage_mv(setting, load)
            power_w = amd_power_w(setting, load)
        else:
            clock_mhz = nvidia_clock_mhz(self.kind, setting, self._lock_for(device_id)) if load else IDLE_CLOCK_MHZ
            voltage_mv = None  # NVML reports no core voltage on GeForce/RTX cards: neither does this one
            power_w = nvidia_power_w(self.kind, setting, clock_mhz) if load else IDLE_POWER_W
        steady_temp_c = 30.0 + 0.17 * power_w
        last = self._thermal.get(device_id)
        if last is None:
            temp_c, energy_j = steady_temp_c, 0.0
        else:
            dt_s = max(0.0, now - last[0])
            temp_c = steady_temp_c + (last[1] - steady_temp_c) * math.exp(-dt_s / THERMAL_TAU_S)
            energy_j = last[2] + power_w * dt_s
        self._thermal[device_id] = (now, temp_c, energy_j)
        return Telemetry(
            time_s=now,
            power_w=round(power_w, 1),
            temp_edge_c=round(temp_c, 1),
            temp_hotspot_c=round(temp_c + 4 + 0.04 * power_w, 1),
            temp_mem_c=round(temp_c + 4, 1),
            core_clock_mhz=round(IDLE_CLOCK_MHZ + (clock_mhz - IDLE_CLOCK_MHZ) * load),
            mem_clock_mhz=MEM_CLOCK_MHZ,
            voltage_mv=None if voltage_mv is None else round(voltage_mv),
            util_pct=round(min(100.0, 97.0 * load + rng.uniform(0, 2)), 1),
            fan_rpm=round(600 + 40 * max(0.0, temp_c - 30)),
            energy_j=round(energy_j, 1),
            pstate=None if self.kind.lock_clocks_mhz is None else (2 if load else 8),
            fan_pct=round(min(100.0, 20 + 1.2 * max(0.0, temp_c - 30)), 1),
            vram_used_mib=VRAM_IDLE_MIB + VRAM_LOAD_MIB * load,
            vram_total_mib=VRAM_TOTAL_MIB,
            power_limit_w=POWER_CAP_W,
            # An AMD-style card reports no limit reasons, as the real amdgpu backend without amdsmi (they are only
            # in the binary gpu_metrics, which amdsmi reads: docs/backends.md), so the simulation shows the
            # "limits: n/a" path; the NVIDIA-style card reports them as NVML does.
            throttle_reasons=None if self.kind.lock_clocks_mhz is None
            else ("power cap",) if power_w >= POWER_CAP_W * 0.98 else (),
        )

    def work_rate_tok_s(self, device_id: str) -> float:
        """The tokens a second this card would train at now: what its efficiency (tok/J = this / power_w) is to be
        measured with. The stress engine runs on the CPU for a simulated card, so its own tok/s is the CPU's
        (two back-to-back stock trials measured 3,055 and 4,002 tok/s on a shared 2-core box), and dividing it by
        the simulated power makes noise of the efficiency. The card's rate is deterministic: in proportion to its
        sustained clock (the AMD-style card holds one clock at every offset: equal work, less power lower down;
        the NVIDIA-style card's clock is its lock, or what the power cap allows)."""
        if not self._loaded(device_id):
            return 0.0
        if self.kind.lock_clocks_mhz is None:
            return WORK_RATE_TOK_S
        clock = nvidia_clock_mhz(self.kind, self._setting(device_id), self._lock_for(device_id))
        return WORK_RATE_TOK_S * clock / LOAD_CLOCK_MHZ

    def _lock_for(self, device_id: str) -> int:
        lock = self.lock_clock_mhz(device_id)
        assert lock is not None
        return lock



# --- the electrical model (pure functions: the tests and the benchmark read them) -------------------------------
def amd_voltage_mv(offset_mv: int, load: float) -> float:
    """The AMD-style card's core voltage: idle or loaded, moved by the offset as it is."""
    return IDLE_MV + (STOCK_LOAD_MV - IDLE_MV) * load + offset_mv


def amd_power_w(offset_mv: int, load: float) -> float:
    """Board power at equal work: dynamic power ~ V^2 at the same clock (the AMD-style card is not
    power-limited; at stock it loads just under the cap).

    >>> round(amd_power_w(0, 1.0), 1), round(amd_power_w(-50, 1.0), 1), amd_power_w(-50, 0.0)
    (300.0, 274.7, 15.0)
    """
    return IDLE_POWER_W + DYNAMIC_POWER_W * load * (amd_voltage_mv(offset_mv, load) / STOCK_LOAD_MV) ** 2


def nvidia_voltage_mv(kind: SimKind, offset_mhz: int, clock_mhz: float) -> float:
    """The NVIDIA-style card's voltage at `clock_mhz` on its V/F line, lowered by the clock offset."""
    assert kind.lock_clocks_mhz is not None
    lo, hi = kind.lock_clocks_mhz
    stock = NV_CURVE_MV[0] + (NV_CURVE_MV[1] - NV_CURVE_MV[0]) * (clock_mhz - lo) / (hi - lo)
    return stock - offset_mhz / kind.units_per_mv


def nvidia_power_w(kind: SimKind, offset_mhz: int, clock_mhz: float) -> float:
    """Loaded board power at `clock_mhz`: dynamic power ~ f V^2, NV_TOP_POWER_W at the stock table top."""
    assert kind.lock_clocks_mhz is not None
    top = kind.lock_clocks_mhz[1]
    scale = (clock_mhz / top) * (nvidia_voltage_mv(kind, offset_mhz, clock_mhz) / NV_CURVE_MV[1]) ** 2
    return IDLE_POWER_W + (NV_TOP_POWER_W - IDLE_POWER_W) * scale


def nvidia_clock_mhz(kind: SimKind, offset_mhz: int, lock_mhz: int) -> float:
    """The clock sustained under a training load: the lock, or lower where the power cap holds it (the highest
    clock whose power fits POWER_CAP_W, found by bisection on the monotone power curve), to 1 MHz.

    >>> nvidia_clock_mhz(NVIDIA, 0, 2505) < 2505 < nvidia_clock_mhz(NVIDIA, 0, 2505) + 300
    True
    >>> nvidia_clock_mhz(NVIDIA, 150, 2505) > nvidia_clock_mhz(NVIDIA, 0, 2505), nvidia_clock_mhz(NVIDIA, 0, 1800)
    (True, 1800.0)
    """
    assert kind.lock_clocks_mhz is not None
    if nvidia_power_w(kind, offset_mhz, lock_mhz) <= POWER_CAP_W:
        return float(lock_mhz)
    lo, hi = float(kind.lock_clocks_mhz[0]), float(lock_mhz)
    while hi - lo > 0.5:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if nvidia_power_w(kind, offset_mhz, mid) <= POWER_CAP_W else (lo, mid)
    return float(int(lo))
