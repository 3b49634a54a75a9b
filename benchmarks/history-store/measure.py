"""History shipping, measured: per prompt, the bytes a rollout worker receives (the serialised index)
and the bytes Redis keeps (compressed responses + index), and the seconds to store an epoch's
responses and to fetch a step's indexes, Redis vs memory, on a finished run's dumps.

Usage: python benchmarks/history-store/measure.py RUN_DIR OUT_DIR
Starts its own redis-server on a free loopback port (Debian's package). Medians of 5 repeats.
"""

from __future__ import annotations

import json
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rhymerl.api.history_keys import history_key_prefix
from rhymerl.workers import dumps
from rhymerl.workers.history.redis_store import RedisHistoryStore
from rhymerl.workers.history.store import MemoryHistoryStore

REPEATS = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(run: Path, out: Path) -> None:
    records = dumps.read_run(run)
    epochs = dumps.by_epoch(records)
    last, prev = max(epochs), max(epochs) - 1
    prompts = sorted({r.prompt_id for r in epochs[prev]})
    step_size = len({r.prompt_id for r in records if r.step == min(r.step for r in epochs[last])})
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed"
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        url = f"redis://127.0.0.1:{port}/0"
        rows = {"redis": {"store_s": [], "fetch_s": []}, "memory": {"store_s": [], "fetch_s": []}}
        for _ in range(REPEATS):
            for kind in ("redis", "memory"):
                store = (RedisHistoryStore.connect(url, history_key_prefix("bench", "history"))
                         if kind == "redis" else MemoryHistoryStore())
                if isinstance(store, RedisHistoryStore):
                    store.clear()
                t0 = time.perf_counter()
                store.update(epochs[prev])
                rows[kind]["store_s"].append(time.perf_counter() - t0)
                fetch = []
                for i in range(0, len(prompts), step_size):
                    t0 = time.perf_counter()
                    got = store.indexes_before(last, prompts[i:i + step_size])
                    fetch.append(time.perf_counter() - t0)
                    assert len(got) == len(prompts[i:i + step_size])
                rows[kind]["fetch_s"].append(statistics.median(fetch))
        redis_store = RedisHistoryStore.connect(url, history_key_prefix("bench", "history"))
        index_bytes = [len(redis_store.client.hget(redis_store.index_key(p), "blob") or b"") for p in prompts]
        kept = [sum(len(v) for v in redis_store.client.hgetall(redis_store.responses_key(p, prev)).values())
                for p in prompts]
        raw = [sum(4 * len(r.response_ids) for r in epochs[prev] if r.prompt_id == p) for p in prompts]
        memory_used = int(redis_store.client.info("memory")["used_memory"])
    finally:
        proc.terminate()
        proc.wait()
    result = {
        "run": str(run), "epoch_shipped": prev, "prompts": len(prompts), "prompts_per_step": step_size,
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "index_bytes_per_prompt_median": statistics.median(index_bytes),
        "response_bytes_per_prompt_raw_int32_median": statistics.median(raw),
        "response_bytes_per_prompt_kept_compressed_median": statistics.median(kept),
        "redis_used_memory_bytes": memory_used,
        **{f"{kind}_{k}_median": statistics.median(v) for kind, d in rows.items() for k, v in d.items()},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
