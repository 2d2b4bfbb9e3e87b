"""AMD clock-limit (throttle) reasons: amdgpu's ASIC-independent throttler bits, as amdsmi reports them.

The SMU's throttler status reaches user space only inside the binary `gpu_metrics` table, whose layout differs by
table version (v1.3 on RDNA3/RDNA4 desktop cards, v1.4/v1.5 on Instinct, v2.x on APUs). amdsmi parses every
version, so the backend asks it (`amdsmi_get_gpu_metrics_info(handle)["indep_throttle_status"]`) rather than
parsing the table by hand. The bits are the kernel's `SMU_THROTTLER_*_BIT` (drivers/gpu/drm/amd/pm/swsmu/inc/
amdgpu_smu.h), which each ASIC's ppt code maps its own firmware bits onto (`smu_cmn_get_indep_throttler_status`).

What is not known stays unknown (None, shown `limits: n/a`): amdsmi missing, the call failing, or the field
absent from this card's table (amdsmi's Python interface gives "N/A" for a field the library left at its type's
maximum). An int is a reading: 0 means no limit active, shown `none`.
"""

from __future__ import annotations

# bit -> the name a user reads (the temperature, VR-hot and PROCHOT bits all say "thermal": the load check
# (tuner.tuning.load_check) treats any reason containing "thermal" as the board slowing itself down for heat)
INDEP_THROTTLERS: dict[int, str] = {
    0: "power cap (PPT0)", 1: "power cap (PPT1)", 2: "power cap (PPT2)", 3: "power cap (PPT3)",
    4: "sustained power (SPL)", 5: "fast power (FPPT)", 6: "slow power (SPPT)", 7: "slow power (APU)",
    16: "current (gfx)", 17: "current (soc)", 18: "current (mem)", 19: "current (vdd)", 20: "current (cvip)",
    21: "current (edc cpu)", 22: "current (edc gfx)", 23: "current (apcc)",
    32: "thermal (gpu)", 33: "thermal (core)", 34: "thermal (mem)", 35: "thermal (edge)", 36: "thermal (hotspot)",
    37: "thermal (soc)", 38: "thermal (vr gfx)", 39: "thermal (vr soc)", 40: "thermal (vr mem0)",
    41: "thermal (vr mem1)", 42: "thermal (liquid0)", 43: "thermal (liquid1)", 44: "thermal (vr hot 0)",
    45: "thermal (vr hot 1)", 46: "thermal (prochot cpu)", 47: "thermal (prochot gfx)",
    56: "power management (ppm)", 57: "reliability (fit)",
}
UINT64_MAX = (1 << 64) - 1  # what the library leaves in a field the table does not have


def throttle_reasons(metrics: object) -> tuple[str, ...] | None:
    """The active reasons in amdsmi's gpu metrics, in bit order; () when none is active; None when unknown.

    >>> throttle_reasons({"indep_throttle_status": (1 << 0) | (1 << 36)})
    ('power cap (PPT0)', 'thermal (hotspot)')
    >>> throttle_reasons({"indep_throttle_status": 0}), throttle_reasons({"indep_throttle_status": "N/A"})
    ((), None)
    >>> throttle_reasons({"indep_throttle_status": 1 << 60}), throttle_reasons(None)
    (('reason bit 60',), None)
    """
    if not isinstance(metrics, dict):
        return None
    status = metrics.get("indep_throttle_status")
    if isinstance(status, bool) or not isinstance(status, int) or not 0 <= status < UINT64_MAX:
        return None
    return tuple(INDEP_THROTTLERS.get(bit, f"reason bit {bit}") for bit in range(64) if status >> bit & 1)
