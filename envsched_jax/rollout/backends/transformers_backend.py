"""transformers ``generate`` behind the backend interface: the baseline a user would write.

``TransformersBackend(model_dir)`` loads a safetensors folder with
``AutoModelForCausalLM`` (torch, CPU or CUDA) and serves requests with static batching: an engine
thread takes up to ``max_batch`` queued requests that share sampling settings, left-pads their
prompts, runs one ``model.generate`` call, and resolves them when the whole batch is done (so a
short request waits for the longest in its batch, and nothing joins a batch once it runs: the
contrast with the continuous-batching backends is the point of the benchmark).

Log-probs: ``generate(output_logits=True)`` returns the raw (unprocessed) logits of every step;
their log-softmax at the sampled token is the raw log-prob :mod:`.base` asks for. Seeds: torch's
sampling in a batch shares one generator, so per-request seeds are not honoured (the batch is
seeded with its first request's seed): sampled tokens depend on the batch's composition.
Weights: ``update_weights`` reloads the folder (requests already running finish first).
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time

from envsched_jax.rollout.backends.base import Completion, GenerationRequest


class TransformersBackend:
    name = "transformers"

    def __init__(self, model_dir: str, *, max_batch: int = 16, max_context: int = 2048,
                 pad_token_id: int = 0, device: str | None = None):
        import torch

        self._torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.max_batch = max_batch
        self.max_context = max_context
        self.pad_token_id = pad_token_id
        self._lock = threading.Lock()
        self._load(model_dir)
        self._queue: queue.Queue = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="transformers-backend",
                                        daemon=True)
        self._thread.start()

    def _load(self, model_dir: str) -> None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=self._torch.float32)
        # Only a request's own stop tokens end it (as in the other backends), never the
        # checkpoint's generation config.
        model.generation_config.eos_token_id = None
        self.model = model.to(self.device).eval()

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future[Completion]:
        future: concurrent.futures.Future[Completion] = concurrent.futures.Future()
        if self._closed:
            future.set_result(Completion.failed("the transformers backend is closed"))
        elif len(request.prompt_ids) >= self.max_context:
            future.set_result(Completion.failed(
                f"prompt of {len(request.prompt_ids)} tokens leaves no room under max_context "
                f"{self.max_context}"))
        else:
            self._queue.put((request, future, time.monotonic()))
        return future

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            deferred = []
            while len(batch) < self.max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                same = (nxt[0].sampling, nxt[0].stop_token_ids) == \
                    (item[0].sampling, item[0].stop_token_ids)
                (batch if same else deferred).append(nxt)
            for d in deferred:
                self._queue.put(d)
            try:
                with self._lock:
                    results = self._generate([r for r, _, _ in batch])
            except Exception as err:  # the whole batch fails, named
                results = [Completion.failed(f"{type(err).__name__}: {err}")] * len(batch)
            for (_, future, submitted), completion in zip(batch, results):
                future.set_result(Completion(completion.token_ids, completion.logprobs,
                                             completion.finish_reason, completion.error,
                                             time.monotonic() - submitted))

    def _generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        torch = self._torch
        first = requests[0]
        width = max(len(r.prompt_ids) for r in requests)
        ids = torch.full((len(requests), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for row, r in enumerate(requests):
            ids[row, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[row, width - len(r.prompt_ids):] = 1
        budget = min(first.sampling.max_new_tokens, self.max_context - width)
        s = first.sampling
        kwargs = dict(do_sample=not s.greedy, max_new_tokens=budget, output_logits=True,
                      return_dict_in_generate=True, pad_token_id=self.pad_token_id,
                      eos_token_id=list(first.stop_token_ids) or None)
        if not s.greedy:
            kwargs.update(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)  # 0: all
        torch.manual_seed(first.seed)
        with torch.no_grad():
            out = self.model.generate(input_ids=ids.to(self.device),
                                      attention_mask=mask.to(self.device), **kwargs)
        new = out.sequences[:, width:].cpu()
        logps = torch.stack([torch.log_softmax(step.float(), dim=-1) for step in out.logits],
                            dim=1).cpu()
        stops = set(first.stop_token_ids)
        results = []
        for row, r in enumerate(requests):
            tokens, logprobs, reason = [], [], "length"
            for i, token in enumerate(new[row].tolist()):
                tokens.append(token)
                logprobs.append(float(logps[row, i, token]))
                if token in stops:
                    reason = "stop"
                    break
            if reason == "length" and len(tokens) > r.sampling.max_new_tokens:
                tokens, logprobs = tokens[:r.sampling.max_new_tokens], logprobs[:r.sampling.max_new_tokens]
            results.append(Completion(tuple(tokens), tuple(logprobs), reason))
        return results

    def update_weights(self, params_dir: str) -> float:
        start = time.perf_counter()
        with self._lock:
            self._load(params_dir)
        return time.perf_counter() - start

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join(timeout=30)
