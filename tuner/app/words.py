"""The UI's words for things the core says in the CLI's terms: a flag becomes the key or the form field that does
the same here, said from where the user is.

The core's messages name CLI flags (`continue it with --resume`, `--floor -300 mV is outside...`); in the UI those
flags do not exist, so a notice that says them sends the user looking for an option that is not there. Every
notice goes through `for_people` (TunerApp.notify), with the screen it is shown on: on the Bisect screen "u resumes
it", elsewhere "u resumes it on the Bisect screen (3)" (never "press u on the Bisect screen" while you are on it).
A flag the UI has no key for is named as the command line's (`tuner unsafe clear`), never as if the UI had it. A
whole command in backticks (`tuner bisect --device sim0 --resume`) is left as it is: it is plainly a shell line.
"""

from __future__ import annotations

import re

from tuner.core.errors import TunerError

# Every screen: its key, mode (tuner.screens.<mode>) and title; the App, its palette, key bar and nav bar read it
SCREENS_IN_ORDER = (
    ("1", "dashboard", "Dashboard"),
    ("2", "tune", "Tune"),
    ("3", "bisect", "Auto-bisect"),
    ("4", "profiles", "Profiles"),
    ("5", "doctor", "Doctor"),
    ("6", "help", "Help"),
)
BISECT = "bisect"  # the Bisect screen's mode
FORM_FIELDS = ("step", "resolution", "margin", "trial", "confirm", "floor", "mode")  # the Bisect screen's form


def short_title(title: str) -> str:
    """"Auto-bisect" -> "Bisect": a screen's name on the nav bar (its TITLE) and, cut to six letters, the key bar."""
    return title.split("-")[-1].capitalize()


def _rules(here: str | None) -> tuple[tuple[re.Pattern[str], str], ...]:
    """(pattern, replacement), applied in order; each names what the UI offers instead, from `here`."""
    on = "" if here == BISECT else " on the Bisect screen (3)"
    return (
        (re.compile(r"resume with --resume"), f"u resumes it{on}"),
        (re.compile(r"continue (it|the rig) with --resume,? or (?:discard it|start afresh) with --restart"),
         rf"u continues \1 and n starts afresh{on}"),
        (re.compile(r"start a new one without --resume"), f"start a new one with b{on}"),
        (re.compile(r"pass --overwrite to replace it"), "choose another name, or delete the old one first"),
        (re.compile(r"\s*\(--overwrite replaces only a regular file\)"), ""),
        (re.compile(r"or pass --ignore-unsafe if you are sure"),
         "or forget the failure on the command line (`tuner unsafe clear`) if you are sure"),
        (re.compile(r"use --preset nanochat"), "choose the nanochat preset (p on the Tune screen)"),
        (re.compile(r"--no-compile"), "the engine's compile turned off"),
        (re.compile(r"(with(?:out)?) --tolerance"), r"\1 the command line's `--tolerance`"),
        (re.compile(r"\(--tolerance\)"), "(the tolerance comparison)"),
        (re.compile(r"tune this card with `tuner bisect`, or pass --force \(and ideally --verify DUR\)"),
         f"tune this card{on} (forcing it is the command line's `tuner apply --force`)"),
        (re.compile(r"tune this rig with `tuner bisect --device all`, or pass --force"),
         f"tune the rig (ALL CARDS{on}; forcing it is the command line's `tuner apply --force`)"),
        (re.compile(r"check `tuner list`, or pass --force to apply the other parts and skip this one"),
         "check the cards (Dashboard, 1); forcing the other parts is the command line's `tuner apply --force`"),
        (re.compile(r"--force does not override a vendor or knob mismatch; tune this card with `tuner bisect`"),
         f"tune this card{on}"),
        (re.compile(r"--force does not override a vendor or knob mismatch"), "nothing overrides that"),
        (re.compile(r"(?<![\w`-])--(" + "|".join(FORM_FIELDS) + r")\b"), r"\1"),  # the form's field of that name
        (re.compile(r"or use --device all"), f"or choose ALL CARDS (d{on})"),
        (re.compile(r"(?<![\w-])--device\b"), "the cards chosen"),
        (re.compile(r"\(--restart\)"), f"(n restarts it{on})"),
        (re.compile(r"--resume"), f"resume (u{on})"),
        (re.compile(r"--restart"), f"restart (n{on})"),
        # said again on the Bisect screen (a text put in the UI's words before it was known where it would show)
        *([(re.compile(r" on the Bisect screen \(3\)"), "")] if here == BISECT else []),
    )


JOB_NAMES = {"StressJob": "the stress run", "VerifyJob": "the profile's verify trial",
             "BisectRunner": "the auto-bisect"}  # of one card or several: make_safe names the cards
_BACKTICKED = re.compile(r"`[^`]*`")


def for_people(text: str, *, here: str | None = None) -> str:
    """`text` with the CLI's flags replaced by what the UI offers, said from the screen `here` (a mode name:
    "bisect"), or from anywhere (None). A command in backticks is left as it is."""
    kept: list[str] = []

    def keep(match: re.Match[str]) -> str:
        kept.append(match.group(0))
        return f"\0{len(kept) - 1}\0"

    rules = _rules(here)
    # the rules that quote a command themselves run first, then whole commands are set aside from the rest
    for pattern, words in rules:
        if "`" in pattern.pattern:
            text = pattern.sub(words, text)
    text = _BACKTICKED.sub(keep, text)
    for pattern, words in rules:
        if "`" not in pattern.pattern:
            text = pattern.sub(words, text)
    return re.sub(r"\0(\d+)\0", lambda m: kept[int(m.group(1))], text)


def job_name(job: object) -> str:
    return JOB_NAMES.get(type(job).__name__, "the running job")


def describe_error(error: BaseException) -> str:
    """One line for a notification: a TunerError's message and remedy, else the exception's type and text."""
    if isinstance(error, TunerError):
        return for_people(error.one_line())
    return f"{type(error).__name__}: {error}"
