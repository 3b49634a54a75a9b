"""One train rank of tests/train/test_data_parallel.py, as its own process (torch.distributed on gloo).

    python dp_rank.py RANK WORLD PORT OUT SCENARIO [CHECKPOINT_IN]

Every rank trains the same fixed batch on a tiny model of fixed seed; rank 0 writes the full
weights, optimiser state and step statistics to OUT (torch.save). With CHECKPOINT_IN, the ranks
first load that full state (written by any rank count), then train.
"""

from __future__ import annotations

import math
import os
import sys

import torch

from rhymerl.api.algorithm import AlgorithmSpec
from rhymerl.workers.model.folder import ModelConfig
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.train import ranks as rk
from rhymerl.workers.train.trainer import Trainer, TrainSample

SCENARIOS: dict[str, dict[str, object]] = {
    # one update on the whole batch, micro-batches of unequal count per rank (a tight token budget)
    "single": {"budget": 40},
    # mini-batches, two PPO epochs (old log-probabilities from a first pass), a KL reference
    "ppo": {"budget": 10_000, "algo": {"ppo_epochs": 2, "mini_batch_size": 4, "kl_coef": 0.1}},
    # a sample whose loss is nan: left out under skip, on whichever rank holds it
    "skip": {"budget": 40, "algo": {"on_nonfinite": "skip"}, "nan": 3},
}


def model() -> TinyLlama:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=256)
    return TinyLlama(cfg).eval()


def samples(nan: int | None = None) -> list[TrainSample]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(8):
        prompt = torch.randint(3, 40, (3 + i,), generator=g).tolist()
        resp = torch.randint(3, 40, (5 + 3 * (i % 4),), generator=g).tolist()
        behaviour = [-3.5] * len(resp) if i != nan else [math.nan] * len(resp)
        out.append(TrainSample(prompt, resp, 1.0 if i % 2 == 0 else -1.0, f"sample {i}", behaviour))
    return out


def trainer(scenario: str, ranks: rk.Ranks) -> Trainer:
    spec = SCENARIOS[scenario]
    algo = AlgorithmSpec.model_validate({"group_size": 2, "prompts_per_step": 4, "lr": 1e-2,
                                         **dict(spec.get("algo", {}))})  # type: ignore[call-overload]
    correction = "token"  # a nan behaviour log-probability makes that sample's loss nan
    return Trainer(model(), algo, 1.0, micro_batch_tokens=int(str(spec["budget"])), correction=correction,
                   ranks=ranks)


def _full(t: torch.Tensor) -> torch.Tensor:
    """A gradient whole (an FSDP2 shard is a DTensor: gathered from every rank)."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t.detach().clone()


def main() -> None:
    rank, world, port, out, scenario = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    torch.set_num_threads(1)
    ranks = rk.Ranks(rank, world)
    store = None
    if rank == 0:
        store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                                           timeout=rk.TIMEOUT)
    rk.join(ranks, "127.0.0.1", port, store)
    t = trainer(scenario, ranks)
    if len(sys.argv) > 6:
        saved = torch.load(sys.argv[6], weights_only=True) if rank == 0 else {"weights": {}, "optimizer": {}}
        rk.load_full_state(t.model, t.optimizer, saved["weights"], saved["optimizer"])
    stats = t.step(samples(SCENARIOS[scenario].get("nan")))  # type: ignore[arg-type]
    grads = {name: _full(p.grad) for name, p in t.model.named_parameters() if p.grad is not None}
    weights, optimizer = rk.full_state(t.model, t.optimizer)
    if rank == 0:
        torch.save({"weights": weights, "optimizer": optimizer, "stats": stats, "grads": grads,
                    "skipped": t.skipped_samples}, out)
    rk.leave()


if __name__ == "__main__":
    main()
    # The results are on disk and the group is left. Skip the interpreter's teardown: destroying the
    # FSDP2 and gloo objects after the group is gone aborts now and then in torch's C++ destructors
    # ("terminate called without an active exception" with no Python frame, about 1 run in 80 on
    # two cores), which says nothing about the training this script checks.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
