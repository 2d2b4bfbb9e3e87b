"""`tuner profile list|show|export|import|delete`: the profile store from the command line."""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

from tuner.commands._output import format_table, format_value, print_json
from tuner.core import exit_codes
from tuner.profiles import Profile, validate_name
from tuner.profiles.schema import format_created
from tuner.profiles.store import (
    delete_profile,
    find_in_store,
    is_system,
    read_profile_file,
    save_profile,
    scan,
    write_profile_file,
)


def add_parser(subparsers) -> None:
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
    q.add_argument("path", metavar="PATH", help="file to write, or - for stdout")
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


def _store_name(profile: Profile) -> str:
    return profile.source.stem if profile.source else profile.name


def _summary(profile: Profile) -> dict:
    return {"name": _store_name(profile), "store": _where(profile), "path": str(profile.source),
            **profile.to_json_dict()}


def run_list(args, ctx) -> int:
    profiles, bad = scan()
    for _path, why in bad:  # `why` names the file
        print(f"tuner: warning: skipped {why}", file=sys.stderr)
    if args.json:
        print_json({"profiles": [_summary(p) for p in profiles],
                    "invalid": [{"path": str(path), "error": why} for path, why in bad]})
        return exit_codes.OK
    if not profiles:
        print("no profiles yet (`tuner bisect --save NAME` makes one; `tuner profile import FILE` adds one)")
        return exit_codes.OK
    rows = [(_store_name(p), _where(p), p.device.label, format_value(p.setting.value, p.setting.unit),
             "yes" if p.tuning else "no", format_created(p.meta.created)) for p in profiles]
    print(format_table(("NAME", "STORE", "DEVICE", "SETTING", "TUNED", "CREATED"), rows))
    return exit_codes.OK


def trials_table(trials, unit: str, width: int) -> list[str]:
    """The trials as a table that fits `width` columns: the reason comes last, cut to the room left, and a cut
    reason is given in full below the table, wrapped to the width (a REASON column 200 characters wide wrapped
    every row into a mess)."""
    indent = "    "
    rows = [(format_value(x.setting, unit), x.phase, x.verdict, x.duration_s, x.tok_s, x.power_w, x.max_temp_c)
            for x in trials]
    headers = ("SETTING", "PHASE", "VERDICT", "S", "TOK/S", "W", "MAX °C")
    fixed = format_table(headers, rows).splitlines()
    room = max(12, width - len(indent) - max(len(line) for line in fixed) - 2)
    notes, out = [], []
    fixed_width = max(len(x) for x in fixed)
    for i, line in enumerate(fixed):
        reason = "REASON" if i == 0 else (trials[i - 1].reason or "-")
        if len(reason) > room:
            notes.append((rows[i - 1][0], reason))
            reason = reason[: room - 1] + "…"
        out.append(f"{indent}{line.ljust(fixed_width)}  {reason}".rstrip())
    for setting, reason in notes:
        out += textwrap.wrap(f"{setting}: {reason}", width=max(20, width - len(indent)), initial_indent=indent,
                             subsequent_indent=indent + "  ")
    return out


def run_show(args, ctx) -> int:
    profile = read_profile_file(find_in_store(args.name))
    if args.json:
        print_json(_summary(profile))
        return exit_codes.OK
    if args.toml:
        sys.stdout.write(profile.to_toml())
        return exit_codes.OK
    d, s, t = profile.device, profile.setting, profile.tuning
    lines = [
        f"{_store_name(profile)}  ({_where(profile)} store: {profile.source})",
        f"  created      {format_created(profile.meta.created)} by tuner {profile.meta.tool_version}",
        f"  device       {d.label} ({d.vendor}, {d.pci_id or '?'} / {d.subsystem_id or '?'})",
        f"  card         slot {d.pci_slot or '?'}, serial {d.serial or '?'}, VBIOS {d.vbios or '?'}",
        f"  software     driver {d.driver_version or '?'}, kernel {d.kernel or '?'}, OD format {d.od_format or '?'}",
        f"  setting      {s.kind} {format_value(s.value, s.unit)}{_setting_extras(s)}",
    ]
    if t is None:
        lines.append("  tuning       none recorded (not from a bisect)")
    else:
        def fig(value, fmt):
            return "?" if value is None else fmt.format(value)

        lines += [
            (f"  throughput   {fig(t.baseline_tok_s, '{:.0f}')} -> {fig(t.tuned_tok_s, '{:.0f}')} tok/s"),
            f"  power        {fig(t.baseline_power_w, '{:.1f}')} -> {fig(t.tuned_power_w, '{:.1f}')} W",
            (f"  efficiency   {fig(t.baseline_tok_per_j, '{:.2f}')} -> {fig(t.tuned_tok_per_j, '{:.2f}')} tok/J "
            f"({fig(t.efficiency_gain_pct, '{:+.1f}')} %)"),
            (f"  search       first failure {fig(t.first_failure, '{:+d}')}, "
            f"lowest pass {fig(t.lowest_pass, '{:+d}')}, confirmed {fig(t.confirmed, '{:+d}')}, "
            f"margin {fig(t.margin, '{:d}')} {s.unit}"),
            (f"  workload     preset {t.preset or '?'}, mode {t.mode or '?'}, dtype {t.dtype or '?'}, trials "
            f"{fig(t.trial_duration_s, '{:g}')} s, confirm {fig(t.confirm_duration_s, '{:g}')} s"),
        ]
        if t.trials:
            lines += ["  trials", *trials_table(t.trials, s.unit, shutil.get_terminal_size().columns)]
    print("\n".join(lines))
    return exit_codes.OK


def _setting_extras(s) -> str:
    lock = f" at a locked {s.lock_clock_mhz} MHz" if s.lock_clock_mhz else ""
    return lock + (f", power limit {s.power_limit_w:g} W" if s.power_limit_w else "")


def run_export(args, ctx) -> int:
    profile = read_profile_file(find_in_store(args.name))
    if args.path == "-":
        sys.stdout.write(profile.to_toml())
        return exit_codes.OK
    path = write_profile_file(profile, Path(args.path), overwrite=args.overwrite)
    print(f"exported {args.name!r} to {path}")
    return exit_codes.OK


def run_import(args, ctx) -> int:
    if args.name is not None:  # `--name ""` is an error, not "no name"
        validate_name(args.name, path="--name")
    profile = read_profile_file(Path(args.path))  # validated (and never through a symlink) before storing
    if args.name is not None:
        profile = profile.renamed(args.name)
    path = save_profile(profile, overwrite=args.overwrite, system=args.system)
    if args.json:
        print_json({"imported": profile.name, "path": str(path), "profile": profile.to_json_dict()})
    else:
        print(f"imported {profile.name!r} ({profile.device.label}, "
              f"{format_value(profile.setting.value, profile.setting.unit)}) to {path}")
    return exit_codes.OK


def run_delete(args, ctx) -> int:
    path = delete_profile(args.name, system=args.system)
    print(f"deleted {path}")
    return exit_codes.OK

