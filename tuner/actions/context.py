"""What every CLI command receives: the parsed global options and a lazily opened backend."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from tuner.backends import Backend, open_backend


@dataclass
class Context:
    simulate: bool = False
    sim_gpus: int = 1
    sim_seed: int = 0
    # in the simulated knob's unit (MHz when sim_kind is "nvidia"); one value: sim0's, a tuple: one per card
    sim_vmin_mv: int | tuple[int, ...] | None = None
    sim_kind: str = "amd"
    sim_nondeterministic: bool = False
    sim_contention_after_s: float | None = None
    _backend: Backend | None = field(default=None, repr=False)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Context:
        return cls(
            simulate=args.simulate,
            sim_gpus=args.sim_gpus,
            sim_seed=args.sim_seed,
            sim_vmin_mv=args.sim_vmin,
            sim_kind=args.sim_kind,
            sim_nondeterministic=getattr(args, "sim_nondeterministic", False),
            sim_contention_after_s=getattr(args, "sim_contention_after", None),
        )

    @property
    def backend(self) -> Backend:
        """Opened on first use, so `tuner --version` or `tuner doctor` never need a GPU."""
        if self._backend is None:
            self._backend = open_backend(
                simulate=self.simulate,
                sim_gpus=self.sim_gpus,
                sim_seed=self.sim_seed,
                sim_vmin_mv=self.sim_vmin_mv,
                sim_kind=self.sim_kind,
                sim_nondeterministic=self.sim_nondeterministic,
                sim_contention_after_s=self.sim_contention_after_s,
            )
        return self._backend

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
