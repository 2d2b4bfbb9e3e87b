"""`tuner service install|uninstall|status`: the systemd unit that applies system profiles at boot.

The rules live in tuner.actions.boot_service (the UI calls the same functions); this only parses and prints.
"""

from __future__ import annotations

from argparse import Namespace
from datetime import datetime

from tuner.actions import boot_service
from tuner.actions.context import Context
from tuner.commands._argtypes import Subparsers
from tuner.commands._output import print_json, warn
from tuner.core import exit_codes, paths
from tuner.core.errors import TunerError
from tuner.profiles import boot as boot_rules


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "service",
        help="install or remove the boot service that applies profiles",
        description=f"The boot service ({boot_rules.UNIT_NAME}) runs `tuner apply --boot` once per boot, after the "
        "GPU driver has loaded. It applies each profile in /etc/tuner/profiles to the card it was proven on (each "
        "part of a rig profile to its own card), and skips applying when the kernel command line has tuner.reset "
        "or the previous boot ended during a tuning trial. Its log: journalctl -u tuner-apply. Installing and "
        "removing need root.",
    )
    sub = p.add_subparsers(dest="service_command", metavar="ACTION", required=True)
    q = sub.add_parser("install", help="write and enable the unit (root)")
    q.add_argument("--profile", metavar="NAME",
                   help="copy this profile (name or path) to the system store and apply only it at boot")
    q.add_argument("--overwrite", action="store_true", help="replace a system profile of the same name")
    q.set_defaults(run=run_install)
    q = sub.add_parser("uninstall", help="disable and remove the unit (root); system profiles are kept")
    q.set_defaults(run=run_uninstall)
    q = sub.add_parser("status", help="is the unit installed, what would the next boot do, what each card reads",
                       description="Whether the boot and resume units are installed, the system profiles, what the "
                       "next boot would do, how the last boot run ended, and per card: applied as the profile says, "
                       "not applied (and why), changed by something else since (the value found and the value "
                       "installed), or missing. With --simulate the simulated cards are read against the system "
                       "store (installing stays refused for simulated profiles).")
    q.add_argument("--json", action="store_true", help="print one JSON document")
    q.set_defaults(run=run_status)


def _print(result: boot_service.BootServiceResult) -> None:
    for line in result.messages:
        print(line if not line.startswith("(not run here") else f"  {line}")
    warn(result.warnings)


def run_install(args: Namespace, ctx: Context) -> int:
    try:
        result = boot_service.install(args.profile, overwrite=args.overwrite, simulated_session=ctx.simulate)
    except boot_service.NoSystemProfiles as e:
        raise boot_service.NoSystemProfiles(e.message, "pass --profile NAME") from None
    _print(result)
    return exit_codes.OK


def run_uninstall(args: Namespace, ctx: Context) -> int:
    _print(boot_service.remove())
    return exit_codes.OK


def run_status(args: Namespace, ctx: Context) -> int:
    backend, error = None, None
    try:  # the cards as they read now (simulated ones with --simulate); without a GPU the rest still shows
        backend = ctx.backend
    except TunerError as e:
        error = e.one_line()
    st = boot_service.status(backend, simulated=ctx.simulate, backend_error=error)
    if args.json:
        print_json(st.to_dict())
        return exit_codes.OK
    print(f"unit        {st.unit} ({'installed' if st.installed else 'not installed'})")
    if st.exec_start:
        print(f"runs        {st.exec_start}")
    if st.enabled or st.active:
        print(f"systemd     {st.enabled or '?'}, {st.active or '?'}")
    print(f"profiles    {paths.system_profiles_dir()}: " + (", ".join(
        f"{p.name} ({p.summary})" for p in st.system_profiles) or "none"))
    for path, why in st.invalid_profiles:
        print(f"  invalid   {path}: {why}" if str(path) not in why else f"  invalid   {why}")
    print(f"next boot   {'skips: ' + st.next_boot_skips if st.next_boot_skips else 'applies'}")
    for c in st.cards:
        where = f"{c.device} {c.label}" if c.device else "(no card)"
        print(f"card        {c.profile}{f' card[{c.card}]' if c.card is not None else ''} on {where}: {c.text()}")
    if st.cards_error:
        print(f"cards       not read: {st.cards_error}")
    if st.last_run is not None:
        when = datetime.fromtimestamp(st.last_run.finished_at).strftime("%Y-%m-%d %H:%M:%S")
        how = "ok" if st.last_run.ok else f"exit {st.last_run.exit_code}"
        print(f"last boot   {'SIMULATED ' if st.last_run.simulated else ''}{when}: {how}")
        for line in st.last_run.lines:
            print(f"  {line}")
    elif st.last_run_unreadable:
        print(f"last boot   {st.last_run_unreadable}")
    return exit_codes.OK
