"""Typed frozen dataclasses from nested dicts (TOML's layout), and back to flat keys: `build` checks
every value against its field's annotation (converting only what loses nothing: an int where a float
is wanted) and names the key and what it accepts when one is wrong; `apply_overrides` sets
`a.b=value` overrides (values parsed as TOML); `flatten` gives dotted keys (MLflow params). Generic:
`rhymerl.config.run` builds `RunConfig` with them.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from typing import Any, Literal, get_args, get_origin

from rhymerl.errors import ConfigError


def check(cond: bool, key: str, msg: str) -> None:
    """Raise ConfigError naming `key` with `msg` unless `cond`."""
    if not cond:
        raise ConfigError(f"config key '{key}': {msg}", key=key)


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`, converting only lossless cases (int -> float)."""
    origin = get_origin(tp)
    if origin in (types.UnionType, typing.Union):  # e.g. str | tuple[str, ...]: the first that fits
        for option_tp in get_args(tp):
            try:
                return _coerce(value, option_tp, key)
            except ConfigError:
                continue
        check(False, key, f"got {value!r}; expected {' or '.join(_describe(a) for a in get_args(tp))}")
    if origin is Literal:
        allowed = get_args(tp)
        check(value in allowed, key, f"got {value!r}; allowed values: {', '.join(map(repr, allowed))}")
        return value
    if origin is tuple and len(get_args(tp)) == 2 and get_args(tp)[1] is Ellipsis:  # tuple[X, ...]
        check(isinstance(value, (list, tuple)), key, f"expected a list, got {value!r}")
        return tuple(_coerce(v, get_args(tp)[0], f"{key}[{i}]") for i, v in enumerate(value))
    if origin is tuple:
        args = get_args(tp)
        check(isinstance(value, (list, tuple)) and len(value) == len(args), key,
              f"expected a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, key) for v, a in zip(value, args))
    if tp is float:
        check(isinstance(value, (int, float)) and not isinstance(value, bool), key,
              f"expected a number, got {value!r}")
        return float(value)
    if tp is int:
        check(isinstance(value, int) and not isinstance(value, bool), key,
              f"expected an integer, got {value!r}")
        return value
    if tp is bool:
        check(isinstance(value, bool), key, f"expected true or false, got {value!r}")
        return value
    if tp is str:
        check(isinstance(value, str), key, f"expected a string, got {value!r}")
        return value
    raise ConfigError(f"config key '{key}': unsupported type {tp}", key=key)


def _describe(tp: Any) -> str:
    if get_origin(tp) is tuple:
        return f"a list ({_describe(get_args(tp)[0])} each)"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(tp, str(tp))


def build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """An instance of dataclass `cls` from `data` (nested dicts for nested dataclasses), every value
    checked against its annotation; unknown keys are errors naming the allowed ones."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"unknown config key '{full}'; allowed keys here: {', '.join(names)}", key=full)
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            check(isinstance(value, dict), full, "expected a table of settings")
            kwargs[key] = build(tp, value, f"{full}.")
        else:
            kwargs[key] = _coerce(value, tp, full)
    return cls(**kwargs)


def _parse_scalar(text: str) -> Any:
    """Parse an override value the way TOML would (numbers, booleans, lists), else a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `a.b=value` override set (values parsed as TOML)."""
    out = _deep_copy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        dotted, text = item.split("=", 1)
        parts = dotted.strip().split(".")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: '{p}' is not a table of settings")
        node[parts[-1]] = _parse_scalar(text.strip())
    return out


def _deep_copy(d: dict[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in d.items()}


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts into dotted keys (MLflow params)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
