"""Start the engine as the account `tuner.core.privileges` chose, with the files it must write made writable.

An engine dropped from root to a user can neither write root's state directory nor read root's files, so the
paths in its options are staged in a private directory owned by that account: the reference it records
(`record`) is copied into place when the engine ends (read as a regular file, never through a link: the account
owns the directory); a reference it reads is copied in (and back, when `verify_repeatable` writes into it); a
`file://` rendezvous directory (the ranks of a rig trial meet there) is handed to the account. Nothing is staged
when the engine runs as the process that asked.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.core.atomic import write_atomic
from tuner.core.errors import PermissionDenied
from tuner.core.privileges import EngineIdentity, EngineRefused

if TYPE_CHECKING:
    from tuner.engine.options import EngineOptions
    from tuner.tuning.engine_client import EngineConfig


@dataclass
class Spawn:
    """What `subprocess.Popen` needs to start one engine, and what to do once it ended (`finish`, idempotent)."""

    argv: list[str]
    env: dict[str, str]
    popen_kwargs: dict[str, object] = field(default_factory=dict)
    identity: EngineIdentity | None = None
    _finish: Callable[[], None] = lambda: None
    _finished: bool = False

    def finish(self) -> None:
        if not self._finished:
            self._finished = True
            self._finish()

    def failed(self, error: PermissionError) -> Exception:
        """What to raise when the engine could not be started: the account it runs as may not run the
        interpreter (a venv whose Python lives in root's home), said in one line with the remedy."""
        if self.identity is None:
            return error
        return PermissionDenied(f"the stress engine runs as {self.identity.user}, who may not run {self.argv[0]} "
                                f"({error.strerror})", f"install the tuner where {self.identity.user} can read and "
                                "run it (a venv in your home, or the system install), then try again")


def prepare(config: EngineConfig) -> Spawn:
    """The spawn for `config`; raises PermissionDenied when the engine would run as root and may not."""
    identity = config.identity
    if isinstance(identity, EngineRefused):
        raise PermissionDenied(identity.reason, identity.remedy)
    if identity is None:
        return Spawn(config.argv(), config.environ())
    stage = Path(tempfile.mkdtemp(prefix="tuner-engine-"))
    try:
        os.chown(stage, identity.uid, identity.gid)
        options, copy_back = _stage_paths(config, identity, stage)
        staged = replace(config, options=options)
        spawn = Spawn(staged.argv(), identity.environ(staged.environ()),
                      {"user": identity.uid, "group": identity.gid, "extra_groups": list(identity.extra_groups)},
                      identity)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise

    def finish() -> None:
        try:
            for source, destination in copy_back:
                _copy_back(source, destination)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    spawn._finish = finish
    return spawn


def _stage_paths(config: EngineConfig, identity: EngineIdentity,
                 stage: Path) -> tuple[EngineOptions, list[tuple[Path, Path]]]:
    options = config.options
    copy_back: list[tuple[Path, Path]] = []
    if options.record:
        staged = stage / "record.ref"
        copy_back.append((staged, Path(options.record)))
        options = replace(options, record=str(staged))
    if options.reference and os.path.isfile(options.reference):  # a missing one: the engine says so itself
        staged = stage / "reference.ref"
        shutil.copyfile(options.reference, staged)
        os.chown(staged, identity.uid, identity.gid)
        if options.verify_repeatable:  # the engine writes the replay's outcome into the reference
            copy_back.append((staged, Path(options.reference)))
        options = replace(options, reference=str(staged))
    if options.rendezvous and options.rendezvous.startswith("file://"):
        os.chown(Path(options.rendezvous.removeprefix("file://")).parent, identity.uid, identity.gid)
    return options, copy_back


def _copy_back(source: Path, destination: Path) -> None:
    """Copy a file the engine wrote into place, as a regular file read without following a link."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # the engine ended before writing it: nothing to put in place
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return
        data = f.read()
    write_atomic(destination, data)
