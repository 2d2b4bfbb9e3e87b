"""A simulated GPU, so the whole workflow can be tried and tested on a machine without one.

Each card has a hidden stable limit (`vmin_mv`). Below it the stress engine is told to inject silent bit flips at
a per-step rate that makes a fault within 50 steps near certain; far below it the card "hangs". Telemetry responds
to load and to the offset (dynamic power ~ V^2, temperature lags power). Everything is deterministic from the seed.
Applied offsets persist in the state directory so separate `tuner` invocations see the same card.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tuner.core import paths
from tuner.core.atomic import write_atomic
from tuner.backends.base import Backend
from tuner.core.errors import StateError, UsageError
from tuner.core.models import Capabilities, DeviceInfo, Knob, KnobKind, StressTarget, Telemetry

VMIN_RANGE_MV = (-120, -30)
KNOB_MIN_MV, KNOB_MAX_MV, KNOB_STEP_MV = -200, 0, 5
HANG_DEPTH_MV = 40  # at or below vmin - 40 mV the card stops responding
MAX_SIM_GPUS = 16

# Electrical model of an imaginary 300 W card; the figures only need to be plausible and monotone.
STOCK_LOAD_MV, IDLE_MV = 1100.0, 800.0
IDLE_POWER_W, DYNAMIC_POWER_W = 15.0, 285.0
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
    depth_mv = vmin_mv - offset_mv
    if depth_mv <= 0:
        return 0.0
    return round(min(1.0, 0.15 + 0.02 * depth_mv), 6)


def hangs_at(offset_mv: int, vmin_mv: int) -> bool:
    return offset_mv <= vmin_mv - HANG_DEPTH_MV


def draw_vmin_mv(seed: int, index: int) -> int:
    """The hidden limit of card `index` for `seed`, in VMIN_RANGE_MV."""
    return random.Random(f"tuner-sim:{seed}:{index}").randint(*VMIN_RANGE_MV)


class SimulatedBackend(Backend):
    name = "simulated"
    simulated = True

    def __init__(
        self,
        gpus: int = 1,
        seed: int = 0,
        vmin_mv: int | None = None,
        state_path: Path | None = None,
        clock: Callable[[], float] = time.time,
        warn: Callable[[str], None] | None = None,
        nondeterministic: bool = False,
        contention_after_s: float | None = None,
    ):
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= MAX_SIM_GPUS:
            raise UsageError(f"--sim-gpus must be 1..{MAX_SIM_GPUS}, got {gpus}", "e.g. --sim-gpus 2")
        if vmin_mv is not None and not KNOB_MIN_MV < vmin_mv < KNOB_MAX_MV:
            raise UsageError(
                f"--sim-vmin must be between {KNOB_MIN_MV} and {KNOB_MAX_MV} mV (exclusive), got {vmin_mv}",
                "e.g. --sim-vmin -52",
            )
        self.gpus, self.seed = gpus, seed
        self._vmins = [draw_vmin_mv(seed, i) for i in range(gpus)]
        if vmin_mv is not None:
            self._vmins[0] = vmin_mv
        self.state_path = state_path or paths.state_dir() / "simulated" / f"seed-{seed}.json"
        self._clock = clock
        # simulated platform flaws, carried out by the engine's fault-injection module (tuner/engine/faults.py)
        self.nondeterministic = nondeterministic
        self.contention_at = None if contention_after_s is None else time.time() + contention_after_s
        self._warn = warn or (lambda msg: print(f"tuner: warning: {msg}", file=sys.stderr))
        self._thermal: dict[str, tuple[float, float, float]] = {}  # id -> (time_s, temp_c, energy_j)
        self._samples = 0
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
                if not isinstance(card.get("offset_mv"), int):
                    raise ValueError(card_id)
            return state
        except (ValueError, KeyError, TypeError, AttributeError):
            self._warn(f"simulated GPU state {self.state_path} was corrupt; reset the simulated cards to stock")
            state = {"cards": {}}
            self._save_state(state)
            return state

    def _save_state(self, state: dict | None = None) -> None:
        try:
            write_atomic(self.state_path, json.dumps(state or self._state, indent=1).encode())
        except OSError as e:
            raise StateError(
                f"cannot write simulated GPU state {self.state_path}: {e.strerror}", "check XDG_STATE_HOME"
            ) from None

    def _card(self, device_id: str) -> dict:
        self.device(device_id)  # UnknownDevice for a bad id
        return self._state["cards"].setdefault(device_id, {"offset_mv": 0})

    # --- hidden truth (tests and the benchmark read it; the UI never shows it) ---------------------------------
    def vmin_mv(self, device_id: str) -> int:
        return self._vmins[self._index(device_id)]

    def _index(self, device_id: str) -> int:
        self.device(device_id)
        return int(device_id.removeprefix("sim"))

    # --- Backend ------------------------------------------------------------------------------------------------
    def devices(self) -> list[DeviceInfo]:
        return [
            DeviceInfo(
                id=f"sim{i}",
                vendor="simulated",
                name="Simulated RDNA-class GPU",
                pci_id="0000:0000",
                subsystem_id="0000:0000",
                vbios="SIM.000.000",
                driver_version="simulated",
                serial=f"SIM-{self.seed:04d}-{i:02d}",
                od_format="simulated",
                simulated=True,
            )
            for i in range(self.gpus)
        ]

    def knob(self, device_id: str) -> Knob:
        return Knob(
            kind=KnobKind.VOLTAGE_OFFSET,
            unit="mV",
            stock=0,
            current=self._card(device_id)["offset_mv"],
            min=KNOB_MIN_MV,
            max=KNOB_MAX_MV,
            step=KNOB_STEP_MV,
            aggressive_direction=-1,
        )

    def apply(self, device_id: str, value: int, *, allow_overvolt: bool = False) -> Knob:
        self.knob(device_id).validate(value, allow_overvolt=allow_overvolt)
        self._card(device_id)["offset_mv"] = value
        self._save_state()
        return self.knob(device_id)

    def reset(self, device_id: str) -> Knob:
        return self.apply(device_id, 0)

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
        offset_mv, vmin_mv = self.knob(device_id).current, self.vmin_mv(device_id)
        return StressTarget(
            torch_device="cpu",
            pci_bus_id=None,
            fault_rate=fault_rate_per_step(offset_mv, vmin_mv),
            hang=hangs_at(offset_mv, vmin_mv),
            simulated=True,
            engine_args=self._flaw_args(),
        )

    def _flaw_args(self) -> tuple[str, ...]:
        args: tuple[str, ...] = ("--sim-nondeterministic",) if self.nondeterministic else ()
        if self.contention_at is not None:
            args += ("--sim-contention-at", f"{self.contention_at:.3f}")
        return args

    def note_load(self, device_id: str, active: bool) -> None:
        card = self._card(device_id)
        if active:
            card["load_pid"] = os.getpid()
        else:
            card.pop("load_pid", None)
        self._save_state()

    def _loaded(self, device_id: str) -> bool:
        pid = self._card(device_id).get("load_pid")
        if not isinstance(pid, int):
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def telemetry(self, device_id: str) -> Telemetry:
        now = self._clock()
        load = 1.0 if self._loaded(device_id) else 0.0
        offset_mv = self._card(device_id)["offset_mv"]
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
            core_clock_mhz=round(IDLE_CLOCK_MHZ + (LOAD_CLOCK_MHZ - IDLE_CLOCK_MHZ) * load),
            mem_clock_mhz=MEM_CLOCK_MHZ,
            voltage_mv=round(voltage_mv * jitter),
            util_pct=round(min(100.0, 97.0 * load * jitter + rng.uniform(0, 2)), 1),
            fan_rpm=round(600 + 40 * max(0.0, temp_c - 30)),
            energy_j=round(energy_j, 1),
        )
