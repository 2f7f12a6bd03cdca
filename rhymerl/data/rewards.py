"""Reward functions as plug-ins: `reward.functions` and `reward.weights` resolved to a `RewardSet`.

A spec names one function:

* ``"gsm8k"``, ``"math"``: a built-in (`rhymerl.data.reward_builtins`), reading the gold answer
  from the row's answer column.
* ``"path/to/file.py:name"``: `name` in a Python file (a spec whose part before the last ``:``
  ends in ``.py`` or holds a ``/``). A relative path is taken from `base_dir`.
* ``"pkg.module:name"``: `name` in an importable module.

The plug-in convention. A function is called as ``name(prompt, completion, row)``: the rendered
prompt text, the completion text, and the prompt's dataset row (a dict of every column). It
returns either a real number (the reward; it says nothing about correctness) or a pair
``(value, correct)`` with `correct` a bool or None (None: this function does not judge answers).
A bool alone is refused: it would be unclear whether it means a reward or correctness.

`RewardSet.score` gives the weighted sum of the values, each function's value by its name (the
part after ``:``, or the built-in's name), and `correct`: None when no function judged the
answer, else True only if every function that judged it said True.

Every loading error is found by `load_reward_set`, before anything runs, as a `ConfigError`
naming the key (``reward.functions[i]``, ``reward.weights``) and the fix. A function that
raises, or returns a non-finite or ill-typed value, while scoring raises `RewardFunctionError`
naming the function, the prompt id and the cause.

Processes: a `RewardSet` is plain data (specs, and the source text of each file read at load)
and pickles into any process (Ray workers); each process resolves a function on first use and
keeps it. A file plug-in runs from the text read at load, so every worker runs the code that
was checked even if the file changes or is absent on the worker's machine; a module plug-in
must be importable there.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import math
import numbers
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

from rhymerl.data.reward_builtins import BUILTINS
from rhymerl.errors import ConfigError

Kind = Literal["builtin", "module", "file"]


class RewardFunctionError(RuntimeError):
    """A reward function failed while scoring; the message names it, the prompt id and the cause."""


@dataclass(frozen=True)
class RewardScore:
    """The score of one completion."""

    total: float  # the weighted sum of `values`
    values: Mapping[str, float]  # each function's value, by function name, in spec order
    correct: bool | None  # None unless some function judged correctness; then all() of those that did


@dataclass(frozen=True)
class RewardFunction:
    """One entry of `reward.functions`, as plain data that rebuilds the callable in any process."""

    spec: str  # as written in the config
    name: str  # its key in `RewardScore.values`
    kind: Kind
    target: str  # the built-in's name, the module's name, or the file's absolute path
    attr: str = ""  # the function's name in the module or file ("" for a built-in)
    source: str = ""  # the file's text, read at load (kind "file")

    def resolve(self, answer_key: str) -> Callable[..., Any]:
        """The callable, built once per process (a file's module is executed from `source`)."""
        key = (self.kind, self.target, self.attr, _digest(self.source), answer_key)
        if key not in _RESOLVED:
            if self.kind == "builtin":
                _RESOLVED[key] = BUILTINS[self.target](answer_key)
            elif self.kind == "module":
                _RESOLVED[key] = getattr(importlib.import_module(self.target), self.attr)
            else:
                _RESOLVED[key] = getattr(_file_module(self.target, self.source), self.attr)
        return _RESOLVED[key]


_RESOLVED: dict[tuple[str, ...], Callable[..., Any]] = {}  # per process: see RewardFunction.resolve


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _file_module(path: str, source: str) -> types.ModuleType:
    """Execute a plug-in file's text as a module registered under a name unique to path and text."""
    name = f"rhymerl_reward_plugin_{_digest(path + chr(0) + source)}"
    if name not in sys.modules:
        module = types.ModuleType(name)
        module.__file__ = path
        # Registered before running, as an import does: dataclasses and pickling look it up.
        sys.modules[name] = module
        try:
            exec(compile(source, path, "exec"), module.__dict__)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


@dataclass(frozen=True)
class RewardSet:
    """Resolved reward functions and their weights; `score` one completion at a time."""

    functions: tuple[RewardFunction, ...]
    weights: tuple[float, ...]
    answer_key: str = "answer"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.functions)

    @property
    def uses_answer_column(self) -> bool:
        """Whether a built-in reads `answer_key` (so the dataset must have that column)."""
        return any(f.kind == "builtin" for f in self.functions)

    def check(self, prompt: str, row: Mapping[str, Any], prompt_id: str = "?") -> None:
        """Score an empty completion of one row before the run starts: a function that fails on it
        (or a built-in whose gold answer does not read) is a ConfigError then, not a crash mid-run."""
        try:
            self.score(prompt, "", row, prompt_id)
        except RewardFunctionError as exc:
            raise ConfigError(f"reward.functions: {exc}; a reward function must score any completion, "
                              "even an empty one") from exc

    def score(self, prompt: str, completion: str, row: Mapping[str, Any], prompt_id: str = "?") -> RewardScore:
        """Weighted sum, each value by name, and correctness (rules in the module docstring)."""
        values: dict[str, float] = {}
        verdicts: list[bool] = []
        for fn in self.functions:
            try:
                call = fn.resolve(self.answer_key)
            except Exception as exc:
                raise RewardFunctionError(f"reward function {fn.name!r} ({fn.spec}) cannot be loaded in this "
                                          f"process: {type(exc).__name__}: {exc}; a module plug-in must be "
                                          "importable wherever rewards are scored") from exc
            try:
                out = call(prompt, completion, row)
            except Exception as exc:
                raise RewardFunctionError(
                    f"reward function {fn.name!r} ({fn.spec}) raised on prompt {prompt_id}: "
                    f"{type(exc).__name__}: {exc}") from exc
            value, correct = _coerce(out, fn, prompt_id)
            values[fn.name] = value
            if correct is not None:
                verdicts.append(correct)
        total = sum(w * values[f.name] for f, w in zip(self.functions, self.weights))
        return RewardScore(total=float(total), values=values, correct=all(verdicts) if verdicts else None)


def _coerce(out: Any, fn: RewardFunction, prompt_id: str) -> tuple[float, bool | None]:
    """(value, correct) from a plug-in's return value, or RewardFunctionError saying what is wrong."""
    where = f"reward function {fn.name!r} ({fn.spec}) on prompt {prompt_id}"
    value, correct = out if isinstance(out, tuple) and len(out) == 2 else (out, None)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RewardFunctionError(f"{where} returned {out!r}; return a number or a (number, correct) pair")
    if correct is not None and not isinstance(correct, bool):
        raise RewardFunctionError(f"{where} returned correct={correct!r}; it must be True, False or None")
    if not math.isfinite(value):
        raise RewardFunctionError(f"{where} returned the non-finite value {value!r}; return a finite number")
    return float(value), correct


# ---------------------------------------------------------------- loading


def load_reward_set(functions: Sequence[str], weights: Sequence[float] | None = None,
                    answer_key: str = "answer", base_dir: str | Path | None = None) -> RewardSet:
    """Resolve and check every spec and weight now (see the module docstring); ConfigError on the first problem.

    `weights` None or empty means 1.0 each. Relative file paths are taken from `base_dir`
    (default: the current directory).
    """
    if isinstance(functions, str) or not functions:
        raise ConfigError(f"reward.functions must be a non-empty list of specs, got {functions!r}; e.g. "
                          "[\"math\"] or [\"rewards.py:my_reward\"] (built-ins: " + ", ".join(BUILTINS) + ")")
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    loaded: list[RewardFunction] = []
    for i, spec in enumerate(functions):
        fn = _load_one(f"reward.functions[{i}]", spec, base)
        _check_callable(f"reward.functions[{i}]", fn, fn.resolve(answer_key))
        clash = [j for j, other in enumerate(loaded) if other.name == fn.name]
        if clash:
            raise ConfigError(f"reward.functions[{i}] = {spec!r}: its name {fn.name!r} is already used by "
                              f"reward.functions[{clash[0]}]; rename one function (names key the logged values)")
        loaded.append(fn)
    return RewardSet(tuple(loaded), _check_weights(weights, len(loaded)), answer_key)


def _load_one(key: str, spec: Any, base: Path) -> RewardFunction:
    """The RewardFunction a spec names, its module imported or file executed; ConfigError naming `key`."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"{key} = {spec!r} is not a spec; write a built-in name or 'FILE.py:NAME' or 'MODULE:NAME'")
    target, sep, attr = spec.rpartition(":")
    if not sep:
        if spec in BUILTINS:
            return RewardFunction(spec=spec, name=spec, kind="builtin", target=spec)
        hint = " and a ':NAME' after it" if spec.endswith(".py") or "." in spec or "/" in spec else ""
        raise ConfigError(f"{key} = {spec!r} is not a built-in reward function (built-ins: "
                          f"{', '.join(BUILTINS)}); name one{hint}, or write 'FILE.py:NAME' or 'MODULE:NAME'")
    if not attr.isidentifier() or not target:
        raise ConfigError(f"{key} = {spec!r}: write 'FILE.py:NAME' or 'MODULE:NAME' with NAME a Python name")
    if target.endswith(".py") or "/" in target:
        path = (base / target).resolve()
        if not path.is_file():
            raise ConfigError(f"{key} = {spec!r}: file {path} does not exist; fix the path "
                              f"(a relative path is taken from {base})")
        fn = RewardFunction(spec=spec, name=attr, kind="file", target=str(path), attr=attr,
                            source=path.read_text())
        where = f"file {path}"
    else:
        fn = RewardFunction(spec=spec, name=attr, kind="module", target=target, attr=attr)
        where = f"module {target!r}"
    try:
        module = _file_module(fn.target, fn.source) if fn.kind == "file" else importlib.import_module(target)
    except (Exception, SystemExit) as exc:
        raise ConfigError(f"{key} = {spec!r}: importing {where} failed with {type(exc).__name__}: {exc}; "
                          "fix the code (or the module's name) so it imports") from exc
    if not hasattr(module, attr):
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ConfigError(f"{key} = {spec!r}: {where} has no {attr!r}; its callables are: "
                          f"{', '.join(names) or '(none)'}")
    return fn


def _check_callable(key: str, fn: RewardFunction, obj: Any) -> None:
    """ConfigError unless `obj` is callable as obj(prompt, completion, row)."""
    if not callable(obj):
        raise ConfigError(f"{key} = {fn.spec!r} is not callable (type {type(obj).__name__}); name a function "
                          "taking (prompt, completion, row)")
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return  # some builtins publish no signature: they are tried at the first score
    try:
        signature.bind("prompt", "completion", {})
    except TypeError as exc:
        raise ConfigError(f"{key} = {fn.spec!r} cannot be called as {fn.name}(prompt, completion, row) "
                          f"(signature {fn.name}{signature}: {exc}); give it those three positional "
                          "parameters") from exc


def _check_weights(weights: Sequence[float] | None, n: int) -> tuple[float, ...]:
    """The weights as floats (1.0 each when none are given); ConfigError naming reward.weights."""
    if weights is None or (not isinstance(weights, str) and len(weights) == 0):
        return (1.0,) * n
    if isinstance(weights, str) or not isinstance(weights, Sequence):
        raise ConfigError(f"reward.weights = {weights!r} is not a list; write one number per function, e.g. [1.0, 0.5]")
    if len(weights) != n:
        raise ConfigError(f"reward.weights = {weights!r} has {len(weights)} entries but reward.functions has {n}; "
                          "give one weight per function, or none for 1.0 each")
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w):
            raise ConfigError(f"reward.weights[{i}] = {w!r} is not a finite number; write e.g. 1.0 or 0.5")
    return tuple(float(w) for w in weights)
