"""Typed configs from plain mappings (torch-free): the one builder every settings section goes through.

A mapping becomes a dataclass by its fields' type hints. Every problem is collected as one line naming its
dotted key: an unknown key (with the closest name), a value that is not one of a ``Literal``'s choices, a
bool where a number is wanted, a non-finite number, an integer of 2**63 or more (nothing here counts that
far: a typo), an empty string. Numbers written as text (YAML 1.1 reads ``1e-3`` as a string) are read as
numbers. Value ranges stay with each config: an upper bound as the field's ``metadata={"maximum": N}``, and
a ``__post_init__`` that raises ConfigError is one more problem of its section.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import sys
import types
import typing
from collections.abc import Iterable
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
    maxima = {f.name: f.metadata["maximum"] for f in fields if "maximum" in f.metadata}
    kwargs = {}
    for name in (name for name in data if name in names):
        key, value = f"{prefix}{name}", data[name]
        if name in maxima and above(value, maxima[name]):
            problems.append(
                f"{key}: must be at most {maxima[name]:,}, got {show_number(number_from_text(value))}"
            )
        else:
            kwargs[name] = convert(hints[name], value, key, problems)
    if len(problems) > before:
        return None
    try:
        return cls(**kwargs)
    except ConfigError as exc:  # the section's own value checks
        problems.append(f"{where}: {exc}")
        return None


def above(value: Any, maximum: float) -> bool:
    """Whether ``value`` is a number (or a number written as text) greater than ``maximum``."""
    value = number_from_text(value)
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > maximum


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
