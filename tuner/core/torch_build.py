"""Which torch build this machine's GPUs need: CUDA for NVIDIA, ROCm for AMD, CPU where neither is found.

One rule, read by two: `scripts/install-system.sh` (which installs that build) and `tuner doctor` (which says
whether the installed one matches). Standard library only: the installer runs it with the system's python3
straight from the checkout, before any venv exists (`python3 -m tuner.core.torch_build`).

The vendor comes from the PCI vendor id of each DRM card (`/sys/class/drm/cardN/device/vendor`, under
`TUNER_SYSFS_ROOT` so tests and dry runs read fake trees): `0x10de` NVIDIA, `0x1002` AMD; other vendors (an
Intel iGPU, simpledrm) are not tuned and do not count. `TUNER_TORCH` overrides the choice (`cpu`, `cuda`, `rocm`,
or `keep`: leave the torch already installed alone); `TUNER_TORCH_INDEX` overrides the index a build comes from.
A machine with both vendors' cards needs one build per vendor, which one venv cannot hold: refused, naming both.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tuner.core import kernel_files

VENDOR_IDS = {0x10DE: "nvidia", 0x1002: "amd"}
BUILD_OF_VENDOR = {"nvidia": "cuda", "amd": "rocm"}
BUILDS = ("cpu", "cuda", "rocm", "keep")
# Where each build comes from. PyPI's own torch wheels for Linux x86_64 are the CUDA build; the ROCm and CPU builds
# live on PyTorch's indexes (https://pytorch.org/get-started/locally/). A newer ROCm index: TUNER_TORCH_INDEX.
INDEX_URLS = {
    "cpu": "https://download.pytorch.org/whl/cpu",
    "cuda": None,  # PyPI
    "rocm": "https://download.pytorch.org/whl/rocm7.2",
}
WORDS = {"cpu": "CPU-only", "cuda": "CUDA", "rocm": "ROCm", "keep": "the one already installed"}


class BuildChoiceError(ValueError):
    """No single build fits (cards of both vendors), or TUNER_TORCH names no build: one line for the user."""


@dataclass(frozen=True)
class TorchBuild:
    name: str  # "cpu" | "cuda" | "rocm" | "keep"
    why: str  # "NVIDIA card at card1", "TUNER_TORCH=cpu", "no NVIDIA or AMD card found"
    index_url: str | None  # None: the default index (PyPI)

    @property
    def words(self) -> str:
        return WORDS[self.name]


def gpu_vendors(root: Path) -> dict[str, list[str]]:
    """{vendor: [card, ...]} for the NVIDIA and AMD cards under `root`/sys/class/drm, in card order."""
    found: dict[str, list[str]] = {}
    for card, _, vendor_id in kernel_files.drm_cards(root):
        if vendor_id in VENDOR_IDS:
            found.setdefault(VENDOR_IDS[vendor_id], []).append(card)
    return found


def needed_build(root: Path | None = None, env: Mapping[str, str] | None = None) -> TorchBuild:
    """The build this machine needs (TUNER_TORCH first). Raises BuildChoiceError."""
    env = os.environ if env is None else env
    root = Path(env.get("TUNER_SYSFS_ROOT") or "/") if root is None else root  # empty is unset, as paths.sysfs_root
    override = env.get("TUNER_TORCH", "").strip()
    if override:
        if override not in BUILDS:
            raise BuildChoiceError(f"TUNER_TORCH={override!r} names no torch build; use one of {', '.join(BUILDS)}")
        return TorchBuild(override, f"TUNER_TORCH={override}", _index(override, env))
    vendors = gpu_vendors(root)
    if len(vendors) > 1:
        named = "; ".join(f"{v.upper() if v == 'amd' else 'NVIDIA'} at {', '.join(c)}" for v, c in vendors.items())
        raise BuildChoiceError(f"this machine has NVIDIA and AMD cards ({named}), and one torch build cannot drive "
                               "both; set TUNER_TORCH=cuda or TUNER_TORCH=rocm for the cards you will tune")
    if not vendors:
        return TorchBuild("cpu", "no NVIDIA or AMD card found", _index("cpu", env))
    vendor, cards = next(iter(vendors.items()))
    name = BUILD_OF_VENDOR[vendor]
    label = "NVIDIA" if vendor == "nvidia" else "AMD"
    return TorchBuild(name, f"{label} card{'s' if len(cards) > 1 else ''} at {', '.join(cards)}", _index(name, env))


def _index(name: str, env: Mapping[str, str]) -> str | None:
    return env.get("TUNER_TORCH_INDEX") or INDEX_URLS.get(name)


def installed_build(probe: Mapping[str, object]) -> str | None:
    """The build of the torch `tuner.engine.probe` found ("cuda", "rocm", "cpu"), or None when there is none."""
    if not probe.get("torch"):
        return None
    return "rocm" if probe.get("hip") else "cuda" if probe.get("cuda") else "cpu"


def main(argv: list[str] | None = None) -> int:
    """`python -m tuner.core.torch_build`: the build as shell assignments (build=, why=, index=), for the
    installer; exit 2 with one line on stderr when no single build fits."""
    del argv
    try:
        build = needed_build()
    except BuildChoiceError as e:
        print(f"tuner: error: {e}", file=sys.stderr)
        return 2
    import shlex

    print(f"build={build.name}\nwhy={shlex.quote(build.why)}\nindex={shlex.quote(build.index_url or '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
