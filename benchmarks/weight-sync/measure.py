"""Seconds to hand a policy version to rollout workers: the collective (a gloo broadcast,
workers/roles/weight_sync.py) vs Ray's object store, across processes on this machine.

    python benchmarks/weight-sync/measure.py OUT_DIR [--sizes embedded,100m,1b] [--receivers 2] [--repeats 3]

A sender actor holds random weights shaped like a Llama of each size (the 1B one in bfloat16, to
fit this machine's memory with every copy); `receivers` actors take each version: `collective`
from the moment the sender starts broadcasting until every receiver staged it; `object-store`
from `ray.put` on the sender until every receiver `ray.get` it. Medians of --repeats, the methods
interleaved, after one warm-up of each; every collective transfer forms its group anew, as in a
run. Writes results.json and weight_sync.png; prints the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import ray
import torch

from rhymerl.tools.bench.report import machine
from rhymerl.workers.roles.weight_layout import Group, Layout
from rhymerl.workers.roles.weight_sync import WeightReceiver, WeightSender

SIZES = {  # hidden, layers, intermediate, vocab, dtype
    "embedded": (128, 4, 352, 32, "float32"),
    "100m": (768, 12, 2048, 32000, "float32"),
    "1b": (2048, 16, 5632, 32000, "bfloat16"),
}


def weights(size: str) -> dict[str, torch.Tensor]:
    hidden, layers, inter, vocab, dtype = SIZES[size]
    dt = getattr(torch, dtype)
    out = {"model.embed_tokens.weight": torch.randn(vocab, hidden).to(dt)}
    for i in range(layers):
        for name, shape in (("q", (hidden, hidden)), ("k", (hidden, hidden)), ("v", (hidden, hidden)),
                            ("o", (hidden, hidden)), ("gate", (inter, hidden)), ("up", (inter, hidden)),
                            ("down", (hidden, inter))):
            out[f"model.layers.{i}.{name}.weight"] = torch.randn(*shape).to(dt)
    out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


@ray.remote(num_cpus=0)
class Sender:
    def __init__(self, size: str) -> None:
        self.weights = weights(size)
        self.channel = WeightSender()

    def where(self) -> tuple[str, int, Layout, int]:
        unique = {t.data_ptr(): t for t in self.weights.values()}
        return self.channel.host, self.channel.port, Layout.of(self.weights), sum(
            t.numel() * t.element_size() for t in unique.values())

    def send(self, group: Group) -> float:
        t0 = time.time()
        self.channel.send(group, self.weights)
        return t0

    def put(self) -> tuple[float, Any]:
        t0 = time.time()
        return t0, [ray.put(self.weights)]


@ray.remote(num_cpus=0)
class Receiver:
    def __init__(self) -> None:
        self.receiver = WeightReceiver()

    def receive(self, version: int, group: Group, rank: int, layout: Layout) -> float:
        self.receiver.receive(version, group, rank, layout)
        self.receiver.take(version, 0)
        return time.time()

    def fetch(self, box: list[Any]) -> float:
        got = ray.get(box[0])
        assert got
        return time.time()


def measure(size: str, receivers: int, repeats: int) -> dict[str, Any]:
    sender = Sender.remote(size)  # type: ignore[attr-defined]
    host, port, layout, nbytes = ray.get(sender.where.remote())
    rx = [Receiver.remote() for _ in range(receivers)]  # type: ignore[attr-defined]
    times: dict[str, list[float]] = {"collective": [], "object-store": []}
    for rep in range(-1, repeats):  # -1: a warm-up of each (connections, first allocations), not counted
        for method in (("collective", "object-store") if rep % 2 == 0 else ("object-store", "collective")):
            if method == "collective":
                group = Group(host, port, f"bench-{size}-{rep}", receivers + 1)
                done = [r.receive.remote(rep, group, i + 1, layout) for i, r in enumerate(rx)]
                start = ray.get(sender.send.remote(group))
            else:
                start, box = ray.get(sender.put.remote())
                done = [r.fetch.remote(box) for r in rx]
            if rep >= 0:
                times[method].append(max(ray.get(done)) - start)
            else:
                ray.get(done)
    for a in (sender, *rx):
        ray.kill(a)
    row: dict[str, Any] = {"size": size, "dtype": SIZES[size][4], "gb": round(nbytes / 1e9, 3), "receivers": receivers}
    for method, ts in times.items():
        row[f"{method}_s"] = round(statistics.median(ts), 3)
        row[f"{method}_gb_per_s"] = round(nbytes * receivers / 1e9 / statistics.median(ts), 2)
        row[f"{method}_runs"] = [round(t, 3) for t in ts]
    row["speedup"] = round(row["object-store_s"] / row["collective_s"], 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--sizes", default="embedded,100m,1b")
    parser.add_argument("--receivers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ray.init(num_cpus=4, include_dashboard=False, configure_logging=False, log_to_driver=False)
    rows = []
    for size in args.sizes.split(","):
        rows.append(measure(size, args.receivers, args.repeats))
        print(json.dumps(rows[-1]), flush=True)
    ray.shutdown()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"machine": machine(), "command": " ".join(sys.argv),
                                                       "rows": rows}, indent=1))
    print("| size | GB | receivers | collective s | object store s | collective GB/s | object store GB/s | speedup |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size']} ({r['dtype']}) | {r['gb']} | {r['receivers']} | {r['collective_s']} | "
              f"{r['object-store_s']} | {r['collective_gb_per_s']} | {r['object-store_gb_per_s']} | {r['speedup']} |")
    plot(rows, args.out / "weight_sync.png")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.8))
    ax = fig.subplots()
    sizes = [f"{r['size']}\n{r['gb']} GB" for r in rows]
    for i, method in enumerate(("collective", "object-store")):
        ax.bar([j + 0.4 * i for j in range(len(rows))], [r[f"{method}_s"] for r in rows], 0.4, label=method)
    ax.set_xticks([j + 0.2 for j in range(len(rows))], sizes)
    ax.set_yscale("log")
    ax.set_ylabel(f"seconds to {rows[0]['receivers']} receivers (median)")
    ax.set_title("one policy version to rollout workers, processes on one machine", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
