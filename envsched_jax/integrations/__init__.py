"""Adapters that make a scheduler the task sampler of other RL trainers.

:mod:`.core` holds what they share (:class:`~envsched_jax.integrations.core.SchedulerFeed`); each
trainer has its own module (``tunix``, ``trl``, ``verl``, ``verifiers``), imported only by a
caller that has that trainer installed (``pip install 'envsched_jax[<trainer>]'``). The core
package never imports a trainer.
"""

from envsched_jax.integrations.core import SchedulerFeed

__all__ = ["SchedulerFeed"]
