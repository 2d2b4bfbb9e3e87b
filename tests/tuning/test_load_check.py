"""Heavy-load evidence: percentiles and power limits in the telemetry summary, the baseline's load note, and
the warning for a light load naming its likely cause."""

from __future__ import annotations

from tuner.core.models import Telemetry
from tuner.tuning.events import TrialResult
from tuner.tuning.job import _with_load_report
from tuner.tuning.load_check import light_load_warning, load_note
from tuner.tuning.sampler import percentile, summarize


def test_percentile_nearest_rank():
    assert percentile([], 95) is None
    assert percentile([5.0], 95) == 5.0
    assert percentile([float(i) for i in range(1, 101)], 95) == 95.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 95) == 4.0


def test_summary_has_p95_power_limit_and_throttle_reasons():
    samples = [Telemetry(time_s=float(i), power_w=100.0 + i, core_clock_mhz=1800.0, power_limit_w=350.0,
                         throttle_reasons=("sw_power_cap",) if i % 2 else ()) for i in range(20)]
    samples.append(Telemetry(time_s=20.0, power_w=300.0, throttle_reasons=("hw_thermal", "sw_power_cap")))
    s = summarize(samples)
    assert s.p95_power_w == 119.0 and s.power_limit_w == 350.0
    assert s.throttle_reasons == ("sw_power_cap", "hw_thermal")
    assert s.median_core_clock_mhz == 1800.0


def test_load_note_and_light_load_causes():
    assert load_note(245.0, 350.0) == "load 245 W of the card's 350 W limit (70 %)"
    assert load_note(None, 350.0) is None and load_note(200.0, None) is None
    assert light_load_warning(300.0, 350.0, preset="tiny") is None  # 86 %: heavy enough
    assert "preset" in light_load_warning(100.0, 350.0, preset="small")
    assert "thermally" in light_load_warning(100.0, 350.0, preset="nanochat", throttle_reasons=("hw_thermal",))
    assert "CPU" in light_load_warning(100.0, 350.0, preset="nanochat")
    assert light_load_warning(100.0, None, preset="tiny") is None  # no limit known: no claim either way


def test_baseline_gets_its_load_note_and_a_light_load_warning():
    r = TrialResult(setting=0, unit="mV", phase="baseline", verdict="pass", power_w=120.0, power_limit_w=400.0)
    noted, light = _with_load_report(r, "small")
    assert noted.load_note == "load 120 W of the card's 400 W limit (30 %)"
    assert light is not None and "small" in light
    again = TrialResult.from_record(noted.to_record())
    assert again.load_note == noted.load_note and again.power_limit_w == 400.0


class _LightCard:
    """The simulated card drawing a quarter of its power limit under load (a light stress load)."""

    @staticmethod
    def make():
        from dataclasses import replace

        from tuner.backends.simulated import SimulatedBackend

        class LightCard(SimulatedBackend):
            def telemetry(self, device_id):
                return replace(super().telemetry(device_id), power_w=80.0, power_limit_w=330.0)

        return LightCard(vmin_mv=-52)


def test_a_bisect_baseline_reports_its_load_and_warns_when_light(boot):
    from tests.tuning.fake_engine import FakeEngine
    from tuner.tuning.events import TrialFinished, TrialWarning
    from tuner.tuning.job import BisectJob, BisectParams

    events: list = []
    BisectJob(_LightCard.make(), "sim0", BisectParams(trial_s=1, confirm_s=1), events.append,
              engine_factory=FakeEngine()).run()
    baseline = next(e.result for e in events if isinstance(e, TrialFinished) and e.result.phase == "baseline")
    assert baseline.load_note == "load 80 W of the card's 330 W limit (24 %)"
    assert baseline.power_limit_w == 330.0 and baseline.p95_power_w == 80.0
    light = [e.message for e in events if isinstance(e, TrialWarning) and "light" in e.message]
    assert len(light) == 1 and "'tiny' preset" in light[0]
    others = [e.result for e in events if isinstance(e, TrialFinished) and e.result.phase != "baseline"]
    assert others and all(r.load_note is None for r in others)  # only the baseline reports it


def test_the_nvidia_backends_hardware_slowdown_names_count_as_thermal():
    """The names are the ones tuner.backends.nvidia decodes the clock event reasons into (spaces, not the old
    underscores): a light load held back by any of them blames the cooling, not the preset."""
    from tuner.backends.nvidia import REASON_NAMES

    shown = dict(REASON_NAMES)
    for reason in (shown["HwSlowdown"], shown["HwPowerBrakeSlowdown"], shown["SwThermalSlowdown"],
                   shown["HwThermalSlowdown"]):
        warning = light_load_warning(100.0, 300.0, preset="nanochat", throttle_reasons=(reason,))
        assert warning is not None and "thermally limited" in warning, reason
