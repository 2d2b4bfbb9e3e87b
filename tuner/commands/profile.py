"""`tuner profile list|show|export|import|delete`: the profile store from the command line."""

from __future__ import annotations

import functools
import shutil
import sys
from argparse import Namespace
from collections.abc import Sequence
from pathlib import Path

import msgspec

from tuner.actions.context import Context
from tuner.actions.exports import profile_export_path
from tuner.actions.profile_store import (
    delete_profile,
    export_profile,
    find_in_store,
    import_profile,
    is_system,
    read_profile_file,
    scan,
)
from tuner.commands._argtypes import Subparsers
from tuner.commands._output import display_width, fit, format_table, format_value, print_json, warn, wrap
from tuner.core import exit_codes
from tuner.core.models import printable
from tuner.profiles import evidence, reference_bundle
from tuner.profiles.reference_bundle import kib
from tuner.profiles.schema import Profile, ProfilePart, Setting, Trial, format_created, validate_name
from tuner.tuning.bound import describe as describe_bound

# a workload saved without a dtype ran with the engine's `--dtype auto` (bf16 where the card has it, else fp32)
AUTO_DTYPE = "auto"


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "profile",
        help="list, show, export, import or delete saved profiles",
        description="Saved profiles: user profiles in $XDG_CONFIG_HOME/tuner/profiles, boot profiles in "
        "/etc/tuner/profiles. Every file is validated before it is stored or used; nothing is overwritten "
        "without --overwrite.",
    )
    sub = p.add_subparsers(dest="profile_command", metavar="ACTION", required=True)

    q = sub.add_parser("list", help="every saved profile")
    q.add_argument("--json", action="store_true", help="print one JSON document")
    q.set_defaults(run=run_list)

    q = sub.add_parser("show", help="one profile and its evidence")
    q.add_argument("name", metavar="NAME")
    q.add_argument("--json", action="store_true", help="print one JSON document")
    q.add_argument("--toml", action="store_true", help="print the TOML file itself")
    q.set_defaults(run=run_show)

    q = sub.add_parser("export", help="write a profile to a file (for another machine)")
    q.add_argument("name", metavar="NAME")
    q.add_argument("path", metavar="PATH", nargs="?",
                   help="file to write, or - for stdout (default: NAME.toml in the current directory)")
    q.add_argument("--overwrite", action="store_true", help="replace PATH if it exists")
    q.set_defaults(run=run_export)

    q = sub.add_parser("import", help="validate a profile file and store it")
    q.add_argument("path", metavar="PATH")
    q.add_argument("--name", metavar="NAME", help="store it under this name (default: the name inside the file)")
    q.add_argument("--overwrite", action="store_true", help="replace a stored profile of the same name")
    q.add_argument("--system", action="store_true", help="store it for the boot service (/etc; needs root)")
    q.add_argument("--json", action="store_true", help="print one JSON document")
    q.set_defaults(run=run_import)

    q = sub.add_parser("delete", help="remove a stored profile")
    q.add_argument("name", metavar="NAME")
    q.add_argument("--system", action="store_true", help="delete from the system store (needs root)")
    q.set_defaults(run=run_delete)


def _where(profile: Profile) -> str:
    return "system" if is_system(profile) else "user"


def _summary(profile: Profile) -> dict:
    return {"name": profile.store_name, "store": _where(profile), "path": str(profile.source),
            "sensitivity": evidence.profile_sensitivity(profile), **profile.to_json_dict()}


def run_list(args: Namespace, ctx: Context) -> int:
    profiles, bad = scan()
    warn(f"skipped {why}" for _path, why in bad)  # `why` names the file
    if args.json:
        print_json({"profiles": [_summary(p) for p in profiles],
                    "invalid": [{"path": str(path), "error": why} for path, why in bad]})
        return exit_codes.OK
    if not profiles:
        print("no profiles yet (`tuner bisect --save NAME` makes one; `tuner profile import FILE` adds one)")
        return exit_codes.OK
    rows = [(p.store_name, _where(p), _device_cell(p), _setting_cell(p),
             "yes" if any(part.tuning for part in p.parts) else "no", format_created(p.meta.created)) for p in profiles]
    print(format_table(("NAME", "STORE", "DEVICE", "SETTING", "TUNED", "CREATED"), rows))
    return exit_codes.OK


def _device_cell(profile: Profile) -> str:
    if not profile.is_rig:
        return profile.device.label
    # measured on simulated cards: said here as a single card's label says it
    simulated = " [SIMULATED]" if any(p.device.simulated for p in profile.parts) else ""
    return f"rig of {len(profile.parts)} cards{simulated}"


def _setting_cell(profile: Profile) -> str:
    if not profile.is_rig:
        return format_value(profile.setting.value, profile.setting.unit)
    units = {p.setting.unit for p in profile.parts}
    if len(units) == 1:
        return ", ".join(f"{p.setting.value:+d}" for p in profile.parts) + f" {units.pop()}"
    return ", ".join(format_value(p.setting.value, p.setting.unit) for p in profile.parts)


def trials_table(trials: Sequence[Trial], unit: str, width: int) -> list[str]:
    """The trials as a table that fits `width` columns: the reason comes last, cut to the room left, and a cut
    reason is given in full below the table, wrapped to the width (a REASON column 200 characters wide wrapped
    every row into a mess)."""
    indent = "    "
    rows = [(format_value(x.setting, unit), x.phase, x.verdict, x.duration_s, x.tok_s, x.power_w, x.max_temp_c)
            for x in trials]
    headers = ("SETTING", "PHASE", "VERDICT", "S", "TOK/S", "W", "MAX °C")
    fixed = format_table(headers, rows).splitlines()
    fixed_width = max(len(line) for line in fixed)
    room = max(12, width - len(indent) - fixed_width - 2)
    notes, out = [], []
    for i, line in enumerate(fixed):
        reason = "REASON" if i == 0 else printable(trials[i - 1].reason or "-")  # a stranger's file's text
        if display_width(reason) > room:  # terminal columns: a CJK character takes two
            notes.append((rows[i - 1][0], reason))
            reason = fit(reason, room)
        out.append(f"{indent}{line.ljust(fixed_width)}  {reason}".rstrip())
    for setting, reason in notes:
        out += wrap(f"{setting}: {reason}", max(20, width - len(indent)), initial_indent=indent,
                    subsequent_indent=indent + "  ")
    return out


def _field(label: str, text: str, width: int, indent: str = "  ") -> list[str]:
    """`  label        text`, the text wrapped to `width` under its own column (never cut). The text may come from
    a stranger's file: control and format characters are escaped (`printable`), as a card's name is."""
    head = f"{indent}{label:<12} "
    text = printable(text)
    return wrap(text, max(len(head) + 20, width), initial_indent=head, subsequent_indent=" " * len(head)) or [
        head.rstrip()]


def _fig(value: object, fmt: str) -> str:
    return "?" if value is None else fmt.format(value)


def _part_lines(part: Profile | ProfilePart, width: int, indent: str = "  ") -> list[str]:
    """One card's identity, setting and evidence: the body of a single-card show, or one block of a rig's."""
    d, s, t = part.device, part.setting, part.tuning
    field = functools.partial(_field, width=width, indent=indent)
    lines = [
        *field("device", f"{d.label} ({d.vendor}, {d.pci_id or '?'} / {d.subsystem_id or '?'})"),
        *field("card", f"slot {d.pci_slot or '?'}, serial {d.serial or '?'}, VBIOS {d.vbios or '?'}"),
        *field("software", f"driver {d.driver_version or '?'}, kernel {d.kernel or '?'}, OD format "
               f"{d.od_format or '?'}"),
        *field("setting", f"{s.kind} {format_value(s.value, s.unit)}{_setting_extras(s)}"),
    ]
    if t is None:
        return [*lines, *field("tuning", "none recorded (not from a bisect)")]
    lines += [
        *field("throughput", f"{_fig(t.baseline_tok_s, '{:.0f}')} -> {_fig(t.tuned_tok_s, '{:.0f}')} tok/s"),
        *field("power", f"{_fig(t.baseline_power_w, '{:.1f}')} -> {_fig(t.tuned_power_w, '{:.1f}')} W"),
        *field("efficiency", f"{_fig(t.baseline_tok_per_j, '{:.2f}')} -> {_fig(t.tuned_tok_per_j, '{:.2f}')} tok/J "
               f"({_fig(t.efficiency_gain_pct, '{:+.1f}')} %)"),
        *field("search", f"first failure {_fig(t.first_failure, '{:+d}')}, lowest pass "
               f"{_fig(t.lowest_pass, '{:+d}')}, confirmed {_fig(t.confirmed, '{:+d}')}, margin "
               f"{_fig(t.margin, '{:d}')} {s.unit}"),
        *field("workload", f"preset {t.preset or '?'}, mode {t.mode or '?'}, dtype {t.dtype or AUTO_DTYPE}, "
               f"trials {_fig(t.trial_duration_s, '{:g}')} s, confirm {_fig(t.confirm_duration_s, '{:g}')} s"),
        *field("evidence", evidence.strength(part, why=True) or ""),
    ]
    bound = describe_bound(msgspec.to_builtins(t.bound), msgspec.to_builtins(t.confirmed_bound), s.value,
                           t.confirmed, s.unit, t.bound_s)  # the bound tables as the dicts Bound.to_dict() wrote
    if bound:
        lines[-1:-1] = field("bound", bound)
    if t.trials:
        table = trials_table(t.trials, s.unit, width - len(indent) + 2)
        lines += [f"{indent}trials", *(f"{indent[:-2]}{line}" for line in table)]
    return lines


def _rig_lines(profile: Profile, width: int) -> list[str]:
    r = profile.rig
    values = ", ".join(format_value(p.setting.value, p.setting.unit) for p in profile.parts)
    lines = _field("rig", f"{len(profile.parts)} cards: {values}", width)
    if r is None:
        lines += _field("confirmed", "no whole-rig confirmation recorded", width)
    else:
        attempts = "" if r.attempts is None else f", {r.attempts} attempt{'s' if r.attempts != 1 else ''}"
        lines += _field("confirmed", f"every card at once for {_fig(r.confirm_duration_s, '{:g}')} s, one "
                        f"data-parallel job over {r.backend or '?'}{attempts}; mode {r.mode or '?'}, preset "
                        f"{r.preset or '?'}, dtype {r.dtype or AUTO_DTYPE}", width)
        if r.tok_s is not None or r.power_w is not None:
            lines += _field("together", f"{_fig(r.tok_s, '{:.0f}')} tok/s, {_fig(r.power_w, '{:.1f}')} W, "
                            f"{_fig(r.tok_per_j, '{:.2f}')} tok/J (all cards)", width)
    for index, part in enumerate(profile.parts):
        lines += ["", f"  card[{index}]", *_part_lines(part, width, indent="    ")]
    return lines


def run_show(args: Namespace, ctx: Context) -> int:
    source = find_in_store(args.name)
    profile = read_profile_file(source)
    bundled = reference_bundle.reference_beside(source)  # checked: a damaged one stops the command in one line
    if args.json:
        ref = None if bundled is None else {"path": str(bundled[1]), "size_bytes": bundled[2], **bundled[0].summary()}
        print_json({**_summary(profile), "reference": ref})
        return exit_codes.OK
    if args.toml:
        sys.stdout.write(profile.to_toml())
        return exit_codes.OK
    width = shutil.get_terminal_size().columns
    lines = [
        *wrap(f"{profile.store_name}  ({_where(profile)} store: {profile.source})", max(40, width),
              subsequent_indent="    "),
        *_field("created", f"{format_created(profile.meta.created)} by tuner {profile.meta.tool_version}", width),
    ]
    lines += _rig_lines(profile, width) if profile.is_rig else _part_lines(profile, width)
    if bundled is not None:
        b, ref_path, size = bundled
        lines += _field("reference", f"{ref_path.name}: {b.steps:,} stock steps of {b.preset} ({kib(size)}), "
                        f"recorded on {b.origin.host or '?'} ({b.origin.device_id}), for `tuner screen` and "
                        "`apply --verify`", width)
    print("\n".join(lines))
    return exit_codes.OK


def _setting_extras(s: Setting) -> str:
    lock = f" at a locked {s.lock_clock_mhz} MHz" if s.lock_clock_mhz else ""
    return lock + (f", power limit {s.power_limit_w:g} W" if s.power_limit_w else "")


def run_export(args: Namespace, ctx: Context) -> int:
    profile = read_profile_file(find_in_store(args.name))
    if args.path == "-":
        bundled = reference_bundle.reference_beside(profile.source) if profile.source else None  # checked
        sys.stdout.write(profile.to_toml())
        if bundled is not None:
            print(f"tuner: note: its stock reference ({bundled[1].name}, {kib(bundled[2])}) is not carried on "
                  "stdout: export to a file to carry it beside the profile", file=sys.stderr)
        return exit_codes.OK
    target = Path(args.path) if args.path is not None else profile_export_path(profile.name)
    path, carried = export_profile(profile, target, overwrite=args.overwrite)  # the reference checked first
    if carried is None:
        print(f"exported {args.name!r} to {path} (no stock reference bundled: `tuner bisect --save` records one)")
        return exit_codes.OK
    b, ref_path, size = carried
    print(f"exported {args.name!r} to {path} and its stock reference to {ref_path} ({kib(size)}, {b.steps:,} "
          f"steps of {b.preset}, sha256 {b.sha256[:16]})")
    return exit_codes.OK


def run_import(args: Namespace, ctx: Context) -> int:
    if args.name is not None:  # `--name ""` is an error, not "no name"
        validate_name(args.name, path="--name")
    profile, path, carried = import_profile(Path(args.path), name=args.name, overwrite=args.overwrite,
                                            system=args.system)
    reference = None if carried is None else {"path": str(carried[1]), "size_bytes": carried[2],
                                              "sha256": carried[0].sha256}
    if args.json:
        print_json({"imported": profile.name, "path": str(path), "reference": reference,
                    "profile": profile.to_json_dict()})
    else:
        with_ref = f", with its stock reference ({kib(carried[2])})" if carried else ""
        print(f"imported {profile.name!r} ({_device_cell(profile)}, {_setting_cell(profile)}) to {path}{with_ref}")
    return exit_codes.OK


def run_delete(args: Namespace, ctx: Context) -> int:
    path, ref = delete_profile(args.name, system=args.system)
    print(f"deleted {path}" + (f" and its stock reference {ref}" if ref else ""))
    return exit_codes.OK

