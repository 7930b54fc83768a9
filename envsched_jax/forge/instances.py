"""Random selection problems, for the MILP benchmark and for trying the selector without a pool.

Seeds get pass rates k/15 (15 rollouts each, as the paper's case V), 0-2 required and 0-3
optional skills from a taxonomy of ``num_skills`` skills arranged in chains (``deeper``: the next
skill of the chain) with two neighbours each, and prompt lengths uniform in [1,000, 10,000]
tokens, so a few candidates exceed the 8,192-token limit. Nothing here is tuned: the draws are
uniform and seeded.
"""

from __future__ import annotations

import numpy as np

from envsched_jax.forge.candidates import SeedSpec, SkillGraph


def skill_taxonomy(num_skills: int = 24, chain_length: int = 4) -> tuple[list[str], SkillGraph]:
    names = [f"skill{i:03d}" for i in range(num_skills)]
    deeper = {names[i]: (names[i + 1],) for i in range(num_skills - 1) if (i + 1) % chain_length}
    neighbours = {k: (names[(i + chain_length) % num_skills], names[(i + 2 * chain_length + 1) % num_skills])
                  for i, k in enumerate(names)}
    return names, SkillGraph(deeper=deeper, neighbours=neighbours)


def random_seeds(num_seeds: int, seed: int = 0, num_skills: int = 24) -> tuple[list[SeedSpec], SkillGraph]:
    rng = np.random.default_rng(seed)
    names, graph = skill_taxonomy(num_skills)
    seeds = []
    for i in range(num_seeds):
        order = rng.permutation(num_skills)
        r, o = int(rng.integers(0, 3)), int(rng.integers(0, 4))
        seeds.append(SeedSpec(f"seed{i:05d}", int(rng.integers(0, 16)) / 15,
                              tuple(names[j] for j in order[:r]), tuple(names[j] for j in order[r:r + o]),
                              prompt_tokens=tuple(int(t) for t in rng.integers(1_000, 10_001, 6))))
    return seeds, graph
