"""The simulator's command-line options, declared once for `tuner --simulate` and `tuner-helper --simulate`. A tuner
compares its own with a simulated helper's (tuner.actions.context), so the two must read them alike: the same
flags, converters and refusals. The helper simulates what its SimConfig carries; a bad card's corruption rate and
its driver version are the tuner's alone (tuner.helper.schema.SimConfig)."""

from __future__ import annotations

import argparse

from tuner.core.argtypes import DECIMAL, seconds_between, whole_number


def add_simulator_options(group: argparse._ActionsContainer, *, for_helper: bool = False) -> None:
    """The `--sim-*` options on `group` (`--simulate` itself is the caller's: its help differs). Their defaults are
    set here, unless the container suppresses defaults (tuner.cli's parent parser: a command's own parser must not
    overwrite the main parser's)."""
    if group.argument_default is not argparse.SUPPRESS:
        group.set_defaults(sim_gpus=1, sim_seed=0, sim_kind="amd")
    group.add_argument("--sim-gpus", type=whole_number, metavar="N",
                       help="number of simulated cards (default 1)")
    group.add_argument("--sim-seed", type=whole_number, metavar="S",
                       help="seed for the simulated cards' hidden limits and telemetry (default 0)")
    group.add_argument("--sim-kind", choices=("amd", "nvidia"),
                       help="amd (default): a voltage offset in mV; nvidia: a positive clock offset in MHz (15 MHz "
                       "steps) at a locked max clock")
    group.add_argument("--sim-vmin", type=limit_list, metavar="LIMIT[,LIMIT...]",
                       help="hidden stable limit in the knob's unit: mV (default: drawn from the seed in -120..-30), "
                       "or MHz with --sim-kind nvidia (drawn in 60..240). One value sets sim0; a comma list sets one "
                       "card each, in card order (sim0,sim1,...; no more values than --sim-gpus)")
    group.add_argument("--sim-nondeterministic", action="store_true",
                       help="runs on the simulated cards never repeat bit for bit (a platform flaw, for testing)")
    group.add_argument("--sim-contention-after", type=seconds_between(0, 1e6), metavar="SECONDS",
                       help="runs on the simulated cards stop repeating bit for bit this many seconds after the "
                       f"{'helper' if for_helper else 'tuner'} starts (as when another process starts using the GPU)")
    if for_helper:
        return
    group.add_argument("--sim-sdc-rate", type=rate_list, metavar="RATE[,RATE...]",
                       help="a bad card: silent corruption at this per-step probability at every setting, stock "
                       "included (e.g. 0.001). One value sets sim0; a comma list one card each, in card order")
    group.add_argument("--sim-driver", metavar="VERSION",
                       help="the driver version the simulated cards report (default 'simulated'): a card whose "
                       "fingerprint differs from a reference's")


def limit_list(text: str) -> int | tuple[int, ...]:
    """`-52` (sim0's limit, as always) or `-52,-67,-40` (one per card, in card order)."""
    parts = text.split(",")
    if len(parts) == 1:
        return whole_number(text)
    if any(not p.strip() for p in parts):
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got {text!r}")
    return tuple(whole_number(p) for p in parts)


def rate_list(text: str) -> float | tuple[float, ...]:
    """`0.001` (sim0's rate) or `0,0.01,0` (one per card, in card order): probabilities in [0, 1]."""
    rates = []
    for part in text.split(","):
        if not DECIMAL.fullmatch(part.strip()):  # float() also takes `٠.٥`, `0.0_1`, `1e-3` and `nan`
            raise argparse.ArgumentTypeError(f"expected probabilities (ASCII digits) separated by commas, got {text!r}")
        rate = float(part.strip())
        if not 0.0 <= rate <= 1.0:
            raise argparse.ArgumentTypeError(f"a per-step rate is between 0 and 1, got {part.strip()!r}")
        rates.append(rate)
    return rates[0] if len(rates) == 1 else tuple(rates)
