"""`tuner status`: one telemetry sample and the knob, for one device or all."""

from __future__ import annotations

from argparse import Namespace

from tuner.actions import safety_files
from tuner.actions.context import Context
from tuner.commands._argtypes import Subparsers
from tuner.commands._device import knob_or_error
from tuner.commands._output import format_value, print_json, warn
from tuner.core import exit_codes
from tuner.core.errors import StateError, TunerError
from tuner.core.models import DeviceInfo, Knob, Telemetry
from tuner.core.telemetry_text import fan_text, limits_text, vram_text

_FIELDS = (  # (label, attribute, format)
    ("power", "power_w", "{:.1f} W"),
    ("power cap", "power_limit_w", "{:.0f} W"),
    ("edge", "temp_edge_c", "{:.0f} °C"),
    ("hotspot", "temp_hotspot_c", "{:.0f} °C"),
    ("memory", "temp_mem_c", "{:.0f} °C"),
    ("core clock", "core_clock_mhz", "{:.0f} MHz"),
    ("mem clock", "mem_clock_mhz", "{:.0f} MHz"),
    ("voltage", "voltage_mv", "{:.0f} mV"),
    ("utilisation", "util_pct", "{:.0f} %"),
    ("energy", "energy_j", "{:.0f} J"),
)


def add_parser(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "status",
        help="show one telemetry sample and the current setting",
        description="Show one telemetry sample and the current undervolt setting. Figures the device does not "
        "report are shown as 'n/a' (null in JSON); so are clock-limit reasons the backend cannot read "
        "(`limits: n/a`, \"throttle_reasons\": null), which differ from `limits: none` ([] in JSON: none active).",
    )
    p.add_argument("--device", metavar="ID", help="device id from `tuner list` (default: all)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def format_telemetry(sample: Telemetry) -> list[str]:
    lines = []
    for label, attr, fmt in _FIELDS:
        value = getattr(sample, attr)
        lines.append(f"  {label:<12} {'n/a' if value is None else fmt.format(value)}")
    lines.append(f"  {'fan':<12} {fan_text(sample)}")
    lines.append(f"  {'VRAM':<12} {vram_text(sample)}")
    # as the dashboard says it: "n/a" when the backend cannot read the reasons, "none" only when it read none
    lines.append(f"  limits: {limits_text(sample.throttle_reasons)}")
    return lines


def safety_warnings(device_id: str, knob: Knob) -> list[str]:
    """Warning signs in the device's safety files: a trial (a card's, a rig's, a verify) left open by a tool that
    died (the card may still hold its value), or a damaged file (which blocks set, apply and bisect on the card)."""
    try:
        trial = safety_files.leftover_trial(device_id)
    except StateError as e:
        return [e.one_line()]
    if trial is None:
        return []
    why = {safety_files.Owner.EARLIER_BOOT: "the machine rebooted during it",
           safety_files.Owner.UNKNOWN_BOOT: "the boot id is unreadable, so a reset during it cannot be ruled out",
           }.get(trial["owner"], f"its process {trial['pid']} is gone")
    what = f"a {trial['phase'] or 'tuning'} trial at {format_value(trial['setting'], knob.unit)} did not finish ({why})"
    again = f"`tuner bisect --device {trial['resume']} --resume` runs it again" if trial["resume"] else ""
    if knob.current != knob.stock:
        return [f"{device_id} reads {format_value(knob.current, knob.unit)}, left over: {what}; run "
                f"`tuner reset --device {device_id}`" + (f", then {again}" if again else "")]
    return [f"{device_id}: {what}; the card is at stock" + (f"; {again}" if again else "")]


def run(args: Namespace, ctx: Context) -> int:
    backend = ctx.backend
    report: list[tuple[DeviceInfo, Knob | None, TunerError | None, Telemetry]]
    if args.device is not None:  # the card asked for: its knob error is the answer
        dev = backend.device(args.device)
        report = [(dev, backend.knob(dev.id), None, backend.telemetry(dev.id))]
    else:  # every card: one without a knob does not hide the others, but when none has one that is the answer
        knobs = [(dev, *knob_or_error(backend, dev.id)) for dev in backend.devices()]
        first_error = next((e for _, k, e in knobs if e is not None), None)
        if first_error is not None and all(k is None for _, k, _ in knobs):
            raise first_error
        report = [(dev, knob, error, backend.telemetry(dev.id)) for dev, knob, error in knobs]
    warnings = {d.id: safety_warnings(d.id, k) if k else [] for d, k, _, _ in report}
    warn(line for lines in warnings.values() for line in lines)
    if args.json:
        docs = [{"device": d.to_dict(), "knob": k and k.to_dict(), **({"error": e.one_line()} if e else {}),
                 "telemetry": t.to_dict(), "warnings": warnings[d.id]} for d, k, e, t in report]
        print_json(docs[0] if args.device is not None else {"devices": docs})
        return exit_codes.OK
    for dev, knob, error, sample in report:
        print(f"{dev.id}  {dev.label}")
        if knob is None:
            print(f"  {'setting':<12} unsupported: {error and error.one_line()}")
        else:
            print(f"  {'setting':<12} {format_value(knob.current, knob.unit)} (stock "
                  f"{format_value(knob.stock, knob.unit)}, range {knob.min:+d}..{knob.max:+d}, step {knob.step})")
            for line in knob.clamped:  # curve points the driver's range kept from the asked offset
                print(f"  {'clamped':<12} {line}")
        print("\n".join(format_telemetry(sample)))
    return exit_codes.OK
