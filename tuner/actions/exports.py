"""Where an export goes when the user names no path: one default for the UI and the CLI.

The current directory (where `tuner` was started), as `curl -O`, `git format-patch` and `pg_dump`-style tools
write: an export is a file the user asked for and will copy elsewhere, and XDG has no directory for those
(`$XDG_STATE_HOME` and `$XDG_CONFIG_HOME` are the tool's own, not the user's). The path is absolute, so the UI shows
it in full in its prompt and the CLI says where it wrote. `tuner profile export NAME` and `tuner report` use it
when PATH is left out; the Profiles screen's `e` and the Bisect screen's `e` offer it.
"""

from __future__ import annotations

from pathlib import Path


def profile_export_path(name: str) -> Path:
    """`<cwd>/NAME.toml`: a profile as one file (`tuner profile export NAME`, the Profiles screen's `e`)."""
    return Path.cwd() / f"{name}.toml"


def report_export_path(device_id: str, session: str | None) -> Path:
    """`<cwd>/bisect-DEVICE-SESSION.csv`: a bisect's trials (`tuner report`, the Bisect screen's `e`)."""
    return Path.cwd() / f"bisect-{device_id}-{session or 'trials'}.csv"
