"""The optimizer: Adam with linear warm-up then cosine decay (EnvSched section 3.1).

The paper trains for 200 single-epoch steps with Adam, lr = 1e-6, a cosine schedule and 10
warm-up steps; :class:`OptimConfig`'s defaults are exactly that. With step s counted from 0 (the
optimizer's update count), lr_peak = ``learning_rate``, W = ``warmup_steps``, S =
``total_steps`` and lr_end = ``end_learning_rate``::

    lr(s) = lr_peak s / W                                                   0 <= s < W
    lr(s) = lr_end + (lr_peak - lr_end) (1 + cos(pi (s - W) / (S - W))) / 2   W <= s <= S
    lr(s) = lr_end                                                          s > S

CHOICEs (the paper names only "cosine schedule, 10 warmup steps"): the warm-up starts at 0, so
the first update (s = 0) does not move the parameters (as Hugging Face's and verl's
cosine-with-warm-up schedules do); the cosine decays to a floor of ``end_learning_rate`` = 0 at
step S and stays there; S counts the warm-up steps.
"""

from __future__ import annotations

import dataclasses
import math

import optax


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Optimizer and learning-rate schedule; defaults are the paper's."""

    learning_rate: float = 1e-6
    """Peak learning rate, reached at the end of the warm-up (the paper: 1e-6)."""
    warmup_steps: int = 10
    """W: steps of linear warm-up from 0 to the peak (the paper: 10)."""
    total_steps: int = 200
    """S: length of the whole schedule, warm-up included (the paper: 200 steps)."""
    end_learning_rate: float = 0.0
    """Floor the cosine decays to at step S and keeps afterwards (our choice: 0)."""
    b1: float = 0.9
    """Adam's first-moment decay (optax's default)."""
    b2: float = 0.999
    """Adam's second-moment decay (optax's default)."""
    eps: float = 1e-8
    """Adam's denominator epsilon (optax's default)."""
    grad_clip_norm: float | None = None
    """Clip the gradient to this global L2 norm before Adam; None: no clipping (the paper gives
    none)."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW, scaled by the scheduled learning rate, applied to every
    parameter); 0: plain Adam, as in the paper."""

    def __post_init__(self):
        if not (self.learning_rate > 0.0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"OptimConfig.learning_rate must be finite and > 0, got {self.learning_rate!r}")
        if self.warmup_steps < 0:
            raise ValueError(f"OptimConfig.warmup_steps must be >= 0, got {self.warmup_steps!r}")
        if self.total_steps <= self.warmup_steps:
            raise ValueError(f"OptimConfig.total_steps must exceed warmup_steps = {self.warmup_steps}, "
                             f"got {self.total_steps!r}")
        if not 0.0 <= self.end_learning_rate <= self.learning_rate:
            raise ValueError(f"OptimConfig.end_learning_rate must lie in [0, learning_rate = "
                             f"{self.learning_rate}], got {self.end_learning_rate!r}")
        for name in ("b1", "b2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"OptimConfig.{name} must lie in [0, 1), got {getattr(self, name)!r}")
        if not self.eps > 0.0:
            raise ValueError(f"OptimConfig.eps must be > 0, got {self.eps!r}")
        if self.grad_clip_norm is not None and not self.grad_clip_norm > 0.0:
            raise ValueError(f"OptimConfig.grad_clip_norm must be > 0 or None, got {self.grad_clip_norm!r}")
        if not (self.weight_decay >= 0.0 and math.isfinite(self.weight_decay)):
            raise ValueError(f"OptimConfig.weight_decay must be finite and >= 0, got {self.weight_decay!r}")


def make_schedule(config: OptimConfig) -> optax.Schedule:
    """The learning rate as a function of the update count (the module docstring's lr(s))."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=config.learning_rate, warmup_steps=config.warmup_steps,
        decay_steps=config.total_steps, end_value=config.end_learning_rate)


def make_optimizer(config: OptimConfig) -> optax.GradientTransformation:
    """Adam (AdamW when ``weight_decay > 0``) on :func:`make_schedule`, after global-norm
    gradient clipping when ``grad_clip_norm`` is set.

    Example::

        tx = make_optimizer(OptimConfig())
        opt_state = tx.init(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    """
    schedule = make_schedule(config)
    if config.weight_decay > 0.0:
        adam = optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps,
                           weight_decay=config.weight_decay)
    else:
        adam = optax.adam(schedule, b1=config.b1, b2=config.b2, eps=config.eps)
    if config.grad_clip_norm is None:
        return adam
    return optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), adam)
