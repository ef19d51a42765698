"""A small, safe, declarative predicate language over the effective configuration.

A predicate is a mapping with exactly one operator key:

* ``all: [p, ...]`` / ``any: [p, ...]`` / ``not: p`` — boolean structure;
* ``eq: {field: value, ...}``, ``ne: {...}`` — equality (several fields = all must hold);
* ``in: {field: [v1, v2]}`` — membership;
* ``gte`` / ``gt`` / ``lte`` / ``lt: {field: number}`` — numeric comparison (false when the field is None);
* ``version: "<0.23.0"`` — the vLLM version is in the range (false when the version is unparseable);
* ``has_arg: "--flag"`` — spec.extraArgs contains the flag (``--flag`` or ``--flag=value``);
* ``has_patch: "id"`` — spec.image.patches contains the id.

Fields are the effective-config names of ``effective.FIELDS`` or ``env.NAME`` (an engine environment
variable; None when not set). Predicates are compiled once into closures; nothing is ever eval'd.
Unknown operators or fields are errors when the rule file is loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gdn_operator.rules.effective import FIELDS
from gdn_operator.versions import VersionKey, VersionRange

#: A compiled predicate: (effective values, version key or None) -> bool
Compiled = Callable[[dict[str, Any], VersionKey | None], bool]

_NUMERIC: dict[str, Callable[[float, float], bool]] = {
    "gte": lambda a, b: a >= b,
    "gt": lambda a, b: a > b,
    "lte": lambda a, b: a <= b,
    "lt": lambda a, b: a < b,
}
OPERATORS = ("all", "any", "not", "eq", "ne", "in", "gte", "gt", "lte", "lt", "version", "has_arg", "has_patch")


class PredicateError(ValueError):
    pass


def _check_field(name: Any, where: str) -> str:
    if not isinstance(name, str):
        raise PredicateError(f"{where}: field name must be a string, got {name!r}")
    if name in FIELDS or (name.startswith("env.") and len(name) > 4):
        return name
    raise PredicateError(f"{where}: unknown field {name!r} (known: {', '.join(sorted(FIELDS))}, env.NAME)")


def _scalar(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise PredicateError(f"{where}: value must be a scalar (string, number, bool, null), got {type(value).__name__}")


def referenced_fields(pred: Any) -> set[str]:
    """Every effective value a (valid) predicate reads (`version` reads the parsed version too)."""
    out: set[str] = set()
    if not isinstance(pred, dict):
        return out
    for op, arg in pred.items():
        if op in ("all", "any"):
            for p in arg:
                out |= referenced_fields(p)
        elif op == "not":
            out |= referenced_fields(arg)
        elif op in ("eq", "ne", "in") or op in _NUMERIC:
            out |= set(arg)
        elif op == "version":
            out.add("vllm_version")
        elif op == "has_patch":
            out.add("patches")
        elif op == "has_arg":
            out.add("extra_args_flags")
    return out


def compile_predicate(pred: Any, where: str = "when") -> Compiled:
    """Validate and compile a predicate. Raises PredicateError naming the location of any problem."""
    if not isinstance(pred, dict) or len(pred) != 1:
        raise PredicateError(f"{where}: a predicate is a mapping with exactly one operator ({', '.join(OPERATORS)})")
    ((op, arg),) = pred.items()
    here = f"{where}.{op}"

    if op in ("all", "any"):
        if not isinstance(arg, list) or not arg:
            raise PredicateError(f"{here}: expects a non-empty list of predicates")
        subs = tuple(compile_predicate(p, f"{here}[{i}]") for i, p in enumerate(arg))
        return _all_of(subs) if op == "all" else _any_of(subs)

    if op == "not":
        sub = compile_predicate(arg, here)
        return lambda v, ver: not sub(v, ver)

    if op in ("eq", "ne"):
        if not isinstance(arg, dict) or not arg:
            raise PredicateError(f"{here}: expects a mapping of field: value")
        pairs = tuple((_check_field(f, here), _scalar(x, f"{here}.{f}")) for f, x in arg.items())
        if op == "eq":
            return _equals(*pairs[0]) if len(pairs) == 1 else _equals_all(pairs)
        return _none_of(tuple(_equals(f, x) for f, x in pairs))

    if op == "in":
        if not isinstance(arg, dict) or not arg:
            raise PredicateError(f"{here}: expects a mapping of field: [values]")
        sets = []
        for f, xs in arg.items():
            _check_field(f, here)
            if not isinstance(xs, list) or not xs:
                raise PredicateError(f"{here}.{f}: expects a non-empty list of values")
            sets.append((f, tuple(_scalar(x, f"{here}.{f}") for x in xs)))
        return _in_all(tuple(sets))

    if op in _NUMERIC:
        if not isinstance(arg, dict) or not arg:
            raise PredicateError(f"{here}: expects a mapping of field: number")
        cmp = _NUMERIC[op]
        nums = []
        for f, x in arg.items():
            _check_field(f, here)
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise PredicateError(f"{here}.{f}: expects a number, got {x!r}")
            nums.append((f, x))
        nums_t = tuple(nums)

        def numeric(v: dict[str, Any], ver: Any) -> bool:
            for f, x in nums_t:
                got = v.get(f)
                if isinstance(got, bool) or not isinstance(got, (int, float)) or not cmp(got, x):
                    return False
            return True

        return numeric

    if op == "version":
        if not isinstance(arg, str):
            raise PredicateError(f"{here}: expects a version range string such as '<0.23.0'")
        try:
            rng = VersionRange(arg)
        except ValueError as e:
            raise PredicateError(f"{here}: {e}") from None

        def version(v: dict[str, Any], ver: Any) -> bool:
            return ver is not None and rng.contains_key(ver)

        return version

    if op == "has_arg":
        if not isinstance(arg, str) or not arg.startswith("-"):
            raise PredicateError(f"{here}: expects a flag such as '--enable-foo'")
        return lambda v, ver: arg in v.get("extra_args_flags", ())

    if op == "has_patch":
        if not isinstance(arg, str) or not arg:
            raise PredicateError(f"{here}: expects a patch id")
        return lambda v, ver: arg in v.get("patches", ())

    raise PredicateError(f"{where}: unknown operator {op!r} (known: {', '.join(OPERATORS)})")


# The combinators are loops, not all()/any() over a generator: matching is admission's hot path (bench/bench_rules.py).


def _all_of(subs: tuple[Compiled, ...]) -> Compiled:
    def all_of(v: dict[str, Any], ver: Any) -> bool:
        for s in subs:  # noqa: SIM110
            if not s(v, ver):
                return False
        return True

    return all_of


def _any_of(subs: tuple[Compiled, ...]) -> Compiled:
    def any_of(v: dict[str, Any], ver: Any) -> bool:
        for s in subs:  # noqa: SIM110
            if s(v, ver):
                return True
        return False

    return any_of


def _none_of(subs: tuple[Compiled, ...]) -> Compiled:
    def none_of(v: dict[str, Any], ver: Any) -> bool:
        for s in subs:  # noqa: SIM110
            if s(v, ver):
                return False
        return True

    return none_of


def _in_all(sets: tuple[tuple[str, tuple[Any, ...]], ...]) -> Compiled:
    """Every field's value is one of its listed values."""

    def in_all(v: dict[str, Any], ver: Any) -> bool:
        for f, xs in sets:
            got = v.get(f)
            for x in xs:
                if _eq(got, x):
                    break
            else:
                return False
        return True

    return in_all


def _equals(f: str, x: Any) -> Compiled:
    """A compiled `field == x` that keeps true != 1 (bool is an int in Python)."""
    if x is None or isinstance(x, bool):
        return lambda v, ver: v.get(f) is x  # True/False/None are singletons
    if isinstance(x, str):
        return lambda v, ver: v.get(f) == x
    return lambda v, ver: _eq(v.get(f), x)


def _equals_all(pairs: tuple[tuple[str, Any], ...]) -> Compiled:
    """Every `field == x` of `pairs` (an `eq` of several fields) in one loop: the singletons by identity, then the
    strings, then the rest (as `_equals` compares each); the answer is `all_of` theirs, without a call per field."""
    same = tuple((f, x) for f, x in pairs if x is None or isinstance(x, bool))
    text = tuple((f, x) for f, x in pairs if isinstance(x, str))
    other = tuple((f, x) for f, x in pairs if not (x is None or isinstance(x, (bool, str))))

    def equals_all(v: dict[str, Any], ver: Any) -> bool:
        get = v.get
        for f, one in same:
            if get(f) is not one:
                return False
        for f, word in text:
            if get(f) != word:
                return False
        for f, x in other:  # noqa: SIM110
            if not _eq(get(f), x):
                return False
        return True

    return equals_all


def _eq(a: Any, b: Any) -> bool:
    # bool is an int in Python: keep true != 1 so `eq: {tensor_parallel_size: true}` cannot match by accident
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return bool(a == b)
