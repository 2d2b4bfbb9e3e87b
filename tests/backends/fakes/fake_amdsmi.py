"""A fake `amdsmi` module: the handful of calls the AMD backend makes, answering as the real library does.

Strict where the real one is unkind: a card whose ASIC serial the library cannot read (unique_id 0 or not exposed:
APUs, many consumer boards) answers `asic_serial` "N/A" (ROCm/rocm-systems PR #3041; older versions printed the
placeholder as hex, "ffffffffffffffff" or zeros, PR #2269), never a missing key or None.
"""

from __future__ import annotations

import types

NOT_AVAILABLE = "N/A"  # what amdsmi's Python interface puts in a field the library could not read


def fake_amdsmi(serials: dict[str, str | None], *, market_name: str = "Radeon Fake 9070") -> types.SimpleNamespace:
    """amdsmi over the cards at the PCI addresses in `serials`; a None serial is one the library cannot read. The real
    asic_serial is the card's unique_id printed as unpadded hex by newer releases ("%lu" by old ones; ROCm/amdsmi
    src/amd_smi/amd_smi.cc, amdsmi_get_gpu_asic_info), where the kernel's sysfs `unique_id` is "%016llx": a test
    that gives both writes the two texts of one number."""
    handles = {f"h{i}": bdf for i, bdf in enumerate(serials)}
    return types.SimpleNamespace(
        AmdSmiInitFlags=types.SimpleNamespace(INIT_AMD_GPUS=1),
        amdsmi_init=lambda flags: None,
        amdsmi_get_processor_handles=lambda: list(handles),
        amdsmi_get_gpu_device_bdf=lambda h: handles[h],
        amdsmi_get_gpu_asic_info=lambda h: {"market_name": market_name,
                                            "asic_serial": serials[handles[h]] or NOT_AVAILABLE},
        amdsmi_get_gpu_vbios_info=lambda h: {"version": "023.008.000.068"},
        amdsmi_shut_down=lambda: None,
    )
