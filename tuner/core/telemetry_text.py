"""Telemetry figures in words, shared by the dashboard and `tuner status` so both say the same thing: a figure
the device does not report is "n/a", never a made-up 0, and clock-limit reasons the backend cannot read are "n/a",
never "none" (which claims that none are active)."""

from __future__ import annotations

from tuner.core.models import Telemetry


def fmt(value: float | None, unit: str, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:.{digits}f} {unit}"


def limits_text(reasons: tuple[str, ...] | None) -> str:
    """The clock-limit reasons; "n/a" when the backend cannot read them (None), "none" only when it read none."""
    if reasons is None:
        return "n/a"
    return ", ".join(reasons) if reasons else "none"


def fan_text(sample: Telemetry) -> str:
    """`45 % (1200 rpm)`, or the rpm alone when the share of the maximum is unknown."""
    if sample.fan_pct is not None:
        return f"{sample.fan_pct:.0f} %" + (f" ({sample.fan_rpm:.0f} rpm)" if sample.fan_rpm is not None else "")
    return fmt(sample.fan_rpm, "rpm")


def vram_text(sample: Telemetry) -> str:
    """`1.5/24 GiB` used of total (the total left out when unknown)."""
    if sample.vram_used_mib is None:
        return "n/a"
    used_gib = sample.vram_used_mib / 1024
    if sample.vram_total_mib:
        return f"{used_gib:.1f}/{sample.vram_total_mib / 1024:.0f} GiB"
    return f"{used_gib:.1f} GiB"
