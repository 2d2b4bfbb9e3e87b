"""`tuner-helper`: the root helper that owns the cards and the machine's safety state (docs/helper.md).

Started by systemd socket activation in a system install; in the foreground for tests and by hand:
`tuner-helper [--simulate ...] --socket PATH --group NAME --state-dir DIR`.
"""

from __future__ import annotations

import argparse
import contextlib
import grp
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from tuner import __version__
from tuner.backends import Backend, check_no_simulator_options, open_backend
from tuner.backends.simulated_options import add_simulator_options
from tuner.core import exit_codes, paths, root_owned
from tuner.core.argtypes import OneLineParser
from tuner.core.errors import PermissionDenied, TunerError, UsageError
from tuner.core.privileges import sudo_uid
from tuner.helper import kmsg
from tuner.helper import schema as s
from tuner.helper.server import HelperServer, bind_listener, inherited_listener
from tuner.helper.service import HelperService
from tuner.helper.state import MachineState

DESCRIPTION = """\
The root helper of undervolt-tuner: the one process that writes GPU settings and keeps the machine's safety state
(the unsafe list, the open-trial journal, one writer per card). The tuner, its UI and its stress engine run as
the user and ask the helper over a unix socket; the helper re-checks every write (the card's range and step, no
overvolt unless allowed, the unsafe list, one writer per card), puts back any change that is not confirmed in
time or whose client goes away, and puts back every unconfirmed change when it is stopped."""

EPILOG = f"""\
examples:
  tuner-helper --socket /run/tuner/helper.sock --group tuner      the system helper, in the foreground
  tuner-helper --simulate --socket /tmp/h/helper.sock --group tuner --state-dir /tmp/h/state

Under systemd socket activation the socket comes from systemd (ListenStream=, SocketMode=0660, SocketGroup=).
The simulated options are those of `tuner --simulate`; a tuner started with them and TUNER_HELPER_SOCKET uses it.

{exit_codes.EXIT_CODE_HELP}

environment:
  TUNER_STATE_DIR   the default of --state-dir (default {paths.DEFAULT_SYSTEM_STATE_DIR})
  TUNER_SYSFS_ROOT  read and write sysfs under this root instead of / (fake trees)"""


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="tuner-helper", description=DESCRIPTION, epilog=EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"tuner-helper {__version__}")
    p.add_argument("--socket", type=Path, default=Path(paths.DEFAULT_HELPER_SOCKET), metavar="PATH",
                   help=f"the unix socket to listen on (default {paths.DEFAULT_HELPER_SOCKET}; ignored under "
                   "socket activation)")
    p.add_argument("--group", default="tuner", metavar="NAME",
                   help="members of this group (and root) may ask; the socket is 0660 root:NAME (default tuner)")
    p.add_argument("--state-dir", type=Path, default=None, metavar="DIR",
                   help="the machine's safety state (default $TUNER_STATE_DIR or /var/lib/tuner)")
    p.add_argument("--allow-overvolt", action="store_true",
                   help="accept overvolting requests that ask for it (refused by default)")
    p.add_argument("--kmsg", type=Path, default=kmsg.DEFAULT_KMSG, metavar="PATH", help=argparse.SUPPRESS)
    g = p.add_argument_group("simulated GPU")
    g.add_argument("--simulate", action="store_true", help="drive simulated GPUs (no hardware is touched)")
    add_simulator_options(g, for_helper=True)
    return p


def open_helper_backend(args: argparse.Namespace, state_dir: Path) -> Backend:
    if not args.simulate:
        return open_backend(simulate=False)
    from tuner.backends.simulated import SimulatedBackend

    name = f"seed-{args.sim_seed}.json" if args.sim_kind == "amd" else f"{args.sim_kind}-seed-{args.sim_seed}.json"
    return SimulatedBackend(gpus=args.sim_gpus, seed=args.sim_seed, vmin_mv=args.sim_vmin, kind=args.sim_kind,
                            state_path=state_dir / "simulated" / name, nondeterministic=args.sim_nondeterministic,
                            contention_after_s=args.sim_contention_after)


def prepare_state_dir(path: Path) -> MachineState:
    """The state directory, created if missing; refused when others could write into it or it is a link."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o755)
        st = os.lstat(path)
    except OSError as e:  # a regular file there, or a link to one; a parent that is not a directory
        reason = "it exists and is not a directory" if isinstance(e, FileExistsError) else e.strerror
        raise UsageError(f"cannot use the state directory {path}: {reason}",
                         "give --state-dir a directory only root can write (it is created if missing)") from None
    if os.path.islink(path) or (os.geteuid() == 0 and st.st_uid != 0) or st.st_mode & 0o022:
        raise UsageError(f"the state directory {path} is a link, or others can write into it",
                         f"use a directory only root can write (`chown root {path} && chmod 755 {path}`)")
    above = root_owned.first_writable([path.parent]) if os.geteuid() == 0 else None
    if above is not None:  # its owner could rename the state directory away and put their own in its place
        raise UsageError(f"the state directory {path} is below {above[0]}, which another user can change "
                         f"({above[1]})", "use a directory whose every parent only root can write (e.g. "
                         f"{paths.DEFAULT_SYSTEM_STATE_DIR})")
    state = MachineState(path)
    state.create()
    return state


def serve(args: argparse.Namespace, backend: Backend | None = None) -> int:
    """Run the helper until SIGTERM/SIGINT/SIGHUP. `backend`: tests hand in one over a fake kernel."""
    if not args.simulate:  # a --sim-* option with --simulate forgotten must not drive the real cards as root
        check_no_simulator_options(args.sim_nondeterministic, args.sim_contention_after, None, None,
                                   vmin=args.sim_vmin, gpus=args.sim_gpus, seed=args.sim_seed, kind=args.sim_kind)
    if os.geteuid() != 0 and not args.simulate:
        raise PermissionDenied("tuner-helper writes GPU settings and must run as root", "start it as root (or "
                               "through its systemd socket unit), or pass --simulate to try it")
    sudo_user = sudo_uid()  # refused before anything is made
    try:
        gid = grp.getgrnam(args.group).gr_gid
    except KeyError:
        raise UsageError(f"no group {args.group!r}", f"create it: `groupadd --system {args.group}`") from None
    state = prepare_state_dir(args.state_dir or paths.system_state_dir())
    backend = backend or open_helper_backend(args, state.root)
    sim = s.SimConfig(args.sim_gpus, args.sim_seed, args.sim_kind, args.sim_vmin, args.sim_nondeterministic,
                      args.sim_contention_after) if args.simulate else None
    service = HelperService(backend, state, group=args.group, allow_overvolt=args.allow_overvolt, sim=sim)
    service.recover_at_start()
    for uid in {0, sudo_user or 0}:
        service.import_user(uid)  # the invoking user's own per-user state (root's, and the sudo user's)
    inherited = inherited_listener()
    listener, lock_fd = (inherited, None) if inherited is not None else bind_listener(args.socket, gid)
    server = HelperServer(service, listener, gid, kmsg_path=args.kmsg)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, server.request_stop)
    where = "the socket systemd passed" if inherited is not None else str(args.socket)
    print(f"tuner-helper: serving {len(service.devices)} card(s) ({backend.name}"
          f"{', SIMULATED' if backend.simulated else ''}) on {where} for group {args.group}", file=sys.stderr,
          flush=True)
    try:
        server.serve()
    finally:
        listener.close()
        if inherited is None:
            with contextlib.suppress(OSError):  # still ours: the startup lock is held until here
                if os.lstat(args.socket).st_uid == os.geteuid():
                    os.unlink(args.socket)
        if lock_fd is not None:
            os.close(lock_fd)
        backend.close()
    print("tuner-helper: stopped; every unconfirmed change was put back", file=sys.stderr, flush=True)
    return exit_codes.OK


def main(argv: Sequence[str] | None = None, backend: Backend | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return serve(args, backend)
    except TunerError as e:
        print(f"tuner-helper: error: {e.one_line()}", file=sys.stderr)
        return e.exit_code
