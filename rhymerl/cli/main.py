"""`rhymerl`: validate and run RLJobs, print the CRD, run benchmarks.

Exit codes: 0 success, 1 runtime failure, 2 invalid input (spec, YAML, data) with every problem
printed as `field.path: reason`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rhymerl.api import SpecError, load_job
from rhymerl.cli.bench import bench_app
from rhymerl.cli.trace import trace_app

app = typer.Typer(help="RL post-training (GRPO, DAPO) made fast by history.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
app.add_typer(bench_app, name="bench")
app.add_typer(trace_app, name="trace")
err = Console(stderr=True)

INVALID = 2


def _fail_spec(exc: SpecError) -> typer.Exit:
    err.print(f"[red]invalid RLJob[/] {exc.source}", highlight=False)
    for problem in exc.problems:
        err.print(f"  {problem}", highlight=False)
    return typer.Exit(INVALID)


@app.command()
def validate(job: Annotated[Path, typer.Argument(help="RLJob YAML file")],
             set_: Annotated[list[str] | None, typer.Option("--set", help="override key.path=value")] = None) -> None:
    """Check an RLJob file: exit 0 when valid, 2 with every problem listed."""
    try:
        parsed = load_job(job, set_ or [])
    except SpecError as exc:
        raise _fail_spec(exc) from None
    typer.echo(f"{job}: valid RLJob '{parsed.metadata.name}'")


@app.command()
def crd() -> None:
    """Print the RLJob CustomResourceDefinition (generated from the spec)."""
    from rhymerl.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())


@app.command()
def run(
    job: Annotated[Path | None, typer.Argument(help="RLJob YAML file (omit with --resume)")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="override key.path=value")] = None,
    out: Annotated[Path | None, typer.Option(help="run folder (default runs/<name>-<time>)")] = None,
    resume: Annotated[Path | None, typer.Option(help="continue the run in this folder")] = None,
) -> None:
    """Run an RLJob on this machine (the local backend)."""
    from rhymerl.operator.local import run_local
    from rhymerl.workers.controller.prompts import DataError

    if resume is None and job is None:
        err.print("give an RLJob file, or --resume RUN_DIR")
        raise typer.Exit(INVALID)
    if resume is not None and (job is not None or set_):
        err.print("--resume continues a run with its saved spec; do not pass a job file or --set with it")
        raise typer.Exit(INVALID)
    try:
        if resume is not None:
            run_local(None, resume)
            return
        assert job is not None
        parsed = load_job(job, set_ or [])
        source = parsed.spec.data.source
        if not source.startswith("builtin:"):
            # the resolved spec in the run folder must not depend on the directory it was run from
            parsed.spec.data.source = str((job.parent / source).resolve())
        run_local(parsed, out)
    except SpecError as exc:
        raise _fail_spec(exc) from None
    except (DataError, FileExistsError, FileNotFoundError, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False)
        raise typer.Exit(INVALID) from None


if __name__ == "__main__":
    app()
