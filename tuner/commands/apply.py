"""`tuner apply PROFILE`: apply a saved profile to the card it was proven on (or, with care, another one)."""

from __future__ import annotations

import sys

from tuner.actions.profile_apply import ProfileApply, plan_profile_apply, set_profile_lock_clock
from tuner.actions.setting import SetRequest, apply_setting_now, prepare_setting
from tuner.actions.verify import verify_setting
from tuner.commands._argtypes import duration, seconds_between
from tuner.commands._confirm import Answer, keep_or_revert
from tuner.commands._output import format_value, print_json
from tuner.core import exit_codes
from tuner.core.errors import TunerError, UsageError
from tuner.profiles import Profile, load_profile
from tuner.profiles import boot as boot_rules
from tuner.profiles.identity import Match, fingerprint, match_device
from tuner.profiles.store import scan

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
                   help="with --boot: how long to retry device discovery "
                   f"(default {boot_rules.DEFAULT_DISCOVERY_WAIT_S:g})")
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
    plan = plan_profile_apply(backend, profile, args.device, force=args.force, verify=args.verify is not None,
                              ignore_unsafe=args.ignore_unsafe)
    for warning in plan.warnings:
        print(f"tuner: warning: {warning}", file=sys.stderr)
    locked = set_profile_lock_clock(backend, plan)
    if locked:
        print(locked, file=sys.stderr)
    device, knob, result, value = plan.device, plan.knob, plan.match, plan.value

    if args.verify is not None:
        if not args.json:
            print(f"{device.id}  {device.label}: verifying {format_value(value, knob.unit)} for "
                  f"{args.verify:g} s (reverts to {format_value(knob.current, knob.unit)} on failure)")
        outcome = verify_setting(backend, device.id, value, args.verify, workload=plan.workload,
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
        return _apply_with_confirmation(args, ctx, plan)
    after = apply_setting_now(backend, SetRequest(device.id, value, ignore_unsafe=args.ignore_unsafe))
    _report(args, profile, device, result, after)
    return exit_codes.OK


def _apply_with_confirmation(args, ctx, plan: ProfileApply) -> int:
    """The same keep-or-revert confirmation as `tuner set`: kept only on a yes within the timeout."""
    profile, device, result = plan.profile, plan.device, plan.match
    change = prepare_setting(ctx.backend, SetRequest(device.id, plan.value, ignore_unsafe=args.ignore_unsafe),
                             purpose=f"tuner apply {profile.name}")

    def announce(change) -> None:
        applied = change.applied
        print(f"{device.id}  {device.label}: {format_value(change.before.current, applied.unit)} -> "
              f"{format_value(applied.current, applied.unit)} from {profile.name!r} (read back)",
              file=sys.stderr if args.json else sys.stdout, flush=True)

    answer = keep_or_revert(change, announce=announce)
    if change.kept:
        _report(args, profile, device, result, change.applied)
        return exit_codes.OK
    why = "interrupted" if answer is Answer.INTERRUPTED else "not confirmed"
    print(f"{why}: reverted to {format_value(change.reverted_to.current, change.reverted_to.unit)}",
          file=sys.stderr)
    if args.json:
        print_json(_doc(profile, device, result, change.reverted_to, applied=False))
    return exit_codes.INTERRUPTED if answer is Answer.INTERRUPTED else exit_codes.NOT_CONFIRMED


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
    if profile.is_rig:
        log(f"skipped {profile.name!r}: a rig profile; this version applies single-card profiles at boot")
        return {"status": "skipped", "reason": "rig profile"}
    for device in backend.devices():
        knob = backend.knob(device.id)
        if match_device(profile, device, knob).match is not Match.SAME_CARD:
            continue
        try:
            # the unsafe list holds at boot (never --ignore-unsafe there)
            after = apply_setting_now(backend, SetRequest(device.id, profile.setting.value))
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
