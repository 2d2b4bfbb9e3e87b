"""A fleet of simulated cards screened against one reference: does the standard tier drain every bad card and no
healthy one, and how long does each tier take?

What is real and what is modelled (say it with the figures):
- **real**: the screen itself. Every card goes through `tuner.actions.screen.fleet.Screen` (one per host of
  `--per-host` simulated cards, `SimulatedBackend` with `--sim-sdc-rate` per card), so the card locks, the stress
  action, the fault attribution (repeat, then stock), the verdicts, the actions and the exit codes are the tuner's
  own, and every host's verdict document is validated against docs/schemas/screen-verdict.v1.json.
- **measured**: the engine's step time with the reference compared at every step, and its start-up time, from one
  real engine run on a simulated card here (`--calibrate-s`, the tiny preset on this CPU); or `--step-ms` /
  `--setup-s` given (e.g. a GPU's nanochat figures).
- **modelled**: the engine runs. Each run asked for (its `EngineConfig`: the card's fault rate, the load, the fault
  seed) lasts setup + steps x step time in virtual time, and fails at a step drawn from the card's per-step rate
  (geometric, from the fault seed: a bad card's corruption, found by the bitwise comparison on the step it
  happens, as the engine detection bench measures for consequential flips). Healthy cards never differ (the engine
  is deterministic by construction); `--transient-rate` adds rare one-off faults to every card to show that they
  are retested, not drained.
- wall time per tier: the hosts run at once (a scheduler screens them in parallel), each host's cards at once (one
  engine per card): a host takes its slowest card's runs (screen, then repeat and stock runs after a fault), the
  fleet its slowest host.

    python bench/fleet_screen.py [--cards 200] [--bad 5] [--rate 0.003] [--tiers quick,standard,long]
        [--per-host 8] [--seed 0] [--step-ms MS --setup-s S | --calibrate-s 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REPO = Path(__file__).resolve().parents[1]


# --- the modelled engine ----------------------------------------------------------------------------------------


class ModelRun:
    """An engine run in virtual time (StressRun's shape: start, events, stop, result). Faults at the per-step rate
    the engine request carries (`fault_rate`: the simulated card's own, as the real engine would be asked to
    inject), drawn from the request's fault seed; the comparison finds each on its own step."""

    def __init__(self, config, watchdog, *, step_s: float, setup_s: float, transient_rate: float, log: list):
        self.config, self.watchdog = config, watchdog
        self.step_s, self.setup_s, self.transient_rate, self.log = step_s, setup_s, transient_rate, log
        self._result = None

    def start(self):
        return self

    def stop(self) -> None:
        pass

    def events(self):
        from tests.engine.examples import example
        from tuner.tuning import engine_client as sc

        o = self.config.options
        steps = o.steps if o.steps is not None else max(1, int(o.duration_s / self.step_s))
        rate = 1.0 - (1.0 - float(o.fault_rate or 0.0)) * (1.0 - self.transient_rate)
        rng = random.Random(f"fleet-model:{o.fault_seed}:{o.duration_s}:{o.steps}")
        fault_at = None
        if rate > 0:
            fault_at = 1 + int(math.log(1.0 - rng.random()) / math.log1p(-rate)) if rate < 1 else 1
            if fault_at > steps:
                fault_at = None
        done = steps if fault_at is None else fault_at
        self.log.append((o.fault_seed, self.setup_s + done * self.step_s))
        yield example("start", fault_rate=float(o.fault_rate or 0.0), fault_seed=o.fault_seed)
        ref_steps = steps
        reference = None
        if o.reference:
            compared = done - (fault_at is not None)  # the faulty step differed: not a matching step
            reference = {"path": o.reference, "reference_steps": ref_steps, "compared_steps": compared,
                         "beyond_reference_steps": 0, "note": None, "tolerance": None, "loop": True, "segments": 1}
        if fault_at is not None:
            yield example("fault", kind="mismatch", step=fault_at, reference_step=fault_at, detail="state bits differ",
                          figure="state")
            end = example("end", verdict="fail", reason=f"mismatch at step {fault_at}", kind="mismatch",
                          step=fault_at, reference_step=fault_at, steps=done, duration_s=done * self.step_s,
                          median_step_ms=self.step_s * 1e3, bpb=None, reference=reference, exit_code=1,
                          figure="state")
            verdict, kind, reason = "fail", "mismatch", end.reason
        else:
            end = example("end", steps=done, duration_s=done * self.step_s, median_step_ms=self.step_s * 1e3,
                          reference=reference)
            verdict, kind, reason = "pass", None, "completed"
        yield end
        self._result = sc.StressResult(verdict, kind, reason, fault_at, done, done * self.step_s,
                                       None, None, 0 if verdict == "pass" else 1, reference_step=fault_at, end=end)

    def result(self, timeout: float | None = None):
        return self._result


# --- measuring the real engine ------------------------------------------------------------------------------------


def calibrate(seconds: float) -> tuple[float, float, dict]:
    """One real engine run on a simulated card, recorded then replayed against itself: the replay's median step
    time (reference compared at every step) and its start-up time (launch to the first step)."""
    from tuner.backends.simulated import SimulatedBackend
    from tuner.tuning import engine_client as sc

    with tempfile.TemporaryDirectory() as tmp:
        backend = SimulatedBackend(state_path=Path(tmp) / "sim.json")
        target = backend.stress_target("sim0")
        ref = Path(tmp) / "ref.json"
        record = sc.engine_request(target, duration_s=seconds, record=str(ref))
        run = sc.StressRun(record, watchdog=sc.WatchdogPolicy.for_config(record)).start()
        list(run.events())
        if run.result().verdict != "pass":
            raise SystemExit(f"calibration recording failed: {run.result().reason}")
        replay = sc.engine_request(target, duration_s=seconds, reference=str(ref), reference_loop=True)
        t0 = time.monotonic()
        first = None
        run = sc.StressRun(replay, watchdog=sc.WatchdogPolicy.for_config(replay)).start()
        for event in run.events():
            if first is None and type(event).__name__ == "StepEvent":
                first = time.monotonic() - t0
        r = run.result()
        if r.verdict != "pass" or r.end is None or r.end.median_step_ms is None:
            raise SystemExit(f"calibration replay failed: {r.reason}")
        info = {"steps": r.steps, "compared_steps": r.end.reference.compared_steps if r.end.reference else None,
                "median_step_ms": r.end.median_step_ms, "setup_s": round(first or 0.0, 2)}
        return r.end.median_step_ms / 1e3, first or 0.0, info


# --- the fleet ----------------------------------------------------------------------------------------------------


def reference_bundle(tmp: Path, steps: int):
    """A bundle for the simulated card (its trajectory's digests are never read: the engine is modelled)."""
    from tuner.backends.simulated import SimulatedBackend
    from tuner.engine.reference import Reference
    from tuner.profiles import reference_bundle as rb

    device = SimulatedBackend(state_path=tmp / "ref-sim.json").device("sim0")
    fp = {"protocol": 1, "preset": "tiny", "seed": 0, "batch_size": 8, "dtype": "fp32"}
    traj = Reference(fp, ["0" * 32] * steps, canary=None)
    rec = rb.Recording(tier="quick", load_s=30.0, steps=steps, median_step_ms=None, repeatable=True,
                       replayed_steps=steps)
    bundle = rb.build_bundle(device=device, recording=rec, trajectory=traj)
    path = tmp / "fleet.ref"
    rb.write_bundle(bundle, path)
    return bundle, path


def screen_fleet(args, tier_name: str, step_s: float, setup_s: float, bad: set[int], schema) -> dict:
    import jsonschema

    from tuner.actions.screen import verdict as v
    from tuner.actions.screen.attribution import tier_named
    from tuner.actions.screen.card import fault_seed_for
    from tuner.actions.screen.fleet import Screen
    from tuner.backends.simulated import SimulatedBackend
    from tuner.tuning.kernel_log import NullWatcher

    tier = tier_named(tier_name)
    hosts = math.ceil(args.cards / args.per_host)
    drained, healthy_drained, retests, verdicts = [], [], [], {}
    host_wall, gpu_s = [], 0.0
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        os.environ["XDG_STATE_HOME"] = str(tmp / "state")
        bundle, path = reference_bundle(tmp, steps=max(1, int(30.0 / step_s)))
        for h in range(hosts):
            first = h * args.per_host
            n = min(args.per_host, args.cards - first)
            rates = [args.rate if first + i in bad else 0.0 for i in range(n)]
            backend = SimulatedBackend(gpus=n, seed=h, sdc_rate=rates, state_path=tmp / f"host{h}.json")
            log: list = []
            lock = threading.Lock()

            def factory(config, watchdog, log=log, lock=lock):
                run = ModelRun(config, watchdog, step_s=step_s, setup_s=setup_s,
                               transient_rate=args.transient_rate, log=[])
                with lock:
                    log.append(run)
                return run

            ids = [d.id for d in backend.devices()]
            report = Screen(backend, ids, bundle, path, tier, engine_factory=factory,
                            kernel_watcher_factory=NullWatcher).run()
            jsonschema.validate(json.loads(v.encode(report)), schema)
            # each card's virtual time: its runs one after another; the host: its slowest card
            seeds = {fault_seed_for(backend.device(d), p): d for d in ids for p in ("screen", "repeat", "stock")}
            per_card: dict[str, float] = dict.fromkeys(ids, 0.0)
            for run in log:
                for seed, seconds in run.log:
                    per_card[seeds[seed]] += seconds
            host_wall.append(max(per_card.values()))
            gpu_s += sum(per_card.values())
            for i, card in enumerate(report.verdicts):
                index = first + i
                verdicts[card.verdict] = verdicts.get(card.verdict, 0) + 1
                if card.action == "drain":
                    (drained if index in bad else healthy_drained).append(index)
                elif card.verdict == "retest":
                    retests.append(index)
    return {"tier": tier.name, "load_s": tier.load_s, "steps_per_run": int(tier.load_s / step_s),
            "drained_bad": len(drained), "bad": len(bad), "drained_healthy": len(healthy_drained),
            "retest": len(retests), "verdicts": verdicts, "wall_s": round(max(host_wall), 1),
            "mean_host_s": round(statistics.fmean(host_wall), 1), "gpu_hours": round(gpu_s / 3600, 2),
            "bench_s": round(time.monotonic() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cards", type=int, default=200)
    ap.add_argument("--bad", type=int, default=5, help="cards that corrupt at stock (default 5)")
    ap.add_argument("--rate", type=float, default=0.003, help="a bad card's per-step corruption rate (0.003)")
    ap.add_argument("--transient-rate", type=float, default=0.0,
                    help="one-off faults on every card, per step (default 0)")
    ap.add_argument("--tiers", default="quick,standard,long")
    ap.add_argument("--per-host", type=int, default=8, help="cards per host (default 8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-ms", type=float, help="model this step time instead of measuring it")
    ap.add_argument("--setup-s", type=float, help="model this engine start-up time instead of measuring it")
    ap.add_argument("--calibrate-s", type=float, default=8.0, help="seconds of the real calibration runs (8)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    calibration = None
    if args.step_ms is None or args.setup_s is None:
        step_s, setup_s, calibration = calibrate(args.calibrate_s)
    step_s = args.step_ms / 1e3 if args.step_ms is not None else step_s
    setup_s = args.setup_s if args.setup_s is not None else setup_s
    bad = set(random.Random(f"fleet:{args.seed}").sample(range(args.cards), args.bad))
    schema = json.loads((REPO / "docs/schemas/screen-verdict.v1.json").read_text())
    rows = [screen_fleet(args, name.strip(), step_s, setup_s, bad, schema) for name in args.tiers.split(",")]
    doc = {"cards": args.cards, "bad": sorted(bad), "rate_per_step": args.rate, "transient_rate": args.transient_rate,
           "per_host": args.per_host, "step_ms": round(step_s * 1e3, 3), "setup_s": round(setup_s, 2),
           "calibration": calibration, "tiers": rows}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    how = (f"measured here: {calibration['median_step_ms']:.1f} ms/step with the reference compared, "
           f"{calibration['setup_s']:.1f} s start-up" if calibration else "given")
    print(f"{args.cards} simulated cards, {args.bad} bad at stock (per-step rate {args.rate:g}), hosts of "
          f"{args.per_host}; step {step_s * 1e3:.1f} ms, setup {setup_s:.1f} s ({how}); engine runs modelled, the "
          "screen's decisions real")
    print(f"{'tier':<9} {'load':>6} {'steps/run':>9} {'bad drained':>11} {'healthy drained':>15} {'retest':>6} "
          f"{'fleet wall':>10} {'GPU-h':>6} {'bench s':>7}")
    for r in rows:
        print(f"{r['tier']:<9} {r['load_s']:>5g}s {r['steps_per_run']:>9,} {r['drained_bad']:>7}/{r['bad']:<3} "
              f"{r['drained_healthy']:>15} {r['retest']:>6} {r['wall_s']:>9.0f}s {r['gpu_hours']:>6.2f} "
              f"{r['bench_s']:>7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
