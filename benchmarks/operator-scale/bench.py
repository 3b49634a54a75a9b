"""The operator at 100 and 1,000 RLJobs against kmock (tests/operator/reconcile/kube_emulator.py): API calls per
minute at rest, after the jobs converged, and the operator process' memory, with the informer cache
(`cached`) and without it (every pass reads from the API, kopf watches the children: the operator before).

This process runs the API server (kmock) and stages the jobs' pods (one per StatefulSet replica, as the
StatefulSet controller would); the operator runs in a child process (`serve`, as `rhymerl operator`), so its
memory is its own. Usage: .venv/bin/python benchmarks/operator-scale/bench.py [COUNT[:cached|:uncached] ...]
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests" / "operator" / "reconcile"))

import aiohttp  # noqa: E402
import kmock  # noqa: E402
from kube_emulator import FIXTURE_AGENT, ApiServer  # noqa: E402

NS = "team-a"
REST_S = float(os.environ.get('REST_S', 60))
RESYNC_S = 30.0  # the operator's default
CAP_S = float(os.environ.get('CAP_S', 600))  # the longest wait for convergence
KEEP = 64  # requests kept in kmock's log (more than are ever in flight at once: 8 passes and 12 watches)


class Log:
    """Counts the operator's requests from kmock's request log and keeps that log short. kmock decides which
    reaction serves a request by scanning its whole log of requests, for every request: left to grow, that
    scan, not the operator, is what a run of hundreds of jobs measures (cProfile: 97% of the server's time
    at 300 jobs). Entries older than the last KEEP were answered long ago, so they go once counted."""

    def __init__(self, server: ApiServer) -> None:
        self.log = server._requests
        self.seen = 0  # entries at the front of the log already counted
        self.all = self.writes = self.job_gets = 0

    def count(self) -> None:
        for r in self.log[self.seen:]:
            if r.headers.get("User-Agent") == FIXTURE_AGENT:
                continue
            self.all += 1
            self.writes += r.method.value != "GET"
            self.job_gets += r.method.value == "GET" and "/rljobs/" in r.url.path
        self.seen = len(self.log)
        extra = len(self.log) - KEEP
        if extra > 0:
            del self.log[:extra]
            self.seen -= extra

    def take(self) -> tuple[int, int, int]:
        """Operator requests since the last call: (all, writes, RLJob GETs, which an uncached pass makes one of)."""
        self.count()
        out = self.all, self.writes, self.job_gets
        self.all = self.writes = self.job_gets = 0
        return out

    async def trim(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            self.count()


def operator_main(url: str, cached: bool) -> None:
    import kopf
    from kubernetes.aio.client import Configuration

    from rhymerl.operator.reconcile.run import serve, settings

    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=url, insecure=True)

    asyncio.run(serve([NS], metrics_port=None, health_port=None, resync_s=RESYNC_S,
                      configuration=Configuration(host=url), registry=registry, kopf_settings=settings(),
                      cached=cached))


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def run(jobs: int, cached: bool) -> dict[str, Any]:
    async with ApiServer() as server, kmock.Server(server):
        server.declare([NS])
        url = str(server.url).rstrip("/")
        log = Log(server)
        trimming = asyncio.get_running_loop().create_task(log.trim())
        drain = log.take

        async with aiohttp.ClientSession(base_url=str(server.url), headers={"User-Agent": FIXTURE_AGENT}) as http:
            for i in range(jobs):
                body = {"apiVersion": "rhymerl.io/v1alpha1", "kind": "RLJob",
                        "metadata": {"name": f"job-{i:04d}", "namespace": NS}, "spec": {}}
                async with http.post(f"/apis/rhymerl.io/v1alpha1/namespaces/{NS}/rljobs", json=body) as r:
                    assert r.status < 300, await r.text()
            drain()
            proc = multiprocessing.get_context("spawn").Process(target=operator_main, args=(url, cached), daemon=True)
            started = time.monotonic()
            proc.start()
            assert proc.pid is not None
            # converge: the children exist, then the pods, then no write by the operator for 10 s
            pods_made: set[str] = set()
            quiet_since = time.monotonic()
            total = 0
            converged = False
            while True:
                await asyncio.sleep(1.0)
                for sts in server.live("statefulsets", NS):
                    name = sts["metadata"]["name"]
                    if name in pods_made:
                        continue
                    pods_made.add(name)
                    template = sts["spec"]["template"]
                    for ordinal in range(int(sts["spec"].get("replicas") or 0)):
                        pod = {"apiVersion": "v1", "kind": "Pod",
                               "metadata": {"name": f"{name}-{ordinal}", "namespace": NS,
                                            "labels": dict(template["metadata"]["labels"]),
                                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                                                 "name": name, "uid": sts["metadata"]["uid"],
                                                                 "controller": True}]},
                               "spec": template["spec"],
                               "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                                          "containerStatuses": [{"name": c["name"], "ready": True, "restartCount": 0,
                                                                 "state": {"running": {}}}
                                                                for c in template["spec"]["containers"]]}}
                        async with http.post(f"/api/v1/namespaces/{NS}/pods", json=pod) as r:
                            assert r.status < 300, await r.text()
                n, writes, _ = drain()
                total += n
                if writes:
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since >= 10 and pods_made and \
                        len(pods_made) == len(server.live("statefulsets", NS)):
                    converged = True
                    break
                if time.monotonic() - started > CAP_S:
                    break
            converged_s = time.monotonic() - started
            # at rest: a full minute (two resyncs at the default 30 s)
            drain()
            cpu_before = cpu_s(proc.pid)
            await asyncio.sleep(REST_S)
            at_rest, rest_writes, passes = drain()
            cpu_rest = cpu_s(proc.pid) - cpu_before
            memory = rss_mib(proc.pid)
            proc.terminate()
            proc.join(10)
            trimming.cancel()
            return {"jobs": jobs, "cached": cached, "objects": sum(len(server.live(p, NS)) for p in
                                                                 ("statefulsets", "pods", "services", "configmaps")),
                    "converged": converged, "converge_s": round(converged_s, 1), "converge_calls": total,
                    "calls_per_min_at_rest": round(at_rest * 60.0 / REST_S, 1),
                    "writes_at_rest": rest_writes, "uncached_passes_at_rest": passes, "rss_mib": round(memory, 1),
                    "cpu_s_per_min_at_rest": round(cpu_rest * 60.0 / REST_S, 1)}


def main() -> None:
    """Arguments: job counts (each run without the cache, then with it), or COUNT:cached / COUNT:uncached for
    one run. Rows go into results.json, replacing a previous row of the same count and mode."""
    runs: list[tuple[int, bool]] = []
    for arg in sys.argv[1:] or ["100", "1000"]:
        count, _, mode = arg.partition(":")
        runs += [(int(count), c) for c in (False, True) if not mode or mode == ("cached" if c else "uncached")]
    path = HERE / "results.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    for jobs, cached in runs:
        row = asyncio.run(run(jobs, cached))
        print(json.dumps(row), flush=True)
        rows = [r for r in rows if (r["jobs"], r["cached"]) != (jobs, cached)] + [row]
        path.write_text(json.dumps(sorted(rows, key=lambda r: (r["jobs"], r["cached"])), indent=1) + "\n")


if __name__ == "__main__":
    main()
