"""What every CLI command receives: the parsed global options and a lazily opened backend.

Which backend (docs/helper.md): the root helper at `$TUNER_HELPER_SOCKET`, else at `/run/tuner/helper.sock` when
that exists, so the UI, the CLI and the engine run as the user and the helper alone writes. Without a helper that
lets this user in: as root, in-process as before (rescue); as anyone else, in-process for reading, every write
refused with exit code 9 and how to get in. `--simulate` uses the helper only when `$TUNER_HELPER_SOCKET` names
a simulated one with the same options; otherwise it runs in-process, with no helper and no root.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from tuner.backends import Backend, check_no_simulator_options, open_backend
from tuner.backends.helper_client import HelperBackend, HelperRefused, HelperUnreachable, ReadOnlyBackend
from tuner.core import paths
from tuner.core.errors import UsageError


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
    sim_sdc_rate: float | tuple[float, ...] | None = None  # a bad card's per-step corruption rate (one per card)
    sim_driver: str | None = None  # the driver version simulated cards report
    # where a note from the backend goes (the helper put a card back, a read-only fallback): stderr for the CLI;
    # the UI routes it to a notification while it runs, since nothing printed then reaches the screen. Looked up
    # at each note, so the helper's heartbeat thread finds the UI's once it has taken over.
    notice: Callable[[str], None] = field(default=lambda line: print(f"tuner: note: {line}", file=sys.stderr),
                                          repr=False)
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
            sim_sdc_rate=getattr(args, "sim_sdc_rate", None),
            sim_driver=getattr(args, "sim_driver", None),
        )

    @property
    def backend(self) -> Backend:
        """Opened on first use, so `tuner --version` or `tuner doctor` never need a GPU."""
        if self._backend is None:
            self._backend = self.open_backend()
        return self._backend

    def _in_process(self) -> Backend:  # every simulation option, under open_backend's own names
        return open_backend(**{f.name: getattr(self, f.name) for f in fields(self) if f.name.startswith("sim")})

    def open_backend(self, *, euid: int | None = None,
                     note: Callable[[str], None] | None = None) -> Backend:
        """The helper's backend when one lets us in, else in-process (read-only unless root or simulated)."""
        euid = os.geteuid() if euid is None else euid
        note = note or (lambda line: self.notice(line))
        path, chosen = paths.helper_socket()
        refusal: HelperUnreachable | None = None
        if chosen or (not self.simulate and path.exists()):
            if not self.simulate:
                check_no_simulator_options(self.sim_nondeterministic, self.sim_contention_after_s, self.sim_sdc_rate,
                                           self.sim_driver, vmin=self.sim_vmin_mv, gpus=self.sim_gpus,
                                           seed=self.sim_seed, kind=self.sim_kind)
            try:
                helper = HelperBackend.connect(path, client=" ".join(sys.argv)[:200] or "tuner",
                                               warn=lambda line: note(line))
            except HelperUnreachable as e:
                refusal = e
            else:
                return self._check_simulation(helper)
        if self.simulate:
            if refusal is not None:
                note(f"{refusal.message}; simulating in-process")
            return self._in_process()
        local = self._in_process()
        if euid == 0:
            if refusal is not None:
                note(f"{refusal.message}; working in-process as root")
            return local
        if isinstance(refusal, HelperRefused):
            note(f"read-only: {refusal.message}; {refusal.remedy}")
            return ReadOnlyBackend(local, "the helper does not let this user in", refusal.remedy or "")
        return ReadOnlyBackend(local, refusal.message if refusal else f"no helper is installed ({path} is missing)")

    def _check_simulation(self, helper: HelperBackend) -> Backend:
        """`--simulate` through a helper needs a simulated helper with the same cards; a real helper's cards are
        never simulated ones."""
        if not self.simulate:
            return helper
        sim = helper.hello.sim
        asked = (self.sim_gpus, self.sim_seed, self.sim_kind, self.sim_vmin_mv, self.sim_nondeterministic,
                 self.sim_contention_after_s)
        own = self.sim_sdc_rate is not None or self.sim_driver is not None  # the helper simulates neither
        if own or sim is None or (sim.gpus, sim.seed, sim.kind, sim.vmin, sim.nondeterministic,
                           sim.contention_after_s) != asked:
            path = helper.connection.path
            helper.close()
            what = "drives real cards" if sim is None else "simulates other cards"
            raise UsageError(f"--simulate was given, and the helper at {path} (TUNER_HELPER_SOCKET) {what}",
                             "unset TUNER_HELPER_SOCKET to simulate in-process, or start the helper with the same "
                             "--sim options")
        return helper

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
