"""A parsed document (TOML or JSON) held to its one declared type, and the one explanation of a misfit.

Each file format is declared once, as msgspec Structs whose fields carry their bounds (`Annotated[int,
Meta(ge=..., le=...)]`, a pattern, a length). `fit()` converts strictly: "-40" and -40.0 are not integers, a string
is not a date-time. msgspec says *where* a document does not fit; what is wrong there is worked out from the value
and its declared type, in the caller's words (a profile speaks of tables and integers, a journal of objects and
whole numbers), so the line names the bound, the form or the choices and never quotes a regex.

A field's own words go in `Meta(extra=...)`, all optional: `what` (its noun), `whole` (a list or map explained as
a whole, in its noun: "a list of card ids", not item 3), `form` (a pattern's example: "is not in the form
1002:7550"), `one_of` (a pattern's choices in order; `one_of()` declares both), `says` (a pattern's phrase with
{value}), `remedy`, `count` (a length bound's phrase with {n}, {lo}, {hi}, {what}, {value}). No textual, no torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, time
from typing import Any, TypeVar

import msgspec
from msgspec import inspect as mi

T = TypeVar("T")
Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Words:
    """The nouns of one file format, for the value a field expects and the value it got."""

    integer: str
    number: str
    string: str
    boolean: str
    date_time: str
    table: str
    array: str

    def given(self, value: object) -> str:
        """'a string 'abc'': the kind of value found, and the value (cut to 40 characters)."""
        kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", dict: self.table,
                 list: self.array, tuple: self.array, datetime: "a date-time", date: "a date", time: "a time"}
        return f"{kinds.get(type(value), type(value).__name__)} {show(value)}"


@dataclass
class Misfit(Exception):
    """Where a document does not fit its type and why. `kind`: "missing" (a required key), "unknown" (a key the
    type does not declare) or "value". `expected` is the declared noun at `path`; `detail` the explanation."""

    path: Path
    kind: str
    value: object = None
    expected: str = ""
    detail: str = ""
    remedy: str | None = None
    known: tuple[str, ...] = ()  # the keys the table at path[:-1] declares (for "missing" and "unknown")


def show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def one_of(options: Iterable[str]) -> msgspec.Meta:
    """A string that is one of `options` (declared as a pattern, so the field stays a plain `str` for mypy)."""
    options = tuple(options)
    return msgspec.Meta(pattern=r"\A(?:" + "|".join(map(re.escape, options)) + r")\Z", extra={"one_of": options})


def form(regex: str, example: str) -> msgspec.Meta:
    """A string of the whole form `regex` (anchored here: `$` would let a trailing newline through)."""
    return msgspec.Meta(pattern=rf"\A(?:{regex})\Z", extra={"form": example})


def fit(doc: object, type_: type[T], words: Words, *, closed: bool = False) -> T:
    """`doc` as `type_` (a dataclass or a msgspec Struct), or Misfit. `closed`: a key no table declares is a misfit
    too (an outer table's first). Date-times stay TOML's own (a string is never parsed into one)."""
    unknown = _first_unknown(doc, _info(type_), ()) if closed else None
    if unknown is not None:
        raise unknown
    try:
        return msgspec.convert(doc, type_, strict=True, builtin_types=(datetime,))
    except msgspec.ValidationError as e:
        raise _explain(doc, _info(type_), str(e), words) from None


_INFO: dict[object, mi.Type] = {}


def _info(type_: object) -> mi.Type:
    """msgspec's description of a declared type: ~1 ms to build, so once per type, not once per document."""
    if type_ not in _INFO:
        _INFO[type_] = mi.type_info(type_)
    return _INFO[type_]


def _first_unknown(node: object, t: mi.Type, path: Path) -> Misfit | None:
    if not isinstance(node, dict | list | tuple):
        return None  # a scalar holds no key
    t = _unwrap(t, node)[0]
    if isinstance(t, mi.DataclassType | mi.StructType) and isinstance(node, dict):
        declared = {f.encode_name: f.type for f in t.fields}
        unknown = next((k for k in node if k not in declared), None)
        if unknown is not None:
            return Misfit((*path, unknown), "unknown", node[unknown], known=tuple(declared))
        inner = (_first_unknown(v, declared[k], (*path, k)) for k, v in node.items())
    elif isinstance(t, mi.CollectionType) and isinstance(node, list | tuple):
        inner = (_first_unknown(v, t.item_type, (*path, i)) for i, v in enumerate(node))
    else:
        return None
    return next((m for m in inner if m is not None), None)


# --- finding the place msgspec names --------------------------------------------------------------------------
_SEGMENT = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+|\.\.\.)\]")


def _segments(message: str) -> tuple[str, list[str | int]]:
    """msgspec's message without its place, and the place as keys and indices ('...' for a map's value)."""
    text, sep, where = message.rpartition(" - at `")
    if not sep:
        return message, []
    return text, [int(i) if i.isdigit() else (name or i) for name, i in _SEGMENT.findall(where.rstrip("`"))]


def _unwrap(t: mi.Type, value: object) -> tuple[mi.Type, dict[str, Any]]:
    """The declared type under its metadata, and the member of `X | None` that a non-None value is held to."""
    extra: dict[str, Any] = {}
    while True:
        if isinstance(t, mi.Metadata):
            extra = {**(t.extra or {}), **extra}
            t = t.type
        elif isinstance(t, mi.UnionType):
            members = [m for m in t.types if not isinstance(m, mi.NoneType)]
            if value is None and len(members) < len(t.types):
                return mi.NoneType(), extra
            t = members[0]
        else:
            return t, extra


def _explain(doc: object, root: mi.Type, message: str, words: Words) -> Misfit:
    """Walk down to the place msgspec names; a table on the way that lacks a key is told first (the outer shape
    before what is inside: a file without [device] says so, not what its [profile] lacks)."""
    text, segments = _segments(message)
    node, (t, extra), path = doc, _unwrap(root, doc), tuple[str | int, ...]()
    for seg in [*segments, None]:
        if isinstance(t, mi.DataclassType | mi.StructType) and isinstance(node, dict):
            missing = next((f.encode_name for f in t.fields if f.required and f.encode_name not in node), None)
            if missing is not None:
                return Misfit((*path, missing), "missing", known=tuple(f.encode_name for f in t.fields))
        if seg is None or (extra.get("whole") and isinstance(t, mi.CollectionType | mi.DictType)):
            break  # the place; or a container that answers for its items ("a map of card -> whole number")
        tables = mi.DataclassType | mi.StructType
        field = next((f for f in t.fields if f.encode_name == seg), None) if isinstance(t, tables) else None
        if field is not None and isinstance(node, dict) and seg in node:
            node, t = node[seg], field.type
        elif isinstance(t, mi.CollectionType) and isinstance(node, list | tuple) and isinstance(seg, int) \
                and seg < len(node):
            node, t = node[seg], t.item_type
        else:
            break
        path = (*path, seg)
        t, extra = _unwrap(t, node)
    expected, detail = _value_problem(node, t, extra, words)
    return Misfit(path, "value", node, expected, detail or text[:1].lower() + text[1:], extra.get("remedy"))


def _value_problem(v: object, t: mi.Type, extra: dict[str, Any], words: Words) -> tuple[str, str | None]:
    """The declared noun, and what is wrong with `v` against `t` (None when this cannot tell: msgspec's text)."""
    noun = extra.get("what") or (f"one of {', '.join(extra['one_of'])}" if "one_of" in extra else _noun(t, words))
    wrong_kind = f"expected {noun}, got {words.given(v)}"
    if isinstance(t, mi.IntType):
        if isinstance(v, bool) or not isinstance(v, int):
            return noun, wrong_kind
        return noun, _bounds(v, t.ge, t.le, "{}")
    if isinstance(t, mi.FloatType):
        if isinstance(v, bool) or not isinstance(v, int | float):
            return noun, wrong_kind
        if isinstance(v, float) and not math.isfinite(v):
            return noun, f"expected a finite number, got {v}"
        return noun, _bounds(v, t.ge, t.le, "{:g}")
    if isinstance(t, mi.StrType):
        return noun, _str_problem(v, t, extra, wrong_kind)
    if isinstance(t, mi.DateTimeType):
        if not isinstance(v, datetime):
            return noun, wrong_kind
        return noun, ("the date-time needs a time zone (write it in UTC with a trailing Z)"
                      if t.tz and v.tzinfo is None else None)
    if isinstance(t, mi.CollectionType):
        if not isinstance(v, list | tuple):
            return noun, wrong_kind
        n = len(v)
        lo, hi = t.min_length or 0, t.max_length
        if n < lo or (hi is not None and n > hi):
            template = extra.get("count", "{n} items, expected {lo}..{hi}")
            return noun, template.format(n=n, lo=lo, hi=hi, value=show(v), what=noun)
        return noun, wrong_kind if extra.get("whole") else None
    if isinstance(t, mi.DataclassType | mi.StructType):
        return noun, wrong_kind if not isinstance(v, dict) else None
    if isinstance(t, mi.DictType):  # a map is explained as a whole (msgspec does not say which key)
        if not isinstance(v, dict) or extra.get("whole"):
            return noun, wrong_kind
        return noun, f"{show(v)} holds a value that is not {_noun(t.value_type, words)}"
    return noun, wrong_kind if isinstance(t, mi.BoolType) else None


def _str_problem(v: object, t: mi.StrType, extra: dict[str, Any], wrong_kind: str) -> str | None:
    if not isinstance(v, str):
        return wrong_kind
    if t.max_length is not None and len(v) > t.max_length:
        return f"string is {len(v)} characters long, the limit is {t.max_length}"
    if t.pattern is not None and not re.search(t.pattern, v):
        if "one_of" in extra:
            return f"expected one of {', '.join(extra['one_of'])}, got {show(v)}"
        if "form" in extra:
            return f"{show(v)} is not in the form {extra['form']}"
        if "says" in extra:
            return str(extra["says"]).format(value=show(v))
        return f"{show(v)} is not in the expected form"
    return None


def _bounds(v: int | float, lo: int | float | None, hi: int | float | None, fmt: str) -> str | None:
    if (lo is None or v >= lo) and (hi is None or v <= hi):
        return None
    return f"{show(v)} is outside {'-inf' if lo is None else fmt.format(lo)}..{'inf' if hi is None else fmt.format(hi)}"


def _noun(t: mi.Type, words: Words) -> str:
    nouns = {mi.BoolType: words.boolean, mi.IntType: words.integer, mi.FloatType: words.number,
             mi.StrType: words.string, mi.DateTimeType: words.date_time, mi.DataclassType: words.table,
             mi.StructType: words.table, mi.DictType: words.table, mi.ListType: words.array,
             mi.VarTupleType: words.array}
    return nouns.get(type(t), "something else")


__all__ = ["Misfit", "Words", "fit", "form", "one_of", "show"]
