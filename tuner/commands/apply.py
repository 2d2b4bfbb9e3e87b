"""`tuner apply PROFILE`: apply a saved profile to the card it was proven on (or, with care, another one)."""

from __future__ import annotations

import platform
import sys

from tuner.core import exit_codes

from tuner.tuning import journal
from tuner.commands._argtypes import duration, seconds_between
from tuner.commands._output import format_value, print_json
from tuner.core.errors import TunerError, UsageError
from tuner.actions.keep_or_revert import PendingChange
from tuner.core.models import DeviceInfo
from tuner.profiles import Profile, load_profile
from tuner.profiles import boot as boot_rules
from tuner.profiles.identity import Match, MatchResult, fingerprint, match_device
from tuner.profiles.store import scan
from tuner.profiles.verify import verify_setting

_boot_wait = seconds_between(0, 600)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "apply",
        help="apply a saved profile (checks it is the card it was proven on)",
        description="Apply a profile's setting. On the card it was proven on it applies directly; on another card "
        "of the same model it needs --verify DUR (a stress trial at the setting, reverted on failure) or --force; "
        "on another model it needs --force; another vendor or knob kind is always refused. The value must lie in "
        "the card's current range and never overvolts.",
        epilog="examples:\n  tuner apply r9700 --yes\n  tuner apply ./r9700.toml --device 0000:03:00.0 --verify 5m\n"
        "  tuner apply --boot            (what the boot service runs: every system profile, same card only)",
    )
    p.add_argument("profile", nargs="?", metavar="PROFILE", help="profile name (see `tuner profile list`) or path")
    p.add_argument("--device", metavar="ID", help="device id from `tuner list` (default: the profile's card)")
    p.add_argument("--force", action="store_true",
                   help="apply to another card or model without a stress trial (never across vendors or knob kinds)")
    p.add_argument("--verify", type=duration, metavar="DUR",
                   help="run a stress trial of DUR (e.g. 5m) at the setting and revert if it fails")
    p.add_argument("--yes", action="store_true", help="keep the setting without the keep-or-revert prompt")
    p.add_argument("--boot", action="store_true",
                   help="boot mode (the systemd unit): wait for the driver, apply only to the same card, skip when "
                   "booted with tuner.reset or after a crashed tuning trial; logs to stderr (the journal)")
    p.add_argument("--boot-wait", type=_boot_wait, default=boot_rules.DEFAULT_DISCOVERY_WAIT_S, metavar="S",
                   help=f"with --boot: how long to retry device discovery (default {boot_rules.DEFAULT_DISCOVERY_WAIT_S:g})")
    p.add_argument("--ignore-unsafe", action="store_true",
                   help="apply even a value at or beyond one that froze, hung or reset this card in a trial "
                   "(never at boot)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def run(args, ctx) -> int:
    if args.boot:
        return _run_boot(args, ctx)
    if args.profile is None:
        raise UsageError("which profile?", "give a profile name or path (see `tuner profile list`)")
    profile = load_profile(args.profile)  # validated before any device is touched
    backend = ctx.backend
    device = _pick_device(profile, backend, args.device)
    knob = backend.knob(device.id)
    result = match_device(profile, device, knob, kernel=platform.release())
    _check_match(result, profile, device, force=args.force, verify=args.verify is not None)
    value = profile.setting.value
    knob.validate(value)  # range, step, no overvolt: OutOfRange (exit 2) before anything is written
    journal.check_safety_state(device.id)  # damaged safety files block even --ignore-unsafe (fail closed)
    if not args.ignore_unsafe:
        journal.refuse_unsafe(device.id, knob, value)
    for warning in result.warnings + _unapplied_fields(profile, knob, backend):
        print(f"tuner: warning: {warning}", file=sys.stderr)
    _set_lock_clock(profile, device, knob, backend)

    if args.verify is not None:
        if not args.json:
            print(f"{device.id}  {device.label}: verifying {format_value(value, knob.unit)} for "
                  f"{args.verify:g} s (reverts to {format_value(knob.current, knob.unit)} on failure)")
        t = profile.tuning
        workload = {"preset": t.preset, "mode": t.mode, "dtype": t.dtype} if t else {}
        outcome = verify_setting(backend, device.id, value, args.verify, workload=workload,
                                 on_line=lambda line: print(f"  {line}", file=sys.stderr))
        if args.json:
            print_json(_doc(profile, device, result, outcome.knob, verify=outcome.to_dict()))
        elif outcome.passed:
            print(f"{device.id}  {device.label}: {format_value(value, knob.unit)} passed and is kept")
        else:
            print(f"{device.id}  {device.label}: {format_value(value, knob.unit)} {outcome.verdict}ed "
                  f"({outcome.reason or 'no reason given'}); reverted to "
                  f"{format_value(outcome.knob.current, outcome.knob.unit)}")
        return exit_codes.OK if outcome.passed else exit_codes.TEST_FAILED

    if not args.yes:
        return _apply_with_confirmation(args, ctx, profile, device, result, value)
    after = backend.apply(device.id, value)
    _report(args, profile, device, result, after)
    return exit_codes.OK


def _apply_with_confirmation(args, ctx, profile, device, result, value) -> int:
    """The same keep-or-revert confirmation as `tuner set`: kept only on a yes within the timeout."""
    from tuner.commands.set import _ask  # the shared prompt (select()-based countdown on stdin)

    with PendingChange(ctx.backend, device.id, value) as change:
        applied = change.applied
        print(f"{device.id}  {device.label}: {format_value(change.before.current, applied.unit)} -> "
              f"{format_value(applied.current, applied.unit)} from {profile.name!r} (read back)",
              file=sys.stderr if args.json else sys.stdout, flush=True)
        if _ask(change):
            change.keep()
    if change.kept:
        _report(args, profile, device, result, applied)
        return exit_codes.OK
    print(f"not confirmed: reverted to {format_value(change.reverted_to.current, applied.unit)}", file=sys.stderr)
    if args.json:
        print_json(_doc(profile, device, result, change.reverted_to, applied=False))
    return exit_codes.USAGE


def _pick_device(profile: Profile, backend, device_id: str | None) -> DeviceInfo:
    if device_id:
        return backend.device(device_id)
    devices = backend.devices()
    for dev in devices:
        if match_device(profile, dev, backend.knob(dev.id)).match is Match.SAME_CARD:
            return dev
    if len(devices) == 1:
        return devices[0]
    raise UsageError(f"the card this profile was proven on ({fingerprint(profile.device)}) is not here, and there are "
                     "several GPUs", "name one with --device ID")


def _check_match(result: MatchResult, profile: Profile, device: DeviceInfo, *, force: bool, verify: bool) -> None:
    if result.match is Match.INCOMPATIBLE:
        raise UsageError(f"refusing to apply {profile.name!r} to {device.id}: {result.reason}; nothing was applied",
                         "--force does not override a vendor or knob mismatch; tune this card with `tuner bisect`")
    if result.match is Match.OTHER_MODEL and not force:
        raise UsageError(f"refusing to apply {profile.name!r} to {device.id}: {result.reason}; nothing was applied",
                         "tune this card with `tuner bisect`, or pass --force (and ideally --verify DUR)")
    if result.match is Match.SAME_MODEL and not (force or verify):
        raise UsageError(f"{profile.name!r} was proven on another card: {result.reason}; nothing was applied",
                         "pass --verify 5m to test it on this card first (reverted on failure), or --force")
    if result.match is not Match.SAME_CARD:
        print(f"tuner: warning: {result.reason}", file=sys.stderr)


def _unapplied_fields(profile: Profile, knob, backend) -> tuple[str, ...]:
    """Fields the backend cannot set: said out loud, never silently dropped."""
    out = []
    s = profile.setting
    if (s.lock_clock_mhz is not None and s.lock_clock_mhz != knob.lock_clock_mhz
            and not hasattr(backend, "set_lock_clock")):
        out.append(f"the profile was proven at a locked max clock of {s.lock_clock_mhz} MHz, this card is at "
                   f"{knob.lock_clock_mhz or 'no lock'}, and this backend cannot change the lock")
    if s.power_limit_w is not None:
        out.append(f"the profile records a power limit of {s.power_limit_w:g} W, which apply does not set")
    return tuple(out)


def _set_lock_clock(profile: Profile, device: DeviceInfo, knob, backend) -> None:
    """NVIDIA: the offset was proven at a locked max clock; lock to it first, as `tuner set --lock-mhz` does."""
    lock = profile.setting.lock_clock_mhz
    if lock is not None and lock != knob.lock_clock_mhz and hasattr(backend, "set_lock_clock"):
        backend.set_lock_clock(device.id, lock)
        print(f"{device.id}: the offset is applied at a locked max graphics clock of {lock} MHz (as proven)",
              file=sys.stderr)


def _doc(profile, device, result, knob, **extra) -> dict:
    return {"profile": profile.name, "device": device.to_dict(), "match": result.to_dict(),
            "value": profile.setting.value, "knob": knob.to_dict(), **extra}


def _report(args, profile, device, result, after) -> None:
    if args.json:
        print_json(_doc(profile, device, result, after, applied=True))
    else:
        print(f"{device.id}  {device.label}: applied {profile.name!r} "
              f"({format_value(after.current, after.unit)}, read back)")


# --- boot mode ----------------------------------------------------------------------------------------------------


def _run_boot(args, ctx) -> int:
    """Apply system profiles to their own cards. A skip by design exits 0 (the unit is not 'failed'); a profile
    that could not be applied exits with its error's code after the others were tried."""
    log = boot_rules.log
    reason = boot_rules.skip_reason()
    if reason:
        log(f"skipped: {reason}")
        return exit_codes.OK
    if args.profile is not None:
        profiles = [load_profile(args.profile)]
    else:
        profiles, bad = scan(system=True)
        for path, why in bad:
            log(f"ignoring {path}: {why}")
        if not profiles:
            log("no profiles in the system store; nothing to apply")
            return exit_codes.OK

    def ready(backend) -> bool:
        return all(any(match_device(p, d, backend.knob(d.id)).match is Match.SAME_CARD for d in backend.devices())
                   for p in profiles)

    def reopen():
        ctx.close()
        ctx._backend = None  # a fresh discovery each try; the driver may have finished probing since
        return ctx.backend

    backend = boot_rules.discover(reopen, ready, wait_s=args.boot_wait)
    worst = exit_codes.OK
    report = []
    for profile in profiles:
        outcome = _boot_apply_one(profile, backend, log)
        report.append({"profile": profile.name, **outcome})
        if outcome.get("exit_code", 0):
            worst = worst or outcome["exit_code"]
    if args.json:
        print_json({"boot": report})
    return worst


def _boot_apply_one(profile: Profile, backend, log) -> dict:
    for device in backend.devices():
        knob = backend.knob(device.id)
        if match_device(profile, device, knob).match is not Match.SAME_CARD:
            continue
        try:
            knob.validate(profile.setting.value)
            journal.check_safety_state(device.id)  # a damaged unsafe list or journal blocks this card
            journal.refuse_unsafe(device.id, knob, profile.setting.value)  # never overridden at boot
            after = backend.apply(device.id, profile.setting.value)
        except TunerError as e:
            log(f"could not apply {profile.name!r} to {device.id}: {e.one_line()}")
            return {"device": device.id, "status": "error", "reason": e.one_line(), "exit_code": e.exit_code}
        log(f"applied {profile.name!r} to {device.id} {device.label}: {format_value(after.current, after.unit)}"
            " (read back)")
        return {"device": device.id, "status": "applied", "value": after.current}
    why = (f"its card ({fingerprint(profile.device)}) is not in this machine; at boot a profile applies only to the "
           "card it was proven on (use `tuner apply NAME --verify 5m` for another card)")
    log(f"skipped {profile.name!r}: {why}")
    return {"status": "skipped", "reason": why}
