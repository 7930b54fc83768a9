"""The materialisation prompts of Envs-FORGE (seeds/001 appendix C) and the bundle reply format.

Every prompt is two chat messages: a **system message** holding the executable-environment
contract every recipe shares (appendix C.1: synchronized instruction, fixtures, oracle, tests,
environment and helper files in one valid bundle; stated verifier expectations; pinned runtime;
valid build context; a reward of 0 or 1 even when tests fail) and the reply format, and a **user
message** that differs by recipe:

- fixed recipes (``few_shot``, ``self_instruct``, ``evol_instruct``, ``evol_instruct_depth``,
  ``evol_instruct_breadth``): one template, :func:`baseline_prompt`, in which only the injected
  ``Strategy:`` and ``Evolution direction:`` lines change (appendix C.1). The direction is the
  one of the action the recipe's mask allowed (``evol_instruct`` alternates it seed by seed,
  :func:`~envsched_jax.forge.actions.recipe_mask`), so no policy-relative number reaches a
  baseline;
- ``forge``: the solver-conditioned prompt, :func:`forge_prompt` (appendix C.2), which states,
  in this order, the optimised action, the seed's pass-rate estimate (value, source, rollouts),
  the reward band, the six candidates' projections and frontier scores, the target difficulty,
  the edit mask, the skill subgraph and the consistency contract, and only then the seed files.

The pinned runtime is this project's: the local base image ``envsched-forge-base``, no RUN or
ADD, no network, the host's bash / coreutils / python3 as toolchain. :func:`system_prompt`
states exactly the rules that :func:`envsched_jax.forge.verify.check_safety` enforces, rendered
from :class:`~envsched_jax.forge.verify.VerifyConfig`, so a model that follows the prompt can
pass the check and a limit changed there changes here.

**Reply format** (our design; the paper says only that a repair returns "a complete JSON
object"). The model returns the whole bundle as one JSON object::

    {"files": [{"path": "instruction.md", "content": "...", "executable": false,
                "encoding": "utf-8"}, ...],
     "requirements": [{"id": "R1", "text": "..."}, ...]}

``files`` lists every file of the new Harbor bundle (a file left out does not exist);
``executable`` (default false) and ``encoding`` (``utf-8``, the default, or ``base64`` for
binary content) are optional. ``requirements`` is optional: when present it replaces
``[metadata.forge] requirements`` of the returned ``task.toml``, which is where gold verification's
synchronization check reads the declared requirements; a model thus never has to write TOML
arrays of tables. :func:`parse_bundle_reply` validates every field and path and returns a
Harbor-layout :class:`~envsched_jax.forge.bundle.TaskBundle`; :func:`bundle_to_reply` is its
inverse.

**Repairs** (appendix C.1: a repair keeps the recipe's policy, corrects parsing, build,
static-validation or oracle failures and returns a complete JSON object): :func:`repair_messages`
keeps the first two messages, adds the previous reply as the assistant's turn and a user message
(:func:`repair_prompt`) that names the failed check, quotes its reason and a bounded tail of each
relevant log, restates the policy (the strategy and direction lines, or the solver's decision)
and asks for the complete bundle again. Only the latest reply is kept, so a repair prompt does
not grow with the number of repairs.

**Prompt length** (appendix A.2: a constant of each candidate fixed before solving):
:func:`candidate_prompt_sizes` renders the prompt each of a seed's six candidates would get and
measures it (:class:`PromptSize`: characters, and tokens estimated at
:data:`CHARS_PER_TOKEN` characters each unless a tokenizer's counter is given), which is what
:attr:`~envsched_jax.forge.candidates.SeedSpec.prompt_tokens` needs (:func:`candidate_prompt_tokens`).

CHOICES where the paper is silent (each stated where it is made): the reward bands
(:func:`reward_band`), the artifact-to-path mapping of the edit mask (:data:`ARTIFACT_PATHS`),
the seed files shown task-defining files first, fixtures last, within a character budget that keeps
every built-in seed's C.2 prompt under 8192 tokens (longer files cut with a marker, files beyond
the budget listed by name, binary files as base64: :func:`render_seed_files`), the token estimate
(:data:`CHARS_PER_TOKEN`), and the parser's size limits (:class:`ReplyLimits`).
"""

from __future__ import annotations

import base64
import binascii
import copy
import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from envsched_jax.forge.actions import (ACTIONS, ARTIFACTS, RECIPES, FrontierConfig, action, edit_mask,
                                        frontier_band, frontier_score, projected_pass_rate, recipe_mask)
from envsched_jax.forge.bundle import HARBOR_REWARD_FILE, BundleError, BundleFile, TaskBundle, convert
from envsched_jax.forge.candidates import ForgeConfig, SeedSpec, SkillGraph, candidate_skills
from envsched_jax.forge.verify import VerifyConfig, declared_requirements

PROMPT_VERSION = "forge-appendix-c/1"
CHARS_PER_TOKEN = 2.75
"""Characters per token of :func:`estimate_tokens`. Measured: SmolLM2-135M's tokenizer gives
2.76-3.19 characters per token on the C.2 prompts of four built-in seeds (instruction prose, TOML,
JSON fixtures, bash and Python), well below the 4 of the English-prose rule of thumb. The low end
is taken so that the estimate rarely undercounts, since an undercount would let an over-long
prompt through ``ForgeConfig.max_prompt_tokens``; tokenizers with larger vocabularies pack more
characters per token, for which the estimate errs high. Pass a tokenizer's counter for an exact
count."""

Message = dict[str, str]
Messages = tuple[Message, ...]

ARTIFACT_PATHS: dict[str, str] = {
    "instruction": "instruction.md",
    "data": "the fixtures under environment/ other than the Dockerfile (the input files the agent works on)",
    "solution": "solution/ (the oracle: solve.sh and any file it uses)",
    "tests": "tests/test.sh and the checks it runs",
    "environment": "environment/Dockerfile (base image, working directory, copied paths, environment variables)",
    "helpers": "support files that are not entry points (a checker module or expected-output file under "
               "tests/, a helper script of the oracle or of the workspace)",
}
"""Where each artifact of an edit mask (:data:`~envsched_jax.forge.actions.ARTIFACTS`) lives in a
Harbor bundle. Our mapping: the paper names the artifacts, not their files."""

_BASELINE_STRATEGIES: dict[str, str] = {
    "few_shot": "few_shot - treat the seed as a worked example and write a new task of the same kind that "
                "stays structurally close to it: the same sort of workspace and the same shape of "
                "requirements and checks, with new concrete data, names and values.",
    "self_instruct": "self_instruct - write a new task from the same domain as the seed: a different goal that "
                     "a user of this domain could plausibly ask for, reusing the seed's setting but not its "
                     "exact requirements.",
    "evol_instruct": "evol_instruct - evolve the seed into a more complex task: more constraints, more steps "
                     "or harder edge cases, so that a correct solution needs more careful work than the seed's.",
}
_BASELINE_STRATEGIES["evol_instruct_depth"] = _BASELINE_STRATEGIES["evol_instruct"]
_BASELINE_STRATEGIES["evol_instruct_breadth"] = _BASELINE_STRATEGIES["evol_instruct"]

_DIRECTIONS: dict[str, str] = {
    "in_depth": "in_depth - stay on the seed's own skill chain: harder or different variants of the same "
                "operations (stricter formats, more cases, more rules); bring in no new kind of skill.",
    "in_breadth": "in_breadth - reach into a neighbouring skill: add or swap in a requirement that needs a "
                  "related but different skill (another format, tool or kind of check), keeping the seed's "
                  "core skill.",
}

_PROJECTIONS: dict[str, str] = {
    "increase_complexity": "the seed is too easy for the current policy: make it harder (more requirements, "
                           "stricter constraints, trickier data) so that the policy passes it less often.",
    "reduce_complexity": "the seed is too hard for the current policy: turn it into a bridge task that keeps "
                         "its core reasoning and removes what masks it (infrastructure, optional requirements, "
                         "sheer volume), so that the policy passes it some of the time.",
    "diversify_frontier": "the seed is already near the policy's learning frontier: vary its requirements and "
                          "data while keeping its difficulty and its skill family.",
}

_REPAIR_GUIDANCE: dict[str, str] = {
    "parse": "Your reply could not be read as the bundle JSON object. Return exactly one JSON object in the "
             "reply format of the system message (no prose around it), with every field valid.",
    "schema": "The files do not form a valid Harbor bundle (a required file is missing or task.toml is not "
              "valid). Keep the layout and the task.toml fields of the system message.",
    "safety": "The bundle breaks a runtime rule of the system message. Remove the offending line and solve the "
              "task with bash, coreutils and the python3 standard library only, inside /app and /tmp; the "
              "Dockerfile may only use FROM envsched-forge-base, WORKDIR, COPY, ENV, LABEL and CMD.",
    "length": "The bundle is over a size limit. Make the fixtures smaller and the instruction shorter while "
              "keeping every requirement.",
    "overlap": "The bundle is too close to the seed or to a bundle made earlier. Write a new instruction in your "
               "own words and new fixture data and values, and update the oracle and tests to match.",
    "sync": "The artifacts are out of sync. Every requirement you declare must be stated in instruction.md (its "
            "text, verbatim) and checked in the tests (its id appears there); a requirement you removed must "
            "disappear from the oracle and the tests; declare the requirements in the reply's \"requirements\" "
            "field.",
    "build": "The Docker build of environment/ failed. Every COPY source must exist under environment/ (paths "
             "relative to it), and the Dockerfile may only use FROM envsched-forge-base, WORKDIR, COPY, ENV, "
             "LABEL and CMD.",
    "oracle": "The oracle solution did not earn reward 1 under the tests. Run through solution/solve.sh against "
              "the fixtures and tests/ by hand: make the oracle produce exactly what the tests expect (or fix a "
              "test that expects something the instruction does not ask for), and make tests/test.sh write 1 to "
              f"{HARBOR_REWARD_FILE} when every check passes.",
    "untouched": "The tests already give reward 1 on the untouched workspace, before any solution ran, so they do "
                 "not test the task. Make the tests check the outputs the task asks for, which the untouched "
                 "workspace does not contain.",
}
REPAIR_KINDS = tuple(_REPAIR_GUIDANCE)
"""Failure kinds with their own repair guidance: ``parse`` and every check of gold verification."""
_GENERIC_GUIDANCE = "Correct the cause quoted above and keep every other part of the bundle consistent with it."

_LOGS_BY_KIND: dict[str, tuple[str, ...]] = {
    "oracle": ("oracle", "oracle_tests"),
    "untouched": ("untouched_tests",),
}


class PromptError(ValueError):
    """A request the prompts cannot be rendered for; the message names the field and value."""


class BundleReplyError(ValueError):
    """A model reply that is not a valid bundle. ``kind`` is ``parse`` (not the JSON object of the
    reply format: syntax, a field, a path, an encoding, a size) or ``schema`` (valid JSON whose
    files do not form a Harbor bundle); the message names the field or path."""

    def __init__(self, kind: Literal["parse", "schema"], message: str):
        super().__init__(message)
        self.kind = kind


@dataclasses.dataclass(frozen=True)
class ReplyLimits:
    """What :func:`parse_bundle_reply` accepts (our limits, inside :class:`VerifyConfig`'s)."""

    max_reply_chars: int = 8 * 2**20
    max_files: int = 200
    max_file_bytes: int = 2**20
    max_total_bytes: int = 4 * 2**20
    max_path_chars: int = 200
    max_requirements: int = 50

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
                raise ValueError(f"ReplyLimits.{f.name} must be a positive int, got {value!r}")


@dataclasses.dataclass(frozen=True)
class PromptConfig:
    """Everything that shapes a prompt.

    Attributes:
      forge: the selection's constants; its priors and frontier give the six projections, frontier
        scores and reward bands of the C.2 prompt, so pass the ``ForgeConfig`` the MILP used.
      verify: the gold verification's limits and allowed base images, stated in the contract.
      limits: the reply parser's limits, stated in the contract.
      max_file_chars: characters of one seed file shown; longer files are cut with a marker.
      max_seed_chars: characters of the seed files' section (markers included); files beyond it are
        listed, not shown. With the defaults a C.2 prompt of any built-in seed stays within
        ``ForgeConfig.max_prompt_tokens`` (8192) by the estimate of :func:`estimate_tokens`.
      max_log_chars: characters of each log tail a repair prompt quotes.
      max_previous_reply_chars: characters of the previous reply kept in a repair conversation.
    """

    forge: ForgeConfig = ForgeConfig()
    verify: VerifyConfig = VerifyConfig()
    limits: ReplyLimits = ReplyLimits()
    max_file_chars: int = 3_000
    max_seed_chars: int = 12_000
    max_log_chars: int = 2_000
    max_previous_reply_chars: int = 64_000

    def __post_init__(self):
        for name in ("max_file_chars", "max_seed_chars", "max_log_chars", "max_previous_reply_chars"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
                raise ValueError(f"PromptConfig.{name} must be a positive int, got {value!r}")


# ---------------------------------------------------------------------------------------------
# The shared contract (appendix C.1) and the reply format


def system_prompt(config: PromptConfig = PromptConfig()) -> str:
    """The system message of every recipe: the executable-environment contract and reply format."""
    vc, lim = config.verify, config.limits
    bases = " or ".join(f"`FROM {image}`" for image in vc.allowed_base_images)
    max_files = min(vc.max_files, lim.max_files)
    max_total = min(vc.max_total_bytes, lim.max_total_bytes)
    return "\n\n".join([
        "You write executable training environments for terminal agents trained with reinforcement "
        "learning. An environment is a task bundle: a task that a shell agent solves inside a container, "
        "and a verifier that grades the agent's work with reward 0 or 1. Every bundle you return is built "
        "and run by an automatic gold check before it is used; a bundle that fails comes back to you with "
        "the reason.",

        "BUNDLE LAYOUT (Harbor). Paths are relative to the bundle root; these are the only top-level "
        "entries allowed:\n"
        "- task.toml: metadata. `version = \"1.0\"`; a [metadata] table with author_name, difficulty "
        "(\"easy\", \"medium\" or \"hard\"), category, tags (a list of strings) and skills = {required = "
        "[...], optional = [...]} naming the skills the task exercises; [verifier] timeout_sec and [agent] "
        "timeout_sec (positive numbers of seconds).\n"
        "- instruction.md: what the agent is asked to do, complete and self-contained: every requirement "
        "the tests check, with the exact paths, formats and values.\n"
        "- environment/Dockerfile and its build context environment/: the container the agent works in. "
        "Fixtures (the input files) live under environment/ (e.g. environment/app/) and are copied into "
        "the image.\n"
        "- solution/solve.sh: the oracle, a bash script that solves the task in a fresh container, working "
        "directory /app. It never sees the tests.\n"
        "- tests/test.sh: the verifier entry, with any helper files beside it under tests/ (mounted at "
        "/tests).",

        "PINNED RUNTIME (enforced; a bundle that breaks a rule is rejected):\n"
        f"1. The Dockerfile has exactly one FROM, and it is {bases}: a local image, nothing is pulled. After "
        "it only WORKDIR, COPY, ENV, LABEL and CMD are allowed. RUN and ADD are refused: a build has no "
        "network and the base image has no package manager. COPY sources are paths inside environment/ "
        "(relative, no '..', no absolute path, no --from), and every source must exist.\n"
        "2. The only toolchain is bash, coreutils and python3 with its standard library (the host's /usr, "
        "mounted read-only). Nothing can be installed and there is no network.\n"
        "3. Nowhere in solution/ or tests/, not even in a comment: curl, wget, ssh, scp, rsync, ftp, telnet, "
        "netcat or `nc -`, pip install, apt install, npm install, git clone, import socket, urllib.request, "
        "http.client, import requests, /dev/tcp/, or any http:// or https:// address.\n"
        "4. Nowhere in solution/ or tests/: host paths (/home/, /root/, /mnt/, /media/, /srv/, /boot/, "
        "/proc/1/, /sys/fs/cgroup, the Docker socket). Work in /app and /tmp.\n"
        "5. No secrets in any file (private keys, access tokens).\n"
        f"6. Limits: instruction.md at most {vc.max_instruction_chars} characters; at most {max_files} files "
        f"and {max_total} bytes in all; one file at most {lim.max_file_bytes} bytes.",

        "HOW THE GOLD CHECK RUNS A BUNDLE:\n"
        "1. It builds environment/ into an image.\n"
        "2. It runs `bash /solution/solve.sh` in a container of that image, in /app, with only /solution "
        "mounted.\n"
        "3. It runs `bash /tests/test.sh` in a second container that starts from the files the oracle left, "
        f"with /tests (read-only) and /logs mounted. {HARBOR_REWARD_FILE} must then contain exactly 1.\n"
        "4. It runs the tests the same way on the untouched image: they must not give reward 1 there.\n"
        "It also rejects a copy: a bundle whose workspace and tests are identical to those of the seed or of "
        "an earlier bundle, or whose tests are theirs behind a near copy of their instruction.",

        "VERIFIER EXPECTATIONS:\n"
        f"- tests/test.sh always writes 0 or 1 to {HARBOR_REWARD_FILE}, even when a check fails or crashes: "
        "create /logs/verifier, write 0 first, overwrite it with 1 only when every check passes, and exit 0.\n"
        "- The tests check exactly what instruction.md states, with the values it states, and nothing else; "
        "the expected values live under tests/, never in the workspace.\n"
        "- The tests are deterministic and finish within seconds.",

        "SYNCHRONIZATION: instruction, fixtures, oracle, tests, environment and helper files describe one "
        "task. Every requirement stated in the instruction is implemented by the oracle and checked by the "
        "tests; nothing is checked that the instruction does not state; file names, formats and values agree "
        "everywhere; the bundle is complete and runs as it is.",

        "REQUIREMENTS: declare each checkable requirement as {\"id\", \"text\"}: a short unique id (letters, "
        "digits, '.', '_', ':' or '-', e.g. \"R1\" or \"csv.quoting\") that appears in the tests where the "
        "requirement is checked, and a text that appears verbatim in instruction.md.",

        "REPLY FORMAT: the complete new bundle as one JSON object and nothing else:\n"
        "{\"files\": [{\"path\": \"instruction.md\", \"content\": \"...\"}, {\"path\": \"tests/test.sh\", "
        "\"content\": \"#!/bin/bash\\n...\", \"executable\": true}, ...], "
        "\"requirements\": [{\"id\": \"R1\", \"text\": \"...\"}]}\n"
        "- files: every file of the bundle, each with its complete content; a file you leave out does not "
        "exist. task.toml, instruction.md, environment/Dockerfile, solution/solve.sh and tests/test.sh are "
        "required.\n"
        f"- path: relative to the bundle root, '/'-separated, at most {lim.max_path_chars} characters, no "
        "'..', no leading '/', under one of the top-level entries above; each path once.\n"
        "- content: the whole file as text. For a binary file set \"encoding\": \"base64\" and give the "
        "base64 of its bytes.\n"
        "- executable: optional, false by default; true for scripts.\n"
        "- requirements: optional; when given it replaces the requirements declared in task.toml "
        f"([metadata.forge] requirements). At most {lim.max_requirements}.",
    ])


# ---------------------------------------------------------------------------------------------
# Seed files


def _harbor_seed(seed: TaskBundle) -> TaskBundle:
    try:
        return seed if seed.layout == "harbor" else convert(seed, "harbor")
    except BundleError as err:
        raise PromptError(f"seed {seed.name!r} cannot be shown in the Harbor layout: {err}") from None


def _cut(text: str, limit: int, what: str) -> str:
    if len(text) <= limit:
        return text
    return (text[:limit] + f"\n[... {what}: {len(text) - limit} more characters not shown; write complete "
            "new content for this file ...]")


_SHOW_FIRST = ("instruction.md", "task.toml", "environment/Dockerfile", "solution/", "tests/")
_END_FILE = "<<<END FILE>>>"
_MIN_SHOWN = 200
"""Fewest characters of a file worth showing; a file with less room left is only listed."""
_CUT_RESERVE = 160
"""Room kept for the marker of a cut file."""
_MAX_LISTED = 30
"""Files not shown that are listed by name; the rest are counted."""


def _show_order(path: str) -> tuple[int, str]:
    """Instruction, metadata, Dockerfile, oracle, tests, then the fixtures: the files that define
    the task come before the data, which a rewrite regenerates anyway and which a cut costs least."""
    rank = next((k for k, head in enumerate(_SHOW_FIRST) if path == head or (head.endswith("/") and
                                                                              path.startswith(head))),
                len(_SHOW_FIRST))
    return rank, path


def render_seed_files(seed: TaskBundle, config: PromptConfig = PromptConfig()) -> str:
    """The seed's files between ``<<<FILE path (...)>>>`` / ``<<<END FILE>>>`` markers, in the
    order of :func:`_show_order`, within ``max_seed_chars`` characters (markers included).

    A file longer than ``max_file_chars``, or than the room left, is cut with a marker; a binary
    (non-UTF-8) file is shown as base64; a file for which fewer than :data:`_MIN_SHOWN` characters
    are left is not shown, and such files are listed by path and size at the end (at most
    :data:`_MAX_LISTED` of them by name)."""
    bundle = _harbor_seed(seed)
    blocks, hidden, used = [], [], 0
    for path in sorted(bundle.files, key=_show_order):
        entry = bundle.files[path]
        flags = ["executable"] if entry.executable else []
        try:
            text = entry.data.decode("utf-8")
        except UnicodeDecodeError:
            text = base64.b64encode(entry.data).decode("ascii")
            flags.append("binary, shown as base64")
        head = f"<<<FILE {path} ({', '.join(flags + [f'{len(entry.data)} bytes'])})>>>"
        room = config.max_seed_chars - used - len(head) - len(_END_FILE) - 4
        if len(text) <= min(config.max_file_chars, room):
            body = text
        elif min(config.max_file_chars, room - _CUT_RESERVE) >= _MIN_SHOWN:
            body = _cut(text, min(config.max_file_chars, room - _CUT_RESERVE), f"{path} is cut here")
        else:
            hidden.append(f"{path} ({len(entry.data)} bytes)")
            continue
        blocks.append(f"{head}\n{body}\n{_END_FILE}")
        used += len(blocks[-1]) + 2
    if hidden:
        more = len(hidden) - _MAX_LISTED
        blocks.append("Not shown (the prompt's room for seed files is used up): " + "; ".join(hidden[:_MAX_LISTED])
                      + (f"; and {more} more files" if more > 0 else "") + ".")
    return "\n\n".join(blocks)


# ---------------------------------------------------------------------------------------------
# C.1: the fixed recipes


def _check_recipe(recipe: str) -> None:
    if recipe not in RECIPES:
        raise PromptError(f"recipe must be one of {list(RECIPES)}, got {recipe!r}")


def _seed_and_reply(seed: TaskBundle, config: PromptConfig) -> list[str]:
    """The closing sections every first prompt shares: the seed's files, then what to reply."""
    return ["## Seed bundle", render_seed_files(seed, config), "",
            "## Reply", "Return the complete new bundle as one JSON object in the reply format of the system message."]


def baseline_prompt(seed: TaskBundle, recipe: str, direction: str, config: PromptConfig = PromptConfig()) -> str:
    """The user message of a fixed recipe (appendix C.1). Two recipes' messages for one seed differ
    only in the ``Strategy:`` and ``Evolution direction:`` lines."""
    _check_recipe(recipe)
    if recipe == "forge":
        raise PromptError("recipe 'forge' gets the solver-conditioned prompt (forge_prompt), not the baseline one")
    if direction not in _DIRECTIONS:
        raise PromptError(f"direction must be one of {sorted(_DIRECTIONS)}, got {direction!r}")
    return "\n".join([
        "# Synthesise one executable terminal-task environment from the seed below",
        "",
        "## Policy",
        f"Strategy: {_BASELINE_STRATEGIES[recipe]}",
        f"Evolution direction: {_DIRECTIONS[direction]}",
        "",
        "## Contract",
        "Follow the bundle layout, pinned runtime, verifier expectations and synchronization rules of the "
        "system message. Rewrite the instruction, fixtures, oracle, tests and environment together so that "
        "they describe one new task; declare its requirements.",
        "",
        *_seed_and_reply(seed, config),
    ])


# ---------------------------------------------------------------------------------------------
# C.2: the solver-conditioned prompt


Band = Literal["overmatched", "frontier", "saturated"]


def reward_band(p: float, frontier: FrontierConfig = FrontierConfig()) -> Band:
    """Which side of the learning frontier a pass rate lies on: the band of
    :func:`~envsched_jax.forge.actions.frontier_band` (0.2 to 0.8 at the defaults) is ``frontier``;
    below it the seed is ``overmatched``, above it ``saturated``."""
    low, high = frontier_band(frontier)
    return "overmatched" if p < low else "saturated" if p > high else "frontier"


def _band_edges(frontier: FrontierConfig) -> str:
    low, high = frontier_band(frontier)
    return (f"overmatched below {low:.2f} (the policy rarely solves it), frontier from "
            f"{low:.2f} to {high:.2f}, saturated above {high:.2f} "
            "(the policy nearly always solves it)")


def _number(decision: Mapping[str, Any], key: str, where: str) -> float:
    value = decision.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise PromptError(f"{where}: decision[{key!r}] must be a number in [0, 1], got {value!r}")
    return float(value)


def _skill_names(decision: Mapping[str, Any], key: str, where: str) -> list[str]:
    names = decision.get("skill_names") or {}
    if not isinstance(names, Mapping):
        raise PromptError(f"{where}: decision['skill_names'] must map skill indices to names, got {names!r}")
    indices = decision.get(key, [])
    if isinstance(indices, (str, bytes)) or not isinstance(indices, Sequence):
        raise PromptError(f"{where}: decision[{key!r}] must be a list of skill indices, got {indices!r}")
    out = []
    for index in indices:
        name = names.get(index, names.get(str(index)))
        if not isinstance(name, str):
            raise PromptError(f"{where}: decision[{key!r}] lists skill {index!r}, which decision['skill_names'] "
                              "does not name")
        out.append(name)
    return out


def _mask(decision: Mapping[str, Any], chosen_action, where: str) -> dict[str, bool]:
    mask = decision.get("edit_mask")
    if mask is None:
        return edit_mask(chosen_action)
    if (not isinstance(mask, Mapping) or set(mask) != set(ARTIFACTS)
            or not all(isinstance(v, bool) for v in mask.values())):
        raise PromptError(f"{where}: decision['edit_mask'] must map each of {list(ARTIFACTS)} to true or false, "
                          f"got {mask!r}")
    return dict(mask)


def _source_line(pass_rate_source: str, rollouts: int, where: str) -> str:
    if pass_rate_source == "rollouts":
        if isinstance(rollouts, bool) or not isinstance(rollouts, int) or rollouts < 1:
            raise PromptError(f"{where}: a pass rate from rollouts needs rollouts >= 1, got {rollouts!r}")
        return f"verifier rewards of {rollouts} rollouts of the current policy"
    if pass_rate_source == "predicted":
        return "predicted for a seed the current policy has not been rolled out on (0 rollouts)"
    raise PromptError(f"{where}: pass_rate_source must be 'rollouts' or 'predicted', got {pass_rate_source!r}")


def _skills_block(preserved: list[str], added: list[str], removed: list[str]) -> list[str]:
    def listed(names: list[str]) -> str:
        return ", ".join(names) if names else "(none)"

    return [f"Preserved skills (keep exercising them): {listed(preserved)}",
            f"Added skills (new requirements must exercise them): {listed(added)}",
            f"Removed skills (no requirement may still need them): {listed(removed)}"]


def _decision_view(decision: Mapping[str, Any], config: PromptConfig, where: str) -> dict[str, Any]:
    """The validated numbers and names of a C.2 decision record."""
    try:
        chosen = action(decision.get("action"))  # type: ignore[arg-type]
    except ValueError as err:
        raise PromptError(f"{where}: decision['action']: {err}") from None
    p = _number(decision, "pass_rate", where)
    target = _number(decision, "projected_pass_rate", where)
    priors, frontier = config.forge.priors, config.forge.frontier
    rows = [(a, float(projected_pass_rate(p, a, priors))) for a in ACTIONS]
    projected = dict((a.name, q) for a, q in rows)[chosen.name]
    if abs(projected - target) > 1e-6:
        raise PromptError(f"{where}: decision['projected_pass_rate'] is {target!r}, but the prompt's transfer priors "
                          f"project {projected!r} for {chosen.name}; pass the ForgeConfig the selection used")
    return {"action": chosen, "pass_rate": p, "target": target,
            "candidates": [(a, q, float(frontier_score(q, frontier))) for a, q in rows],
            "mask": _mask(decision, chosen, where),
            "preserved": _skill_names(decision, "skills_preserved", where),
            "added": _skill_names(decision, "skills_added", where),
            "removed": _skill_names(decision, "skills_removed", where)}


def forge_prompt(seed: TaskBundle, decision: Mapping[str, Any], *, pass_rate_source: str = "rollouts",
                 rollouts: int = 0, config: PromptConfig = PromptConfig()) -> str:
    """The user message of Envs-FORGE (appendix C.2) for one seed and its solver decision.

    ``decision`` is a record of :meth:`~envsched_jax.forge.milp.Selection.decisions` (or of
    :func:`candidate_decisions`). The six projections and frontier scores are recomputed from its
    pass rate with ``config.forge``; a chosen action whose projection disagrees with the record's
    ``projected_pass_rate`` is refused (the selection used other priors)."""
    where = f"seed {seed.name!r}"
    view = _decision_view(decision, config, where)
    chosen, frontier = view["action"], config.forge.frontier
    source = _source_line(pass_rate_source, rollouts, where)
    p, target = view["pass_rate"], view["target"]
    table = [f"- {a.name}: projected pass rate {q:.3f}, frontier score {f:.4f}"
             + ("  <- selected" if a == chosen else "") for a, q, f in view["candidates"]]
    must = [a for a in ARTIFACTS if view["mask"][a]]
    may = [a for a in ARTIFACTS if not view["mask"][a]]
    return "\n".join([
        "# Rewrite the seed environment below under the solver's decision",
        "",
        "## Optimised action",
        f"Action: {chosen.name}",
        f"Projection {chosen.projection}: {_PROJECTIONS[chosen.projection]}",
        f"Direction {_DIRECTIONS[chosen.direction]}",
        "",
        "## Seed estimate",
        f"Pass rate of the seed under the current policy: {p:.3f}",
        f"Source: {source}",
        "",
        "## Reward band",
        f"Bands: {_band_edges(frontier)}.",
        f"The seed lies in the {reward_band(p, frontier)} band (pass rate {p:.3f}).",
        "",
        "## Candidate projections (all six actions; the solver picked the one marked)",
        *table,
        "",
        "## Target difficulty",
        f"Projected pass rate of the rewritten task: {target:.3f} ({reward_band(target, frontier)} band); write a "
        "task that the current policy would pass about this often.",
        "",
        "## Edit mask",
        *[f"- must change: {a}: {ARTIFACT_PATHS[a]}" for a in must],
        *[f"- may stay as it is when the rewrite does not need it changed: {a}: {ARTIFACT_PATHS[a]}" for a in may],
        "Every artifact that must change is rewritten in step with the others; edits stay within the "
        "operator families of this action.",
        "",
        "## Skill subgraph",
        *_skills_block(view["preserved"], view["added"], view["removed"]),
        "Update [metadata] skills in task.toml to this subgraph.",
        "",
        "## Consistency contract",
        "- No instruction-only edit: a change of the instruction comes with the matching change of the "
        "fixtures, oracle and tests.",
        "- No hidden requirement: the tests check nothing the instruction does not state.",
        "- A requirement you add appears in instruction.md (its declared text) and in the tests (its id); "
        "declare it in \"requirements\".",
        "- A requirement you remove disappears from the oracle and from the tests, and from \"requirements\".",
        "- The oracle earns reward 1 under the new tests; the untouched workspace does not.",
        "",
        *_seed_and_reply(seed, config),
    ])


def _baseline_direction(recipe: str, decision: Mapping[str, Any], where: str) -> str:
    """The evolution direction of a fixed recipe's request: its action's, which the recipe must allow."""
    try:
        chosen = action(decision.get("action"))  # type: ignore[arg-type]
    except ValueError as err:
        raise PromptError(f"{where}: decision['action']: {err}") from None
    allowed = {ACTIONS[a].name for a in recipe_mask(recipe, 2).nonzero()[1].tolist()}
    if chosen.name not in allowed:
        raise PromptError(f"{where}: recipe {recipe!r} allows only {sorted(allowed)}, but the decision selects "
                          f"{chosen.name!r}")
    return chosen.direction


def request_messages(seed: TaskBundle, decision: Mapping[str, Any], recipe: str, *,
                     pass_rate_source: str = "rollouts", rollouts: int = 0,
                     config: PromptConfig = PromptConfig()) -> Messages:
    """The first call's messages: the system contract and the recipe's user message."""
    _check_recipe(recipe)
    if recipe == "forge":
        user = forge_prompt(seed, decision, pass_rate_source=pass_rate_source, rollouts=rollouts, config=config)
    else:
        user = baseline_prompt(seed, recipe, _baseline_direction(recipe, decision, f"seed {seed.name!r}"), config)
    return ({"role": "system", "content": system_prompt(config)}, {"role": "user", "content": user})


# ---------------------------------------------------------------------------------------------
# Repairs


@dataclasses.dataclass(frozen=True)
class Failure:
    """Why an attempt was rejected: the failure kind (``parse`` or a check's name), its reason, and
    the verification's logs by name (``oracle``, ``oracle_tests``, ``untouched_tests``)."""

    kind: str
    reason: str
    logs: Mapping[str, str] = dataclasses.field(default_factory=dict)


def _policy_lines(seed: TaskBundle, decision: Mapping[str, Any], recipe: str, config: PromptConfig) -> list[str]:
    where = f"seed {seed.name!r}"
    if recipe != "forge":
        return [f"Strategy: {_BASELINE_STRATEGIES[recipe]}",
                f"Evolution direction: {_DIRECTIONS[_baseline_direction(recipe, decision, where)]}"]
    view = _decision_view(decision, config, where)
    must = [a for a in ARTIFACTS if view["mask"][a]]
    return [f"Action: {view['action'].name}; target pass rate {view['target']:.3f}.",
            f"Artifacts that must change: {', '.join(must)}.",
            *_skills_block(view["preserved"], view["added"], view["removed"]),
            "The consistency contract of the first message still holds."]


def _tail(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"[... {len(text) - limit} earlier characters not shown ...]\n" + text[-limit:]


def repair_prompt(seed: TaskBundle, decision: Mapping[str, Any], recipe: str, failure: Failure,
                  config: PromptConfig = PromptConfig()) -> str:
    """The user message asking for a corrected bundle after ``failure`` (module docstring)."""
    _check_recipe(recipe)
    logs = [(name, failure.logs[name]) for name in _LOGS_BY_KIND.get(failure.kind, ())
            if failure.logs.get(name, "").strip()]
    quoted = [f"Log `{name}` (last {config.max_log_chars} characters at most):\n```\n"
              f"{_tail(text.rstrip(), config.max_log_chars)}\n```" for name, text in logs]
    return "\n".join([
        f"# Repair: the previous bundle failed the `{failure.kind}` check",
        "",
        f"Reason: {_tail(failure.reason.strip() or '(no reason given)', config.max_log_chars)}",
        *([""] + quoted if quoted else []),
        "",
        _REPAIR_GUIDANCE.get(failure.kind, _GENERIC_GUIDANCE),
        "",
        "## Keep the same policy",
        *_policy_lines(seed, decision, recipe, config),
        "",
        "Return the complete corrected bundle, every file, as one JSON object in the reply format of the system "
        "message.",
    ])


def repair_messages(first: Messages, previous_reply: str, seed: TaskBundle, decision: Mapping[str, Any],
                    recipe: str, failure: Failure, config: PromptConfig = PromptConfig()) -> Messages:
    """The first call's system and user messages, the previous reply (cut at
    ``max_previous_reply_chars``) as the assistant's turn, then :func:`repair_prompt`."""
    kept = previous_reply if len(previous_reply) <= config.max_previous_reply_chars else (
        previous_reply[:config.max_previous_reply_chars]
        + f"\n[... {len(previous_reply) - config.max_previous_reply_chars} more characters of this reply "
          "not shown ...]")
    return (*first[:2], {"role": "assistant", "content": kept},
            {"role": "user", "content": repair_prompt(seed, decision, recipe, failure, config)})


# ---------------------------------------------------------------------------------------------
# The reply: parse and serialise


_FENCE = re.compile(r"```[ \t]*(?:json)?[ \t]*\r?\n(.*?)\r?\n[ \t]*```", re.S | re.I)
_TOP_LEVEL = ("task.toml", "instruction.md")
_TOP_FOLDERS = ("environment/", "solution/", "tests/")
_REQUIREMENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_FILE_KEYS = frozenset({"path", "content", "encoding", "executable"})


def _parse_error(message: str) -> BundleReplyError:
    return BundleReplyError("parse", f"reply: {message}")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup is not None:
        raise _parse_error(f"key {dup!r} appears twice in one JSON object")
    return dict(pairs)


def _reply_object(text: str, limits: ReplyLimits) -> dict[str, Any]:
    if not isinstance(text, str):
        raise _parse_error(f"must be a string, got {type(text).__name__}")
    if len(text) > limits.max_reply_chars:
        raise _parse_error(f"is {len(text)} characters, over the limit of {limits.max_reply_chars}")
    body = text.strip()
    if not body.startswith("{"):
        fenced = _FENCE.search(text)
        if fenced is None:
            raise _parse_error("is not a JSON object: it neither starts with '{' nor holds a ```json fenced block"
                               + (" (the reply is empty)" if not body else ""))
        body = fenced.group(1).strip()
    try:
        doc = json.loads(body, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as err:
        raise _parse_error(f"not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}") from None
    except RecursionError:
        raise _parse_error("not valid JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise _parse_error(f"must be a JSON object, got a JSON {type(doc).__name__}")
    unknown = sorted(set(doc) - {"files", "requirements"})
    if unknown:
        raise _parse_error(f"unknown key {unknown[0]!r} (the keys are 'files' and 'requirements')")
    return doc


def _check_reply_path(path: object, where: str, limits: ReplyLimits) -> str:
    if not isinstance(path, str) or not path:
        raise _parse_error(f"{where}.path must be a non-empty string, got {path!r}")
    name = f"{where}.path {path!r}"
    if len(path) > limits.max_path_chars:
        raise _parse_error(f"{name} is longer than {limits.max_path_chars} characters")
    if path.startswith("/"):
        raise _parse_error(f"{name} must be relative to the bundle, not absolute")
    if any(ord(c) < 32 or c in "\\\x7f" for c in path):
        raise _parse_error(f"{name} must be a POSIX path without backslashes or control characters")
    parts = path.split("/")
    if ".." in parts:
        raise _parse_error(f"{name} must stay inside the bundle ('..' is refused)")
    if any(part in ("", ".") for part in parts):
        raise _parse_error(f"{name} must be normalised (no empty or '.' parts)")
    if path not in _TOP_LEVEL and not (path.startswith(_TOP_FOLDERS) and path not in _TOP_FOLDERS):
        raise _parse_error(f"{name} is not part of a Harbor bundle (allowed: {', '.join(_TOP_LEVEL)} and files "
                           f"under {', '.join(_TOP_FOLDERS)})")
    return path


def _file_entry(entry: object, where: str, limits: ReplyLimits) -> tuple[str, BundleFile]:
    if not isinstance(entry, dict):
        raise _parse_error(f"{where} must be an object with 'path' and 'content', got {type(entry).__name__}")
    unknown = sorted(set(entry) - _FILE_KEYS)
    if unknown:
        raise _parse_error(f"{where} has unknown key {unknown[0]!r} (the keys are {sorted(_FILE_KEYS)})")
    path = _check_reply_path(entry.get("path"), where, limits)
    where = f"{where} ({path})"
    if "content" not in entry or not isinstance(entry["content"], str):
        raise _parse_error(f"{where}.content must be a string, got {entry.get('content')!r:.60}")
    encoding = entry.get("encoding", "utf-8")
    executable = entry.get("executable", False)
    if not isinstance(executable, bool):
        raise _parse_error(f"{where}.executable must be true or false, got {executable!r}")
    if encoding == "utf-8":
        try:
            data = entry["content"].encode("utf-8")
        except UnicodeEncodeError as err:
            raise _parse_error(f"{where}.content is not encodable as UTF-8 ({err.reason})") from None
    elif encoding == "base64":
        try:
            data = base64.b64decode(entry["content"], validate=True)
        except (binascii.Error, ValueError) as err:
            raise _parse_error(f"{where}.content is not valid base64 ({err})") from None
    else:
        raise _parse_error(f"{where}.encoding must be 'utf-8' or 'base64', got {encoding!r}")
    if len(data) > limits.max_file_bytes:
        raise _parse_error(f"{where} is {len(data)} bytes, over the limit of {limits.max_file_bytes}")
    return path, BundleFile(data, executable)


def _requirements(value: object, limits: ReplyLimits, where: str = "requirements",
                  error: Callable[[str], BundleReplyError] | None = None) -> list[dict[str, str]]:
    """A validated requirement list: ``id`` and ``text`` strings, ids well-formed and unique."""
    error = error or _parse_error
    if not isinstance(value, list):
        raise error(f"{where} must be a list of {{'id', 'text'}} objects, got {type(value).__name__}")
    if len(value) > limits.max_requirements:
        raise error(f"{where} lists {len(value)} items, over the limit of {limits.max_requirements}")
    out, seen = [], set()
    for k, item in enumerate(value):
        if not isinstance(item, dict) or set(item) != {"id", "text"}:
            raise error(f"{where}[{k}] must be an object with exactly 'id' and 'text', got {item!r:.80}")
        rid, text = item["id"], item["text"]
        if not isinstance(rid, str) or not _REQUIREMENT_ID.fullmatch(rid):
            raise error(f"{where}[{k}].id must be 1-64 letters, digits, '.', '_', ':' or '-', got {rid!r}")
        if not isinstance(text, str) or not text.strip():
            raise error(f"{where}[{k}].text must be a non-empty string, got {text!r}")
        if rid in seen:
            raise error(f"{where}[{k}].id {rid!r} is declared twice")
        seen.add(rid)
        out.append({"id": rid, "text": text})
    return out


def _check_declared(bundle: TaskBundle, limits: ReplyLimits) -> TaskBundle:
    """A requirement declaration written into task.toml directly gets the checks of the
    ``requirements`` field, so that what gold verification's sync check reads is well-formed."""
    meta = bundle.metadata.get("metadata", {})
    forge = meta.get("forge") if isinstance(meta, dict) else None
    if isinstance(forge, dict) and "requirements" in forge:
        _requirements(forge["requirements"], limits, "[metadata.forge].requirements",
                      lambda message: BundleReplyError("schema", f"reply: task.toml: {message}"))
    return bundle


def _with_requirements(bundle: TaskBundle, requirements: list[dict[str, str]]) -> TaskBundle:
    doc = copy.deepcopy(bundle.metadata)
    meta = doc.setdefault("metadata", {})
    forge = meta.setdefault("forge", {}) if isinstance(meta, dict) else None
    if not isinstance(forge, dict):
        raise BundleReplyError("schema", f"reply: task.toml: [metadata.forge] must be a table to hold the "
                                         f"requirements, got {forge!r:.60}")
    forge["requirements"] = requirements
    return bundle.with_metadata(doc)


def parse_bundle_reply(text: str, name: str, limits: ReplyLimits = ReplyLimits()) -> TaskBundle:
    """The Harbor bundle called ``name`` that a model's reply holds (reply format: module docstring).

    Accepts the JSON object alone or inside a ```json fence. Raises :class:`BundleReplyError`
    naming the field or path: ``kind == "parse"`` for anything that is not the reply format
    (invalid JSON, an unknown or mistyped field, a path that is absolute, leaves the bundle or is
    outside the Harbor layout, a duplicate path, bad base64, a size over ``limits``), ``"schema"``
    when the files do not form a Harbor bundle (a required file missing, task.toml invalid, a
    requirement declaration in task.toml that is not a list of ``{id, text}`` tables)."""
    doc = _reply_object(text, limits)
    files_value = doc.get("files")
    if not isinstance(files_value, list) or not files_value:
        raise _parse_error(f"files must be a non-empty list of file objects, got {files_value!r:.60}")
    if len(files_value) > limits.max_files:
        raise _parse_error(f"files lists {len(files_value)} files, over the limit of {limits.max_files}")
    files: dict[str, BundleFile] = {}
    for k, entry in enumerate(files_value):
        path, bundle_file = _file_entry(entry, f"files[{k}]", limits)
        if path in files:
            raise _parse_error(f"files[{k}].path {path!r} appears twice")
        files[path] = bundle_file
    total = sum(len(f.data) for f in files.values())
    if total > limits.max_total_bytes:
        raise _parse_error(f"the files hold {total} bytes in all, over the limit of {limits.max_total_bytes}")
    requirements = _requirements(doc["requirements"], limits) if "requirements" in doc else None
    try:
        bundle = TaskBundle(name, "harbor", files)
        return _check_declared(bundle if requirements is None else _with_requirements(bundle, requirements), limits)
    except BundleError as err:
        raise BundleReplyError("schema", f"reply: the files do not form a Harbor bundle: {err}") from None


def bundle_to_reply(bundle: TaskBundle, *, include_requirements: bool = False, indent: int | None = None) -> str:
    """``bundle`` (converted to Harbor) in the reply format: the inverse of :func:`parse_bundle_reply`.

    Text files are sent as UTF-8, others as base64. With ``include_requirements`` the declared
    requirements are also given in the ``requirements`` field."""
    harbor = _harbor_seed(bundle)
    entries = []
    for path, entry in harbor.files.items():
        try:
            item: dict[str, Any] = {"path": path, "content": entry.data.decode("utf-8")}
        except UnicodeDecodeError:
            item = {"path": path, "content": base64.b64encode(entry.data).decode("ascii"), "encoding": "base64"}
        if entry.executable:
            item["executable"] = True
        entries.append(item)
    doc: dict[str, Any] = {"files": entries}
    if include_requirements:
        declared = declared_requirements(harbor) or {}
        doc["requirements"] = [{"id": rid, "text": text} for rid, text in declared.items()]
    return json.dumps(doc, indent=indent, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# Prompt length (appendix A.2: a constant before solving)


@dataclasses.dataclass(frozen=True)
class PromptSize:
    """A prompt's length: characters of all messages, and tokens (estimated or counted)."""

    chars: int
    tokens: int


def estimate_tokens(text: str) -> int:
    """``ceil(len(text) / CHARS_PER_TOKEN)``: a tokenizer-free estimate."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def prompt_size(messages: Sequence[Mapping[str, str]], count_tokens: Callable[[str], int] | None = None) -> PromptSize:
    """The length of ``messages`` (contents only, without a chat template's few tokens per turn)."""
    contents = [m["content"] for m in messages]
    count = count_tokens or estimate_tokens
    return PromptSize(sum(len(c) for c in contents), sum(int(count(c)) for c in contents))


def candidate_decisions(spec: SeedSpec, graph: SkillGraph = SkillGraph(),
                        config: ForgeConfig = ForgeConfig()) -> list[dict[str, Any]]:
    """The decision record each of the seed's six candidates would have if selected, in
    :data:`~envsched_jax.forge.actions.ACTIONS` order and in the shape of
    :meth:`~envsched_jax.forge.milp.Selection.decisions` (skills by an index local to the seed)."""
    base = spec.required + spec.optional
    out = []
    for a, nodes in zip(ACTIONS, candidate_skills(spec, graph)):
        names = sorted(set(base) | set(nodes))
        index = {name: i for i, name in enumerate(names)}
        projected = float(projected_pass_rate(spec.pass_rate, a, config.priors))
        out.append({
            "seed_id": spec.seed_id, "action": a.name, "pass_rate": float(spec.pass_rate),
            "projected_pass_rate": projected, "frontier_score": float(frontier_score(projected, config.frontier)),
            "skills_preserved": [index[k] for k in names if k in base and k in nodes],
            "skills_added": [index[k] for k in names if k in nodes and k not in base],
            "skills_removed": [index[k] for k in names if k in base and k not in nodes],
            "skill_names": {i: k for k, i in index.items()}, "edit_mask": edit_mask(a)})
    return out


def candidate_prompt_sizes(seed: TaskBundle, spec: SeedSpec, recipe: str, *, graph: SkillGraph = SkillGraph(),
                           pass_rate_source: str = "rollouts", rollouts: int = 0,
                           config: PromptConfig = PromptConfig(),
                           count_tokens: Callable[[str], int] | None = None) -> tuple[PromptSize, ...]:
    """The first-call prompt length of each of the seed's six candidates under ``recipe``, for
    ``SeedSpec.prompt_tokens``: ``tuple(s.tokens for s in sizes)``. The skills come from
    ``graph`` and the projections from ``config.forge``, as the selection computes them. A fixed
    recipe's prompt depends only on the direction, so a candidate its mask excludes gets the
    length its direction would give (it is ineligible anyway)."""
    _check_recipe(recipe)
    sizes = []
    for decision in candidate_decisions(spec, graph, config.forge):
        if recipe == "forge":
            messages = request_messages(seed, decision, recipe, pass_rate_source=pass_rate_source,
                                        rollouts=rollouts, config=config)
        else:
            direction = action(decision["action"]).direction
            messages = ({"role": "system", "content": system_prompt(config)},
                        {"role": "user", "content": baseline_prompt(seed, recipe, direction, config)})
        sizes.append(prompt_size(messages, count_tokens))
    return tuple(sizes)


def candidate_prompt_tokens(seed: TaskBundle, spec: SeedSpec | None = None, recipe: str = "forge", *,
                            graph: SkillGraph = SkillGraph(), pass_rate_source: str | None = None,
                            rollouts: int = 0, config: PromptConfig = PromptConfig(),
                            count_tokens: Callable[[str], int] | None = None) -> tuple[int, ...]:
    """``SeedSpec.prompt_tokens`` for the seed: the tokens of :func:`candidate_prompt_sizes`.

    With ``spec`` and ``graph`` the counts are exact. With the seed alone they are computed for
    pass rate 0.5 and the seed's own skills, which is what a caller has before its selection
    inputs are assembled, and they stay close: numbers print with fixed decimals, so the pass
    rate moves a prompt only through the band names (a few characters); the source line defaults
    to ``predicted``, the longer one; an empty ``graph`` leaves out the names of skills an
    increase would add. The default recipe renders C.2, which is longer than any fixed recipe's
    C.1 prompt for the same seed, so for those it is an upper bound."""
    if spec is None:
        skills = _harbor_seed(seed).skills
        spec = SeedSpec(seed.name, 0.5, skills.required, skills.optional)
    source = pass_rate_source or ("rollouts" if rollouts > 0 else "predicted")
    sizes = candidate_prompt_sizes(seed, spec, recipe, graph=graph, pass_rate_source=source, rollouts=rollouts,
                                   config=config, count_tokens=count_tokens)
    return tuple(size.tokens for size in sizes)
