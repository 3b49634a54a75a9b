"""`rhymerl operator` as a process: it finds the cluster through a kubeconfig, serves its namespace and
stops cleanly on SIGTERM (what Kubernetes sends when the operator's pod goes)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml
from local_servers import free_port
from operator_harness import Kube


@pytest.mark.asyncio
async def test_rhymerl_operator_serves_its_namespace_and_stops_cleanly_on_sigterm(kube: Kube, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "kmock", "cluster": {"server": str(kube.server.url).rstrip("/")}}],
        "users": [{"name": "someone", "user": {"token": "t"}}],
        "contexts": [{"name": "test", "context": {"cluster": "kmock", "user": "someone"}}],
    }))
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path), "PYTHONSAFEPATH": "1"}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    rhymerl = Path(sys.executable).parent / "rhymerl"
    await kube.create_job("team-a", "alpha")
    await kube.create_job("team-b", "elsewhere")
    proc = await asyncio.create_subprocess_exec(
        str(rhymerl), "operator", "--namespace", "team-a", "--metrics-port", str(free_port()),
        "--health-port", str(free_port()), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while ((kube.job("team-a", "alpha") or {}).get("status") or {}).get("phase") != "Running":
            assert proc.returncode is None, "the operator exited"
            assert time.monotonic() < deadline, "the job did not start running"
            await kube.cluster.step()
            await asyncio.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    output = (await proc.stdout.read()).decode() if proc.stdout else ""
    assert code == 0, output
    assert "Traceback" not in output
    assert kube.children("team-b", "elsewhere") == []  # not its namespace
    assert "status" not in (kube.job("team-b", "elsewhere") or {})


def test_rhymerl_operator_refuses_a_namespace_together_with_all_namespaces() -> None:
    from typer.testing import CliRunner

    from rhymerl.cli.main import app

    result = CliRunner().invoke(app, ["operator", "--namespace", "a", "--all-namespaces"])
    assert result.exit_code == 2
    assert "not both" in result.output
