"""`rhymerl bench ...`: side-by-side benchmarks that print tables and write plots.

Each benchmark's logic lives in rhymerl.tools.bench.<name>; this module only wires commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from rhymerl.cli.report import App
from rhymerl.errors import OptionError, writable_folder

bench_app = App(help="Benchmarks: tables and plots, measured side by side in one run.", no_args_is_help=True)


@bench_app.command("schedule", epilog="Progress (rows simulated of all policies' rows, rows/s) goes to stderr. "
                   "Time is linear in the trace's rows: about 16,000 rows/s over the 10 policies on a 2-core VM, so "
                   "2M rows take about 21 minutes (--policy or --steps for less); docs/scheduling.md, 'Large "
                   "traces'.")
def schedule(
    trace: Annotated[str, typer.Option("--trace", help="trace CSV (step,prompt_id,input_len,output_len) "
                                       "or synthetic:NAME (math, code; held-out class: dapo-math, vl-video, code-14b, "
                                       "search-agent)")] = "synthetic:math",
    workers: Annotated[int, typer.Option("--workers", min=1, help="rollout workers (data-parallel engines)")] = 16,
    groups: Annotated[int, typer.Option("--groups", min=1, help="HistoPipe ranking groups K")] = 8,
    steps: Annotated[int | None, typer.Option("--steps", min=1, help="steps to simulate after warm-up "
                                              "(default: all)")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="folder for results.json, table.md and Gantt "
                                             "PNGs")] = None,
    warmup: Annotated[int | None, typer.Option("--warmup", min=0, help="steps that only seed history (default: one "
                                               "epoch when prompt ids recur, else 0)")] = None,
    profile: Annotated[str | None, typer.Option("--profile", help="iteration profile JSON (default: H100/7B "
                                                "roofline)")] = None,
    policy: Annotated[list[str] | None, typer.Option("--policy", help="only these policies (equal always "
                                                     "runs)")] = None,
    tokens_per_pass: Annotated[float, typer.Option("--tokens-per-pass", min=1.0, help="speculation: tokens per "
                                                   "forward pass")] = 1.0,
    train_time: Annotated[float, typer.Option("--train-time", min=0.0, help="training seconds per step")] = 0.0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    synthetic: Annotated[list[str] | None, typer.Option("--synthetic", help="KEY=VALUE override of a synthetic "
                                                        "trace's generator, e.g. prompts_per_step=128, or seed=3 "
                                                        "for another instance")] = None,
) -> None:
    """Replay a workload trace under every rollout scheduling policy: table, Gantt plots, JSON."""
    from rich.console import Console

    from rhymerl.tools.bench.schedule import BenchConfig, main

    cfg = BenchConfig(trace=trace, workers=workers, groups=groups, steps=steps, warmup=warmup, profile=profile,
                      tokens_per_pass=tokens_per_pass, train_time_s=train_time, seed=seed,
                      policies=tuple(policy or ()), synthetic=tuple(synthetic or ()))
    main(cfg, writable_folder(out) if out else None, Console())


@bench_app.command("scale", epilog="Costs and assumptions: rhymerl/tools/bench/scale.py's docstring and "
                   "benchmarks/scale/results.md.")
def scale(
    out: Annotated[Path | None, typer.Option("--out", help="folder for results.json, table.md, scale.png")] = None,
    workers: Annotated[str, typer.Option("--workers", help="comma-separated rollout GPU counts")] = "16,64,256,1024",
    trace: Annotated[str, typer.Option("--trace", help="synthetic:NAME (math, code), scaled with the "
                                       "workers")] = "synthetic:math",
    steps: Annotated[int, typer.Option("--steps", min=2, help="steps simulated after one epoch of history")] = 8,
    train_time: Annotated[float, typer.Option("--train-time", min=0.0, help="training seconds per step")] = 60.0,
    weight_gb: Annotated[float, typer.Option("--weight-gb", min=0.0, help="weights sent to every rollout worker "
                                             "after each step, GB")] = 14.0,
    network: Annotated[list[str] | None, typer.Option("--network", help="price only these networks (rdma-100g, "
                                                      "ray-serialised; repeat), without the free-network "
                                                      "reference")] = None,
) -> None:
    """Step time and bubbles from 16 to 1,024 GPUs: the simulator with the runtime's pipeline, weight sync
    and history shipping priced by bandwidth."""
    from rich.console import Console

    from rhymerl.tools.bench.scale import BANDWIDTHS, ScaleConfig, main

    unknown = [n for n in network or () if n not in BANDWIDTHS]
    if unknown:
        raise OptionError(f"--network: unknown {', '.join(unknown)}; choose from {', '.join(BANDWIDTHS)}")
    cfg = ScaleConfig(trace=trace, workers=_ints("--workers", workers), steps=steps, train_time_s=train_time,
                      weight_bytes=weight_gb * 1e9, bandwidths=tuple(network) if network else tuple(BANDWIDTHS),
                      free_network=not network)
    main(cfg, writable_folder(out) if out else None, Console())


@bench_app.command("spot", epilog="Prices and preemption inputs, with their sources: rhymerl/tools/sim/spot.py's "
                   "docstring and benchmarks/spot/README.md.")
def spot(
    out: Annotated[Path | None, typer.Option("--out", help="folder for results.json, table.md and the plot")] = None,
    gpus: Annotated[str, typer.Option("--gpus", help="comma-separated fleet sizes (the elastic fleet's "
                                      "largest)")] = "16,64,256",
    trace: Annotated[list[str] | None, typer.Option("--trace", help="synthetic:NAME, scaled with the GPUs, or a "
                                                    "trace CSV as it is (repeat; default: math, code and the "
                                                    "held-out class)")] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="steps simulated (after one epoch of history where "
                                       "prompt ids recur)")] = 6,
    prompts_per_gpu: Annotated[int, typer.Option("--prompts-per-gpu", min=1, help="GRPO groups per GPU per "
                                                 "step")] = 4,
    train_time: Annotated[float, typer.Option("--train-time", min=0.0, help="training seconds per step")] = 60.0,
    on_demand: Annotated[float | None, typer.Option("--on-demand", min=0.0, help="on-demand $ per GPU-hour "
                                                    "(default: a public list price, see the epilog)")] = None,
    spot_price: Annotated[float | None, typer.Option("--spot", min=0.0, help="spot $ per GPU-hour")] = None,
    rate: Annotated[float, typer.Option("--preemptions", min=0.0, help="spot preemptions per GPU-hour")] = 0.25,
    grace: Annotated[float, typer.Option("--grace", min=0.0, help="seconds from a preemption notice until the "
                                         "GPU is gone")] = 120.0,
    missed: Annotated[float, typer.Option("--missed-notice", min=0.0, max=1.0, help="share of preemptions "
                                          "without a usable notice (in-progress tokens lost)")] = 0.1,
    replacement: Annotated[float, typer.Option("--replacement", min=0.0, help="seconds until a requested spot GPU "
                                               "has joined")] = 300.0,
    seed: Annotated[int, typer.Option("--seed", help="seeds the preemptions")] = 0,
    policy: Annotated[str | None, typer.Option("--policy", help="scheduling policy (default: the "
                                               "default's)")] = None,
    search: Annotated[bool, typer.Option("--search", help="evaluate the fleet-size recommendation against every "
                                         "fixed size 1..GPUS (one --gpus value), on-demand")] = False,
) -> None:
    """A step's seconds and dollars on a fixed on-demand, a fixed spot and an elastic spot fleet (simulated);
    with --search, the fleet-size recommendation against the best fixed size."""
    from rich.console import Console

    from rhymerl.algorithms.scheduling.factory import POLICIES
    from rhymerl.tools.bench.spot import TRACES, SpotConfig, main
    from rhymerl.tools.sim.spot import PreemptionModel, Prices

    sizes = _ints("--gpus", gpus)
    if any(n < 1 for n in sizes):
        raise OptionError("--gpus: fleet sizes must be >= 1")
    if search and len(sizes) != 1:
        raise OptionError("--search: give one --gpus value, the largest size searched")
    if policy is not None and policy not in POLICIES:
        raise OptionError(f"--policy: unknown '{policy}'; choose from {', '.join(POLICIES)}")
    prices = Prices(**{k: v for k, v in (("on_demand", on_demand), ("spot", spot_price)) if v is not None})
    model = PreemptionModel(rate_per_gpu_h=rate, grace_s=grace, missed_notice=missed, replacement_s=replacement,
                            seed=seed)
    cfg = SpotConfig(traces=tuple(trace) if trace else TRACES, gpus=sizes, prompts_per_gpu=prompts_per_gpu,
                     steps=steps, train_time_s=train_time, prices=prices, model=model, policy=policy, search=search)
    main(cfg, writable_folder(out) if out else None, Console())


@bench_app.command("drafters", epilog="Costs, acceptance and latency, with their sources: "
                   "benchmarks/freed-drafters/README.md.")
def drafters(
    out: Annotated[Path | None, typer.Option("--out", help="folder for results.json, table.md and the plot")] = None,
    trace: Annotated[list[str] | None, typer.Option("--trace", help="trace CSV or synthetic:NAME (repeat; default: "
                                                    "the held-in math and code)")] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, help="rollout workers")] = 16,
    groups: Annotated[int, typer.Option("--groups", min=1, help="HistoPipe ranking groups K")] = 8,
    steps: Annotated[int, typer.Option("--steps", min=1, help="steps to simulate after one epoch of history")] = 16,
    off_policy: Annotated[str, typer.Option("--off-policy", help="comma-separated off-policy steps (1: the "
                                            "default pipeline, 0: synchronous)")] = "1,0",
    acceptance: Annotated[str, typer.Option("--acceptance", help="comma-separated per-token draft acceptance "
                                            "probabilities")] = "0.3,0.5,0.714,0.9",
    latency_ms: Annotated[str, typer.Option("--latency-ms", help="comma-separated message latency per drafted "
                                            "pass, ms")] = "0,1,5,20",
    window: Annotated[int, typer.Option("--window", min=1, help="draft tokens per verify pass")] = 4,
    max_batch: Annotated[int, typer.Option("--max-batch", min=1, help="most samples one drafter drafts for")] = 16,
    consolidate: Annotated[str, typer.Option("--consolidate", help="comma-separated off/on: runs without and with "
                                             "emptying a straggling worker onto another so that it drafts")] = "off,on",
) -> None:
    """The default scheduler's tail with and without drafters on freed workers (SPECATOR §4.2), simulated
    over a grid of draft acceptance and message latency."""
    from rich.console import Console

    from rhymerl.tools.bench.drafters import TRACES, DraftersConfig, main

    probs = _floats("--acceptance", acceptance)
    if any(not 0.0 <= p < 1.0 for p in probs):
        raise OptionError("--acceptance: probabilities in [0, 1)")
    lat = _floats("--latency-ms", latency_ms)
    if any(v < 0.0 for v in lat):
        raise OptionError("--latency-ms: not negative")
    ops = _ints("--off-policy", off_policy)
    if any(v < 0 for v in ops):
        raise OptionError("--off-policy: not negative")
    modes = consolidate.split(",")
    if any(m not in ("off", "on") for m in modes):
        raise OptionError(f"--consolidate: 'off', 'on' or both, comma-separated; got '{consolidate}'")
    cfg = DraftersConfig(traces=tuple(trace) if trace else TRACES, workers=workers, groups=groups, steps=steps,
                         off_policy=ops, acceptance=probs, latency_ms=lat, window=window, max_batch=max_batch,
                         consolidate=tuple(m == "on" for m in modes))
    main(cfg, writable_folder(out) if out else None, Console())


def _floats(option: str, text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise OptionError(f"{option}: '{text}' is not a comma-separated list of numbers") from None


def _ints(option: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise OptionError(f"{option}: '{text}' is not a comma-separated list of integers") from None


@bench_app.command("engine-profile")
def engine_profile(
    out: Annotated[Path, typer.Option("--out", help="folder for profile.json, table.md, profile.png")],
    model: Annotated[str, typer.Option("--model", help="'builtin:tiny-arith' or a rhymerl model folder (a run's "
                                       "checkpoint)")] = "builtin:tiny-arith",
    dtype: Annotated[str, typer.Option("--dtype", help="float32, bfloat16 or float16")] = "float32",
    device: Annotated[str, typer.Option("--device", help="cpu or cuda[:N]")] = "cpu",
    batch_sizes: Annotated[str, typer.Option("--batch-sizes", help="comma-separated, increasing")] = "1,4,16,64,128,256",
    contexts: Annotated[str, typer.Option("--contexts", help="comma-separated context lengths, increasing, below "
                                          "the model's positions")] = "64,256,512,1000",
    prefill_tokens: Annotated[int, typer.Option("--prefill-tokens", help="prompt length the prefill cost per token "
                                                "is measured at")] = 512,
    rounds: Annotated[int, typer.Option("--rounds", min=1, help="sweeps over the grid; each cell keeps its fastest "
                                        "timing")] = 10,
) -> None:
    """Measure the torch engine's decode iteration time per (batch, context): a simulator profile."""
    from rich.console import Console

    from rhymerl.tools.bench.engine_profile import EngineProfileConfig, main

    cfg = EngineProfileConfig(model, dtype, device, _ints("--batch-sizes", batch_sizes),
                              _ints("--contexts", contexts), prefill_tokens, rounds)
    main(cfg, writable_folder(out), Console())


@bench_app.command("drafter")
def drafter(
    out: Annotated[Path, typer.Option("--out", help="folder for results.json and drafter.png")] = Path(
        "runs/bench-drafter"),
    dumps: Annotated[Path | None, typer.Option("--dumps", help="run folder with rollouts/ dumps (default: "
                                               "synthetic histories)")] = None,
    prompts: Annotated[int, typer.Option("--prompts", min=1, help="synthetic: prompts")] = 4,
    responses: Annotated[int, typer.Option("--responses", min=1, help="synthetic: responses per prompt")] = 16,
    length: Annotated[int, typer.Option("--length", min=8, help="synthetic: tokens per response")] = 16384,
    batch: Annotated[list[int] | None, typer.Option("--batch", min=1, help="batch sizes (repeat the "
                                                    "option; default 1 64 256 1024)")] = None,
    depth: Annotated[list[int] | None, typer.Option("--arctic-depth", min=1, help="arctic max_tree_depth "
                                                    "(repeat; default 24 64)")] = None,
    steps: Annotated[int | None, typer.Option("--steps", min=1, help="timed steps per batch size (default "
                                              "max(30, 4096 / batch))")] = None,
    no_arctic: Annotated[bool, typer.Option("--no-arctic", help="skip arctic-inference")] = False,
    seed: Annotated[int, typer.Option("--seed")] = 0,
) -> None:
    """HistoSpec index vs arctic-inference's suffix cache vs n-gram: build, memory, draft latency."""
    from rich.console import Console

    from rhymerl.tools.bench.drafter import DrafterBenchConfig, run

    cfg = DrafterBenchConfig(prompts=prompts, responses=responses, length=length, seed=seed, dumps=dumps,
                             batches=tuple(batch or (1, 64, 256, 1024)), arctic_depths=tuple(depth or (24, 64)),
                             iterations=steps, arctic=not no_arctic)
    run(cfg, writable_folder(out), Console())


@bench_app.command("acceptance")
def acceptance(
    dumps: Annotated[Path, typer.Option("--dumps", help="run folder with rollouts/ dumps")],
    out: Annotated[Path, typer.Option("--out", help="folder for results.json and acceptance.png")] = Path(
        "runs/bench-acceptance"),
    depth: Annotated[int, typer.Option("--arctic-depth", min=1, help="arctic max_tree_depth")] = 64,
    no_arctic: Annotated[bool, typer.Option("--no-arctic", help="skip arctic-inference")] = False,
) -> None:
    """Replay each epoch against the previous epoch's index: accepted tokens per draft source."""
    from rich.console import Console

    from rhymerl.tools.bench.acceptance import AcceptanceConfig, run

    run(AcceptanceConfig(dumps=dumps, arctic_depth=depth, arctic=not no_arctic), writable_folder(out), Console())


def _batch_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"--batch-sizes: '{text.strip()}' is neither 'job' nor an integer") from None
    if value < 1:
        raise OptionError(f"--batch-sizes: {value} must be >= 1")
    return value


@bench_app.command("rollout")
def rollout(
    run: Annotated[Path, typer.Option("--run", help="finished run folder (policy, prompts and history come "
                                      "from it)")],
    batch_sizes: Annotated[str | None, typer.Option(
        "--batch-sizes", help="comma-separated workloads: 'job' (the run's own rollout, one engine call per training "
        "step) and/or engine batch sizes (torch: all samples as one continuously batched pool; vllm: the job's calls, "
        "at most that many sequences per engine step); default job,16,64,256 (torch), job (vllm)")] = None,
    methods: Annotated[str | None, typer.Option("--methods", help="comma-separated subset of the methods")] = None,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="runs per cell; the median is reported")] = 1,
    out: Annotated[Path | None, typer.Option("--out", help="folder for results.json, table.md, speedup.png, "
                                             "verify_profile.png")] = None,
    engine: Annotated[str, typer.Option("--engine", help="torch (the methods above, outputs checked identical) or "
                                        "vllm (none, ngram, suffix, history, history-alone, history-aimd, fastest-of-n, "
                                        "draft-model)")
                      ] = "torch",
    device: Annotated[str, typer.Option("--device", help="cpu or cuda[:N] (--engine torch)")] = "cpu",
    epoch: Annotated[int | None, typer.Option("--epoch", help="the run's epoch to generate, each step drafting from "
                                              "what the run held before it (1: no history of its own); default: one "
                                              "past the run's last")] = None,
) -> None:
    """Speculative vs plain rollout on a run's prompts and weights: time, tokens/s, identical outputs."""
    from rich.console import Console

    if engine == "vllm":
        _rollout_vllm(run, methods, _batch_sizes(batch_sizes or "job"), repeats, epoch, out, Console())
        return
    if engine != "torch":
        raise OptionError(f"--engine: '{engine}' is not torch or vllm")
    from rhymerl.tools.bench.rollout import METHODS, RolloutBenchConfig, main

    # plain decoding always runs first: it is the reference for timing and for identical outputs
    picked = [m.strip() for m in methods.split(",")] if methods else list(METHODS)
    chosen = ("none", *[m for m in picked if m != "none"])
    unknown = [m for m in chosen if m not in METHODS]
    if unknown:
        raise OptionError(f"--methods: unknown {', '.join(unknown)}; known: {', '.join(METHODS)}")
    sizes = _batch_sizes(batch_sizes or "job,16,64,256")
    main(RolloutBenchConfig(run, sizes, chosen, repeats, device, epoch), writable_folder(out) if out else None, Console())


def _batch_sizes(text: str) -> tuple[int | str, ...]:
    return tuple(b.strip() if b.strip() == "job" else _batch_size(b) for b in text.split(","))


def _rollout_vllm(run: Path, methods: str | None, sizes: tuple[int | str, ...], repeats: int, epoch: int | None,
                  out: Path | None, console: Any) -> None:
    from rhymerl.tools.bench.rollout_vllm import METHODS, VllmBenchConfig, main
    from rhymerl.workers.rollout.vllm_engine import vllm_installed

    if not vllm_installed():
        raise OptionError("--engine vllm: vLLM is not installed (bash scripts/setup.sh --vllm)")
    picked = [m.strip() for m in methods.split(",")] if methods else list(METHODS)
    unknown = [m for m in picked if m not in METHODS]
    if unknown:
        raise OptionError(f"--methods: unknown {', '.join(unknown)}; known with --engine vllm: {', '.join(METHODS)}")
    out_dir = writable_folder(out) if out else None
    batches = tuple(None if b == "job" else int(b) for b in sizes)
    main(VllmBenchConfig(run, ("none", *[m for m in picked if m != "none"]), repeats, epoch, batches), out_dir, console)


@bench_app.command("replicas")
def replicas(
    run: Annotated[Path, typer.Option("--run", help="finished run folder (policy, prompts and length history "
                                      "come from it)")],
    replicas: Annotated[int, typer.Option("--replicas", min=2, help="rollout workers")] = 4,
    policies: Annotated[str | None, typer.Option("--policies", help="comma-separated scheduling policies "
                                                 "(default: all)")] = None,
    groups: Annotated[int, typer.Option("--groups", min=1, help="HistoPipe ranking groups K")] = 4,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="runs per policy; medians are reported")] = 1,
    relay: Annotated[str, typer.Option("--relay", help="group drafts across workers: on (siblings' tokens relayed "
                                       "between workers, as a run does), off, or both (each policy twice)")] = "on",
    first_epoch: Annotated[bool, typer.Option("--first-epoch", help="replay as a run's first epoch: no history "
                                              "index, no length history")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="folder for results.json, table.md, makespan.png")] = None,
) -> None:
    """Scheduling policies placing a run's next epoch on N rollout workers (real engines): measured makespans."""
    from rich.console import Console

    from rhymerl.tools.bench.replicas import ReplicaBenchConfig, main

    relays = {"on": (True,), "off": (False,), "both": (True, False)}
    if relay not in relays:
        raise OptionError(f"--relay: {relay!r}; one of on, off, both")
    chosen = tuple(p.strip() for p in policies.split(",")) if policies else ReplicaBenchConfig.policies
    main(ReplicaBenchConfig(run, replicas, chosen, groups, repeats, relays[relay], first_epoch),
         writable_folder(out) if out else None, Console())


@bench_app.command("profile-recovery")
def profile_recovery(
    run: Annotated[Path, typer.Option("--run", help="finished run folder with speculation method history (policy, "
                                      "prompts and history come from it)")],
    spoil: Annotated[float, typer.Option("--spoil", help="how many times too slow the spoiled profile's every "
                                         "cell is")] = 10.0,
    steps: Annotated[int | None, typer.Option("--steps", min=1, help="training steps of the next epoch to roll out "
                                              "(default: all)")] = None,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="runs of every step per variant; medians are "
                                         "reported")] = 3,
    out: Annotated[Path | None, typer.Option("--out", help="folder for results.json, table.md, recovery.png")] = None,
) -> None:
    """A verify-cost profile measured 10x too slow vs a clean one: how fast the passes correct it."""
    from rich.console import Console

    from rhymerl.tools.bench.profile_recovery import RecoveryBenchConfig, main

    main(RecoveryBenchConfig(run, spoil, steps, repeats), writable_folder(out) if out else None, Console())


@bench_app.command("contention")
def contention(
    job: Annotated[Path, typer.Option("--job", help="the job whose first epoch is rolled out, e.g. "
                                      "examples/quickstart.yaml")],
    steps: Annotated[int, typer.Option("--steps", min=1, help="training steps of the first epoch rolled out")] = 1,
    busy: Annotated[str, typer.Option("--busy", help="comma-separated counts of competing busy processes")] = "0,1,2",
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="runs per setting; medians are reported")] = 3,
    out: Annotated[Path | None, typer.Option("--out", help="folder for results.json, table.md, "
                                             "contention.png")] = None,
) -> None:
    """Rollout beside busy processes at 1 thread, all CPUs and adaptive threads: seconds and the fair share."""
    from rich.console import Console

    from rhymerl.tools.bench.contention import ContentionBenchConfig, main

    levels = _ints("--busy", busy)
    if any(n < 0 for n in levels):
        raise OptionError("--busy: counts must be >= 0")
    main(ContentionBenchConfig(job, steps, levels, repeats), writable_folder(out) if out else None, Console())
