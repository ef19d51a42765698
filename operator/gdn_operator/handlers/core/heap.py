"""The heap of a long-lived process of the operator (the operator's own, and its webhook front's:
front.py), settled once start-up is done."""

from __future__ import annotations

import gc
import logging

from gdn_operator.rules import load_rules

log = logging.getLogger(__name__)

#: gc.set_threshold: Python's young generations (700, 10) and a full collection after 100 middle ones instead of 10,
#: so the full collections, which walk everything the process holds (the servers' bodies), come ~10x less often;
#: the young ones stay short
GC_THRESHOLDS = (700, 10, 100)


def settle_heap() -> int:
    """Move what start-up made (modules, the rule file and its compiled predicates, pydantic's and kopf's own
    structures; called by __main__ before kopf runs) out of the cyclic garbage collector's generations (gc.freeze),
    and make full collections rarer (GC_THRESHOLDS): what start-up made lives as long as the process, yet
    every full collection walked it again. A full collection holds the GIL, so the webhook's answers wait for it:
    under paced creates (bench/bench_admission.py) they came every 3-4 s and took 35-320 ms, the admission latency's
    tail; GC_THRESHOLDS makes them rarer. Reference counting still frees frozen objects; only cycles among them are
    left to the process's end. What the rarer full collections cost: the garbage they defer (kopf's views of past
    events, a cycle each) stays in the heap longer, ~30 MiB of RSS at 1,000 servers against the interpreter's
    thresholds, for 0 full collections in 1,000 creates instead of 8 of 0.35-0.4 s (bench/bench_heap.py).
    Returns how many objects were frozen."""
    load_rules()  # loaded once per process: frozen with the rest, not found by a collection under load
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    n = gc.get_freeze_count()
    log.info("start-up heap settled: %d objects left out of garbage collection", n)
    return n
