"""The App on the NVIDIA-style simulated card (`tuner --simulate --sim-kind nvidia`): it starts, and the dashboard
and the Tune screen show the card, labelled SIMULATED, with its MHz knob."""

from __future__ import annotations

import html
import re

from tests.tui.helpers import FAKE_CHECKS
from tuner.actions.context import Context
from tuner.app.tuner_app import TunerApp
from tuner.cli import _parse


def _screen_text(app) -> str:
    """What the terminal shows (the screenshot's text, tags and styling dropped)."""
    svg = app.export_screenshot()
    return html.unescape(re.sub(r"<[^>]+>", "", svg)).replace("\xa0", " ")


async def test_the_app_starts_on_the_nvidia_style_card_and_shows_it():
    ctx = Context.from_args(_parse(["--simulate", "--sim-kind", "nvidia"]))
    app = TunerApp(ctx, doctor=lambda: list(FAKE_CHECKS), sample_interval_s=None)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            assert [d.id for d in app.devices] == ["sim0"]
            text = _screen_text(app)
            assert "Simulated Ada-class GPU (NVIDIA-style)" in text and "SIMULATED" in text
            await pilot.press("2")
            await pilot.pause()
            tune = _screen_text(app)
            assert "MHz" in tune and "mV" not in tune.replace("voltage", "")
            assert app.backend.knob("sim0").unit == "MHz"
    finally:
        ctx.close()
