"""Gold verification of task bundles: the static checks, and the Docker checks on a real engine."""

from __future__ import annotations

import pytest

from envsched_jax.envs.sandbox import unavailable_reason
from envsched_jax.forge.bundle import BundleFile, TaskBundle
from envsched_jax.forge.verify import (CHECKS, DockerVerifier, VerifyConfig, check_safety, check_sync,
                                       instruction_similarity, verify_bundle)

DOCKERFILE = "FROM envsched-forge-base\nWORKDIR /app\nCOPY app/ /app/\n"
TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/out.txt 2>/dev/null)" = "3" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
SOLVE_SH = "#!/bin/bash\ngrep -c ERROR /app/log.txt > /app/out.txt\n"


def make_bundle(name="count-errors", *, instruction="Count the ERROR lines of /app/log.txt and write the count "
                                                 "to /app/out.txt.", solve=SOLVE_SH, test=TEST_SH,
                dockerfile=DOCKERFILE, log="ERROR a\nINFO b\nERROR c\nERROR d\n", extra=None, toml_extra=""):
    files = {
        "task.toml": BundleFile(f'version = "1.0"\n\n[metadata]\nauthor_name = "test"\n{toml_extra}\n'
                                '[verifier]\ntimeout_sec = 30.0\n\n[agent]\ntimeout_sec = 30.0\n'.encode()),
        "instruction.md": BundleFile(instruction.encode()),
        "environment/Dockerfile": BundleFile(dockerfile.encode()),
        "environment/app/log.txt": BundleFile(log.encode()),
        "solution/solve.sh": BundleFile(solve.encode(), executable=True),
        "tests/test.sh": BundleFile(test.encode(), executable=True),
    }
    files.update(extra or {})
    return TaskBundle(name, "harbor", files)


# ---------------------------------------------------------------------------------------------
# Static checks


@pytest.mark.parametrize("change, message", [
    (dict(dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n"), r"FROM 'ubuntu:24.04' is not a local base image"),
    (dict(dockerfile=DOCKERFILE + "RUN apt-get update\n"), r"Dockerfile:4: RUN is refused"),
    (dict(dockerfile=DOCKERFILE + "ADD https://x.org/a /a\n"), r"Dockerfile:4: ADD is refused"),
    (dict(dockerfile="FROM envsched-forge-base\nCOPY ../secret /app/\n"), r"COPY source '../secret' leaves"),
    (dict(dockerfile="FROM envsched-forge-base\nVOLUME /data\n"), r"instruction VOLUME is not allowed"),
    (dict(solve="#!/bin/bash\ncurl -s http://example.com > /app/out.txt\n"), r"solution/solve.sh:2: network use"),
    (dict(test=TEST_SH + "python3 -c 'import socket'\n"), r"tests/test.sh:4: network use"),
    (dict(solve="#!/bin/bash\ncat /var/run/docker.sock\n"), r"solution/solve.sh:2: a host path"),
    (dict(extra={"environment/app/id_rsa": BundleFile(b"-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n")}),
     r"environment/app/id_rsa: contains what looks like a secret"),
])
def test_safety_refuses_with_the_cause(change, message):
    bundle = make_bundle(**change)
    result = verify_bundle(bundle, None)
    assert not result.accepted and result.failed_check.name == "safety"
    assert result.failed_check.reason == check_safety(bundle, VerifyConfig())
    import re
    assert re.search(message, result.failed_check.reason), result.failed_check.reason


def test_static_checks_pass_on_a_good_bundle_and_length_and_overlap_reject():
    good = make_bundle()
    static = verify_bundle(good, None)
    assert [c.name for c in static.checks] == list(CHECKS[:5]) and all(c.passed for c in static.checks)
    assert not static.accepted            # never accepted without the executed checks
    long = verify_bundle(good, None, config=VerifyConfig(max_instruction_chars=20))
    assert long.failed_check.name == "length" and "more than 20" in long.failed_check.reason
    same = verify_bundle(make_bundle("copy"), None, parent=good)
    assert same.failed_check.name == "overlap" and "byte-identical to 'count-errors'" in same.failed_check.reason
    near = verify_bundle(make_bundle("near", log="ERROR x\n"), None, parent=good)
    assert near.failed_check.name == "overlap" and "near copy" in near.failed_check.reason
    assert "the tests are the same" in near.failed_check.reason
    # the same words over a different verifier (new data and expected values) is a new task
    other_tests = make_bundle("variant", log="ERROR x\n", test=TEST_SH.replace('= "3"', '= "1"'))
    assert verify_bundle(other_tests, None, parent=good).failed_check is None
    assert instruction_similarity("count the lines", "sort the words by length") < 0.3


def test_sync_contract_for_added_and_removed_requirements():
    parent = make_bundle(toml_extra='forge = { requirements = [{ id = "R1", text = "Count ERROR lines." }] }')
    added = make_bundle("harder", instruction="Count ERROR lines. Also Ignore comment lines.",
                        toml_extra='forge = { requirements = [{ id = "R1", text = "Count ERROR lines." }, '
                                   '{ id = "R2", text = "Ignore comment lines." }] }',
                        test=TEST_SH + "# R1 R2\n")
    assert check_sync(added, parent) == ""
    unstated = make_bundle("h2", instruction="Count ERROR lines.", test=TEST_SH + "# R2\n",
                           toml_extra='forge = { requirements = [{ id = "R2", text = "Ignore comment lines." }] }')
    assert "added requirement 'R2' is not stated in the instruction" in check_sync(unstated, parent)
    untested = make_bundle("h3", instruction="Ignore comment lines.",
                           toml_extra='forge = { requirements = [{ id = "R2", text = "Ignore comment lines." }] }')
    assert check_sync(untested, parent) == "added requirement 'R2' is not checked by the tests"
    kept = make_bundle("easier", instruction="Write 3.", solve=SOLVE_SH + "# R1\n",
                       toml_extra='forge = { requirements = [] }')
    assert check_sync(kept, parent) == "removed requirement 'R1' is still in the oracle"
    scalar = make_bundle("s", toml_extra="forge = { requirements = 3 }")
    assert "forge.requirements must be an array of tables, got int" in check_sync(scalar, parent)
    twice = make_bundle("t", toml_extra='forge = { requirements = [{ id = "R1", text = "a" }, { id = "R1", text = "b" }] }')
    assert "id 'R1' is declared twice" in check_sync(twice, parent)
    result = verify_bundle(make_bundle("s2", log="ERROR z\n", test=TEST_SH + "# R1\n",
                                       toml_extra="forge = { requirements = 3 }"), None, parent=parent)
    assert result.failed_check.name == "sync" and "must be an array" in result.failed_check.reason


# ---------------------------------------------------------------------------------------------
# Docker


_NO_DOCKER = unavailable_reason("docker")


@pytest.fixture(scope="module")
def verifier():
    return DockerVerifier(VerifyConfig(oracle_timeout_s=6, test_timeout_s=10))


@pytest.mark.docker
@pytest.mark.skipif(_NO_DOCKER is not None, reason=f"no Docker engine here: {_NO_DOCKER}")
def test_a_good_bundle_is_accepted_and_its_image_is_cached(verifier):
    bundle = make_bundle(log="ERROR 1\nERROR 2\nINFO\nERROR 3\n")
    first = verify_bundle(bundle, verifier)
    assert first.accepted, first.failed_check
    assert [c.name for c in first.checks] == list(CHECKS)
    assert (first.oracle_reward, first.untouched_reward) == (1.0, 0.0)
    second = verify_bundle(bundle.with_file("solution/notes.txt", b"same environment"), verifier)
    assert second.accepted and second.cache_hit and second.image == first.image


@pytest.mark.docker
@pytest.mark.skipif(_NO_DOCKER is not None, reason=f"no Docker engine here: {_NO_DOCKER}")
@pytest.mark.parametrize("change, check, reason", [
    (dict(solve="#!/bin/bash\necho 2 > /app/out.txt\n"), "oracle", "gave reward 0.0"),
    (dict(solve="#!/bin/bash\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n"), "oracle",
     "gave reward 0.0"),                                     # the oracle cannot forge its reward
    (dict(solve="#!/bin/bash\nsleep 60\n"), "oracle", "oracle timed out after 6 s"),
    (dict(test="#!/bin/bash\nexit 0\n"), "oracle", "wrote no /logs/verifier/reward.txt"),
    (dict(test="#!/bin/bash\nmkdir -p /logs/verifier; echo yes > /logs/verifier/reward.txt\n"), "oracle",
     "not a number"),
    (dict(test="#!/bin/bash\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n"), "untouched",
     "tests pass (reward 1) on the untouched workspace"),
    (dict(dockerfile="FROM envsched-forge-base\nCOPY missing/ /app/\n"), "build", "docker build failed"),
])
def test_broken_bundles_are_rejected_by_the_named_check(verifier, change, check, reason):
    result = verify_bundle(make_bundle(**change), verifier)
    assert not result.accepted
    assert result.failed_check.name == check and reason in result.failed_check.reason, result.failed_check


@pytest.mark.docker
@pytest.mark.skipif(_NO_DOCKER is not None, reason=f"no Docker engine here: {_NO_DOCKER}")
def test_the_oracle_has_no_network_and_a_read_only_toolchain(verifier):
    probe = ("#!/bin/bash\n(echo > /dev/udp/10.0.0.1/53) 2>/dev/null && n=net || n=nonet\n"
             "(touch /usr/bin/x) 2>/dev/null && u=rw || u=ro\n"
             "echo \"$n $u\" > /app/probe.txt\ngrep -c ERROR /app/log.txt > /app/out.txt\n")
    test = ("#!/bin/bash\nmkdir -p /logs/verifier\n"
            "if [ \"$(cat /app/probe.txt)\" = \"nonet ro\" ] && [ \"$(cat /app/out.txt)\" = 3 ]; "
            "then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n")
    result = verify_bundle(make_bundle(solve=probe, test=test), verifier)
    assert result.accepted, (result.failed_check, result.logs)


@pytest.mark.docker
@pytest.mark.skipif(_NO_DOCKER is not None, reason=f"no Docker engine here: {_NO_DOCKER}")
def test_every_builtin_seed_passes_gold_verification_in_docker(verifier):
    from envsched_jax.forge.families import builtin_seeds, to_bundle

    seeds = builtin_seeds()
    assert len(seeds) >= 24
    for name, params in seeds:
        result = verify_bundle(to_bundle(name, params), verifier)
        assert result.accepted, (name, result.failed_check, result.logs)
        assert (result.oracle_reward, result.untouched_reward) == (1.0, 0.0), name


@pytest.mark.docker
@pytest.mark.skipif(_NO_DOCKER is not None, reason=f"no Docker engine here: {_NO_DOCKER}")
def test_a_reward_link_to_a_host_file_is_refused_and_not_read(verifier):
    test = ("#!/bin/bash\nmkdir -p /logs/verifier\nln -s /etc/passwd /logs/verifier/reward.txt\n")
    result = verify_bundle(make_bundle(test=test), verifier)
    assert result.failed_check.name == "oracle" and "cannot be opened as a plain file" in result.failed_check.reason
    assert "root:" not in result.failed_check.reason + "".join(result.logs.values())


@pytest.mark.docker
@pytest.mark.skipif(_NO_DOCKER is not None, reason=f"no Docker engine here: {_NO_DOCKER}")
def test_a_script_task_program_cannot_write_its_own_reward(verifier):
    """The script family's checks run the agent's program, which can reach /logs: a wrong program
    that writes reward 1 there, and leaves a writer running, still earns 0 (families.TEST_SH)."""
    from envsched_jax.forge.families import builtin_seeds, to_bundle

    name, params = next((n, p) for n, p in builtin_seeds() if n.startswith("script-"))
    hostile = ("#!/bin/bash\nmkdir -p /app/bin\ncat > /app/bin/tally <<'X'\n#!/bin/bash\n"
               "echo 1 > /logs/verifier/reward.txt 2>/dev/null\n"
               "(while :; do echo 1 > /logs/verifier/reward.txt; sleep 0.01; done) >/dev/null 2>&1 &\n"
               "echo nonsense\nX\nchmod +x /app/bin/tally\n")
    bundle = to_bundle(name, params).with_file("solution/solve.sh", hostile.encode(), executable=True)
    result = verify_bundle(bundle, verifier)
    assert result.failed_check.name == "oracle" and result.oracle_reward == 0.0, result.logs
