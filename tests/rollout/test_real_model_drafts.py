"""On a real pretrained model (SmolLM2-135M-Instruct: grouped-query attention, a 49K-token vocabulary, its
chat template) the torch engine's speculation keeps plain decoding's tokens for every draft source: the
job's history, the history with the group, n-gram, a draft model, Fastest-of-N over them and a drafter
on a freed worker, with the same log-probabilities. float32, what rollout runs: on the native
attention kernel a token's logits do not depend on how many tokens its pass appends or who shares
it (workers/model/cached_attention.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.workers.model.policy import read_weights, save_weights
from rhymerl.workers.model.tokenizer import load_tokenizer
from rhymerl.workers.model.transformer import TinyLlama, load_model
from rhymerl.workers.rollout.draft_link import DraftStream, News
from rhymerl.workers.rollout.draft_model import DraftModelDrafts, load_draft_model
from rhymerl.workers.rollout.engine import DraftSource, TorchEngine
from rhymerl.workers.rollout.fastest_of_n import job_sources
from rhymerl.workers.rollout.generation import GenRequest, GenResult, SamplingParams
from rhymerl.workers.rollout.group_drafts import GroupDrafts
from rhymerl.workers.rollout.remote_drafts import DraftServer, RemoteDrafts
from rhymerl.workers.rollout.sampling import sample_key
from rhymerl.workers.rollout.speculators import DraftCapController, HistoryDrafts, NgramDrafts

pytestmark = pytest.mark.slow

QUESTIONS = ("What is 17 + 25?", "Mia has 4 boxes of 6 pencils. How many pencils does she have?",
             "Name three colors.")
DRAFT_LAYERS = 6
PARAMS = SamplingParams(temperature=1.0, seed=11, max_response_length=32)
SOURCES = ("history", "history-and-group", "ngram", "draft-model", "fastest-of-n", "freed-drafter")


@pytest.fixture(scope="module")
def policy(smollm2_folder: Path) -> TinyLlama:
    return load_model(smollm2_folder, torch.float32)


@pytest.fixture(scope="module")
def draft(smollm2_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> TinyLlama:
    """A layer-skip draft: the policy's first DRAFT_LAYERS blocks with its norm and head (same tokenizer)."""
    folder = tmp_path_factory.mktemp("draft")
    config = json.loads((smollm2_folder / "config.json").read_text())
    save_weights({k: v for k, v in read_weights(smollm2_folder).items()
                  if not k.startswith("model.layers.") or int(k.split(".")[2]) < DRAFT_LAYERS},
                 folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": DRAFT_LAYERS}))
    (folder / "tokenizer.json").write_bytes((smollm2_folder / "tokenizer.json").read_bytes())
    return load_draft_model(str(folder), smollm2_folder, torch.float32)


def _requests(folder: Path, epoch: int) -> list[GenRequest]:
    tok = load_tokenizer(folder)
    prompts = [tok.encode(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n") for q in QUESTIONS]
    return [GenRequest(p, sample_key(f"q{i}", epoch, k), f"q{i}") for i, p in enumerate(prompts) for k in range(2)]


class Link:
    """A freed worker's drafter in this process, answering at the verifier's next pass."""

    def __init__(self, server: DraftServer) -> None:
        self.server, self.reply = server, None  # type: DraftServer, list[DraftStream] | None

    def send(self, news: Sequence[News]) -> None:
        self.reply = self.server.exchange(news)

    def poll(self) -> list[DraftStream] | None:
        reply, self.reply = self.reply, None
        return reply

    def close(self) -> None: ...


def _source(name: str, indexes: dict[str, HistoryIndex], draft: TinyLlama) -> DraftSource:
    spec = SpeculationSpec(draft_model="a draft", freed_drafters=name == "freed-drafter")
    groups = GroupDrafts(spec, [f"q{i}" for i in range(len(QUESTIONS))])
    if name in ("history", "history-and-group"):
        return HistoryDrafts(spec, indexes, None, groups if name == "history-and-group" else None)
    if name == "ngram":
        return NgramDrafts(spec, None)
    if name == "draft-model":
        return DraftModelDrafts(spec, draft, None)
    if name == "fastest-of-n":
        return job_sources(spec, indexes, DraftCapController(spec), draft, groups)
    remote = RemoteDrafts(spec, None)
    remote.attach(Link(DraftServer(spec, draft)))
    return remote


@pytest.fixture(scope="module")
def epochs(smollm2_folder: Path, policy: TinyLlama) -> tuple[TorchEngine, dict[str, HistoryIndex], list[GenResult]]:
    """The engine, history indexes of epoch 1's responses, and epoch 2's plain responses."""
    engine = TorchEngine(policy, load_tokenizer(smollm2_folder).eos_id, max_batch_size=6)
    before = engine.generate(_requests(smollm2_folder, 1), PARAMS)
    indexes = {f"q{i}": HistoryIndex.build([(r.response_ids, 1.0) for r in before[2 * i: 2 * i + 2]])
               for i in range(len(QUESTIONS))}
    return engine, indexes, engine.generate(_requests(smollm2_folder, 2), PARAMS)


@pytest.mark.parametrize("name", SOURCES)
def test_every_draft_source_keeps_plain_decodings_tokens_on_a_real_model(
        smollm2_folder: Path, draft: TinyLlama, name: str,
        epochs: tuple[TorchEngine, dict[str, HistoryIndex], list[GenResult]]) -> None:
    engine, indexes, plain = epochs
    spec = engine.generate(_requests(smollm2_folder, 2), PARAMS, _source(name, indexes, draft))
    assert [(r.response_ids, r.logprobs) for r in spec] == [(r.response_ids, r.logprobs) for r in plain]
    assert len({tuple(r.response_ids) for r in plain}) == len(plain)  # real sampled text, not one answer
    assert sum(r.drafted for r in spec) > 0  # the source drafted: its drafts were verified, not skipped
    assert sum(r.accepted for r in spec) > 0
