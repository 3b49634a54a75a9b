"""The operator process (`rhymerl operator`): kopf, the API client, metrics and the health endpoint.

kopf runs standalone, without peering. With RHYMERL_LEADER_ELECTION=true (the chart's default) only the
holder of the Lease `rhymerl-operator` in RHYMERL_NAMESPACE reconciles (leader.py), so two replicas may run;
without it, ONE replica (a Deployment with strategy Recreate): two operators would both write. Nothing is lost across a restart: every pass reads the cluster fresh and
the failure count lives in the RLJob's status. Resources are discovered at start (kopf's scanning is
off, so the operator needs no permission on namespaces or CRDs): install the CRD before the operator.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

import kopf
from kubernetes.aio.client import ApiClient, Configuration
from prometheus_client import start_http_server

from rhymerl.errors import UserError
from rhymerl.operator.reconcile.cluster import Cluster
from rhymerl.operator.reconcile.handlers import Operator
from rhymerl.operator.reconcile.leader import LeaderElector
from rhymerl.operator.reconcile.metrics import Metrics
from rhymerl.operator.reconcile.redis_secret_rest import chart_redis_password

log = logging.getLogger(__name__)


async def load_configuration() -> Configuration:
    """The API server and credentials: the pod's service account in a cluster, else ~/.kube/config."""
    from kubernetes.aio import config

    configuration = Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException as in_cluster:
        try:
            await config.load_kube_config(client_configuration=configuration)
        except (config.ConfigException, OSError) as kubeconfig:
            raise UserError(f"no Kubernetes credentials: not in a cluster ({in_cluster}) and no usable kubeconfig "
                            f"({kubeconfig})") from None
    return configuration


def cluster_registry() -> kopf.OperatorRegistry:
    """A registry whose login finds credentials as the kubernetes client does (service account or kubeconfig)."""
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(kopf.login_via_client)
    return registry


def settings() -> kopf.OperatorSettings:
    out = kopf.OperatorSettings()
    out.posting.enabled = False  # kopf would post its own log lines as Events: writes for nothing
    out.scanning.disabled = True
    out.watching.server_timeout = 300
    out.watching.client_timeout = 330
    return out


async def serve(namespaces: list[str] | None, *, metrics_port: int | None = 9090, health_port: int | None = 8080,
                resync_s: float = 30.0, configuration: Configuration | None = None,
                registry: kopf.OperatorRegistry | None = None, stop_flag: asyncio.Event | None = None,
                ready_flag: asyncio.Event | None = None, kopf_settings: kopf.OperatorSettings | None = None,
                on_start: Callable[[Operator], Any] | None = None, cached: bool = True) -> None:
    """Serve the RLJobs of `namespaces` (None: every namespace) until `stop_flag` is set or a signal
    stops kopf. `registry`: where the handlers go (default: `cluster_registry()`)."""
    configuration = configuration or await load_configuration()
    metrics = Metrics()
    exporter = None
    if metrics_port is not None:
        exporter, _ = start_http_server(metrics_port, registry=metrics.registry)
        log.info("metrics on :%d/metrics", metrics_port)
    try:
        await _run(configuration, namespaces, metrics, resync_s=resync_s, health_port=health_port,
                   registry=registry, stop_flag=stop_flag, ready_flag=ready_flag, kopf_settings=kopf_settings,
                   on_start=on_start, cached=cached)
    finally:
        if exporter is not None:
            await asyncio.to_thread(exporter.shutdown)
            exporter.server_close()


async def _run(configuration: Configuration, namespaces: list[str] | None, metrics: Metrics, *, resync_s: float,
               health_port: int | None, registry: kopf.OperatorRegistry | None, stop_flag: asyncio.Event | None,
               ready_flag: asyncio.Event | None, kopf_settings: kopf.OperatorSettings | None,
               on_start: Callable[[Operator], Any] | None, cached: bool) -> None:
    async with ApiClient(configuration) as api, chart_redis_password(api):
        cluster = Cluster(api, on_write=metrics.wrote)
        elector = None
        if os.environ.get("RHYMERL_LEADER_ELECTION") == "true":
            if not os.environ.get("RHYMERL_NAMESPACE"):
                raise UserError("RHYMERL_LEADER_ELECTION=true needs RHYMERL_NAMESPACE: the namespace of the Lease")
            elector = LeaderElector(cluster, os.environ["RHYMERL_NAMESPACE"],
                                    os.environ.get("RHYMERL_POD_NAME") or socket.gethostname())
        op = Operator(cluster, namespaces, resync_s=resync_s, metrics=metrics, elector=elector, cached=cached)
        handlers = op.register(registry if registry is not None else cluster_registry())
        if on_start is not None:
            on_start(op)
        liveness = f"http://0.0.0.0:{health_port}/healthz" if health_port is not None else None
        try:
            await kopf.operator(registry=handlers, settings=kopf_settings or settings(), standalone=True,
                                clusterwide=namespaces is None, namespaces=namespaces or (),
                                liveness_endpoint=liveness, stop_flag=stop_flag, ready_flag=ready_flag)
        finally:
            await op.stop()
