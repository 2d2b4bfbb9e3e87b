"""`tuner --help`'s exit codes (tuner.core.exit_codes.EXIT_CODE_HELP) and the README's table say the same: the
same codes, each with the same headline, and code 6 names every other tool tuner.actions.other_tools finds."""

from __future__ import annotations

import re
from pathlib import Path

from tuner.actions import other_tools
from tuner.core import exit_codes

README = Path(__file__).resolve().parents[2] / "README.md"


def _help_lines() -> dict[int, str]:
    """{code: its text}; a line indented past the code column continues the code above it."""
    out: dict[int, str] = {}
    code = None
    for line in exit_codes.EXIT_CODE_HELP.splitlines()[1:]:
        m = re.match(r"  (\d+)\s+(.*)", line)
        if m:
            code = int(m.group(1))
            out[code] = m.group(2)
        else:
            assert code is not None and line.startswith("       "), line
            out[code] += " " + line.strip()
    return out


def _readme_rows() -> dict[int, str]:
    """{code: its row's text, without backticks}, from the README's exit-code table."""
    rows = re.findall(r"^\| (\d+) \| (.*) \|$", README.read_text(), flags=re.M)
    return {int(code): text.replace("`", "").replace("\\|", "|") for code, text in rows}


def _headline(text: str) -> str:
    """What a code is, before its details: `the card is busy` of `the card is busy: another ...`."""
    return re.split(r"[:;]| \(", text, maxsplit=1)[0].strip()


def test_the_help_and_the_readme_list_the_same_codes_as_the_module():
    declared = {v for k, v in vars(exit_codes).items() if k.isupper() and isinstance(v, int)}
    assert set(_help_lines()) == declared
    assert set(_readme_rows()) == declared


def test_each_code_has_the_same_headline_in_both():
    readme = _readme_rows()
    for code, text in _help_lines().items():
        assert _headline(text).lower() in readme[code].lower(), (code, _headline(text), readme[code])


def test_code_6_names_every_other_tool_in_both():
    for where, text in (("--help", _help_lines()[exit_codes.BUSY]), ("README", _readme_rows()[exit_codes.BUSY])):
        for tool in other_tools.TOOLS:
            assert tool.name in text or tool.product in text, (where, tool.name)
        assert "--ignore-other-tools" in text and "another tuner process" in text, where
