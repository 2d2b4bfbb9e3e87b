"""`python -m tuner.engine.probe`: what this torch build sees, as one JSON document on stdout.

Run by `tuner doctor` in a subprocess, so the CLI and UI processes never import torch.
"""

from __future__ import annotations

import json
import sys


def probe() -> dict:
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure is a finding, not a crash
        return {"torch": None, "error": f"{type(e).__name__}: {e}"}
    from tuner.engine.platform import bf16_supported, props_bus_id

    devices = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            devices.append(
                {"index": i, "name": props.name, "capability": [props.major, props.minor],
                 "bf16": bf16_supported(i), "pci_bus_id": props_bus_id(props),
                 "memory_gib": round(props.total_memory / 2**30, 1)}
            )
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "devices": devices,
    }


if __name__ == "__main__":
    json.dump(probe(), sys.stdout)
    sys.stdout.write("\n")
