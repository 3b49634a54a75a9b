"""Hugging Face models as policies: their tokenizers behind the loop's interface, transformers as the
trainer, checkpoints that are Hugging Face folders."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from hf_models import write_model, write_tokenizer
from jobs import make_job

from rhymerl.api import SpecError
from rhymerl.api.algorithm import AlgorithmSpec
from rhymerl.api.inputs import ModelSpec
from rhymerl.workers import dumps
from rhymerl.workers.controller.preflight import preflight
from rhymerl.workers.model.folder import ModelError, model_dir
from rhymerl.workers.model.hf_policy import HfPolicy, load_hf_policy
from rhymerl.workers.model.hf_tokenizer import HfTokenizer
from rhymerl.workers.model.registry import load_policy
from rhymerl.workers.model.tokenizer import CharTokenizer, load_tokenizer
from rhymerl.workers.run_folder.loop_state import LoopState
from rhymerl.workers.run_folder.run_dir import RunDir
from rhymerl.workers.task.prompts import DataError
from rhymerl.workers.train.trainer import Trainer, TrainSample


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("qwen2"), "qwen2")


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("llama"), "llama")


def test_a_llama_tokenizer_puts_bos_before_a_prompt_and_a_qwen2_tokenizer_nothing(tmp_path: Path) -> None:
    write_tokenizer(tmp_path / "llama", "llama")
    write_tokenizer(tmp_path / "qwen2", "qwen2")
    llama, qwen = load_tokenizer(tmp_path / "llama"), load_tokenizer(tmp_path / "qwen2")
    assert isinstance(llama, HfTokenizer) and isinstance(qwen, HfTokenizer)
    # ids: 3 specials, then "\n" (3), " " (4), ... so "1" is 3 + 1 + 17 = 21
    assert llama.prompt_ids("1+1") == [1, 21, 15, 21] and llama.encode("1+1") == [21, 15, 21]
    assert qwen.prompt_ids("1+1") == [21, 15, 21]
    assert (llama.eos_id, llama.pad_id) == (2, 2) and (qwen.eos_id, qwen.pad_id) == (0, 0)
    assert llama.decode([1, 21, 15, 21, 2]) == "1+1"  # special tokens left out
    assert llama.vocab_size == 3 + 96


def test_the_rhymerl_character_tokenizer_is_still_told_apart_from_a_hugging_face_one() -> None:
    tok = load_policy(ModelSpec())[1]
    assert isinstance(tok, CharTokenizer) and tok.prompt_ids("1+1") == [1, 21, 15, 21]
    assert tok.stop_ids == [tok.eos_id]


def test_a_character_the_tokenizer_lacks_is_found_with_or_without_an_unknown_token(tmp_path: Path) -> None:
    write_tokenizer(tmp_path / "llama", "llama")  # has <unk>: 'é' becomes it
    write_tokenizer(tmp_path / "qwen2", "qwen2")  # has none: 'é' is dropped
    for family in ("llama", "qwen2"):
        tok = load_tokenizer(tmp_path / family)
        assert tok.unknown("ab café 1") == 6
        assert tok.unknown("a b  c\n1+2=3") is None


def test_the_eos_token_comes_from_generation_config_when_the_tokenizer_config_names_none(tmp_path: Path) -> None:
    write_tokenizer(tmp_path, "qwen2")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    tok = load_tokenizer(tmp_path)
    assert tok.eos_id == 2 and tok.pad_id == 2
    assert tok.stop_ids == [2, 0]  # an instruct model's end tokens all end a response


def test_an_instruct_models_end_of_turn_ends_a_response_beside_its_eos(tmp_path: Path) -> None:
    write_tokenizer(tmp_path, "qwen2")  # eos <|endoftext|> (0) in tokenizer_config.json
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))  # <|im_end|> is 2
    tok = load_tokenizer(tmp_path)
    assert tok.eos_id == 0 and tok.stop_ids == [0, 2]


def test_a_folder_without_an_end_of_sequence_token_is_refused_naming_where_to_put_one(tmp_path: Path) -> None:
    write_tokenizer(tmp_path, "qwen2")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ModelError, match=r"no end-of-sequence token .*eos_token in tokenizer_config\.json"):
        load_tokenizer(tmp_path)


def test_a_special_token_missing_from_the_vocabulary_is_named_with_its_file(tmp_path: Path) -> None:
    write_tokenizer(tmp_path, "qwen2")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end|>"}))
    with pytest.raises(ModelError, match=r"tokenizer_config.json: eos_token '<\|end\|>' is not a token"):
        load_tokenizer(tmp_path)


def test_the_torch_engine_with_a_transformers_model_is_refused_at_rollout_engine() -> None:
    with pytest.raises(SpecError) as info:
        make_job("model.implementation=transformers", base="defaults")
    assert [p.path for p in info.value.problems] == ["spec.rollout.engine"]
    make_job("model.implementation=transformers", "rollout.engine=vllm", base="defaults")


def _samples(vocab: int) -> list[TrainSample]:
    g = torch.Generator().manual_seed(1)
    return [TrainSample(torch.randint(3, vocab, (3 + i,), generator=g).tolist(),
                        torch.randint(3, vocab, (5 + 2 * i,), generator=g).tolist(), advantage=(-1.0) ** i)
            for i in range(6)]


def test_training_the_embedded_model_through_transformers_moves_it_as_the_native_trainer_does() -> None:
    native, _ = load_policy(ModelSpec())
    hf, _ = load_policy(ModelSpec(implementation="transformers"))
    assert isinstance(hf, HfPolicy)
    before = {k: v.clone() for k, v in native.hf_state_dict().items()}
    stats, deltas = [], []
    for model in (native, hf):
        trainer = Trainer(model, AlgorithmSpec(group_size=2, prompts_per_step=3, max_grad_norm=1e9), 1.0)
        trainer.optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # the step is the gradient itself
        stats.append(trainer.step(_samples(native.vocab_size)))
        deltas.append({k: v - before[k] for k, v in model.hf_state_dict().items()})
    assert stats[0]["loss"] == pytest.approx(stats[1]["loss"], rel=1e-5)
    assert stats[0]["entropy"] == pytest.approx(stats[1]["entropy"], rel=1e-5)
    assert deltas[0].keys() == deltas[1].keys()
    for name, delta in deltas[0].items():
        assert float(delta.abs().max()) > 0, name
        assert torch.allclose(delta, deltas[1][name], atol=1e-6, rtol=1e-4), name


def test_a_qwen2_policy_trains_checkpoints_as_a_hugging_face_folder_and_restores_every_weight(
        qwen2: Path, tmp_path: Path) -> None:
    import transformers

    policy = load_hf_policy(qwen2)
    trainer = Trainer(policy, AlgorithmSpec(group_size=2, prompts_per_step=3, lr=1e-2), 1.0)
    trainer.step(_samples(99))
    run = RunDir(tmp_path / "run")
    dumps.write_step(run.path, 1, [])  # the step's records, which a checkpoint never runs ahead of
    run.append_metrics({"step": 1})
    folder = run.save_checkpoint(LoopState(step=1, epoch=1), policy, trainer.optimizer, keep_last=2)
    fresh = load_hf_policy(qwen2)
    restored = Trainer(fresh, AlgorithmSpec(group_size=2, prompts_per_step=3, lr=1e-2), 1.0)
    assert run.restore(fresh, restored.optimizer).step == 1
    ours = policy.hf_state_dict()
    for name, value in fresh.hf_state_dict().items():
        assert torch.equal(value, ours[name]), name
    assert any(not torch.equal(v, load_hf_policy(qwen2).hf_state_dict()[k]) for k, v in ours.items())
    # the checkpoint is a model folder transformers itself loads, with the trained weights
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
    tokens = torch.tensor([[21, 15, 21, 33]])
    with torch.no_grad():
        assert torch.allclose(theirs(tokens).logits, policy(tokens), atol=1e-5)


def test_a_checkpoint_of_another_model_is_set_aside_and_the_weights_stay_untouched(
        qwen2: Path, llama: Path, tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    other = load_hf_policy(llama)
    dumps.write_step(run.path, 1, [])
    run.append_metrics({"step": 1})
    run.save_checkpoint(LoopState(step=1, epoch=1), other, torch.optim.SGD(other.parameters(), lr=1.0), 2)
    policy = load_hf_policy(qwen2)
    before = copy.deepcopy(policy.hf_state_dict())
    assert run.restore(policy, torch.optim.SGD(policy.parameters(), lr=1.0)).step == 0
    assert all(torch.equal(v, before[k]) for k, v in policy.hf_state_dict().items())
    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == ["step_000001.damaged"]


def test_preflight_checks_prompts_against_a_hugging_face_tokenizer_and_context(qwen2: Path, tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2\\u00e9", "answer": "4"}\n')
    job = make_job(f"model.path={qwen2}", "model.implementation=transformers", "rollout.engine=vllm",
                   f"data.source={data}", "algorithm.max_response_length=64", base="defaults")
    with pytest.raises(DataError, match=r"data.jsonl:2: prompt: character 'é' \(U\+00E9\) at position 4"):
        preflight(job)
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    checked = preflight(job)
    assert checked.longest_prompt == 4  # Qwen2 puts nothing before a prompt
    assert checked.config is not None and checked.config.max_position_embeddings == 512


def test_the_embedded_models_tokenizer_is_a_hugging_face_one_that_encodes_as_rhymerls(tmp_path: Path) -> None:
    import transformers

    folder = model_dir("builtin:tiny-arith")
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    ours = load_tokenizer(folder)
    assert isinstance(ours, CharTokenizer)  # the character tokenizer itself, not a wrapper
    text = "a=12 ops: b-3 c*2\nb-3 12=9"
    assert theirs(text)["input_ids"] == ours.prompt_ids(text)
    assert (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id) == (1, 2, 0)
    assert theirs.decode([*ours.prompt_ids(text), 2], skip_special_tokens=True) == text
    # a folder from before the Hugging Face format still loads
    (tmp_path / "tokenizer.json").write_text(json.dumps({"type": "char", "vocab": CharTokenizer().vocab}))
    assert isinstance(load_tokenizer(tmp_path), CharTokenizer)


@pytest.mark.parametrize("implementation", ["native", "transformers"])
def test_logits_at_chosen_positions_are_those_rows_of_the_full_logits(qwen2: Path, implementation: str) -> None:
    model = load_policy(ModelSpec(path=str(qwen2), implementation=implementation))[0].double()  # type: ignore[arg-type]
    tokens = torch.randint(3, model.vocab_size, (3, 11), generator=torch.Generator().manual_seed(0))
    at = torch.tensor([[4, 5, 6, 0], [0, 0, 0, 0], [7, 8, 9, 10]])  # a response's positions, padded with 0
    with torch.no_grad():
        full, picked = model(tokens), model(tokens, at=at)
    assert picked.shape == (3, 4, full.shape[-1])
    torch.testing.assert_close(picked, torch.stack([full[r, at[r]] for r in range(3)]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("implementation", ["native", "transformers"])
def test_checkpointed_activations_give_the_same_gradient_as_kept_ones(qwen2: Path, implementation: str) -> None:
    model = load_policy(ModelSpec(path=str(qwen2), implementation=implementation))[0].double()  # type: ignore[arg-type]
    model.train()
    tokens = torch.randint(3, model.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    mlp = next(m for name, m in model.named_modules() if name.endswith("layers.0.mlp"))
    calls: list[int] = []
    forward = mlp.forward
    mlp.forward = lambda *args: calls.append(1) or forward(*args)  # (a recomputation runs no forward hooks)
    grads, runs = [], []
    for on in (False, True):
        model.zero_grad()
        model.checkpoint_activations(on)
        calls.clear()
        model(tokens, at=torch.tensor([[5, 6, 7], [2, 3, 8]])).log_softmax(-1)[..., 7].sum().backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
        runs.append(len(calls))
    assert runs == [1, 2]  # checkpointed: the layer ran again in the backward pass
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == len(list(model.parameters()))
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=0, atol=1e-12, msg=name)
