"""A note from the backend while the UI runs (the root helper put a card back when its lease ran out, said by the
helper client's heartbeat thread) is a notification on screen: printed on stderr it never reached the user."""

from __future__ import annotations

import threading

from tests.polling import until
from tests.tui.helpers import sim_backend
from tuner.actions.context import Context
from tuner.app.tuner_app import TunerApp


async def test_a_note_from_another_thread_is_shown_as_a_warning(tmp_path, capsys):
    ctx = Context(simulate=True)
    ctx._backend = sim_backend(tmp_path)  # the helper's backend in production; any backend will do
    app = TunerApp(ctx, sample_interval_s=None, doctor=list)
    line = "the helper put sim0 back: its lease ran out"
    async with app.run_test(size=(100, 30)) as pilot:
        heartbeat = threading.Thread(target=ctx.notice, args=(line,), name="helper-heartbeat")
        heartbeat.start()
        heartbeat.join(5)
        await until(pilot, lambda: any(line in str(n.message) for n in app._notifications))
        assert [n.severity for n in app._notifications if line in str(n.message)] == ["warning"]
    assert line not in capsys.readouterr().err
