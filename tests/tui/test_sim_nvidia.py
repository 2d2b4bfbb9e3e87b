"""The App on the NVIDIA-style simulated card (`tuner --simulate --sim-kind nvidia`): it starts, and the dashboard
and the Tune screen show the card, labelled SIMULATED, with its MHz knob."""

from __future__ import annotations

import html
import re

import pytest

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


@pytest.mark.heavy(seconds=20)
async def test_a_manual_stress_on_the_nvidia_style_card_records_its_reference_then_compares_with_it():
    """Issue 15 item 8: the first stress at stock records the card's reference (keyed by its serial and the
    engine settings), the next one compares with it instead of recording again; another preset is another key."""
    import asyncio

    from tuner.actions.stress import StressRequest, cached_reference

    ctx = Context.from_args(_parse(["--simulate", "--sim-kind", "nvidia"]))
    app = TunerApp(ctx, doctor=lambda: list(FAKE_CHECKS), sample_interval_s=None,
                   stress_options={"reference_record_s": 1.0})
    device, target = app.backend.device("sim0"), app.backend.stress_target("sim0")
    ref = cached_reference(device, target, StressRequest("sim0", preset="tiny", mode="train")).path
    assert ref is not None and device.serial in ref.name and not ref.exists()
    assert cached_reference(device, target, StressRequest("sim0", preset="small", mode="train")).path != ref

    async def wait(predicate, timeout_s: float = 60.0) -> None:
        for _ in range(int(timeout_s / 0.1)):
            if predicate():
                return
            await asyncio.sleep(0.1)
        raise AssertionError("condition never became true")

    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("2", "s")
            await wait(lambda: app.stress.detector("reference") == "recording")
            await wait(lambda: app.stress.detector("reference") == "ok" and len(app.stress.steps) >= 3)
            assert ref.exists()
            await pilot.press("s")
            await wait(lambda: not app.stress.running)
            await pilot.press("s")
            await wait(lambda: app.stress.run == 2 and len(app.stress.steps) >= 3)
            assert app.stress.detector("reference") == "ok"
            assert not any("recording this card's stock reference" in line for line in app.stress.log)
            await pilot.press("s")
            await wait(lambda: not app.stress.running)
            assert "stopped by you" in (app.stress.verdict or "")
    finally:
        ctx.close()
