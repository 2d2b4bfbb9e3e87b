"""The simulated cards' efficiency model (tuner/backends/simulated.py): power, sustained clock, work rate and
tok/J per setting, for both kinds, from the model itself (no engine, nothing random).
Run: .venv/bin/python bench/sim_efficiency.py"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tuner.backends.simulated import SimulatedBackend


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for kind, settings in (("amd", (0, -20, -25, -50, -100)), ("nvidia", (0, 60, 150, 300))):
            card = SimulatedBackend(kind=kind, state_path=Path(tmp) / kind)
            card.note_load("sim0", True)
            unit = card.knob("sim0").unit
            if kind == "nvidia":
                stock_clock = card.telemetry("sim0").core_clock_mhz
                print(f"nvidia: sustains {stock_clock:.0f} MHz at stock (table top 2505 MHz, power-limited); "
                      f"locked at {card.lock_at_measured_clock('sim0', stock_clock)} MHz as a bisect's baseline does")
            base = None
            for value in settings:
                card.apply("sim0", value)
                t = card.telemetry("sim0")
                rate = card.work_rate_tok_s("sim0")
                tok_per_j = rate / t.power_w
                base = base or tok_per_j
                volts = "-" if t.voltage_mv is None else f"{t.voltage_mv:.0f} mV"
                print(f"{kind:6s} {value:+5d} {unit:3s}  clock {t.core_clock_mhz:5.0f} MHz  voltage {volts:>7s}  "
                      f"power {t.power_w:5.1f} W  {rate:7.0f} tok/s  {tok_per_j:6.2f} tok/J  "
                      f"{(tok_per_j / base - 1) * 100:+5.1f} % vs stock")


if __name__ == "__main__":
    main()
