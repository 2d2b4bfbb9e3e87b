"""The UI's words for things the core says in the CLI's terms: a flag becomes the key that does the same here.

The core's messages name CLI flags (`continue it with --resume`); in the UI those flags do not exist, so a toast
that says them sends the user looking for an option that is not there.
"""

from __future__ import annotations

import re

# (pattern, replacement), applied in order; each names what the UI offers instead
FLAG_WORDS = (
    (re.compile(r"resume with --resume"), "u resumes it on the Bisect screen"),
    (re.compile(r"continue it with --resume or discard it with --restart"),
     "on the Bisect screen, u continues it and n starts afresh"),
    (re.compile(r"start a new one without --resume"), "start a new one with b"),
    (re.compile(r"pass --overwrite to replace it"), "choose another name, or delete the old one first"),
    (re.compile(r"\s*\(--overwrite replaces only a regular file\)"), ""),
    (re.compile(r"--resume"), "resume (u)"),
    (re.compile(r"--restart"), "restart (n)"),
)

JOB_NAMES = {"StressJob": "the stress run", "VerifyJob": "the profile's verify trial",
             "BisectRunner": "the auto-bisect"}  # of one card or several: make_safe names the cards


def for_people(text: str) -> str:
    """`text` with the CLI's flags replaced by what the UI offers."""
    for pattern, words in FLAG_WORDS:
        text = pattern.sub(words, text)
    return text


def job_name(job: object) -> str:
    return JOB_NAMES.get(type(job).__name__, "the running job")
