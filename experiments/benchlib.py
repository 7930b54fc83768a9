"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import multiprocessing as mp


def run_in_child(target, *args):
    """Run ``target(*args, queue)`` in a fresh (spawned) process and return what it puts on the
    queue, so that each measurement has its own peak memory and no warm caches."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result
