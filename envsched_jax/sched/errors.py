"""The errors schedulers raise. Every one of them means: nothing was changed."""

from __future__ import annotations


class SchedulerInputError(ValueError):
    """A call to a scheduler had invalid arguments; nothing was changed."""


class CheckpointError(SchedulerInputError):
    """A snapshot or checkpoint does not fit the scheduler it is loaded into (header, config,
    graph or arrays); the message names the file, the field or array and the value, and the
    scheduler is left exactly as it was."""


class SchedulingError(RuntimeError):
    """The eligibility rules leave too few nodes to fill the batch; nothing was changed."""


class InfeasibleBatchError(SchedulingError, ValueError):
    """The requested batch size is larger than the caps can always fill on this pool; raised by
    the constructor, so also a ``ValueError`` like any other invalid setting."""
