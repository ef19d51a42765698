"""CPU time of the operator's own steps in a benchmark run: where a burst's operator CPU goes.

Not part of the operator. bench/bench_reconcile.py --timers OUT puts this directory first on the operator process's
PYTHONPATH (Python imports the first `sitecustomize` it finds at start-up) with GDN_OPTIMERS=OUT. It then wraps a
few functions of the operator's modules (the module attribute, which every caller looks up at call time) and adds up
each call's thread CPU time (time.thread_time: the calling thread's own CPU, not the time it waited for the GIL or
the API server). From the first reconcile on, it also takes the process's and the main thread's CPU (the main thread
runs kopf: watch streams, event processing, the handlers' async parts). At exit it writes OUT:

    process <CPU-s>            every thread, from the first reconcile to exit
    main_thread <CPU-s>        the event loop's thread, same window
    <step> <CPU-s> <calls>     per wrapped step, inclusive of the steps it calls

Without GDN_OPTIMERS it does nothing.
"""

from __future__ import annotations

import os

if os.environ.get("GDN_OPTIMERS"):
    import atexit
    import collections
    import functools
    import resource
    import threading
    import time
    from typing import Any

    _CPU: collections.Counter[str] = collections.Counter()
    _CALLS: collections.Counter[str] = collections.Counter()
    _START: dict[str, float] = {}
    _LOCK = threading.Lock()

    def _process_cpu() -> float:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    def _wrap(label: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def timed(*a: Any, **kw: Any) -> Any:
            if not _START:
                with _LOCK:
                    if not _START:
                        main = time.pthread_getcpuclockid(threading.main_thread().ident or 0)
                        _START.update(main=time.clock_gettime(main), process=_process_cpu())
            t = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                spent = time.thread_time() - t
                with _LOCK:
                    _CPU[label] += spent
                    _CALLS[label] += 1

        return timed

    def _install() -> None:
        from gdn_operator.handlers.core import kube, servers, statusguard
        from gdn_operator.handlers.server import reconcile, workload

        reconcile.reconcile_sync = _wrap("reconcile_sync", reconcile.reconcile_sync)
        reconcile.plan = _wrap("plan (reconcile)", reconcile.plan)
        workload.on_deployment = _wrap("on_deployment", workload.on_deployment)
        workload.expected_objects = _wrap("expected_objects (drift)", workload.expected_objects)
        kube.apply_changed = _wrap("apply_changed", kube.apply_changed)
        kube.emit_event = _wrap("emit_event", kube.emit_event)
        statusguard.update_status = _wrap("statusguard.update_status", statusguard.update_status)
        servers.Servers.get = _wrap("Servers.get", servers.Servers.get)
        servers.Servers.put = _wrap("Servers.put", servers.Servers.put)
        reconcile.HandledSpecs.build = _wrap("HandledSpecs.build (main thread)", reconcile.HandledSpecs.build)

    def _write() -> None:
        lines = [
            f"process {_process_cpu() - _START.get('process', 0.0):.3f}",
            f"main_thread {time.thread_time() - _START.get('main', 0.0):.3f}",  # atexit runs on the main thread
        ]
        lines += [f"{label} {cpu:.3f} {_CALLS[label]}" for label, cpu in _CPU.most_common()]
        with open(os.environ["GDN_OPTIMERS"], "w") as f:
            f.write("\n".join(lines) + "\n")

    _install()
    atexit.register(_write)
