"""The package's data files (YAML that changes with vLLM releases): one parser, one way to read them once.

* :func:`load_yaml` parses with libyaml's safe loader when PyYAML was built with it (the 44 kB vLLM option
  table: 9 ms instead of 66 ms), else with the pure-Python safe loader. Same documents, same errors
  (``yaml.YAMLError``).
* :func:`once` memoises a loader so that concurrent first calls compute it once. ``functools.lru_cache``
  lets every thread that misses compute: in the operator's first burst after start its API workers each
  parsed the same option table (64 x 66 ms of CPU, as much as the rest of its work for 200 new servers;
  ``bench/bench_reconcile.py --py-spy``).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Hashable
from typing import IO, Any, Generic, ParamSpec, TypeVar

import yaml

P = ParamSpec("P")
R = TypeVar("R")

_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(source: str | bytes | IO[str] | IO[bytes]) -> Any:
    """One YAML document, parsed by a safe loader (libyaml's when available)."""
    return yaml.load(source, Loader=_LOADER)  # noqa: S506  (a safe loader: CSafeLoader or SafeLoader)


class _Once(Generic[P, R]):
    def __init__(self, fn: Callable[P, R]) -> None:
        self._fn = fn
        self._values: dict[Hashable, R] = {}
        self._lock = threading.RLock()
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        key: Hashable = (args, tuple(sorted(kwargs.items())))
        try:
            return self._values[key]
        except KeyError:
            pass
        with self._lock:  # the first caller computes; the others wait for its value
            if key not in self._values:
                self._values[key] = self._fn(*args, **kwargs)
            return self._values[key]

    def cache_clear(self) -> None:
        with self._lock:
            self._values.clear()


def once(fn: Callable[P, R]) -> _Once[P, R]:
    """Memoise ``fn`` per arguments (hashable), computing each value once even when threads ask at once.
    An exception is not cached: the next call tries again."""
    return _Once(fn)
