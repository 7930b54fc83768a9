"""Env-Rethink (seeds/002): preparing file environments (Collection Maps, Event Logs, file
verification) and evolving them into harder, still-verifiable variants.

Where each part of the paper lives:

- :mod:`.workspace`: E = (F, S), the request, rubric, reference outcome and per-file labels
  (section 2.1, appendix A.1); safe loading of raw directories; :mod:`.store`: pools on disk.
- :mod:`.generator`: a seeded, labelled workspace benchmark (appendix A.5).
- :mod:`.file_tools`, :mod:`.pool`: workspaces as a pool type (episodes with list / read /
  search / write / submit tools; rubric checks as verifiers).
- :mod:`.roles`, :mod:`.collection_map`, :mod:`.event_log`: reorganisation (section 4.1): the
  Collection Map, the evidence-reviewed Event Log, EGS and TGS, roles with heuristic and LLM
  backends; :func:`.event_log.prepare` is the entry point.
- :mod:`.verify`, :mod:`.learned_verifier`: file verification ("cleaning", section 4.1,
  appendix A.7, B.4, B.5): metrics, baselines, qualification checks, a learned verifier.
- :mod:`.teacher`: the paper's route to a learned verifier (sub-environments, teacher
  trajectories, A.7 qualification with revised hints, the masked SFT corpus; section 4.1,
  appendix B.1-B.3).
- :mod:`.evolve`: environment evolution (section 4.2, appendix C).
- :mod:`.agents`: offline heuristic task agents; :mod:`.llm_agent`: an LLM agent through the
  project's agent loop; :mod:`.paper`: the paper's reported figures.
"""
