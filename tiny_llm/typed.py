"""Typed configs from plain mappings (torch-free): the one builder every settings section goes through.

A mapping becomes a dataclass by its fields' type hints. Every problem is collected as one line naming its
dotted key: an unknown key (with the closest name), a value that is not one of a ``Literal``'s choices, a
bool where a number is wanted, a non-finite number, an integer of 2**63 or more (nothing here counts that
far: a typo), an empty string. Numbers written as text (YAML 1.1 reads ``1e-3`` as a string) are read as
numbers. A value's range lives beside its field, as its ``metadata`` in JSON Schema's words (``minimum``,
``exclusiveMinimum``, ``maximum``, ``exclusiveMaximum``; for a list, each item's), and is checked here
before the value is converted; a ``__post_init__`` that raises ConfigError (a rule between fields) is one
more problem of its section. A dataclass made without this builder (from a command's flags) checks the same
bounds with ``out_of_bounds``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar, Union

from tiny_llm.errors import ConfigError

T = TypeVar("T")


def typed_from_dict(cls: type[T], data: Any, where: str) -> T:
    """``cls`` built from ``data``; one ConfigError line listing every problem, each named ``where.key``."""
    problems: list[str] = []
    built = build(cls, data, f"{where}." if where else "", problems)
    if problems:
        raise ConfigError("; ".join(problems))
    return built


def build(cls: type, data: Any, prefix: str, problems: list[str]) -> Any:
    """``cls`` from ``data``; or None, each problem added to ``problems`` (keys named ``prefix + name``)."""
    where = prefix.rstrip(".") or "(top level)"
    if not isinstance(data, dict):
        problems.append(f"{where}: expected a mapping, got {describe(data)}")
        return None
    before = len(problems)
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    names = {f.name for f in fields}
    for key in data:
        if key not in names:
            problems.append(f"{prefix}{key}: unknown key{did_you_mean(str(key), names)}")
    problems.extend(f"{prefix}{f.name}: required" for f in fields if f.name not in data and _required(f))
    by_name = {f.name: f for f in fields}
    kwargs = {}
    for name in (name for name in data if name in names):
        key, value = f"{prefix}{name}", data[name]
        outside = bound_problems(by_name[name], hints[name], value, key)
        problems.extend(outside)
        if not outside:
            kwargs[name] = convert(hints[name], value, key, problems)
    if len(problems) > before:
        return None
    try:
        return cls(**kwargs)
    except ConfigError as exc:  # the section's own value checks
        problems.append(f"{where}: {exc}")
        return None


POSITIVE = {"exclusiveMinimum": 0}
NON_NEGATIVE = {"minimum": 0}
FRACTION = {"minimum": 0, "maximum": 1}
"""[0, 1]."""
MOMENTUM = {"minimum": 0, "exclusiveMaximum": 1}
"""[0, 1): an Adam beta, a momentum."""
BOUNDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
"""The metadata keys of a field's range (JSON Schema's: a field and the workflow schema say the same)."""


def bounds(field: dataclasses.Field) -> dict[str, float]:
    """A field's range, as its metadata states it ({} for none)."""
    return {k: field.metadata[k] for k in BOUNDS if k in field.metadata}


def bound_problems(field: dataclasses.Field, hint: Any, value: Any, key: str) -> list[str]:
    """``key: must be <range>, got <value>`` for a number (or a number written as text; for a list, each
    item, named ``key[i]``) outside ``field``'s range; what is no number is left to the type check."""
    limits = bounds(field)
    if not limits:
        return []
    items = list(enumerate(value)) if isinstance(value, (list, tuple)) else [(None, value)]
    problems = []
    for i, item in items:
        number = number_from_text(item)
        if isinstance(number, float) and not math.isfinite(number):
            continue  # the type check's: not a finite number
        if isinstance(number, (int, float)) and not isinstance(number, bool) and not within(number, limits):
            where = key if i is None else f"{key}[{i}]"
            nullable = " or null" if i is None and _admits_none(hint) else ""
            problems.append(f"{where}: must be {range_text(limits)}{nullable}, got {show_number(number)}")
    return problems


def within(value: float, limits: dict[str, float]) -> bool:
    """Whether ``value`` lies in the range."""
    return (
        value >= limits.get("minimum", -math.inf)
        and ("exclusiveMinimum" not in limits or value > limits["exclusiveMinimum"])
        and value <= limits.get("maximum", math.inf)
        and ("exclusiveMaximum" not in limits or value < limits["exclusiveMaximum"])
    )


def range_text(limits: dict[str, float]) -> str:
    """A range as an error message says it: ``> 0``, ``>= 1``, ``at most 256``, ``in [0, 1)``."""
    low = next(((k, limits[k]) for k in ("minimum", "exclusiveMinimum") if k in limits), None)
    high = next(((k, limits[k]) for k in ("maximum", "exclusiveMaximum") if k in limits), None)
    if low and high:
        left, right = "[" if low[0] == "minimum" else "(", "]" if high[0] == "maximum" else ")"
        return f"in {left}{_bound_text(low[1])}, {_bound_text(high[1])}{right}"
    if low:
        return f"{'>=' if low[0] == 'minimum' else '>'} {_bound_text(low[1])}"
    assert high is not None
    return f"{'at most' if high[0] == 'maximum' else 'below'} {_bound_text(high[1])}"


def _bound_text(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def _admits_none(hint: Any) -> bool:
    return typing.get_origin(hint) in (Union, types.UnionType) and type(None) in typing.get_args(hint)


def out_of_bounds(instance: Any, name: Callable[[str], str] = str) -> list[str]:
    """The bound problems of a dataclass made without the builder (from a command's flags), each key named
    ``name(field)``; an integer too large for any setting too."""
    hints = typing.get_type_hints(type(instance))
    problems = []
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= MAX_INTEGER:
            problems.append(f"{name(field.name)}: must be below 2**63 in size, got {show_number(value)}")
        else:
            problems += bound_problems(field, hints[field.name], value, name(field.name))
    return problems


def show_number(value: float) -> str:
    """A number as an error message shows it: a huge integer by its size, not its thousands of digits."""
    if isinstance(value, int) and abs(value) >= 10**15:
        return f"an integer of {len(str(abs(value)))} digits"
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def _required(field: dataclasses.Field) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def convert(hint: Any, value: Any, key: str, problems: list[str]) -> Any:
    """``value`` as ``hint`` wants it; a mismatch adds one problem naming ``key``."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return _convert_union(typing.get_args(hint), value, key, problems)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices or isinstance(value, bool):
            problems.append(f"{key}: expected {expected(hint)}, got {describe(value)}")
        return value
    if origin in (list, tuple):
        return _convert_sequence(hint, value, key, problems)
    if origin is dict or hint is Any:
        if hint is not Any and not isinstance(value, dict):
            problems.append(f"{key}: expected a mapping, got {describe(value)}")
        return value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return build(hint, {} if value is None else value, f"{key}.", problems)
    return _convert_scalar(hint, value, key, problems)


def _convert_union(options: tuple[Any, ...], value: Any, key: str, problems: list[str]) -> Any:
    """The first option that takes ``value``; else the problems of the option of its shape (list or not)."""
    if value is None and type(None) in options:
        return None
    inner = [o for o in options if o is not type(None)]
    for option in inner[:-1]:
        trial: list[str] = []
        converted = convert(option, value, key, trial)
        if not trial:
            return converted
    if len(inner) > 1 and not isinstance(value, (list, dict)):
        scalars = [o for o in inner if typing.get_origin(o) not in (list, tuple, dict)]
        if all(_is_scalar(o) for o in scalars):
            trial = []
            converted = convert(inner[-1], value, key, trial)
            if trial:
                wanted = " or ".join(expected(o) for o in scalars)
                problems.append(f"{key}: expected {wanted}, got {describe(value)}")
            return converted
    shaped = [o for o in inner if (typing.get_origin(o) in (list, tuple)) == isinstance(value, list)]
    return convert((shaped or inner)[-1], value, key, problems)


def _is_scalar(hint: Any) -> bool:
    return hint in (bool, int, float, str) or typing.get_origin(hint) is Literal


def _convert_sequence(hint: Any, value: Any, key: str, problems: list[str]) -> Any:
    """A list (or tuple) of items of the hint's item type; ``tuple[a, b]`` wants exactly those items."""
    if not isinstance(value, (list, tuple)):
        problems.append(f"{key}: expected a list, got {describe(value)}")
        return value
    args = typing.get_args(hint)
    fixed = typing.get_origin(hint) is tuple and not (len(args) == 2 and args[1] is Ellipsis)
    if fixed and len(value) != len(args):
        problems.append(f"{key}: expected a list of {len(args)} items, got {describe(value)}")
        return value
    items = args if fixed else (args[0],) * len(value)
    converted = [convert(items[i], v, f"{key}[{i}]", problems) for i, v in enumerate(value)]
    return tuple(converted) if typing.get_origin(hint) is tuple else converted


def _convert_scalar(hint: Any, value: Any, key: str, problems: list[str]) -> Any:
    if hint in (int, float):
        value = number_from_text(value)
    if hint is int and isinstance(value, float) and value.is_integer() and math.isfinite(value):
        value = int(value)
    if hint is int and isinstance(value, int) and not isinstance(value, bool) and abs(value) >= MAX_INTEGER:
        problems.append(f"{key}: must be below 2**63 in size, got {show_number(value)}")
        return value
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, int) and abs(value) >= 10**300:  # beyond a float: float() would raise
            problems.append(f"{key}: expected a finite number, got {show_number(value)}")
            return value
        if not math.isfinite(value):
            problems.append(f"{key}: expected a finite number, got {value}")
        return float(value)
    fits = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: False,
        str: isinstance(value, str) and bool(value),
    }
    if hint not in fits:
        raise TypeError(f"unsupported config type {hint} for {key}")  # a bug, not user input
    if not fits[hint]:
        problems.append(f"{key}: expected {expected(hint)}, got {describe(value)}")
    return value


def expected(hint: Any) -> str:
    """What a scalar hint wants, as an error message says it."""
    if typing.get_origin(hint) is Literal:
        return f"one of {', '.join(map(str, typing.get_args(hint)))}"
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a non-empty string"}
    return words.get(hint, str(hint))


MAX_INTEGER = 2**63
"""No setting counts this far (an int64 would not hold it): a larger integer is a typo."""
# A number as a person writes it: YAML 1.1 (PyYAML) reads 1e-3 or 5E4 as strings, YAML 1.2 and people do not.
NUMBER_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def number_from_text(value: Any) -> Any:
    """``value`` as an int or float when it is a string that spells a number, else unchanged."""
    if not isinstance(value, str) or not NUMBER_TEXT.fullmatch(value.strip()):
        return value
    text = value.strip()
    if not text.lstrip("+-").isdigit():
        return float(text)
    if len(text) > (sys.get_int_max_str_digits() or len(text)):  # more digits than Python reads as an int
        return float(text)
    return int(text)


def describe(value: Any) -> str:
    """A value with its type, as an error message shows it (``str 'fast'``, ``null``)."""
    if value is None:
        return "null"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        return f"int, {show_number(value)}"
    text = repr(value)
    if len(text) > 80:  # one line a person reads, not a pasted page
        text = f"{text[:60]}... ({len(text)} characters)"
    return f"{type(value).__name__} {text}"


def did_you_mean(key: str, names: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest name, else `` (allowed: ...)``."""
    allowed = sorted(names)
    match = difflib.get_close_matches(key, allowed, n=1)
    return f" (did you mean '{match[0]}'?)" if match else f" (allowed: {', '.join(allowed)})"
