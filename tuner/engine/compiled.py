"""torch.compile for the engine: where compiled artifacts are cached, and Inductor's deterministic mode.

Environment first (before torch is imported: `tuner/engine/cli.py`): Inductor's and Triton's caches go under the
tuner's XDG cache, so the second trial of a bisect loads kernels instead of compiling them again.
Inductor's deterministic mode (`torch._inductor.config.deterministic`, env `TORCHINDUCTOR_DETERMINISTIC=1`)
turns off its on-device benchmarking, whose choices could differ between two runs and change the numerics.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.engine import environment

if TYPE_CHECKING:  # torch is imported in compile_model only: cli.py imports this module before torch
    import torch

    from tuner.engine.model import GPT


def cache_root(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    from tuner.core.paths import cache_dir

    return cache_dir()


def prepare_environment(root: Path) -> list[str]:
    """Before torch is imported (and so before the first compile); explicit settings in the environment win. The
    engine's other variables too (`environment.prepare_environment`): returns what that overrode."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "engine" / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(root / "engine" / "triton"))
    os.environ.setdefault("TORCHINDUCTOR_DETERMINISTIC", "1")  # also read by compile worker processes
    return environment.prepare_environment()


def cpu_compile_problem() -> str | None:
    """Why Inductor cannot compile for the CPU here (it needs a C++ compiler), or None."""
    if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "no C++ compiler (g++/c++/clang++) on PATH: Inductor cannot compile for the CPU"
    return None


def compile_model(model: GPT) -> Callable[..., torch.Tensor]:
    """The model compiled with Inductor in deterministic mode, and the optimizer updates compiled too."""
    import torch
    import torch._inductor.config as inductor_config

    from tuner.engine.optim import compile_updates

    inductor_config.deterministic = True
    inductor_config.fx_graph_cache = True
    compile_updates()
    return torch.compile(model, dynamic=False)
