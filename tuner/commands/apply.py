"""`tuner apply PROFILE`: apply a saved profile to the card it was proven on (or, with care, another one)."""

from __future__ import annotations

import sys
from argparse import Namespace
from dataclasses import replace

from tuner.actions.boot_apply import run_boot_apply
from tuner.actions.context import Context
from tuner.actions.profile_apply import (
    ProfileApply,
    RigApply,
    RigChange,
    plan_profile_apply,
    plan_rig_apply,
    prepare_rig_apply,
    profile_lock_note,
    verify_profile,
)
from tuner.actions.profile_store import load_profile
from tuner.actions.setting import SetRequest, apply_setting_now, prepare_setting
from tuner.backends.base import Backend
from tuner.commands._argtypes import Subparsers
from tuner.commands._confirm import keep_or_revert, say_applied, say_reverted
from tuner.commands._output import format_value, print_json, warn
from tuner.core import exit_codes, system_units
from tuner.core.argtypes import duration, seconds_between
from tuner.core.errors import UsageError
from tuner.core.models import DeviceInfo, Knob
from tuner.profiles import boot as boot_rules
from tuner.profiles.identity import MatchResult
from tuner.profiles.schema import Profile


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "apply",
        help="apply a saved profile (checks it is the card it was proven on)",
        description="Apply a profile's setting. On the card it was proven on it applies directly; on another card "
        "of the same model it needs --verify DUR (a stress trial at the setting, reverted on failure) or --force; "
        "on another model it needs --force; another vendor or knob kind is always refused. The value must lie in "
        "the card's current range and never overvolts. A rig profile applies each part to the card it was proven "
        "on (found by serial, then PCI slot), checks every part before writing to any card, and asks once for "
        "the whole rig; a missing or different card refuses it unless --force.",
        epilog="examples:\n  tuner apply r9700 --yes\n  tuner apply ./r9700.toml --device 0000:03:00.0 --verify 5m\n"
        "  tuner apply my-rig --json     (a rig profile: every card, one keep-or-revert)\n"
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
    p.add_argument("--resume", action="store_true",
                   help="with --boot: the run after a resume from suspend or hibernation (the resume unit): says "
                   "per card whether it came back as installed, at stock or at another value, and re-applies")
    p.add_argument("--boot-wait", type=seconds_between(0, 600), default=None, metavar="S",
                   help="with --boot: how long to retry device discovery "
                   f"(default {boot_rules.DEFAULT_DISCOVERY_WAIT_S:g}, {system_units.RESUME_WAIT_S:g} with --resume)")
    p.add_argument("--ignore-unsafe", action="store_true",
                   help="apply even a value at or beyond one that froze, hung or reset this card in a trial "
                   "(never at boot)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def run(args: Namespace, ctx: Context) -> int:
    if args.resume and not args.boot:
        raise UsageError("--resume is a mode of --boot", "use `tuner apply --boot --resume`")
    if args.boot:
        return _run_boot(args, ctx)
    if args.profile is None:
        raise UsageError("which profile?", "give a profile name or path (see `tuner profile list`)")
    profile = load_profile(args.profile)  # validated before any device is touched
    if profile.is_rig:
        return _run_rig(args, ctx, profile)
    backend = ctx.backend
    plan = plan_profile_apply(backend, profile, args.device, force=args.force, verify=args.verify is not None,
                              ignore_unsafe=args.ignore_unsafe)
    warn(plan.warnings)
    device, knob, result, value = plan.device, plan.knob, plan.match, plan.value

    if args.verify is not None:
        if not args.json:
            print(f"{device.id}  {device.label}: verifying {format_value(value, knob.unit)} for "
                  f"{args.verify:g} s (reverts to {format_value(knob.current, knob.unit)} on failure)")
        outcome = verify_profile(backend, plan, args.verify, on_line=lambda line: print(f"  {line}", file=sys.stderr))
        if args.json:
            print_json(_doc(profile, device, result, outcome.knob, verify=outcome.to_dict()))
        elif outcome.passed:
            print(f"{device.id}  {device.label}: {format_value(value, knob.unit)} passed and is kept "
                  f"({outcome.reference})")
        else:
            print(f"{device.id}  {device.label}: {format_value(value, knob.unit)} {outcome.verdict}ed "
                  f"({outcome.reason or 'no reason given'}); reverted to "
                  f"{format_value(outcome.knob.current, outcome.knob.unit)}")
        return exit_codes.OK if outcome.passed else exit_codes.TEST_FAILED

    # the lock clock goes with the value in one request, so a revert puts back the lock the card had too
    request = replace(plan.set_request(), ignore_unsafe=args.ignore_unsafe)
    locked = profile_lock_note(plan)
    if locked:
        print(locked, file=sys.stderr)
    if not args.yes:
        return _apply_with_confirmation(args, ctx, plan, request)
    after = apply_setting_now(backend, request)
    _report(args, profile, device, result, after)
    return exit_codes.OK


def _apply_with_confirmation(args: Namespace, ctx: Context, plan: ProfileApply, request: SetRequest) -> int:
    """The same keep-or-revert confirmation as `tuner set`: kept only on a yes within the timeout."""
    profile, device, result = plan.profile, plan.device, plan.match
    change = prepare_setting(ctx.backend, request, purpose=f"tuner apply {profile.name}")
    answer = keep_or_revert(
        change, announce=lambda c: say_applied(c, device, f" from {profile.name!r}", as_json=args.json))
    if change.kept:
        assert change.applied is not None  # kept: applied and read back
        _report(args, profile, device, result, change.applied)
        return exit_codes.OK
    code = say_reverted(answer, change)
    if args.json:
        assert change.reverted_to is not None  # not kept: leaving keep_or_revert reverted it (or raised)
        print_json(_doc(profile, device, result, change.reverted_to, applied=False))
    return code


def _doc(profile: Profile, device: DeviceInfo, result: MatchResult, knob: Knob, **extra: object) -> dict:
    return {"profile": profile.name, "device": device.to_dict(), "match": result.to_dict(),
            "value": profile.setting.value, "knob": knob.to_dict(), **extra}


def _report(args: Namespace, profile: Profile, device: DeviceInfo, result: MatchResult, after: Knob) -> None:
    if args.json:
        print_json(_doc(profile, device, result, after, applied=True))
    else:
        print(f"{device.id}  {device.label}: applied {profile.name!r} "
              f"({format_value(after.current, after.unit)}, read back)")


# --- rig profiles -------------------------------------------------------------------------------------------------


def _run_rig(args: Namespace, ctx: Context, profile: Profile) -> int:
    """Every part to the card it was proven on; all checked before any write, one keep-or-revert for the rig."""
    if args.device:
        raise UsageError(f"{profile.name!r} is a rig profile: each part goes to the card it was proven on",
                         "drop --device (or export one card's part as its own profile)")
    if args.verify is not None:
        raise UsageError(f"--verify tests a single-card profile; {profile.name!r} is a rig profile",
                         "confirm a rig with `tuner bisect --device all`, or drop --verify")
    backend = ctx.backend
    plan = plan_rig_apply(backend, profile, force=args.force, ignore_unsafe=args.ignore_unsafe)
    warn(plan.warnings)
    change = prepare_rig_apply(backend, plan, ignore_unsafe=args.ignore_unsafe)

    def announce(change: RigChange) -> None:
        if args.yes:
            return  # kept without asking: the report below says what each card now holds
        for part, pending in zip(plan.to_apply, change.changes, strict=True):
            assert part.device is not None  # to_apply holds the parts whose card is here
            say_applied(pending, part.device, f" from {profile.name!r} card[{part.index}]", as_json=args.json)

    answer = keep_or_revert(change, announce=announce, yes=args.yes)  # one prompt, one timeout, every card
    if change.kept:
        if args.json:
            print_json(_rig_doc(plan, change, applied=True))
        else:
            for part in plan.to_apply:
                device = part.device
                assert device is not None  # to_apply holds the parts whose card is here
                knob = change.applied[device.id]
                print(f"{device.id}  {device.label}: applied {profile.name!r} card[{part.index}] "
                      f"({format_value(knob.current, knob.unit)}, read back)")
        return exit_codes.OK
    code = say_reverted(answer, change)
    if args.json:
        print_json(_rig_doc(plan, change, applied=False))
    return code


def _rig_doc(plan: RigApply, change: RigChange, *, applied: bool) -> dict:
    cards = []
    for part in plan.parts:
        doc = part.to_dict()
        if part.device is None:
            doc["status"] = "skipped"
        else:
            knob = (change.applied if applied else change.reverted_to).get(part.device.id)
            doc["status"] = "applied" if applied else "reverted"
            doc["knob"] = knob.to_dict() if knob else None
        cards.append(doc)
    return {"profile": plan.profile.name, "rig": True, "applied": applied, "cards": cards,
            "warnings": list(plan.warnings)}


# --- boot mode ----------------------------------------------------------------------------------------------------


def _run_boot(args: Namespace, ctx: Context) -> int:
    """Apply system profiles to their own cards (tuner.actions.boot_apply holds the rules). A skip by design exits
    0 (the unit is not 'failed'); a part that could not be applied, or a rig's missing card, exits non-zero after
    the others were tried."""

    def reopen() -> Backend:
        ctx.close()
        ctx._backend = None  # a fresh discovery each try; the driver may have finished probing since
        return ctx.backend

    wait_s = args.boot_wait
    if wait_s is None:
        wait_s = system_units.RESUME_WAIT_S if args.resume else boot_rules.DEFAULT_DISCOVERY_WAIT_S
    report = run_boot_apply(reopen, profile=args.profile, wait_s=wait_s, resume=args.resume,
                            simulated=ctx.simulate)
    if args.json:
        print_json({"boot": [r.to_dict() for r in report.results], "skipped": report.skipped})
    return report.exit_code
