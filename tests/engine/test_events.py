"""tuner/engine/events.py: the one declaration of the engine's protocol. The strict check (`validate`) refuses what
the engine never writes, the reader (`decode_line`) never raises, the emitter writes what the schema declares, and
docs/engine.md's tables are the schema's own."""

from __future__ import annotations

import io
import json
import math

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.cli_helpers import REPO
from tests.engine.examples import EXAMPLES, example
from tuner.engine import events
from tuner.engine.protocol import Emitter


def record(name: str, **fields) -> dict:
    return {"event": name, "t": 1.0, **EXAMPLES[name], **fields}


def test_every_engine_event_has_a_complete_example_that_validates():
    assert set(EXAMPLES) == set(events.BY_NAME)
    for name in EXAMPLES:
        assert isinstance(events.validate(record(name)), events.BY_NAME[name])


def test_the_docs_tables_are_the_schema():
    text = (REPO / "docs" / "engine.md").read_text()
    begin, end = text.index(events.DOCS_BEGIN) + len(events.DOCS_BEGIN), text.index(events.DOCS_END)
    assert text[begin:end].strip() == events.markdown().strip(), \
        "docs/engine.md's event tables differ from tuner/engine/events.py: paste `python -m tuner.engine.events`"


def test_a_field_is_always_written_unless_it_may_be_unset():
    """The docs promise "always present (possibly null)": no field may quietly default to a value."""
    for cls in events.ENGINE_EVENTS:
        for f in msgspec.structs.fields(cls):
            if f.name != "t":
                assert f.required or f.default is msgspec.UNSET, f"{cls.__name__}.{f.name} has a default"


@pytest.mark.parametrize("bad, why", [
    (record("step", loss=None), "loss"),  # a float, not null
    (record("step", step="7"), "step"),  # only a lax reading takes "7" for 7
    (record("step", step=True), "step"),
    (record("step", loss=math.nan), "raw non-finite"),
    (record("step", figure="loss"), "undeclared figure"),
    ({k: v for k, v in record("fault").items() if k != "figure"}, "missing figure"),
    (record("fault", kind="wobble"), "fault kind"),
    (record("end", verdict="pass", exit_code=1), "does not go with"),
    (record("end", verdict="fail", kind="usage", exit_code=1), "not a fault kind"),
    (record("start", data={"source": "x", "bytes": 1, "files": 1, "sha256": "s", "tokens": "many"}), "data"),
    ({**record("step"), "t": -1}, "`t`"),
    ({"event": "future", "t": 1.0}, "unknown event"),
])
def test_validate_refuses_what_the_engine_never_writes(bad, why):
    with pytest.raises(events.ProtocolError, match=why):
        events.validate(bad)


def test_validate_takes_the_written_forms_of_non_finite_floats_and_absent_optional_fields():
    ev = events.validate(record("step", loss="NaN", grad_norm="Infinity", phase="partial"))
    assert math.isnan(ev.loss) and ev.grad_norm == math.inf and ev.phase == "partial"
    assert events.validate(record("step")).phase is msgspec.UNSET


def test_the_emitter_writes_every_declared_field_and_non_finite_floats_as_strings():
    out = io.StringIO()
    sink: list[dict] = []
    em = Emitter(out, sink=sink.append, clock=iter([10.0, 12.5, 12.5]).__next__)
    written = em.emit(events.StepEvent(step=3, loss=math.nan, grad_norm=-math.inf, dt_ms=1.0, tok_s=None,
                                       tflops=None))
    line = out.getvalue()
    assert json.loads(line) == written == sink[0]
    assert list(written) == ["event", "t", "step", "loss", "grad_norm", "dt_ms", "tok_s", "tflops"]  # no phase
    assert written["t"] == 2.5 and written["loss"] == "NaN" and written["grad_norm"] == "-Infinity"
    events.validate(written)


def test_a_wrong_field_is_an_error_where_the_event_is_built():
    with pytest.raises(TypeError, match="figure"):
        events.StepEvent(step=1, loss=1.0, grad_norm=1.0, dt_ms=1.0, tok_s=None, tflops=None, figure="loss")
    with pytest.raises(TypeError, match="tflops"):
        events.StepEvent(step=1, loss=1.0, grad_norm=1.0, dt_ms=1.0, tok_s=None)
    with pytest.raises(ValueError, match="fault kind"):
        events.FaultEvent(kind="wobble", step=1, reference_step=None, detail="d", figure=None)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_what_the_engine_writes_reads_back_as_the_same_event(name):
    built = example(name)
    written = events.to_record(built, built.t)
    read = events.decode_line(json.dumps(written))
    assert read == built and type(read) is type(built) and read.raw == written and read.name == name


def test_a_fault_and_an_end_declare_the_figure_the_rig_trial_reads():
    fault = events.decode_line(json.dumps(record("fault", figure="grads")))
    end = events.decode_line(json.dumps(record("end", verdict="fail", kind="mismatch", exit_code=1, figure="state")))
    assert (fault.figure, end.figure) == ("grads", "state")


@given(st.text(max_size=200))
def test_the_reader_is_total_on_text(text):
    assert isinstance(events.decode_line(text), events.Event)


@given(st.dictionaries(st.sampled_from(["event", "t", "step", "loss", "verdict", "kind", "figure", "exit_code"]),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5),
                                 st.sampled_from(sorted(events.BY_NAME)), st.lists(st.integers(), max_size=3)),
                       max_size=8))
def test_the_reader_is_total_on_json(obj):
    ev = events.decode_line(json.dumps(obj))
    assert isinstance(ev, events.Event)
    if isinstance(obj.get("event"), str) and obj["event"] in events.BY_NAME:
        assert isinstance(ev, (events.BY_NAME[obj["event"]], events.InvalidEvent))


def test_the_schema_module_is_torch_free_and_the_engine_package_imports_nothing_on_its_own():
    import subprocess
    import sys

    code = "import sys, tuner.engine.events, tuner.engine.protocol; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr
