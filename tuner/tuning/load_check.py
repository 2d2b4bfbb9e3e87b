"""Is the stress load heavy? A pass proves stability only for loads at least as demanding as the real job, so the
baseline trial (stock settings) reports its board power against the card's limit, and a load far below the
limit gets a warning that names the likely cause.

Pure functions of a `TrialResult` (mean and 95th-percentile power, the enforced limit, the throttle reasons the
driver reported, the preset). Thresholds: a training load that saturates a GPU draws close to its limit (or is
held there by the "power cap" reason); under LIGHT_LOAD_FRACTION of the limit something else is holding it back.
"""

from __future__ import annotations

LIGHT_LOAD_FRACTION = 0.6
LIGHT_PRESETS = ("tiny", "small")
# The reasons that mean the board slowed itself down (heat, or the hardware slowdown and power-brake signals),
# in the names the backends report (tuner.backends.nvidia.REASON_NAMES).
_THERMAL = ("thermal", "hw thermal", "hw slowdown", "hw power brake")


def load_note(mean_power_w: float | None, power_limit_w: float | None) -> str | None:
    """`load_note(245.0, 350.0) == "load 245 W of the card's 350 W limit (70 %)"`; None when either is unknown."""
    if not mean_power_w or not power_limit_w:
        return None
    pct = 100 * mean_power_w / power_limit_w
    return f"load {mean_power_w:.0f} W of the card's {power_limit_w:.0f} W limit ({pct:.0f} %)"


def light_load_warning(mean_power_w: float | None, power_limit_w: float | None, *, preset: str | None,
                       throttle_reasons: tuple[str, ...] = ()) -> str | None:
    """A one-line warning when the baseline drew under LIGHT_LOAD_FRACTION of the limit, else None."""
    if not mean_power_w or not power_limit_w or mean_power_w >= LIGHT_LOAD_FRACTION * power_limit_w:
        return None
    thermal = [r for r in throttle_reasons if r in _THERMAL or "thermal" in r]
    if thermal:
        cause = f"the card is thermally limited ({', '.join(thermal)}): check its cooling"
    elif preset in LIGHT_PRESETS:
        cause = f"the '{preset}' preset is a light load: use --preset nanochat"
    else:
        cause = ("the GPU is probably waiting on the CPU or the data (another process on the CPU, or "
                 "--no-compile)")
    return (f"the stress load is light: {load_note(mean_power_w, power_limit_w)}; likely cause: {cause}. "
            "A pass under a light load says little about a heavy one")
