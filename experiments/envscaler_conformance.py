"""The project's rewards for EnvScaler's probe tasks against EnvScaler's own runner.

Plays every probe of :mod:`envsched_jax.pool.envscaler_conformance` through EnvScaler's RL
environment, imported from a checkout of its repository and looped as its training manager loops
it, and through the project's episode runtime in each sandbox this machine has; prints, per probe,
EnvScaler's reward, the reward recorded beside the probe, the project's reward before the
``envscaler`` semantics and now in each sandbox, and whether every observation the policy sees
has EnvScaler's text. Results go to ``--out``.

Get a checkout with ``git clone https://github.com/RUC-NLPIR/EnvScaler`` (the probes were
recorded at commit 87e6673); only ``rl/roll/pipeline/agentic/env/envscaler_env`` is read, and
neither its data files nor its dependencies (``gem``, ``openai``) are needed.

Usage:
    python experiments/envscaler_conformance.py --checkout ../EnvScaler
    python experiments/envscaler_conformance.py --checkout ../EnvScaler --sandboxes inprocess bwrap
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import tyro

from envsched_jax.envs.sandbox import SANDBOX_KINDS, SandboxConfig, make_worker_pool, unavailable_reason
from envsched_jax.pool import envscaler_conformance as conf


@dataclasses.dataclass(frozen=True)
class Args:
    checkout: Path
    """A checkout of EnvScaler's repository."""
    sandboxes: tuple[str, ...] = SANDBOX_KINDS
    """Sandboxes to play the probes in (those this machine lacks are skipped, with the reason)."""
    out: Path = Path("runs/envscaler_conformance.json")


def main(args: Args) -> dict:
    rows = {p.name: {"rule": p.rule, "where": p.where, "recorded": p.envscaler,
                     "before": p.before} for p in conf.PROBES}
    with tempfile.TemporaryDirectory() as folder:
        for name, result in conf.envscaler_rewards(args.checkout, Path(folder) / "envscaler").items():
            rows[name].update(envscaler=result.reward,
                              envscaler_texts=[dict(o) for o in result.observations])
        skipped = {}
        for kind in args.sandboxes:
            reason = unavailable_reason(kind)
            if reason:
                skipped[kind] = reason
                continue
            with make_worker_pool(SandboxConfig(kind=kind, num_workers=1, trust="any")) as workers:
                pools = {mode: conf.probe_pool(Path(folder) / kind, mode=mode)
                         for mode in ("non_conversational", "conversational")}
                for probe in conf.PROBES:
                    traj = conf.project_trajectory(workers, pools[probe.mode], probe)
                    row = rows[probe.name]
                    shown = [s.get("message") for s in traj.steps()]
                    row[kind] = traj.reward
                    row[f"{kind}_texts_agree"] = conf.texts_agree(probe, row["envscaler_texts"],
                                                                  shown)
    kinds = [k for k in args.sandboxes if k not in skipped]
    agree = {k: sum(r[k] == r["envscaler"] for r in rows.values()) for k in kinds}
    report = {"checkout": str(args.checkout), "probes": rows, "skipped": skipped,
              "agree": agree, "recorded_agree": sum(r["recorded"] == r["envscaler"]
                                                    for r in rows.values()),
              "before_agree": sum(r["before"] == r["envscaler"] for r in rows.values())}
    print(f"{'probe':24s} {'EnvScaler':>9s} {'recorded':>8s} {'before':>7s} "
          + " ".join(f"{k:>10s}" for k in kinds) + "  texts")
    for name, r in rows.items():
        before = "refused" if r["before"] is None else f"{r['before']:.2f}"
        texts = "yes" if all(r[f"{k}_texts_agree"] for k in kinds) else "NO"
        print(f"{name:24s} {r['envscaler']:9.2f} {r['recorded']:8.2f} {before:>7s} "
              + " ".join(f"{r[k]:10.2f}" for k in kinds) + f"  {texts}")
    n = len(rows)
    print(f"agree with EnvScaler's runner: recorded {report['recorded_agree']}/{n}, before "
          f"{report['before_agree']}/{n}, " + ", ".join(f"{k} {v}/{n}" for k, v in agree.items()))
    for kind, reason in skipped.items():
        print(f"skipped {kind}: {reason}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main(tyro.cli(Args))
