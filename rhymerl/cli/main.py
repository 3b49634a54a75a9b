"""`rhymerl`: validate and run RLJobs, print the CRD, run benchmarks.

Exit codes: 0 success, 1 a bug (a traceback), 2 a problem the user can fix (spec, YAML, data,
paths, a locked or damaged run folder, a failing reward function, a nan under on_nonfinite: fail)
printed as one plain `error: ...` line per problem (rhymerl.cli.report), 130 stopped by Ctrl-C, 143
stopped by SIGTERM (after a step, with its checkpoint; before the first step, with no folder left).
A run that lost what it runs on (a worker or Ray node for good, its restarts used up) is one plain
line too, with the command that resumes it, exit 1 (rhymerl.errors.RunFailed); a full disk, exit 2.
"""

from __future__ import annotations

import sys
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Annotated

import typer

from rhymerl.api import RLJob, load_job
from rhymerl.cli.bench import bench_app
from rhymerl.cli.model import model_app
from rhymerl.cli.report import INVALID, App, print_user_error
from rhymerl.cli.trace import trace_app
from rhymerl.errors import UserError, writable_folder
from rhymerl.tools.pretrain_recipe import DraftConfig, PretrainConfig
from rhymerl.workers.controller.stopping import TERMINATED, RunStopped, Terminated, stop_signals
from rhymerl.workers.runtime.fetch_deadline import Limits

INTERRUPTED = 130  # the shell's code for a command stopped by Ctrl-C (128 + SIGINT)
app = App(help="RL post-training (GRPO, DAPO) made fast by history.", no_args_is_help=True,
          pretty_exceptions_enable=False, add_completion=False)
app.add_typer(bench_app, name="bench")
app.add_typer(trace_app, name="trace")
app.add_typer(model_app, name="model")
PRETRAIN = PretrainConfig()  # the defaults, defined once
DRAFT = DraftConfig()
FETCH = Limits()


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"rhymerl {package_version('rhymerl')}")
        raise typer.Exit()


@app.callback()
def root(version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                               help="print the installed version and exit")] = False) -> None:
    """RL post-training (GRPO, DAPO) made fast by history."""


def _load(job: Path, overrides: list[str]) -> RLJob:
    """The job in `job`; a relative data.source is taken relative to the job file, so the resolved
    spec (and the run folder's copy of it) does not depend on the directory it was run from."""
    parsed = load_job(job, overrides)
    source = parsed.spec.data.source
    if not source.startswith("builtin:") and "://" not in source:  # a fetched source is no path
        parsed.spec.data.source = str((job.parent / source).resolve())
    return parsed


@app.command(epilog="Checks the spec, then every prompt against the model: UTF-8, characters the tokenizer has, "
             "prompt + maxResponseLength within the model's context. Paths that are not on this machine (a "
             "cluster job's) are noted, not checked. Prints one line per valid file.")
def validate(jobs: Annotated[list[Path], typer.Argument(help="RLJob YAML files")],
             set_: Annotated[list[str] | None, typer.Option("--set", help="override key.path=value (applies to "
                                                             "every file)")] = None) -> None:
    """Check RLJob files and their data sets: exit 0 when all are valid, 2 with every problem listed."""
    from rhymerl.workers.controller.preflight import preflight
    from rhymerl.workers.reward.verifiers import check_user_function

    invalid = 0
    for job in jobs:
        try:
            parsed = _load(job, set_ or [])
            checked = preflight(parsed, absent_ok=True)
            reward = parsed.spec.reward.function
            skipped = [*checked.skipped, *filter(None, [check_user_function(reward) if reward else None])]
        except UserError as exc:
            print_user_error(exc, str(job))
            invalid += 1
            continue
        note = f" (not checked here: {'; '.join(skipped)})" if skipped else ""
        typer.echo(f"{job}: valid RLJob '{parsed.metadata.name}'{note}")
    if invalid:
        raise typer.Exit(INVALID)


@app.command()
def crd(helm: Annotated[bool, typer.Option("--helm", help="as the Helm chart's template (charts/rhymerl/templates/"
                                           "crd.yaml), behind crds.enabled")] = False,
        transition: Annotated[bool, typer.Option("--transition", help="the CRD that bridges the upgrade from the "
                                                 "snake_case CRD: the spec kept as written, in either spelling "
                                                 "(docs/operations.md, \"Upgrading\")")] = False) -> None:
    """Print the RLJob CustomResourceDefinition (generated from the spec)."""
    from rhymerl.api.crd import crd_helm_template, crd_yaml

    if helm and transition:
        raise UserError("--transition is applied by hand, once, before the upgrade: not with --helm")
    sys.stdout.write(crd_helm_template() if helm else crd_yaml(transition))


@app.command(epilog="For the upgrade from the snake_case CRD (docs/operations.md, \"Upgrading\"): kubectl get rljobs "
             "-A -o yaml | rhymerl respell - | kubectl replace -f -. Values, metadata and status stay as they are; "
             "YAML comments do not survive.")
def respell(source: Annotated[str, typer.Argument(help="YAML file of RLJobs (one per document, or a List of "
                                                  "them), or - for standard input")]) -> None:
    """Print RLJobs with their fields camelCase, as the CRD names them."""
    import yaml

    from rhymerl.api.load import decode, safe_load_all
    from rhymerl.api.spelling import camel_keys

    out = []
    try:
        data = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
        for doc in safe_load_all(decode(data, source)):
            items = doc.get("items") if isinstance(doc, dict) and doc.get("kind") == "List" else None
            out.append({**doc, "items": [camel_keys(RLJob, i) for i in items]} if isinstance(items, list)
                       else camel_keys(RLJob, doc))
    except (OSError, yaml.YAMLError, ValueError) as exc:
        raise UserError(f"{source}: {exc}") from None
    sys.stdout.write(yaml.safe_dump_all(out, sort_keys=False))


@app.command(epilog="The children the operator would create, without ownerReferences (those need the RLJob's "
             "uid); with no metadata.namespace in the job they are in 'default'. Paths in the spec are the "
             "pods' paths and are not checked here.")
def render(job: Annotated[Path, typer.Argument(help="RLJob YAML file")],
           set_: Annotated[list[str] | None, typer.Option("--set", help="override key.path=value")] = None) -> None:
    """Print the Kubernetes objects of an RLJob as a multi-document YAML stream (GitOps, dry runs)."""
    from rhymerl.operator.manifests import desired, to_yaml

    sys.stdout.write(to_yaml(desired(load_job(job, set_ or []), owner=None)))


@app.command()
def run(
    job: Annotated[Path | None, typer.Argument(help="RLJob YAML file (omit with --resume)")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="override key.path=value")] = None,
    out: Annotated[Path | None, typer.Option(help="run folder (default runs/<name>-<time>)")] = None,
    resume: Annotated[Path | None, typer.Option(help="continue the run in this folder")] = None,
    accept_spec_change: Annotated[bool, typer.Option("--accept-spec-change",
                                                     help="with --resume: go on although the folder's spec.yaml "
                                                     "differs from the one its checkpoint was written under")] = False,
) -> None:
    """Run an RLJob on this machine (the local backend)."""
    if resume is None and job is None:
        raise UserError("give an RLJob file, or --resume RUN_DIR")
    if resume is not None and (job is not None or set_):
        raise UserError("--resume continues a run with its saved spec; do not pass a job file or --set with it")
    if accept_spec_change and resume is None:
        raise UserError("--accept-spec-change goes with --resume RUN_DIR")
    # the spec is read and checked before the runner (torch, the step loop, matplotlib: 2-3 s) is imported,
    # so a mistake in it is reported at once
    parsed = None if job is None else _load(job, set_ or [])
    from rhymerl.cli.local_run import run_local

    try:
        with stop_signals():  # from here on SIGTERM and Ctrl-C stop the run through every finally on the way out
            if parsed is None:
                assert resume is not None
                run_local(None, resume, accept_spec_change=accept_spec_change)
                return
            run_local(parsed, out)
    except KeyboardInterrupt:  # run_local has said where the run stands and how to resume it
        raise typer.Exit(INTERRUPTED) from None
    except (RunStopped, Terminated):  # SIGTERM: after a step, with its checkpoint, or at once; run_local said so
        raise typer.Exit(TERMINATED) from None


@app.command(epilog="The running step loop follows the request as its rounds go on: new workers take over started "
             "samples at once, leaving ones hand theirs back with their tokens. Works with backend local and ray. In "
             "a cluster scale the RLJob instead (kubectl scale rljob/NAME --replicas=N).")
def scale(
    run_dir: Annotated[Path, typer.Argument(help="the run folder of a running (or stopped) run")],
    rollout: Annotated[int, typer.Option("--rollout", help="rollout workers wanted, within the spec's "
                                         "rollout.min_replicas and max_replicas")],
) -> None:
    """Set how many rollout workers a run on this machine uses."""
    from rhymerl.workers.controller.scale import request_scale
    from rhymerl.workers.run_folder.run_dir import RunDir
    from rhymerl.workers.run_folder.run_lock import RunLocked

    run = RunDir(run_dir)
    job = run.load_job()
    if run.finished(job.spec.algorithm.epochs):
        raise UserError(f"{run_dir}: the run finished (step {run.recorded_steps()}): there is nothing to scale")
    try:
        with run.lock:
            live = False
    except RunLocked:
        live = True
    request_scale(run_dir, job, rollout)
    typer.echo(f"{run_dir}: {rollout} rollout workers wanted; "
               + ("the running run follows" if live else "the run is not running: it starts with them when resumed"))


@app.command("eval", epilog="Held-out prompts: --set data.source=FILE (or, for builtin:word-problems, --set "
             "data.split=heldout). Each policy answers the same sample keys, so rows differ only by the weights.")
def eval_(
    run_dir: Annotated[Path, typer.Argument(help="a run folder (its spec.yaml and checkpoints)")],
    overrides: Annotated[list[str] | None, typer.Option("--set", help="spec override key=value, e.g. the "
                                                       "prompts to evaluate on")] = None,
    samples: Annotated[int, typer.Option("--samples", min=1, help="responses per prompt")] = 4,
    checkpoints: Annotated[str, typer.Option("--checkpoints", help="'initial,last', 'all', or initial, last and "
                                             "step numbers, comma-separated")] = "initial,last",
    out: Annotated[Path | None, typer.Option("--out", help="folder for results.json, table.md, "
                                             "pass_at_1.png")] = None,
) -> None:
    """Score a run's policy before training and at its checkpoints: mean reward and pass@1 (torch engine)."""
    from rhymerl.tools.evaluate import main

    main(run_dir, overrides or [], samples, checkpoints, writable_folder(out) if out else None)


@app.command(epilog="Environment (set by the operator's pod template): RHYMERL_CONTROLLER (the Ray head, "
             "host:port), RHYMERL_DATA_DIR (the controller's run folder lives in DATA_DIR/run), RHYMERL_HTTP_PORT "
             "(/healthz, /readyz, /metrics), RHYMERL_POD_IP, RHYMERL_NAMESPACE; HOME is scratch space.")
def worker(
    role: Annotated[str, typer.Option("--role", help="controller, rollout, train, reward or history")],
    spec: Annotated[Path, typer.Option("--spec", help="the RLJob as the operator resolved it (its ConfigMap)")],
) -> None:
    """Run one pod of a job: the controller starts the Ray head and the steps, the others join it."""
    from rhymerl.cli.worker import serve

    raise typer.Exit(serve(role, spec))  # a RunFailed exits 1: the restarted pod resumes the run


@app.command(epilog="A pod's fetch step (the operator's init container) runs it with the job's sources; by hand it "
             "fetches a cluster job's model and data to this machine. s3:// reads AWS_ENDPOINT_URL and the AWS "
             "credentials from the environment, hf:// HF_TOKEN and HF_ENDPOINT. Each timeout is the option, else "
             "its environment variable (FETCH_CONNECT_TIMEOUT_S, FETCH_READ_TIMEOUT_S, FETCH_DEADLINE_S, "
             "FETCH_S3_INSTANCE_CREDENTIALS), else the default; a fetch that fails or runs out of time says why on "
             "one line, exits 2 and leaves no .partial folder.")
def fetch(
    into: Annotated[Path, typer.Option("--into", help="folder: the model goes to INTO/model, data to INTO/data/FILE")],
    model: Annotated[str | None, typer.Option("--model", help="s3://BUCKET/PREFIX, hf://ORG/NAME (or "
                                              "ORG/NAME@REVISION) or pvc://CLAIM/PATH")] = None,
    data: Annotated[str | None, typer.Option("--data", help="s3://BUCKET/KEY, hf://datasets/ORG/NAME/FILE "
                                             "(or ORG/NAME@REVISION/FILE) or pvc://CLAIM/PATH")] = None,
    connect_timeout: Annotated[float | None, typer.Option(
        "--connect-timeout", help=f"seconds to open a connection (default {FETCH.connect_s:g})")] = None,
    read_timeout: Annotated[float | None, typer.Option(
        "--read-timeout", help=f"seconds to wait for an answer's first byte, and between bytes (default "
                               f"{FETCH.read_s:g})")] = None,
    deadline: Annotated[float | None, typer.Option(
        "--deadline", help=f"seconds for the whole fetch, retries included (default {FETCH.deadline_s:g})")] = None,
    s3_instance_credentials: Annotated[bool, typer.Option(
        "--s3-instance-credentials", help="without S3 credentials in the environment, ask the instance metadata "
                                          "service (the node's role)")] = False,
    model_cache: Annotated[Path | None, typer.Option(
        "--model-cache", help="a shared cache folder (the job's spec.model.cache claim): the model goes to "
                              "MODEL_CACHE/<key>, fetched once under a lock there")] = None,
) -> None:
    """Fetch a job's model and data once (a marker records the source; a second run skips what is there)."""
    from rhymerl.workers.runtime.fetch import fetch_all

    if model is None and data is None:
        raise UserError("give --model, --data or both")
    limits = Limits.from_env().overridden(connect_timeout, read_timeout, deadline, s3_instance_credentials)
    for line in fetch_all(into, model, data, limits=limits, model_cache=model_cache):
        typer.echo(line)


@app.command(epilog="The step budget is fixed, not timed: the same seed gives the same weights on the same "
             "torch build. The defaults made the shipped model (about 15 minutes on a 2-core CPU); with --draft, the "
             "shipped draft model (rhymerl/assets/tiny-arith-draft).")
def pretrain(
    out: Annotated[Path, typer.Option(help="model folder to write (weights, config, tokenizer, pretrain.json)")],
    draft: Annotated[bool, typer.Option("--draft", help="distil a small draft model (speculation.method: "
                                        "draft-model) from --teacher instead: KL to the teacher's next-token "
                                        "distributions on the SFT corpus")] = False,
    teacher: Annotated[str, typer.Option(help="--draft: the model distilled (a folder or builtin name)")] = DRAFT.teacher,
    layers: Annotated[int, typer.Option(min=1, help="--draft: transformer blocks of the draft")] = DRAFT.layers,
    steps: Annotated[int | None, typer.Option(min=1, help=f"optimizer steps [default: {PRETRAIN.steps}; --draft: "
                                              f"{DRAFT.steps}]", show_default=False)] = None,
    batch: Annotated[int, typer.Option(min=1, help="sequences per step (doubled in the short phase)")] = PRETRAIN.batch,
    lr: Annotated[float | None, typer.Option(min=0.0, help=f"peak learning rate (warm-up, then cosine) [default: "
                                             f"{PRETRAIN.lr}; --draft: {DRAFT.lr}]", show_default=False)] = None,
    max_ops: Annotated[int, typer.Option(min=1, help="longest arith chain trained on")] = PRETRAIN.max_ops,
    seed: Annotated[int, typer.Option(help="seed of the weights and the data")] = PRETRAIN.seed,
    threads: Annotated[int, typer.Option(min=0, help="torch threads (0: torch's default)")] = PRETRAIN.threads,
    short_steps: Annotated[int, typer.Option(min=0, help="first phase: steps on short chains only")] = PRETRAIN.short_steps,
    eval_every: Annotated[int | None, typer.Option(min=1, help=f"save and report progress every N steps [default: "
                                                   f"{PRETRAIN.eval_every}; --draft: {DRAFT.eval_every}]",
                                                   show_default=False)] = None,
) -> None:
    """Pretrain the embedded default model (SFT on worked arith-chain answers) from scratch, or with
    --draft distil its draft model."""
    import json

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from rhymerl.tools.pretrain import distill_draft, pretrain

    folder = writable_folder(out)
    console = Console(stderr=True)
    columns = (TextColumn("distil" if draft else "sft"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[metric]} {task.fields[loss]}"), TimeRemainingColumn())
    with Progress(*columns, console=console) as bar:
        def show(row: dict[str, float]) -> None:
            bar.console.print(json.dumps(row), markup=False, highlight=False)

        if draft:
            from rhymerl.workers.model.folder import model_dir

            recipe = DraftConfig(teacher, layers, steps or DRAFT.steps, batch, DRAFT.lr if lr is None else lr, max_ops,
                                 seed, threads, eval_every or DRAFT.eval_every)
            task = bar.add_task("distil", total=recipe.steps, metric="kl", loss="-")
            distill_draft(recipe, model_dir(teacher, field="--teacher"), folder,
                          on_step=lambda step, loss: bar.update(task, completed=step, loss=f"{loss:.4f}"), on_eval=show)
        else:
            cfg = PretrainConfig(steps or PRETRAIN.steps, batch, PRETRAIN.lr if lr is None else lr, max_ops, seed,
                                 threads, short_steps, eval_every or PRETRAIN.eval_every)
            task = bar.add_task("sft", total=cfg.steps, metric="loss", loss="-")
            pretrain(cfg, folder, on_step=lambda step, loss: bar.update(task, completed=step, loss=f"{loss:.4f}"),
                     on_eval=show)
    console.print(f"model written to {folder.resolve()}", markup=False, highlight=False)


@app.command("operator", epilog="Runs until SIGTERM or Ctrl-C. Run one replica (a Deployment with strategy "
             "Recreate, as the Helm chart does): kopf runs standalone, without leader election. Credentials: the "
             "pod's service account in a cluster, else ~/.kube/config. The RLJob CRD must be installed first.")
def operator_(
    namespace: Annotated[list[str] | None, typer.Option("--namespace", "-n", help="serve the RLJobs of this "
                                                        "namespace (repeat for more)")] = None,
    all_namespaces: Annotated[bool, typer.Option("--all-namespaces", "-A", help="serve the RLJobs of every "
                                                 "namespace (the default without --namespace)")] = False,
    metrics_port: Annotated[int, typer.Option(min=0, max=65535, help="Prometheus metrics on :PORT/metrics "
                                              "(0: off)")] = 9090,
    health_port: Annotated[int, typer.Option(min=0, max=65535, help="liveness endpoint :PORT/healthz "
                                             "(0: off)")] = 8080,
    resync_seconds: Annotated[float, typer.Option(min=1.0, help="run a pass of every job this often (from the "
                                                  "watches' cache), repairing what events missed")] = 30.0,
) -> None:
    """Run the Kubernetes operator: reconcile RLJobs into StatefulSets, keep their status and conditions."""
    import asyncio
    import logging

    from rhymerl.errors import OptionError
    from rhymerl.operator.reconcile.run import serve

    if namespace and all_namespaces:
        raise OptionError("give --namespace NS (one or more) or --all-namespaces, not both")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # one line per handled event otherwise
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    asyncio.run(serve(list(namespace) if namespace else None, metrics_port=metrics_port or None,
                      health_port=health_port or None, resync_s=resync_seconds))


if __name__ == "__main__":
    app()
