"""Issue 24: a Doctor line that wraps continues under its own text, not under the `[FAIL]` mark."""

from __future__ import annotations

from tests.tui.helpers import make_app, screen_text, until
from tuner.actions.doctor import Check

LONG = [Check("kernel log", "fail", "cannot read the kernel log: journalctl -k exited 1 (No journal files were "
              "found) and /dev/kmsg is not readable by this user, so a driver reset would go unseen",
              "add yourself to the systemd-journal group (sudo usermod -aG systemd-journal $USER), then log in "
              "again and run the doctor once more")]


async def test_wrapped_doctor_lines_are_indented_under_their_text(tmp_path):
    app = make_app(tmp_path, doctor=lambda: list(LONG))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("5")
        await until(pilot, lambda: "[FAIL] kernel log" in screen_text(app))
        lines = screen_text(app).splitlines()
        first = next(i for i, line in enumerate(lines) if "[FAIL] kernel log" in line)
        body = []
        for line in lines[first + 1:]:  # up to the blank line after the check
            if not line.strip():
                break
            body.append(line.rstrip())
        assert body and all(line.startswith(" " * 7) for line in body), "\n".join(lines)
        remedy = next(i for i, line in enumerate(body) if line.lstrip().startswith("-> "))
        assert remedy > 0  # the detail wrapped onto at least one line of its own
        assert all(line.startswith(" " * 10) for line in body[remedy + 1:]), body
        assert "systemd-journal $USER" in " ".join(body)  # what the user types is never split
        assert all(len(line) <= 80 for line in lines)
