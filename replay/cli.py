"""``replay``: run a trace through the simulated engine and compare with what was measured."""
from __future__ import annotations


import click

from schemas.calibration import Calibration
from schemas.cli_support import DataError, user_errors, version_option
from schemas.tables import REPLAY_RESULT, REQUEST_TRACE, STEP_TRACE
from schemas.specs import get_model

from .compare import broken_tolerances, compare, format_table
from .cost_model import cost_model_from_calibration
from .errors import ConfigError, ReplayError
from .simulate import ReplayConfig, replay_frame, steps_frame

_errors = user_errors(data_errors=(ReplayError,), usage_errors=(ConfigError,))


def replay_options(fn):
    """The engine options shared by ``replay`` and ``calibrate fit`` (vLLM's names)."""
    opts = [
        click.option("--scheduler", default="chunked", show_default=True,
                     help="chunked | fcfs | static | sjf | edf, or package.module:ClassName."),
        click.option("--max-num-seqs", type=click.IntRange(min=1), default=256, show_default=True,
                     help="Requests running at once per replica."),
        click.option("--max-num-batched-tokens", type=click.IntRange(min=1), default=8192, show_default=True,
                     help="Token budget per step."),
        click.option("--num-gpu-blocks", type=click.IntRange(min=1), default=None,
                     help="KV blocks per replica [default: from GPU memory]."),
        click.option("--gpu-memory-utilization", type=click.FloatRange(0, 1, min_open=True), default=0.9,
                     show_default=True, help="Fraction of GPU memory for weights + KV."),
        click.option("--block-size", type=click.IntRange(min=1), default=16, show_default=True,
                     help="Tokens per KV block."),
        click.option("--max-model-len", type=click.IntRange(min=1), default=None,
                     help="Longest prompt + output [default: the model's context length]."),
        click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True),
        click.option("--router", type=click.Choice(["round_robin", "least_loaded", "prefix_affinity"]),
                     default="round_robin", show_default=True, help="How arrivals are spread over replicas."),
        click.option("--enable-prefix-caching/--no-enable-prefix-caching", default=False, show_default=True,
                     help="Share full prompt KV blocks between requests (vLLM v1), from block_hashes."),
        click.option("--hash-block-size", type=click.IntRange(min=1), default=None,
                     help="Tokens per block of the trace's block_hashes (Mooncake: 512) "
                          "[default: the trace's hash_block_tokens metadata, else 16]."),
        click.option("--preemption-mode", type=click.Choice(["recompute", "swap"]), default="recompute",
                     show_default=True, help="What preemption does with the victim's KV."),
        click.option("--slo-ttft-s", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="TTFT objective, seconds, of requests without a slo_ttft_s column (edf, goodput)."),
        click.option("--slo-tpot-s", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="TPOT objective, seconds, of requests without a slo_tpot_s column (edf, goodput)."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def replay_config(kwargs: dict, **extra) -> ReplayConfig:
    """A ReplayConfig from the options of :func:`replay_options`."""
    keys = ("scheduler", "max_num_seqs", "max_num_batched_tokens", "num_gpu_blocks", "gpu_memory_utilization",
            "block_size", "max_model_len", "replicas", "router", "enable_prefix_caching", "hash_block_size",
            "preemption_mode", "slo_ttft_s", "slo_tpot_s")
    return ReplayConfig(**{k: kwargs[k] for k in keys}, **extra)


def parse_tolerances(text: str | None) -> dict[str, float]:
    """``"ttft_p50=0.1,tpot_p50=0.1"`` -> ``{"ttft_p50": 0.1, "tpot_p50": 0.1}``."""
    out = {}
    for part in filter(None, (text or "").split(",")):
        key, sep, val = part.partition("=")
        try:
            out[key.strip()] = float(val)
            assert sep and out[key.strip()] >= 0
        except (ValueError, AssertionError):
            raise click.BadParameter(f"{part!r}: expected metric_stat=fraction, e.g. ttft_p50=0.1",
                                     param_hint="--tolerance") from None
    return out


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@version_option()
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--calibration", "calibration_path", required=True, type=click.Path(dir_okay=False),
              help="Calibration JSON written by 'calibrate fit'.")
@click.option("--model", default=None, help="Replay another model on the calibrated GPU (catalog key, "
                                            "HF id or config.json).")
@click.option("--tp", type=click.IntRange(min=1), default=None, help="Tensor-parallel degree [default: the calibration's].")
@replay_options
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the replay result (replay_result/1 Parquet).")
@click.option("--steps-out", type=click.Path(dir_okay=False), default=None,
              help="Write the simulated step trace (step_trace/1 Parquet).")
@click.option("--token-times/--no-token-times", default=False, show_default=True,
              help="Record every predicted token time (pred_token_times_s).")
@click.option("--chrome-trace", type=click.Path(dir_okay=False), default=None,
              help="Write the simulated timeline as a Chrome/Perfetto trace (JSON; open in ui.perfetto.dev).")
@click.option("--tolerance", default=None,
              help="Exit 3 when an error exceeds its bound, e.g. ttft_p50=0.1,tpot_p50=0.1.")
@_errors
def main(trace, calibration_path, model, tp, output, steps_out, token_times, chrome_trace, tolerance, **kwargs):
    """Replay TRACE through the simulated engine; compare with measured latencies.

    \b
    Example:
      replay run.parquet --calibration cal.json --scheduler chunked \\
             --max-num-seqs 128 --max-num-batched-tokens 2048 -o pred.parquet
    """
    from traces.io import read_trace

    tolerances = parse_tolerances(tolerance)
    cal = Calibration.read(calibration_path)
    model_spec = get_model(model) if model else None
    cost_model = cost_model_from_calibration(cal, model_spec, tp)
    kind, frame, meta = read_trace(trace)
    if kind != REQUEST_TRACE:
        raise DataError(f"{trace}: is a {kind}; replay needs a request trace ({REQUEST_TRACE})")
    cfg = replay_config(kwargs, record_token_times=token_times, record_steps=steps_out is not None,
                        record_step_requests=chrome_trace is not None)
    m = cost_model.model
    click.echo(f"replaying {len(frame)} requests: model {m.name}, {cost_model.tp} x {cost_model.gpu.name} "
               f"(TP={cost_model.tp}), scheduler {cfg.scheduler}, max_num_seqs={cfg.max_num_seqs}, "
               f"max_num_batched_tokens={cfg.max_num_batched_tokens}")
    result, engine = replay_frame(frame, cost_model, cfg, meta)
    n_ok = int((result["pred_status"] == "ok").sum())
    rejected = result["pred_status"].str.startswith("rejected").sum()
    click.echo(f"simulated {engine.num_steps} steps; {n_ok} completed, {rejected} rejected, "
               f"{int(result['pred_num_preemptions'].sum())} preemptions; "
               f"KV cache {engine.replicas[0].kv.num_gpu_blocks} blocks x {cfg.block_size} tokens")
    for reason, count in result.loc[result["pred_status"].str.startswith("rejected"), "pred_status"].value_counts().items():
        click.echo(f"  {count} {reason}")
    if cfg.enable_prefix_caching:
        hit, total = int(result["pred_num_cached_tokens"].sum()), int(frame["num_prompt_tokens"].sum())
        click.echo(f"prefix cache: {hit} of {total} prompt tokens hit ({hit / total:.1%})"
                   + ("" if "block_hashes" in frame else "; the trace has no block_hashes, so nothing can hit"))
    elif cfg.router == "prefix_affinity":
        click.echo("note: --router prefix_affinity needs --enable-prefix-caching; routing by load only", err=True)
    if cfg.slo_ttft_s is not None or cfg.slo_tpot_s is not None:
        from .metrics import goodput_rps

        line = f"goodput (ttft <= {cfg.slo_ttft_s} s, tpot <= {cfg.slo_tpot_s} s): predicted " \
               f"{goodput_rps(result, cfg.slo_ttft_s, cfg.slo_tpot_s):.3f} req/s"
        if {"ttft_s", "tpot_s", "e2e_s"} <= set(result.columns):
            line += f", measured {goodput_rps(result, cfg.slo_ttft_s, cfg.slo_tpot_s, prefix=''):.3f} req/s"
        click.echo(line)
    if output:
        from traces.io import write_trace

        write_trace(result, REPLAY_RESULT, output, {"calibration": str(calibration_path), "scheduler": cfg.scheduler})
        click.echo(f"wrote {output}")
    if steps_out:
        from traces.io import write_trace

        write_trace(steps_frame(engine), STEP_TRACE, steps_out, {"source": "servecal replay"})
        click.echo(f"wrote {steps_out}")
    if chrome_trace:
        from .chrome_trace import write_chrome_trace

        write_chrome_trace(chrome_trace, engine, result)
        click.echo(f"wrote {chrome_trace}")
    table = compare(result)
    click.echo(format_table(table))
    if tolerances:
        broken = broken_tolerances(table, tolerances)
        for b in broken:
            click.echo(f"tolerance broken: {b}", err=True)
        if broken:
            raise SystemExit(3)
