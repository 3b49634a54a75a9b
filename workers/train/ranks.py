"""Data-parallel training across ranks: the process group, FSDP2 sharding, and what the ranks agree on.

The train role runs `train.replicas x max(train.resources.gpu, 1)` ranks (`api/roles.train_ranks`),
one process each, in one torch.distributed group: NCCL on GPUs, gloo on CPUs, the same code. Rank
0 opens the rendezvous (a TCPStore on a free port, so no port is chosen in advance), every rank
joins it. The model is sharded with FSDP2 (`fully_shard` on each transformer block, then the whole
model). Each rank's loss is already divided by the mini-batch's normalisers, fixed before the
mini-batch is split over ranks (objectives.aggregate), so the one-rank gradient is the sum of the
ranks' gradients: FSDP2 averages them, so each rank scales its loss by the rank count
(`Ranks.scale`; FSDP2's divide factor of 1 would say it directly, but gloo has no PREMUL_SUM).

FSDP2 all-gathers a block's weights in every forward and reduce-scatters its gradients in every
backward, so every rank must run the same number of passes: a rank with fewer micro-batches runs
idle passes (`Ranks.idle_loss`: the model on one token, times zero), and a retried micro-batch (a
non-finite loss left out under `on_nonfinite: skip`) is retried on every rank.

Checkpoints stay the one-rank format (model.safetensors under Hugging Face names, the optimiser's
state by parameter index): rank 0 gathers the full state and writes it, and a restore on any rank
count scatters it again (`full_state`, `load_full_state`). Unsharded on disk because the train
pods' data volumes are each pod's own (no shared filesystem a sharded write would need); rank 0
holds one full copy in host memory while saving.
"""

from __future__ import annotations

import datetime
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed import Store, TCPStore  # type: ignore[attr-defined]

TIMEOUT = datetime.timedelta(minutes=10)
"""How long a rank waits in a collective for the others (a rank that died ends the wait sooner)."""


@dataclass(frozen=True)
class Ranks:
    """This process's place in the train role's process group (world 1: no group)."""

    rank: int = 0
    world: int = 1

    @property
    def many(self) -> bool:
        return self.world > 1

    def scale(self, loss: Tensor) -> Tensor:
        """A rank's loss as FSDP2's averaged gradient must see it to give the summed one."""
        return loss * self.world if self.many else loss

    def any(self, flag: bool) -> bool:
        """Whether any rank's flag is set."""
        if not self.many:
            return flag
        t = torch.tensor([1.0 if flag else 0.0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)

    def most(self, n: int) -> int:
        if not self.many:
            return n
        t = torch.tensor([float(n)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def sums(self, values: dict[str, float]) -> dict[str, float]:
        """Each key summed over ranks (every rank passes the same keys)."""
        if not self.many or not values:
            return values
        keys = sorted(values)
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(t)
        return dict(zip(keys, t.tolist(), strict=True))

    def maxima(self, values: dict[str, float]) -> dict[str, float]:
        if not self.many or not values:
            return values
        keys = sorted(values)
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return dict(zip(keys, t.tolist(), strict=True))

    def gathered(self, items: list[Any]) -> list[Any]:
        """Every rank's items, in rank order."""
        if not self.many:
            return items
        out: list[list[Any] | None] = [None] * self.world
        dist.all_gather_object(out, items)
        return [x for part in out for x in (part or [])]

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.many:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


ONE_RANK = Ranks()


def share(sizes: list[int], rows: list[int], ranks: Ranks) -> list[int]:
    """This rank's rows of a mini-batch: the longest first, each to the rank with the fewest tokens
    so far (ties: the lowest rank), so ranks finish their passes together. The same on every rank."""
    if not ranks.many:
        return rows
    load = [0] * ranks.world
    mine = []
    for i in sorted(rows, key=lambda i: (-sizes[i], i)):
        r = min(range(ranks.world), key=lambda k: (load[k], k))
        load[r] += sizes[i]
        if r == ranks.rank:
            mine.append(i)
    return sorted(mine)


def listen() -> tuple[Store, str, int]:
    """Rank 0's rendezvous: a TCPStore on a free port of this host, and where the others reach it."""
    host = host_address()
    store = TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    return store, host, store.port


def join(ranks: Ranks, host: str, port: int, store: Store | None = None) -> None:
    """Join the train role's process group (rank 0 passes the store it listens on)."""
    store = store or TCPStore(host, port, is_master=False, timeout=TIMEOUT)
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, store=store, rank=ranks.rank, world_size=ranks.world, timeout=TIMEOUT)


def leave() -> None:
    """Leave the group together (a rank that left early would break the others' last collective)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def host_address() -> str:
    """This host's address as other hosts reach it (the pod IP on a cluster)."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
    except ImportError:
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: only the route's source address
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def shard(model: nn.Module) -> None:
    """FSDP2 over the ranks: each transformer block its own unit (its weights gathered only while it
    runs), the rest (embeddings, final norm, a tied output layer) the root's."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for lst in [m for m in model.modules() if isinstance(m, nn.ModuleList)]:
        for block in lst:
            fully_shard(block)
    fully_shard(model)
    assert isinstance(model, FSDPModule)


def idle_loss(model: nn.Module) -> Tensor:
    """A pass that keeps a rank in step with the others' collectives and adds nothing to a gradient."""
    device = next(model.parameters()).device
    out: Tensor = model(torch.zeros((1, 1), dtype=torch.int64, device=device))
    return out.sum() * 0.0


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The whole model's (and optimiser's, if given) state on rank 0, on the CPU (empty on the
    others): model tensors by parameter name, the optimiser's state by parameter index as a
    one-rank optimiser has it. Collective."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights: dict[str, Tensor] = get_model_state_dict(model, options=options)  # type: ignore[assignment]
    if optimizer is None:
        return weights, {}
    by_name = get_optimizer_state_dict(model, optimizer, options=options)
    return weights, _by_index(by_name, _names(model)) if by_name else {}


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict[str, Tensor],
                    optim_state: dict[str, Any]) -> None:
    """Rank 0's full model and optimiser state (as `full_state` gives them; the others pass empty
    dicts) scattered into every rank's shards. Collective."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, dict(weights), options=options)
    has_state = Ranks(dist.get_rank(), dist.get_world_size()).broadcast(bool(optim_state.get("state")))
    if has_state:
        set_optimizer_state_dict(model, optimizer, _by_name(optim_state, _names(model)) if optim_state else {},
                                 options=options)


def _names(model: nn.Module) -> list[str]:
    """Parameter names in the order an optimiser over `model.parameters()` numbers them."""
    return [name for name, _ in model.named_parameters()]


def _by_index(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    index = {n: i for i, n in enumerate(names)}
    return {"state": {index[n]: s for n, s in state["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]]}


def _by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"state": {names[int(i)]: s for i, s in state["state"].items()},
            "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]]}
