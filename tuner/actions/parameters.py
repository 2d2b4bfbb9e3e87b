"""The parameters of a bisect and of a stress run, each declared once: its flag, its help, how its text is read and
what a blank means. The CLI adds its options from these (tuner.commands._argtypes.add_arguments); the Bisect screen
builds a field for each one with a label and reads it with the same parser, so a bad value gets the same words on
both, after the flag there and the field's label here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tuner.core.durations import duration_text, parse_duration_s
from tuner.core.errors import UsageError
from tuner.core.models import Knob, Mode
from tuner.core.numbers import parse_whole_number
from tuner.engine.options import PRESETS
from tuner.tuning.bound import parse_bound_s

_whole = parse_whole_number  # ASCII digits and a sign; on the form, optionally the card's unit ("15 MHz")


def _count(text: str, unit: str) -> int:
    if (value := _whole(text, unit)) < 1:
        raise UsageError(f"expected at least 1, got {value}")
    return value


def _duration_s(text: str, _unit: str) -> float:
    return parse_duration_s(text)


@dataclass(frozen=True)
class Parameter:
    """One option of `tuner bisect` or `tuner stress`; one with a label is also a field of the Bisect screen."""

    id: str  # argparse's attribute and the form field's id; the flag is it with dashes (--canary-every)
    help: str
    parser: Callable[[str, str], Any] | None = None  # (text, the card's unit) -> value; None: a choice or a flag
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    default: Any = None  # what argparse stores when it is left out (None: the core's default)
    label: str = ""  # the form field's label; "": the command line only
    field: str = ""  # the request's field it fills (BisectParams, StressRequest), when not its id
    later: bool = False  # argparse keeps the text, the command reads it: a bad duration stays the command's error

    @property
    def flag(self) -> str:
        return "--" + self.id.replace("_", "-")

    @property
    def name(self) -> str:
        return self.field or self.id

    def parse(self, text: str, unit: str = "", where: str = "") -> Any:
        """The value of `text`, in the card's `unit` where it has one ("15 MHz"). UsageError (from the parser's
        ValueError or UsageError) says what is wrong after `where`: the flag on the command line, the field's label
        on the form (argparse adds the flag itself)."""
        try:
            if self.parser is not None:
                return self.parser(text, unit)
            if text in self.choices:
                return text
            raise UsageError(f"invalid choice: {text!r} (choose from {', '.join(repr(str(c)) for c in self.choices)})")
        except (ValueError, UsageError) as e:
            message, remedy = (e.message, e.remedy) if isinstance(e, UsageError) else (str(e), None)
            raise UsageError(f"{where}: {message}" if where else message, remedy) from None

    def placeholder(self, knob: Knob) -> str:
        """What a blank field means on this card: the core's default ("10 mV", "30 MHz", "5m", "train", "none")."""
        from tuner.tuning.job import BisectParams  # loaded when asked: `tuner stress` builds its parser without it
        from tuner.tuning.plan import PlanParams

        value = getattr(BisectParams, self.name)
        if value is None:  # left to the plan (job.search_plan_params): its default for this card, in its unit
            value = getattr(PlanParams.defaults_for(knob), self.name)
            return "none" if value is None else f"{value} {knob.unit}"
        return duration_text(value) if self.parser is _duration_s else str(value)


MODE = Parameter("mode", "stress workload of the trials (default train; the confirmation runs mixed)",
                 choices=tuple(Mode), default=Mode.TRAIN, label="mode")
PRESET = Parameter("preset", "engine model size (default: nanochat on GPUs, tiny on the simulated card's CPU engine)",
                   choices=tuple(PRESETS))  # the engine's own list (torch-free), never a copy
COMPILE = Parameter("compile", "torch.compile the engine's model and optimizer (default: on for GPUs)")
# each help's default is the one a blank field shows (the core's): tests/tui/test_parameters.py holds them to it
TRIAL = Parameter("trial", "length of each trial (default 5m; 90s, 5m, 1h)", _duration_s, "DUR", label="trial",
                  field="trial_s", later=True)
CONFIRM = Parameter("confirm", "length of the confirmation run (default 30m)", _duration_s, "DUR", label="confirm",
                    field="confirm_s", later=True)
BOUND = Parameter("bound", "the proof you need: at most one fault per DUR of this load (95 %% confidence; 10m, 2h). "
                  "The trials are then sized by what they can still tell (short screens far from the edge, one --trial "
                  "near it) and the confirmation runs until the bound is reached, within --confirm (then the time "
                  "allowed; a bound it cannot reach is refused before anything runs). Without it the lengths are "
                  "--trial and --confirm and the bound reached is stated all the same",
                  lambda text, _unit: parse_bound_s(text), "DUR", field="bound_s", later=True)  # its words name --bound
BISECT = (
    Parameter("step", "coarse step (default 10 mV; NVIDIA: 2 clock steps)", _whole, "N", label="step"),
    Parameter("resolution", "refine down to this (default 5 mV; NVIDIA: 1 step)", _whole, "N", label="res"),
    Parameter("margin", "added back to the confirmed value (default 10 mV; NVIDIA: 2 steps)", _whole, "N",
              label="margin"),
    TRIAL,
    CONFIRM,
    BOUND,
    Parameter("floor", "never test beyond this setting", _whole, "VALUE", label="floor"),
    MODE,
    PRESET,
    COMPILE,
)

STRESS_DURATION = "5m"
DURATION = Parameter("duration", f"how long (default {STRESS_DURATION}; 90s, 5m, 1h)", _duration_s, "DUR", later=True)
STRESS_LENGTH = (DURATION, Parameter("steps", "how many training steps instead", _count, "N"))  # one or the other
STRESS = (
    replace(MODE, help="train (default), gemm (GEMM burn only) or mixed (partial load and idle gaps)"),
    replace(PRESET, help="model size (default: nanochat on GPUs, tiny on the CPU / simulated card)"),
    COMPILE,
    Parameter("dtype", "compute dtype (default auto: bf16 where supported, else fp32; or $TUNER_DTYPE)",
              choices=("auto", "bf16", "fp16", "fp32")),
    Parameter("seed", "model, data and fault seed (default 0)", _whole, default=0),
    Parameter("canary_every", "canary replay every K steps (default 100; 10 on a simulated card)", _count, "K"),
)
