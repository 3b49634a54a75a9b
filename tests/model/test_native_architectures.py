"""The native decoder holds the hub's Llama-family architectures (grouped-query attention, projection
biases, untied output layers, Llama 3's RoPE scaling): on the same weights its logits are
transformers', its KV-cached path computes what its full forward does, and what it cannot hold it
refuses naming config.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from hf_models import LLAMA3_ROPE, write_model

from rhymerl.workers.model import cached_attention
from rhymerl.workers.model.folder import ModelConfig, ModelError, check_native, read_config
from rhymerl.workers.model.hf_policy import load_hf_policy
from rhymerl.workers.model.policy import save_model
from rhymerl.workers.model.transformer import KVCache, TinyLlama, load_model

VARIANTS = {
    "llama-gqa-untied": ("llama", {}),
    "qwen2-biases-tied": ("qwen2", {}),
    "llama-all-biases-llama3-rope": ("llama", {"attention_bias": True, "mlp_bias": True, "rope_scaling": LLAMA3_ROPE}),
    "mistral-no-window": ("mistral", {"sliding_window": None}),
}
TOLERANCE = {torch.float64: 1e-6, torch.float32: 2e-5}
"""Largest |native - transformers| logit on these models (logits of order 0.1-1). In float64 what
differs is RoPE: transformers computes its angles in float32 whatever the model's dtype, the native
model in float64 (about 1e-7 apart); in float32 the two also sum in different orders."""


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    family, options = VARIANTS[request.param]
    return write_model(tmp_path_factory.mktemp(request.param), family, **options)


def _tokens(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 99, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_native_logits_are_transformers_logits_on_the_same_weights(variant: Path) -> None:
    tokens = _tokens(3, 96)  # past the scaled RoPE's original context of 64
    check_native(variant)
    for dtype, tolerance in TOLERANCE.items():
        with torch.inference_mode():
            ours = load_model(variant, dtype)(tokens)
            theirs = load_hf_policy(variant, dtype)(tokens)
        assert float(theirs.abs().max()) > 0.1  # the models say something: the comparison is not of zeros
        assert float((ours - theirs).abs().max()) <= tolerance, dtype


def test_the_kv_cached_path_computes_the_full_forwards_logits_with_grouped_heads(variant: Path) -> None:
    model = load_model(variant, torch.float64)
    assert model.cfg.kv_heads == 2 and model.cfg.num_attention_heads == 4
    prompt, block = _tokens(3, 9, seed=1), _tokens(3, 5, seed=2)
    counts = torch.tensor([5, 2, 1])
    cache = KVCache(model.cfg, 3, 32, torch.float64, torch.device("cpu"))
    with torch.inference_mode():
        model.prefill(prompt, torch.full((3,), 9), torch.arange(3), cache)
        cached = model.forward_cached(block, torch.full((3,), 9), cache, counts)
        full = model(torch.cat([prompt, block], dim=1))
    for row, n in enumerate(counts.tolist()):
        torch.testing.assert_close(cached[row, :n], full[row, 9: 9 + n], rtol=0, atol=1e-10)


def test_the_native_kernel_and_torch_attention_agree_on_a_grouped_query_model(
        variant: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_model(variant)
    prompt, block = _tokens(3, 7, seed=3), _tokens(3, 5, seed=4)
    logits = {}
    for native in (True, False):
        monkeypatch.setattr(cached_attention, "usable", lambda *_, native=native: native)
        cache = KVCache(model.cfg, 3, 40, torch.float32, torch.device("cpu"))
        assert cache.native is native and cache.v.shape[2] == 2  # one cached head per group
        with torch.inference_mode():
            model.prefill(prompt, torch.full((3,), 7), torch.arange(3), cache)
            logits[native] = model.forward_cached(block, torch.full((3,), 7), cache, torch.tensor([5, 3, 0]))
    torch.testing.assert_close(logits[True], logits[False], rtol=1e-5, atol=1e-5)


def test_a_native_model_saves_a_folder_transformers_loads_to_the_same_logits(variant: Path, tmp_path: Path) -> None:
    model = load_model(variant, torch.float64)
    names = set(model.hf_state_dict())
    assert names == set(load_hf_policy(variant).hf_state_dict())  # the same Hugging Face names, biases and head
    save_model(model, tmp_path)
    assert read_config(tmp_path) == read_config(variant)  # its config.json is the one it came from
    (tmp_path / "tokenizer.json").write_bytes((variant / "tokenizer.json").read_bytes())
    tokens = _tokens(2, 20, seed=5)
    with torch.inference_mode():
        again, before = load_hf_policy(tmp_path, torch.float64)(tokens), model(tokens)
    assert float((again - before).abs().max()) <= TOLERANCE[torch.float64]


def test_a_model_built_in_code_writes_the_options_it_has_into_its_config() -> None:
    data = {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64,
            "tie_word_embeddings": False, "attention_bias": True, "mlp_bias": True, "rope_scaling": LLAMA3_ROPE}
    cfg = ModelConfig.from_data(data)
    assert cfg.source == ""  # read from data, not a folder: the config is written from the options
    written = json.loads(TinyLlama(cfg).config_json())
    assert {k: written[k] for k in data} == data
    assert written["architectures"] == ["LlamaForCausalLM"]
    assert ModelConfig.from_data(written) == cfg


@pytest.mark.parametrize(("change", "why"), [
    ({"model_type": "gemma2"}, r"model_type is 'gemma2'; it holds llama, qwen2, mistral"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"its RoPE scaling is 'yarn'; it holds llama3's"),
    ({"model_type": "mistral", "sliding_window": 4096}, r"it uses sliding-window attention \(sliding_window 4096\)"),
    ({"hidden_act": "gelu"}, r"hidden_act is 'gelu'"),
])
def test_what_the_native_model_cannot_hold_is_refused_naming_config_json_and_the_way_out(
        tmp_path: Path, change: dict[str, object], why: str) -> None:
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, **change}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=rf"config\.json: rhymerl's native model cannot hold this model \({why}\); "
                                         r"set model\.implementation: transformers"):
        check_native(tmp_path)


REAL_TOLERANCE = 5e-4
"""Largest |native - transformers| float32 logit on SmolLM2-135M-Instruct, whose logits reach about 40
(measured 4.4e-5 on an AMD EPYC VM: float32 sums in a different order)."""


@pytest.mark.slow
def test_on_a_real_pretrained_model_native_logits_are_transformers_logits(smollm2_folder: Path) -> None:
    from rhymerl.workers.model.tokenizer import load_tokenizer

    tok = load_tokenizer(smollm2_folder)
    chat = "<|im_start|>user\nWhat is 17 + 25?<|im_end|>\n<|im_start|>assistant\n17 + 25 = 42. To check it, "
    tokens = torch.tensor([tok.encode(chat)])
    with torch.inference_mode():
        ours = load_model(smollm2_folder)(tokens)
        theirs = load_hf_policy(smollm2_folder)(tokens)
    assert float(theirs.abs().max()) > 10
    assert float((ours - theirs).abs().max()) <= REAL_TOLERANCE
    assert torch.equal(ours[0, -1].topk(5).indices, theirs[0, -1].topk(5).indices)
