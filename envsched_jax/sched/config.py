"""EnvSched configuration: every hyper-parameter of the paper's appendix D, with its default.

Only shapes and structural choices are compile-time constants of the jitted kernels
(:meth:`EnvSchedConfig.static`: B, K, B_cov = floor(rho B), K_within, K_cross, the history
capacity, the dtype, the relations used, the infeasible-pick policy, the cold start). Every other
hyper-parameter (the float ones: lambda_g, lambda_s, the half-lives, eta, c0, lambda_sim, the ridge
penalty; the caps; the calibration weights) travels as traced values in an :class:`EnvSchedHyper`
pytree (:meth:`EnvSchedConfig.hyper`), as optax passes a learning rate: changing one does not
recompile, and a sweep over them is a ``vmap``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax.numpy as jnp
from flax import struct


@dataclasses.dataclass(frozen=True)
class EnvSchedConfig:
    """Typed EnvSched settings (tyro turns the field docstrings into ``--help``)."""

    batch_size: int = 64
    """B: environment-task pairs per step."""
    group_size: int = 8
    """K: rollouts per selected pair (rewards arrive as [B, K])."""
    rho: float = 0.5
    """Coverage fraction: B_cov = floor(rho B) coverage picks, the rest exploitation."""
    k_within: int = 6
    """K_within: within-environment neighbours (by S_full)."""
    k_cross: int = 12
    """K_cross: cross-environment neighbours (by S_abs)."""
    lambda_g: float = 2.0
    """Shrinkage of each relation estimate toward the global reference (eq. 3)."""
    lambda_s: float = 2.0
    """Shrinkage of the node history toward the graph prior (eq. 4)."""
    h_long: float = 8.0
    """Long half-life in steps."""
    h_short: float = 2.0
    """Short half-life in steps."""
    eta: float = 0.5
    """Recent-decline coefficient."""
    c0: float = 16.0
    """Exposure-count scale of omega = (1 + c / c0)^(-1/2)."""
    lambda_sim: float = 0.08
    """Batch similarity penalty (eq. 5)."""
    cap_step: int = 4
    """C1: most pairs of one environment in one batch."""
    cap_window: int = 11
    """C3: most selections of one environment over the current and two previous steps."""
    cap_consecutive: int = 2
    """Ctask: a pair is not picked in more than this many consecutive steps."""
    step_capacity: int = 128
    """S: steps of history kept (every observation and step mean of steps t - S .. t - 1; older
    ones would weigh <= 2^-16 at h_long = 8). The history costs O(S B) memory and time."""
    ridge_lambda: float = 1.0
    """Ridge penalty of the progress filter (the paper gives none; our choice)."""
    progress_min_transitions: int = 3
    """Scorable transitions a node needs before the progress filter may exclude it."""
    progress_fit: Literal["earlier_steps", "in_sample"] = "earlier_steps"
    """How the progress filter scores a transition: 'earlier_steps' (the paper, appendix C: by a
    ridge fit on the transitions of strictly earlier steps only, one fit per step of the history
    window) or 'in_sample' (one fit on every transition before t, residuals in-sample; this
    project's rule before 2026-12-04)."""
    infeasible: Literal["error", "relax"] = "error"
    """When caps leave no eligible node: raise ('error') or relax filters/caps in a fixed,
    logged order ('relax')."""
    cold_start: Literal["static", "random"] = "static"
    """Step 0's batch: the paper's cold start from static structure, or B distinct non-excluded
    tasks drawn at random from the scheduler's seed (Table 4's initialisation-robustness runs)."""
    relations: Literal["both", "within", "cross"] = "both"
    """Graph relations used: both (the paper's P = 0.5 G_in + 0.5 G_cross), or only one (Table 3
    ablations: P = G_in or G_cross, and the progress filter's neighbour reference uses only that
    relation's neighbours)."""
    dtype: Literal["float32", "float64"] = "float32"
    """Floating-point type of the estimation kernels (float64 needs jax_enable_x64)."""
    calibration: tuple[int, int] = (13, 7)
    """Weights of eq. 12's calibration, 0.65 pr(vhat) + 0.35 pr(f), as integers a : b (13 : 7 =
    0.65 : 0.35). Integers keep the rank combination exact, so mathematically equal arguments tie
    (package docstring); a sweep over the split uses other integer pairs. a + b <= 1000."""

    def __post_init__(self):
        positive = ("batch_size", "group_size", "step_capacity", "cap_step",
                    "cap_window", "cap_consecutive")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"EnvSchedConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("k_within", "k_cross", "progress_min_transitions"):
            if getattr(self, name) < 0:
                raise ValueError(f"EnvSchedConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.rho <= 1.0:
            raise ValueError(f"EnvSchedConfig.rho must lie in [0, 1], got {self.rho}")
        for name in ("lambda_g", "lambda_s", "h_long", "h_short", "c0"):
            if getattr(self, name) <= 0:
                raise ValueError(f"EnvSchedConfig.{name} must be > 0, got {getattr(self, name)}")
        for name in ("eta", "lambda_sim", "ridge_lambda"):
            if getattr(self, name) < 0:
                raise ValueError(f"EnvSchedConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.infeasible not in ("error", "relax"):
            raise ValueError(f"EnvSchedConfig.infeasible must be 'error' or 'relax', got {self.infeasible!r}")
        if self.cold_start not in ("static", "random"):
            raise ValueError(f"EnvSchedConfig.cold_start must be 'static' or 'random', got {self.cold_start!r}")
        if self.relations not in ("both", "within", "cross"):
            raise ValueError(f"EnvSchedConfig.relations must be 'both', 'within' or 'cross', got {self.relations!r}")
        if self.progress_fit not in ("earlier_steps", "in_sample"):
            raise ValueError(f"EnvSchedConfig.progress_fit must be 'earlier_steps' or 'in_sample', "
                             f"got {self.progress_fit!r}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"EnvSchedConfig.dtype must be 'float32' or 'float64', got {self.dtype!r}")
        cal = self.calibration
        if (not isinstance(cal, (tuple, list)) or len(cal) != 2
                or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 0 for w in cal)
                or not 1 <= sum(cal) <= 1000):
            raise ValueError(f"EnvSchedConfig.calibration must be two ints a, b >= 0 with 1 <= a + b <= 1000, "
                             f"got {cal!r}")
        object.__setattr__(self, "calibration", (int(cal[0]), int(cal[1])))

    @property
    def num_coverage(self) -> int:
        return int(self.rho * self.batch_size)

    def static(self) -> StaticConfig:
        """The compile-time part (module docstring): what the jitted kernels are specialised on."""
        return StaticConfig(**{f: getattr(self, f) for f in STATIC_FIELDS}, num_coverage=self.num_coverage)

    def hyper(self) -> EnvSchedHyper:
        """The traced part (module docstring), as arrays of the kernels' dtype (ints as int32)."""
        dtype = jnp.dtype(self.dtype)
        return EnvSchedHyper(**{f: jnp.asarray(getattr(self, f), dtype) for f in FLOAT_HYPER_FIELDS},
                             **{f: jnp.asarray(getattr(self, f), jnp.int32) for f in INT_HYPER_FIELDS},
                             calibration=jnp.asarray(self.calibration, jnp.int32))


FLOAT_HYPER_FIELDS = ("lambda_g", "lambda_s", "h_long", "h_short", "eta", "c0", "lambda_sim", "ridge_lambda")
INT_HYPER_FIELDS = ("cap_step", "cap_window", "cap_consecutive", "progress_min_transitions")
STATIC_FIELDS = ("batch_size", "group_size", "k_within", "k_cross", "step_capacity", "infeasible", "cold_start",
                 "relations", "dtype", "progress_fit")


@struct.dataclass
class EnvSchedHyper:
    """The traced hyper-parameters: scalars (``calibration``: [2] int32). A leading axis on every
    leaf makes a batch of settings for ``vmap``."""

    lambda_g: Any
    lambda_s: Any
    h_long: Any
    h_short: Any
    eta: Any
    c0: Any
    lambda_sim: Any
    ridge_lambda: Any
    cap_step: Any
    cap_window: Any
    cap_consecutive: Any
    progress_min_transitions: Any
    calibration: Any


@dataclasses.dataclass(frozen=True)
class StaticConfig:
    """The compile-time part of :class:`EnvSchedConfig` (hashable: a ``jax.jit`` static argument)."""

    batch_size: int
    group_size: int
    k_within: int
    k_cross: int
    step_capacity: int
    infeasible: str
    cold_start: str
    relations: str
    dtype: str
    progress_fit: str
    num_coverage: int


class KernelConfig:
    """What the kernels read as ``config``: the static fields as Python values and the hyper-
    parameters as (traced) arrays, under the names of :class:`EnvSchedConfig`."""

    __slots__ = ("_static", "_hyper")

    def __init__(self, static: StaticConfig, hyper: EnvSchedHyper):
        self._static, self._hyper = static, hyper

    def __getattr__(self, name: str) -> Any:
        if name in FLOAT_HYPER_FIELDS or name in INT_HYPER_FIELDS or name == "calibration":
            return getattr(self._hyper, name)
        return getattr(self._static, name)
