"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_lib


def run_in_child(target, *args):
    """Run ``target(*args, queue)`` in a fresh (spawned) process and return what it puts on the
    queue, so that each measurement has its own peak memory and no warm caches. A child that dies
    before reporting raises instead of leaving the parent waiting forever."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, results))
    proc.start()
    while True:
        try:
            result = results.get(timeout=1.0)
            break
        except queue_lib.Empty:
            if not proc.is_alive():
                raise RuntimeError(f"{target.__name__}{args[:2]} failed in its child process (exit code "
                                   f"{proc.exitcode}; its traceback is above)") from None
    proc.join()
    return result
