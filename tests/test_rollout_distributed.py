"""Distributed rollouts on a local Ray cluster: generation actors give the episodes local
generation gives, sandbox actors give the rewards local sandboxes give, routing is sticky per
episode, a killed actor yields named errors and a replacement (never a hang), a hung sandbox node
is cut off by the driver, and weight updates reach every actor (shipped through the object store
as well as read from a shared folder)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
import threading
import time
from collections import defaultdict

import pytest

ray = pytest.importorskip("ray", reason="the 'ray' package is not installed "
                          "(pip install 'envsched_jax[distributed]')")

from envsched_jax.envs.inprocess import run_episode as inprocess_episode  # noqa: E402
from envsched_jax.envs.rollout import RolloutConfig, RolloutJob, RolloutPool  # noqa: E402
from envsched_jax.envs.sandbox import (SandboxConfig, SandboxError, SandboxLimits,  # noqa: E402
                                       UntrustedEnvironment, WorkerPool, make_worker_pool)
from envsched_jax.pool.sources import load_pool  # noqa: E402
from envsched_jax.rollout.agent import AgentConfig, AgentRunner  # noqa: E402
from envsched_jax.rollout.backends import (BackendError, GenerationRequest,  # noqa: E402
                                           backend_class)
from envsched_jax.rollout.backends.scripted import (ScriptedBackend,  # noqa: E402
                                                    reference_responder)
from envsched_jax.rollout.distributed import (RayGenerationBackend,  # noqa: E402
                                              RaySandboxBackend, episode_key,
                                              make_ray_worker_pool)
from sandbox_helpers import sandbox_param  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def tokenizer():
    from envsched_jax.learner import tokenizer as tokenizer_lib
    from envsched_jax.learner.weights import smollm2_gguf_path

    return tokenizer_lib.load_gguf_tokenizer(smollm2_gguf_path())


@pytest.fixture(scope="module")
def light(tokenizer):
    """The tokenizer's Rust core behind the two calls ScriptedBackend makes: what the generation
    actors get (unpickling a transformers tokenizer imports transformers in every actor, seconds
    each on a small machine). Defined here, so Ray ships the class by value."""

    class Light:
        def __init__(self, inner):
            self.inner = inner

        def decode(self, ids, skip_special_tokens=False):
            return self.inner.decode(list(ids), skip_special_tokens=skip_special_tokens)

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": self.inner.encode(text, add_special_tokens=add_special_tokens).ids}

    made = Light(tokenizer.backend_tokenizer)
    sample = 'Done. <tool_call>[{"name": "x", "arguments": {"a": 1}}]</tool_call>'
    assert made(sample)["input_ids"] == tokenizer(sample, add_special_tokens=False)["input_ids"]
    return made


@pytest.fixture(scope="module")
def embedded():
    return load_pool("embedded")


def jobs_of(pool, n_tasks=4, k=2):
    tasks = [t for t in pool.tasks if t.reference_actions][:n_tasks]
    return [(t, r, r) for t in tasks for r in range(k)]


def run_agent(backend, tokenizer, pool, workers, jobs, **config):
    return AgentRunner(backend, tokenizer, workers, pool, AgentConfig(**config)).run(jobs)


def local_episodes(tokenizer, pool, jobs):
    with make_worker_pool(SandboxConfig(kind="inprocess", num_workers=2)) as workers:
        return run_agent(ScriptedBackend(tokenizer, reference_responder(pool)), tokenizer, pool,
                         workers, jobs)


def same_episodes(got, want):
    assert [(e.task_id, e.rollout_index) for e in got] == [(e.task_id, e.rollout_index)
                                                           for e in want]
    for g, w in zip(got, want):
        assert (g.reward, g.end_reason, g.error, g.num_turns) == (w.reward, w.end_reason,
                                                                  w.error, w.num_turns)
        assert g.transcript.token_ids == w.transcript.token_ids
        assert g.transcript.loss_mask == w.transcript.loss_mask
        assert g.transcript.logprobs == w.transcript.logprobs


def wait_until(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


# -- generation ----------------------------------------------------------------------------------

def test_registry_and_episode_keys():
    assert backend_class("ray") is RayGenerationBackend
    assert episode_key("env-task_3#5/turn12") == "env-task_3#5"
    assert episode_key("a/turnx#1/turn0") == "a/turnx#1" and episode_key("plain") == "plain"
    with pytest.raises(ValueError, match="cannot host another 'ray'"):
        RayGenerationBackend(("ray", {}))
    with pytest.raises(ValueError, match="unknown generation backend 'tgi'"):
        RayGenerationBackend(("tgi", {}))
    with pytest.raises(TypeError, match="zero-argument callable or a"):
        RayGenerationBackend("scripted")


def test_scripted_generation_through_actors_matches_local_and_sticks_to_episodes(
        cluster, tokenizer, light, embedded):
    jobs = jobs_of(embedded)
    want = local_episodes(tokenizer, embedded, jobs)
    factory = ("scripted", {"tokenizer": light, "respond": reference_responder(embedded)})
    with RayGenerationBackend(factory, 2, num_cpus=0.5) as backend, \
            make_worker_pool(SandboxConfig(kind="inprocess", num_workers=2)) as workers:
        assert (backend.name, backend.inner_name) == ("ray", "scripted")
        assert backend.max_context == 1 << 20
        infos = backend.actor_infos()
        assert all(i["pid"] != os.getpid() and i["state"] == "ready" for i in infos)
        got = run_agent(backend, tokenizer, embedded, workers, jobs)
        routed = list(backend.routed)
        served = backend.call_actors(lambda b: sorted({r.request_id for r in b.requests}))
    same_episodes(got, want)
    assert [e.reward for e in got] == [1.0] * len(jobs)
    # every turn of an episode went to one actor; new episodes were spread over both
    actors_of = defaultdict(set)
    for request_id, actor in routed:
        actors_of[episode_key(request_id)].add(actor)
    assert len(actors_of) == len(jobs) and all(len(a) == 1 for a in actors_of.values())
    assert {a for s in actors_of.values() for a in s} == {0, 1}
    assert sorted(served[0] + served[1]) == sorted(r for r, _ in routed)  # really served remotely


def test_routing_prefers_the_least_loaded_actor_and_keeps_episodes(cluster, tokenizer, light):
    def respond(prompt, request):
        time.sleep({"slow": 0.6, "hang": 3.0}.get(request.request_id[:4], 0.0))
        return "ok"

    factory = ("scripted", {"tokenizer": light, "respond": respond})
    ids = tuple(tokenizer("hello")["input_ids"])
    with RayGenerationBackend(factory, 2, num_cpus=0.5, request_timeout_s=2.0) as backend:
        slow = backend.submit(GenerationRequest(ids, request_id="slow#0/turn0"))
        # one at a time: actor 0 has one outstanding request, actor 1 none
        fast = [backend.submit(GenerationRequest(ids, request_id=f"fast#{k}/turn0")).result(30)
                for k in range(3)]
        later = backend.submit(GenerationRequest(ids, request_id="slow#0/turn1"))
        results = [slow.result(timeout=30), *fast, later.result(timeout=30)]
        routes = dict(backend.routed)
        # the driver's own request limit, and a caller that gives up
        start = time.monotonic()
        hung = backend.submit(GenerationRequest(ids, request_id="hang#0/turn0"))
        dropped = backend.submit(GenerationRequest(ids, request_id="hang#0/turn1"))
        assert dropped.cancel() and dropped.cancelled()
        late = hung.result(timeout=30)
        assert late.finish_reason == "error" and 1.9 < time.monotonic() - start < 10
        assert late.error.startswith("no reply from Ray generation actor 0 (node ")
        assert late.error.endswith("to request 'hang#0/turn0' within 2 s")
    assert all(r.finish_reason == "stop" for r in results), results
    assert routes["slow#0/turn0"] == routes["slow#0/turn1"] == 0  # sticky, though 0 was busier
    assert all(routes[f"fast#{k}/turn0"] == 1 for k in range(3))  # actor 0 was busy


def test_a_killed_generation_actor_gives_named_errors_and_is_replaced(cluster, tokenizer, light,
                                                                     embedded):
    reference = reference_responder(embedded)

    def respond(prompt, request):
        if request.request_id.startswith("x#"):
            return "ok"
        time.sleep(0.25)
        return reference(prompt, request)

    jobs = jobs_of(embedded, n_tasks=3, k=2)
    factory = ("scripted", {"tokenizer": light, "respond": respond})
    with RayGenerationBackend(factory, 2, num_cpus=0.5, max_replacements=1) as backend, \
            make_worker_pool(SandboxConfig(kind="inprocess", num_workers=3)) as workers:
        victim = backend.actors[0]

        def kill_when_busy():  # once actor 0 has a request in flight
            time.sleep(0.5)
            wait_until(lambda: backend.actor_infos()[0]["outstanding"] > 0, 30)
            ray.kill(victim)

        killer = threading.Thread(target=kill_when_busy)
        killer.start()
        start = time.monotonic()
        episodes = run_agent(backend, tokenizer, embedded, workers, jobs,
                             generation_timeout_s=60.0)
        elapsed = time.monotonic() - start
        killer.join()
        assert wait_until(lambda: backend.num_replaced == 1, 60)
        infos = backend.actor_infos()
        assert infos[0]["state"] == "ready" and infos[0]["pid"] != 0
        ids = tuple(GenerationRequest((1, 2, 3)).prompt_ids)
        after = [backend.submit(GenerationRequest(ids, request_id=f"x#{k}/turn0"))
                 for k in range(4)]
        assert [f.result(timeout=30).finish_reason for f in after] == ["stop"] * 4
        assert {a for _, a in list(backend.routed)[-4:]} == {0, 1}  # the new actor serves
    assert elapsed < 45
    failed = [e for e in episodes if e.end_reason == "generation_error"]
    assert failed, [e.end_reason for e in episodes]
    for e in failed:
        assert "Ray generation actor 0" in e.error and "died while serving request" in e.error
    assert all(e.reward == 1.0 for e in episodes if e not in failed)


def _wait_until_dead(actor, timeout: float, method: str = "info") -> bool:
    """True once calling ``actor.method`` fails because it died (within ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(getattr(actor, method).remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            pass
        time.sleep(0.1)
    return False


def test_all_actors_dead_resolves_with_an_error(cluster, tokenizer, light):
    factory = ("scripted", {"tokenizer": light, "respond": lambda p, r: "ok"})
    ids = tuple(tokenizer("hi")["input_ids"])
    with RayGenerationBackend(factory, 1, num_cpus=0.25, max_replacements=0) as backend:
        ray.kill(backend.actors[0])
        # ray.kill is asynchronous: a request sent at once could still be served (CI saw "stop"
        # under load), so wait until the actor is gone before sending one.
        assert _wait_until_dead(backend.actors[0], 30)
        first = backend.submit(GenerationRequest(ids, request_id="a#0/turn0")).result(timeout=30)
        assert first.finish_reason == "error" and "Ray generation actor 0" in first.error
        assert wait_until(lambda: backend.actor_infos()[0]["state"] == "dead", 30)
        second = backend.submit(GenerationRequest(ids, request_id="a#0/turn1")).result(timeout=5)
        assert "no Ray generation actor is serving" in second.error
        assert "dead after 0 replacement(s)" in second.error
    closed = backend.submit(GenerationRequest(ids)).result(timeout=1)
    assert closed.error == "RayGenerationBackend is closed"


def test_a_factory_that_fails_is_named_at_construction(cluster):
    with pytest.raises(BackendError, match=r"actor 0: .*TypeError.*bogus"):
        RayGenerationBackend(("scripted", {"bogus": 1}), 1, num_cpus=0.25)


def digests(folder):
    return {os.path.relpath(os.path.join(d, f), folder):
            hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest()
            for d, _, files in os.walk(folder) for f in files}


def test_update_weights_reaches_every_actor_shared_and_through_the_object_store(
        cluster, tokenizer, light, tmp_path):
    folder = tmp_path / "export"
    (folder / "extra").mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(os.urandom(3 << 20))
    (folder / "extra" / "tokenizer.json").write_text("{}")
    want = digests(folder)

    def remote_view(b):
        import hashlib as h
        import os as o

        d = b.weights_dir
        return d, {o.path.relpath(o.path.join(r, f), d):
                   h.sha256(open(o.path.join(r, f), "rb").read()).hexdigest()
                   for r, _, fs in o.walk(d) for f in fs}

    factory = ("scripted", {"tokenizer": light, "respond": lambda p, r: "ok"})
    with RayGenerationBackend(factory, 2, num_cpus=0.5, weight_sync="object_store") as backend:
        seconds = backend.update_weights(str(folder))
        assert seconds == max(backend.last_update_seconds) and len(backend.last_update_seconds) == 2
        views = backend.call_actors(remote_view)
        assert len(views) == 2 and all(v == want for _, v in views)
        shipped = [d for d, _ in views]
        assert all(d != str(folder) and "envsched-weights-" in d for d in shipped)
        # a second shipment replaces the first folder on each node
        (folder / "model.safetensors").write_bytes(os.urandom(1 << 20))
        backend.update_weights(str(folder))
        views = backend.call_actors(remote_view)
        assert all(v == digests(folder) for _, v in views)
        assert backend.call_actors(lambda b, old=shipped: [os.path.exists(d) for d in old]) == \
            [[False, False]] * 2
        # a replacement actor starts with the latest weights
        ray.kill(backend.actors[1])
        # ray.kill is asynchronous: wait until actor 1 is gone, or request b could still be
        # served by it and nothing would notice the death (CI saw num_replaced stay 0).
        assert _wait_until_dead(backend.actors[1], 30)
        ids = tuple(tokenizer("hi")["input_ids"])
        backend.submit(GenerationRequest(ids, request_id="a#0/turn0"))
        b = backend.submit(GenerationRequest(ids, request_id="b#0/turn0")).result(timeout=30)
        assert b.finish_reason == "error" and "Ray generation actor 1" in b.error, b
        assert wait_until(lambda: backend.num_replaced == 1, 60)
        assert all(v == digests(folder) for _, v in backend.call_actors(remote_view))
        # a folder every node reads (this machine's filesystem stands in for a shared one)
        backend.update_weights(str(folder), weight_sync="shared_fs")
        assert [d for d, _ in backend.call_actors(remote_view)] == [str(folder)] * 2
        with pytest.raises(BackendError, match="does not exist on node .*object_store"):
            backend.update_weights(str(tmp_path / "missing"), weight_sync="shared_fs")
        with pytest.raises(ValueError, match="does not exist"):
            backend.update_weights(str(tmp_path / "missing"), weight_sync="object_store")


# -- sandboxes -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["inprocess", sandbox_param("bwrap"),
                                  sandbox_param("docker")])
def test_sandbox_actors_give_the_local_rewards(cluster, tokenizer, embedded, kind):
    jobs = jobs_of(embedded)
    want = local_episodes(tokenizer, embedded, jobs)
    with make_ray_worker_pool(SandboxConfig(kind=kind, num_workers=2), num_cpus=0.5) as workers:
        backend = workers.backend
        assert isinstance(backend, RaySandboxBackend) and workers.kind == f"ray-{kind}"
        got = run_agent(ScriptedBackend(tokenizer, reference_responder(embedded)), tokenizer,
                        embedded, workers, jobs)
        # fixed action sequences (one round trip each) through RolloutPool
        tasks = [t for t, k, _ in jobs if k == 0]
        rollouts = RolloutPool(workers, embedded, RolloutConfig(episode_timeout_s=30)).run(
            [RolloutJob(t, actions=t.reference_actions) for t in tasks] +
            [RolloutJob(t, actions=()) for t in tasks])
        assert workers.num_started == 2 and workers.num_replaced == 0
        pids = {w.info["pid"] for w in backend._workers}
    assert os.getpid() not in pids and len(pids) == 2
    same_episodes(got, want)
    assert all(e.trajectory.sandbox == f"ray-{kind}" for e in got)
    expected = [inprocess_episode(embedded.environment(t.env_id), t, acts).reward
                for acts_of in (lambda t: t.reference_actions, lambda t: ()) for t in tasks
                for acts in [acts_of(t)]]
    assert [r.reward for r in rollouts] == expected and expected[:len(tasks)] == [1.0] * len(tasks)
    assert not backend._workers  # the pool closed every actor


def test_in_process_admission_is_the_wrapped_kinds(cluster, embedded):
    env = embedded.environments[0]
    untrusted = dataclasses.replace(env, trusted_class=None)
    strict = RaySandboxBackend("inprocess", check=False)
    strict.admit(env)
    with pytest.raises(UntrustedEnvironment, match="has no trusted in-process class"):
        strict.admit(untrusted)
    RaySandboxBackend("inprocess", trust="any", check=False).admit(untrusted)
    RaySandboxBackend("bwrap", check=False).admit(untrusted)  # jails admit everything
    with pytest.raises(ValueError, match="kind must be one of"):
        RaySandboxBackend("vm", check=False)


def test_a_hung_or_dead_sandbox_actor_is_cut_off_and_replaced(cluster, tokenizer, embedded):
    limits = SandboxLimits(wall_seconds=3.0)
    backend = RaySandboxBackend("inprocess", limits, num_cpus=0.5, grace_s=1.0)
    with WorkerPool(backend, 1) as workers:
        worker = workers.lease()
        assert worker.request({"op": "hello"}, 2.0)["ok"]
        os.kill(worker.info["pid"], signal.SIGSTOP)  # the node stops answering
        start = time.monotonic()
        with pytest.raises(SandboxError, match="no reply from the Ray sandbox actor") as hung:
            worker.request({"op": "hello"}, 1.0)
        assert time.monotonic() - start < 10
        assert (hung.value.kind, hung.value.retire) == ("wall_clock", True)
        workers.give_back(worker, healthy=False)
        worker = workers.lease()
        ray.kill(worker.actor)
        assert _wait_until_dead(worker.actor, 30, "hello")  # ray.kill is asynchronous
        with pytest.raises(SandboxError, match="Ray sandbox actor .* died") as dead:
            worker.request({"op": "hello"}, 2.0)
        assert (dead.value.kind, dead.value.retire) == ("crashed", True)
        workers.give_back(worker, healthy=False)
        # an episode whose actor is killed mid-way is a named sandbox failure, then the pool
        # goes on with a new actor
        task = next(t for t in embedded.tasks if len(t.reference_actions) >= 2)
        reference = reference_responder(embedded)

        def respond(prompt, request):
            if request.request_id.endswith("#0/turn1"):
                ray.kill(backend._workers[0].actor)
                assert _wait_until_dead(backend._workers[0].actor, 30, "hello")
            return reference(prompt, request)

        agent = AgentRunner(ScriptedBackend(tokenizer, respond), tokenizer, workers, embedded)
        broken = agent.run_episode(task, rollout_index=0)
        healthy = agent.run_episode(task, rollout_index=1)
        assert (workers.num_started, workers.num_replaced) == (4, 3)
    assert broken.end_reason == "sandbox_crashed" and "died" in broken.error
    assert broken.reward == 0.0
    assert (healthy.end_reason, healthy.reward) == ("answered", 1.0)
