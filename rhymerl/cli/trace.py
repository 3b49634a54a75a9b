"""`rhymerl trace ...`: workload traces for the scheduling simulator (export, synthesize, inspect).

Mounted by the main CLI as `rhymerl trace`. Exit codes follow rhymerl.cli.main: 2 for bad input
(a trace, dump or profile that cannot be read), with the file and line in the message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rhymerl.cli.report import App
from rhymerl.tools.bench.tables import print_table

trace_app = App(help="Workload traces (step,prompt_id,input_len,output_len) for `rhymerl bench schedule`.",
                no_args_is_help=True)


@trace_app.command("export")
def export(
    run_dir: Annotated[Path, typer.Argument(help="run folder with rollouts/step_*.jsonl")],
    out: Annotated[Path, typer.Option("-o", "--out", help="trace CSV to write")],
) -> None:
    """Write a run's rollout dumps as a workload trace CSV, one row per response."""
    from rhymerl.tools.traces.export import export_run
    from rhymerl.tools.traces.io import output_file

    n = export_run(run_dir, output_file(out))
    typer.echo(f"wrote {n} rows to {out}")


@trace_app.command("convert")
def convert(
    logs: Annotated[list[Path], typer.Argument(help="log files (JSONL), or folders of them ({step}.jsonl)")],
    out: Annotated[Path, typer.Option("-o", "--out", help="trace CSV to write")],
    source: Annotated[str, typer.Option("--from", help="log class: verl (veRL rollout_data_dir dumps, or packed "
                                        "per-step length lists) or agent (multi-turn responses with tool latency); "
                                        "docs/formats.md")],
    tokenizer: Annotated[Path | None, typer.Option("--tokenizer", help="verl logs of texts: the policy's tokenizer "
                                                   "folder (tokenizer.json), to count prompt and response "
                                                   "tokens")] = None,
) -> None:
    """Convert another system's rollout logs into a workload trace CSV, one row per response."""
    from rhymerl.tools.traces.convert import SOURCES
    from rhymerl.tools.traces.convert import convert as run_convert
    from rhymerl.tools.traces.io import TraceError, output_file

    if source not in SOURCES:
        raise TraceError(f"--from: {source!r} is not a log class; choose one of {', '.join(SOURCES)}")
    output_file(out)
    n = run_convert(source, logs, out, tokenizer)
    typer.echo(f"wrote {n} rows to {out}")


@trace_app.command("synth")
def synth(
    name: Annotated[str, typer.Argument(help="synthetic trace: math, code (recurring ids) or the held-out class "
                                        "dapo-math, vl-video, code-14b, search-agent (docs/scheduling.md)")],
    out: Annotated[Path, typer.Option("-o", "--out", help="trace CSV to write")],
    steps: Annotated[int | None, typer.Option("--steps", min=1, help="steps to generate (default: the "
                                              "preset's)")] = None,
    seed: Annotated[int, typer.Option("--seed", help="another seed draws another instance of the same "
                                      "shape")] = 0,
    no_ids: Annotated[bool, typer.Option("--no-ids", help="leave out the prompt_id column (as some systems "
                                         "do)")] = False,
    knobs: Annotated[list[str] | None, typer.Option("--set", help="KEY=VALUE override of a generator knob, e.g. "
                                                    "truncated_share=0.2 (repeat)")] = None,
) -> None:
    """Generate a synthetic trace calibrated to published workload figures (docs/scheduling.md)."""
    from rhymerl.tools.traces import synthetic, write_trace
    from rhymerl.tools.traces.io import output_file, turns_text
    from rhymerl.tools.traces.synthetic import parse_overrides

    output_file(out)
    overrides: dict[str, object] = {"seed": seed}
    if steps is not None:
        overrides["steps"] = steps
    overrides.update(parse_overrides(list(knobs or ()), option="--set"))
    tr = synthetic(name, **overrides)
    rows = zip(tr.step.tolist(), tr.prompt_id, tr.input_len.tolist(), tr.output_len.tolist(), strict=True)
    turns = [turns_text(*tr.turns.of_row(i)) for i in range(len(tr))] if tr.turns is not None else None
    n = write_trace(out, ((s, None if no_ids else p, i, o) for s, p, i, o in rows), turns=turns)
    typer.echo(f"wrote {n} rows to {out}")


@trace_app.command("stats")
def stats(
    source: Annotated[str, typer.Argument(help="trace CSV or synthetic:NAME")],
    groups: Annotated[list[int] | None, typer.Option("--groups", help="ranking groups for rank stability "
                                                     "(default: 8 and 16)")] = None,
) -> None:
    """Length distribution per step and cross-epoch rank stability (RhymeRL §6.1)."""
    import numpy as np

    from rhymerl.tools.traces import load_trace, rank_stability
    from rhymerl.tools.traces.progress import reading_bar

    with reading_bar(source) as progress:
        tr = load_trace(source, progress=progress)
    console = Console()
    t = Table(title=escape(f"{tr.name}: {len(tr)} responses, {tr.num_steps} steps, {tr.ids} prompt ids"))
    longest = int(tr.output_len.max())
    for col in ("step", "responses", "prompts", "median out", "p90 out", "max out", "at longest %", "mean in"):
        t.add_column(col, justify="right")
    for rows in tr.step_rows():
        out_len = tr.output_len[rows]
        step = int(tr.step[rows[0]])
        prompts = len({tr.prompt_id[i] for i in rows.tolist()})
        t.add_row(str(tr.source_steps[step - 1]), str(rows.size), str(prompts), f"{np.median(out_len):.0f}",
                  f"{np.percentile(out_len, 90):.0f}", str(int(out_len.max())),
                  f"{100 * np.mean(out_len == longest):.1f}", f"{tr.input_len[rows].mean():.0f}")
    print_table(console, t)
    console.print(tr.id_note(), markup=False, highlight=False, soft_wrap=True)
    if tr.turns is not None:
        console.print(tr.turns_note(), markup=False, highlight=False, soft_wrap=True)
    if tr.ids == "stable":
        for k in groups or [8, 16]:
            rep = rank_stability(tr, k)
            console.print(f"rank stability, {k} groups: {100 * rep.accurate:.1f}% of responses stay in their group "
                          f"or move down ({rep.pairs} epoch pairs, {rep.responses} responses)")
