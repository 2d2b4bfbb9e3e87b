"""A simulated GPU, so the whole workflow can be tried and tested on a machine without one.

Two kinds (`--sim-kind`): "amd" (default), a voltage offset in mV where lower undervolts harder; and "nvidia", a
positive graphics-clock offset in MHz (15 MHz steps) applied at a locked max clock, where higher undervolts harder
(the card runs each clock at a lower voltage). Each card has a hidden stable limit in its knob's unit (`--sim-vmin`:
mV, or MHz). Past it the stress engine is told to inject silent bit flips at a per-step rate that makes a fault
within 50 steps near certain; far past it the card "hangs". Telemetry responds to load and to the setting (dynamic
power ~ V^2, temperature lags power). Everything is deterministic from the seed. Applied settings persist in the
state directory (one file per kind and seed) so separate `tuner` invocations see the same card.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tuner.backends.base import Backend
from tuner.core import paths
from tuner.core.atomic import write_atomic
from tuner.core.errors import StateError, UsageError
from tuner.core.models import Capabilities, DeviceInfo, Knob, KnobKind, StressTarget, Telemetry
from tuner.core.processes import pid_alive

VMIN_RANGE_MV = (-120, -30)
KNOB_MIN_MV, KNOB_MAX_MV, KNOB_STEP_MV = -200, 0, 5
HANG_DEPTH_MV = 40  # at or below vmin - 40 mV the card stops responding
MAX_SIM_GPUS = 16
SIM_KINDS = ("amd", "nvidia")


@dataclass(frozen=True)
class SimKind:
    """What one kind of simulated card looks like: its knob, the range its hidden limit is drawn from, and how
    its knob's unit maps onto the mV fault model (`units_per_mv`: on the NVIDIA-style card 15 MHz of offset at a
    locked clock is worth about 5 mV less voltage, so 3 MHz a mV)."""

    name: str
    card_name: str
    kind: KnobKind
    unit: str
    knob_min: int
    knob_max: int
    knob_step: int
    aggressive_direction: int
    limit_range: tuple[int, int]
    units_per_mv: int
    lock_clocks_mhz: tuple[int, int] | None = None  # lowest and stock max graphics clock (NVIDIA-style only)
    pci_id: str = "0000:0000"

    @property
    def state_key(self) -> str:
        return f"offset_{self.unit.lower()}"

    def depth_mv(self, setting: int, limit: int) -> float:
        """How far past the limit `setting` is, in mV of the fault model (<= 0: at or inside the limit)."""
        return (setting - limit) * self.aggressive_direction / self.units_per_mv


AMD = SimKind("amd", "Simulated RDNA-class GPU", KnobKind.VOLTAGE_OFFSET, "mV", KNOB_MIN_MV, KNOB_MAX_MV,
              KNOB_STEP_MV, -1, VMIN_RANGE_MV, 1)
# Clock offsets as NVML offers them on Ada/Blackwell cards: 15 MHz steps (tuner.backends.nvml_offsets), a
# negative side that is the less efficient one, a stock max boost to lock at.
NVIDIA = SimKind("nvidia", "Simulated Ada-class GPU (NVIDIA-style)", KnobKind.CLOCK_OFFSET, "MHz", -300, 600, 15,
                 +1, (60, 240), 3, lock_clocks_mhz=(210, 2505), pci_id="10de:0000")
KINDS = {k.name: k for k in (AMD, NVIDIA)}
SIM_NVIDIA_PSTATES = (0, 2)  # the states an offset covers; the card works in P2 and idles in P8

# Electrical model of an imaginary 300 W card; the figures only need to be plausible and monotone.
STOCK_LOAD_MV, IDLE_MV = 1100.0, 800.0
IDLE_POWER_W, DYNAMIC_POWER_W = 15.0, 285.0
POWER_CAP_W = 300.0  # the simulated board's power limit (load power stays just under it at stock)
VRAM_TOTAL_MIB, VRAM_IDLE_MIB, VRAM_LOAD_MIB = 32_768.0, 420.0, 6_200.0
LOAD_CLOCK_MHZ, IDLE_CLOCK_MHZ, MEM_CLOCK_MHZ = 2900.0, 500.0, 1250.0
THERMAL_TAU_S = 15.0


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


def hangs_at(offset_mv: int, vmin_mv: int) -> bool:
    return offset_mv <= vmin_mv - HANG_DEPTH_MV


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
        lo, hi = sorted((0, k.knob_min if k.aggressive_direction < 0 else k.knob_max))
        given = [] if vmin_mv is None else [vmin_mv] if isinstance(vmin_mv, int) else list(vmin_mv)
        if len(given) > gpus:
            raise UsageError(f"--sim-vmin gives {len(given)} limits but there are {gpus} simulated cards",
                             f"give at most one value per card, or pass --sim-gpus {len(given)}")
        for value in given:
            if isinstance(value, bool) or not isinstance(value, int) or not lo < value < hi:
                example = (k.limit_range[0] + k.limit_range[1]) // 2
                raise UsageError(
                    f"--sim-vmin must be between {lo} and {hi} {k.unit} (exclusive) on a simulated {k.name} "
                    f"card, got {value}",
                    f"e.g. --sim-vmin {example}",
                )
        self.gpus, self.seed = gpus, seed
        self._sdc_rates = _per_card_rates(sdc_rate, gpus)
        self.driver = driver or "simulated"
        self._limits = [draw_limit(k, seed, i) for i in range(gpus)]
        self._limits[:len(given)] = given
        name = f"seed-{seed}.json" if k is AMD else f"{k.name}-seed-{seed}.json"
        self.state_path = state_path or paths.state_dir() / "simulated" / name
        self._clock = clock
        # simulated platform flaws, carried out by the engine's fault-injection module (tuner/engine/faults.py)
        self.nondeterministic = nondeterministic
        self.contention_at = None if contention_after_s is None else time.time() + contention_after_s
        self._warn = warn or (lambda msg: print(f"tuner: warning: {msg}", file=sys.stderr))
        self._thermal: dict[str, tuple[float, float, float]] = {}  # id -> (time_s, temp_c, energy_j)
        self._samples = 0
        self._lock_mhz: dict[str, int] = {}
        # a rig bisect drives every card from its own thread: one writer of the shared state at a time
        self._state_lock = threading.RLock()
        self._state = self._load_state()

    # --- state file -------------------------------------------------------------------------------------------
    def _load_state(self) -> dict:
        try:
            raw = self.state_path.read_bytes()
        except FileNotFoundError:
            return {"cards": {}}
        except OSError as e:
            raise StateError(
                f"cannot read simulated GPU state {self.state_path}: {e.strerror}",
                "fix its permissions or remove it (`tuner --simulate reset` recreates it)",
            ) from None
        try:
            state = json.loads(raw)
            cards = state["cards"]
            for card_id, card in cards.items():
                if not isinstance(card.get(self.kind.state_key), int):
                    raise ValueError(card_id)
            return state
        except (ValueError, KeyError, TypeError, AttributeError):
            self._warn(f"simulated GPU state {self.state_path} was corrupt; reset the simulated cards to stock")
            state = {"cards": {}}
            self._save_state(state)
            return state

    def _save_state(self, state: dict | None = None) -> None:
        try:
            with self._state_lock:
                data = json.dumps(state or self._state, indent=1).encode()
                write_atomic(self.state_path, data)
        except OSError as e:
            raise StateError(
                f"cannot write simulated GPU state {self.state_path}: {e.strerror}", "check XDG_STATE_HOME"
            ) from None

    def _card(self, device_id: str) -> dict:
        self.device(device_id)  # UnknownDevice for a bad id
        with self._state_lock:
            return self._state["cards"].setdefault(device_id, {self.kind.state_key: 0})

    def _setting(self, device_id: str) -> int:
        return self._card(device_id)[self.kind.state_key]

    # --- hidden truth (tests and the benchmark read it; the UI never shows it) ---------------------------------
    def limit(self, device_id: str) -> int:
        """The most aggressive stable setting, in the knob's unit."""
        return self._limits[self._index(device_id)]

    def vmin_mv(self, device_id: str) -> int:
        """The AMD-style card's limit in mV."""
        if self.kind is not AMD:
            raise ValueError(f"a simulated {self.kind.name} card's limit is in {self.kind.unit}: use limit()")
        return self.limit(device_id)

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
        k = self.kind
        return Knob(
            kind=k.kind,
            unit=k.unit,
            stock=0,
            current=self._setting(device_id),
            min=k.knob_min,
            max=k.knob_max,
            step=k.knob_step,
            aggressive_direction=k.aggressive_direction,
            lock_clock_mhz=self.lock_clock_mhz(device_id),
        )

    def apply(self, device_id: str, value: int, *, allow_overvolt: bool = False) -> Knob:
        self.knob(device_id).validate(value, allow_overvolt=allow_overvolt)
        with self._state_lock:
            self._card(device_id)[self.kind.state_key] = value
            self._save_state()
        return self.knob(device_id)

    def reset(self, device_id: str) -> Knob:
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
            raise UsageError("--lock-mhz applies only to NVIDIA cards", "drop --lock-mhz")
        self.device(device_id)
        lo, hi = clocks
        if isinstance(mhz, bool) or not isinstance(mhz, int) or not lo <= mhz <= hi:
            raise UsageError(f"--lock-mhz {mhz} is outside this card's clocks {lo}..{hi} MHz",
                             f"pick a clock between {lo} and {hi} MHz")
        self._lock_mhz[device_id] = mhz

    def lock_at_measured_clock(self, device_id: str, clock_mhz: float) -> int | None:
        """As tuner.backends.nvidia: lock at the clock sustained under the stock baseline, snapped down to a
        supported clock (here every 15 MHz from the lowest)."""
        clocks = self.kind.lock_clocks_mhz
        if clocks is None:
            return None
        lo, hi = clocks
        mhz = max(lo, min(hi, lo + int((clock_mhz - lo) // self.kind.knob_step) * self.kind.knob_step))
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
            can_read_voltage=True,
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
        with self._state_lock:
            card = self._card(device_id)
            if active:
                card["load_pid"] = os.getpid()
            else:
                card.pop("load_pid", None)
            self._save_state()

    def _loaded(self, device_id: str) -> bool:
        return pid_alive(self._card(device_id).get("load_pid"))

    def telemetry(self, device_id: str) -> Telemetry:
        now = self._clock()
        load = 1.0 if self._loaded(device_id) else 0.0
        # the voltage the setting means: an mV offset as is; a clock offset lowers the voltage of each clock
        offset_mv = -self.kind.aggressive_direction * self._setting(device_id) / self.kind.units_per_mv
        rng = random.Random(f"tuner-sim-telemetry:{self.seed}:{device_id}:{self._samples}")
        self._samples += 1
        jitter = 1.0 + rng.uniform(-0.01, 0.01)

        voltage_mv = IDLE_MV + (STOCK_LOAD_MV - IDLE_MV) * load + offset_mv
        dynamic_w = DYNAMIC_POWER_W * load * (voltage_mv / STOCK_LOAD_MV) ** 2
        power_w = (IDLE_POWER_W + dynamic_w) * jitter
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
            core_clock_mhz=round(IDLE_CLOCK_MHZ + (self._load_clock_mhz(device_id) - IDLE_CLOCK_MHZ) * load),
            mem_clock_mhz=MEM_CLOCK_MHZ,
            voltage_mv=round(voltage_mv * jitter),
            util_pct=round(min(100.0, 97.0 * load * jitter + rng.uniform(0, 2)), 1),
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

    def _load_clock_mhz(self, device_id: str) -> float:
        lock = self.lock_clock_mhz(device_id)
        return LOAD_CLOCK_MHZ if lock is None else float(lock)
