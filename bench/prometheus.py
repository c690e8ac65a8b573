"""Calibrating from Prometheus scrapes vs from the requests, on a real per-request run (issue #32 item 3).

The ``/metrics`` scrapes a vLLM v1 server would have exposed during the RTX PRO 6000
Llama-3.1-8B run (``lss_vllm_rtxpro6000_llama31_8b_requests.jsonl``, 300 requests) are built
from its per-request timestamps with ``prometheus_client`` itself (``generate_latest``: the
exposition the parser meets is the library's), scraped every ``SCRAPE_S`` seconds from the
first arrival, with vLLM's default bucket bounds (``vllm/v1/metrics/buckets.py`` and
``vllm/v1/metrics/loggers.py``: TTFT ``TIME_TO_FIRST_TOKEN_BUCKETS``; E2E, queue, prefill,
decode and inference time ``REQUEST_LATENCY_BUCKETS``; per-request TPOT
``INTER_TOKEN_LATENCY_BUCKETS``; prompt and output lengths ``build_1_2_5_buckets(max_model_len)``
with Llama-3.1's 131,072). As vLLM v1 records them, TTFT is observed when the first token is
out and the rest when the request finishes; the gauges ``num_requests_running`` (scheduled, not
finished) and ``num_requests_waiting`` (queued, not scheduled) are their values at the scrape.

Calibrations, each scored per request on the requests that arrived after 15 s (``run@15:``,
as bench/fidelity.py's "first 15 s -> rest"):

* ``requests``: ``calibrate fit`` on the requests that arrived in the first 15 s (``run@0:15``);
* ``scrapes 0-30 s``: ``calibrate fit`` on the scrapes of the first 30 s as one window (the
  histograms hold requests when they finish, and none of this run finished in its first 15 s):
  every arrival the scrapes count up to 30 s replayed, and only the requests the replay
  finishes by 30 s matched (:mod:`traces.scrape_window`);
* ``requests, whole run`` and ``scrapes, whole run`` (one window of every scrape): both see every
  request (in sample for run@15:): what the histograms' resolution and the synthesized workload
  cost against the per-request log with the same data.

Out of sample, :func:`window_losses` sets the window's fit (over ``SEEDS`` seeds of its
synthesized workload) beside what it was before (the first 78 arrivals replayed alone from an
idle server, all matched), and beside the fit with more than the scrapes give: the run's real
lengths (all 300, shuffled, as against the finished requests' lengths assumed for the
unfinished ones), the real requests with the latencies from the buckets, and the real requests
with the exact statistics of those finished by 30 s (what the window's requests tell at best).

The attribution (:func:`attribution`) separates what the whole-run scrape fit loses, each loss
alone on the per-request log: its exact summary statistics (the mean and p10-p90 of TTFT, TPOT
and E2E, as scrapes with infinitely fine buckets would give them) against the per-request
quantiles; the latency statistics from the histograms (TTFT and E2E, TPOT, all three); the
requests' arrival times replaced by the scrape level's synthesized ones, and their lengths by
the synthesized ones (each over ``SEEDS`` seeds of the synthesized workload, the product's seed
0 first: one realization of 300 requests is itself a draw), the prompts' and the outputs' apart,
and the outputs all at their exact mean (the other extreme of what one bucket allows); the real
lengths shuffled among the requests (what the order alone costs, the noise under the lengths'
loss); and the scrape fit with all of them.

The lengths' mean fills only bucket bounds (``length_points``, :mod:`traces.aggregate_workload`):
:func:`summaries` measures what it would do to the summaries the docs' aggregate fits use (the
GuideLLM sweep's levels 0, 2, 3 with their 1,024 shared prefix tokens, scored on its benchmarks
1 and 4; the LLMPerf summary, scored on its own requests), each read as it is and as if its
length percentiles were bucket bounds.

    python bench/prometheus.py [--data ../shared/data/real] [--out bench/PROMETHEUS.md]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

#: vLLM's default bucket bounds (vllm/v1/metrics/buckets.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                               20.0, 40.0, 80.0)
MAX_MODEL_LEN = 131072
SCRAPE_S = 15.0
#: Seeds of the synthesized workload over which each synthesized loss is measured (0: the product's).
SEEDS = 5
RUN = "lss_vllm_rtxpro6000_llama31_8b_requests.jsonl"


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's length buckets)."""
    out, exp = [], 0
    while True:
        for m in (1, 2, 5):
            if m * 10 ** exp > max_value:
                return out
            out.append(m * 10 ** exp)
        exp += 1


def write_scrapes(trace: pd.DataFrame, folder: Path, origin_unix_s: float, every_s: float = SCRAPE_S) -> list[Path]:
    """Write ``metrics-<unix s>.txt`` scrapes of a request trace (``request_trace/1`` with
    ``queue_wait_s``, ``ttft_s``, ``tpot_s``, ``e2e_s``; times after ``origin_unix_s``) every
    ``every_s`` from 0 until every request has finished; returns the files."""
    from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

    reg = CollectorRegistry()
    labels = dict(labelnames=["model_name", "engine"])

    def hist(name, buckets):
        return Histogram(name, name, buckets=buckets, registry=reg, **labels).labels("llama-3.1-8b", "0")

    h = {"ttft": hist("vllm:time_to_first_token_seconds", TTFT_BUCKETS),
         "e2e": hist("vllm:e2e_request_latency_seconds", REQUEST_LATENCY_BUCKETS),
         "queue": hist("vllm:request_queue_time_seconds", REQUEST_LATENCY_BUCKETS),
         "prefill": hist("vllm:request_prefill_time_seconds", REQUEST_LATENCY_BUCKETS),
         "decode": hist("vllm:request_decode_time_seconds", REQUEST_LATENCY_BUCKETS),
         "inference": hist("vllm:request_inference_time_seconds", REQUEST_LATENCY_BUCKETS),
         "tpot": hist("vllm:request_time_per_output_token_seconds", INTER_TOKEN_LATENCY_BUCKETS),
         "prompt": hist("vllm:request_prompt_tokens", build_1_2_5_buckets(MAX_MODEL_LEN)),
         "output": hist("vllm:request_generation_tokens", build_1_2_5_buckets(MAX_MODEL_LEN))}
    running = Gauge("vllm:num_requests_running", "running", registry=reg, **labels).labels("llama-3.1-8b", "0")
    waiting = Gauge("vllm:num_requests_waiting", "waiting", registry=reg, **labels).labels("llama-3.1-8b", "0")
    t = trace.assign(sched=trace["arrival_time_s"] + trace["queue_wait_s"],
                     first=trace["arrival_time_s"] + trace["ttft_s"], end=trace["arrival_time_s"] + trace["e2e_s"])
    files, now = [], 0.0
    last = float(t["end"].max())
    while True:
        before = now - every_s
        for r in t[(t["first"] > before) & (t["first"] <= now)].itertuples():
            h["ttft"].observe(r.ttft_s)
        for r in t[(t["end"] > before) & (t["end"] <= now)].itertuples():
            for key, v in (("e2e", r.e2e_s), ("queue", r.queue_wait_s), ("prefill", r.first - r.sched),
                           ("decode", r.end - r.first), ("inference", r.end - r.sched),
                           ("prompt", r.num_prompt_tokens), ("output", r.num_output_tokens)):
                h[key].observe(v)
            if np.isfinite(r.tpot_s):
                h["tpot"].observe(r.tpot_s)
        running.set(int(((t["sched"] <= now) & (t["end"] > now)).sum()))
        waiting.set(int(((t["arrival_time_s"] <= now) & (t["sched"] > now)).sum()))
        path = folder / f"metrics-{origin_unix_s + now:.3f}.txt"
        path.write_bytes(generate_latest(reg))
        files.append(path)
        if now >= last:
            return files
        now += every_s


def main() -> None:
    from click.testing import CliRunner

    from calibrate.aggregate_runs import fit_runs
    from calibrate.runs import load_runs, score_runs
    from fidelity import PRO6000, cost_model, errors
    from replay.config import EngineOptions, ReplayConfig
    from traces.cli import main as traces_cli
    from traces.io import read_trace

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "real"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "PROMETHEUS.md"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    run = tmp / "run.parquet"
    res = CliRunner().invoke(traces_cli, ["import", "vllm-request-stats", str(Path(args.data) / RUN), "-o", str(run)])
    assert res.exit_code == 0, res.output
    _, trace, meta = read_trace(run)
    scrapes = tmp / "scrapes"
    scrapes.mkdir()
    files = write_scrapes(trace, scrapes, float(meta["wall_clock_origin_s"]))
    agg, whole = tmp / "scrapes_0_30.parquet", tmp / "scrapes_all.parquet"
    for out, chosen, window in ((agg, files[:3], "30"), (whole, files, "3600")):
        res = CliRunner().invoke(traces_cli, ["import", "prometheus", *map(str, chosen), "--window-s", window,
                                              "-o", str(out)])
        assert res.exit_code == 0, res.output
    pro = ReplayConfig(EngineOptions(**PRO6000))
    llama = cost_model("llama-3.1-8b", "rtx-pro-6000")

    def runs(spec):
        return load_runs([str(spec)], pro, read_trace)

    rows = []
    score = runs(f"{run}@15:")
    for name, fitted in (("requests arriving 0-15 s (run@0:15)", runs(f"{run}@0:15")),
                         ("scrapes 0-30 s (one 30 s window)", runs(agg)),
                         ("requests, whole run (in sample)", runs(run)),
                         ("scrapes, whole run (one window; in sample)", runs(whole))):
        fit = fit_runs(fitted, llama, jobs=1)[0]
        table = score_runs(score, llama.with_params(fit.cost_params()))
        rows.append({"calibrated from": name, "scored on": "run@15: (141 requests)", **errors(table)})
        print(name, rows[-1], flush=True)
    window = window_losses(runs(run)[0], runs(agg)[0], agg, score, llama)
    losses = attribution(runs(run)[0], runs(whole)[0], whole, score, llama)
    write(pd.DataFrame(rows), window, losses, summaries(Path(args.data), tmp), Path(args.out), len(files))


def _fitted(variants, score, cost) -> dict:
    """The calibrations fitted on each run of ``variants`` (each a list of runs) scored on ``score``:
    ``seeds`` and per p50/p90 column the mean and (``<stat>_sd``) the standard deviation over the
    variants (0 for one)."""
    from calibrate.aggregate_runs import fit_runs
    from calibrate.runs import score_runs
    from fidelity import errors

    got = pd.DataFrame([errors(score_runs(score, cost.with_params(fit_runs(v, cost, jobs=1)[0].cost_params())))
                        for v in variants])
    return {"seeds": len(got), **got.mean().to_dict(),
            **{f"{c}_sd": float(got[c].std()) if len(got) > 1 else 0.0 for c in got}}


def window_losses(req, scrape, agg: Path, score, cost) -> pd.DataFrame:
    """What the 0-30 s window's scrape fit loses out of sample (module docstring): one row per
    case, :func:`_fitted`'s columns. ``req`` is the per-request run of the whole log, ``scrape``
    the run of the window's level 0 (read from ``agg``), ``cost`` the cost model fitted."""
    from dataclasses import replace

    from replay.analysis.metrics import statistics
    from traces.aggregate_workload import SEED, level_options, level_trace
    from traces.io import read_trace
    from traces.scrape_window import OBSERVED_UNTIL

    _, frame, meta = read_trace(agg)
    level, options = frame[frame["level"] == 0], level_options(meta, agg, 0)
    until_s = float(scrape.metadata[OBSERVED_UNTIL])
    order = req.trace.sort_values("arrival_time_s").reset_index(drop=True)
    requests = order[["request_id", "arrival_time_s", "num_prompt_tokens", "num_output_tokens"]]
    pcts = scrape.targets["ttft_s"][0]
    a = order["arrival_time_s"]
    exact = {m: (pcts, statistics(order[m][a + order["ttft_s" if m == "ttft_s" else "e2e_s"] <= until_s]
                                  .dropna().to_numpy(float), pcts)) for m in scrape.targets}
    synthesized = [level_trace(level, f"{agg}#0", SEED + k, **options) for k in range(SEEDS)]
    first_only = {k: v for k, v in scrape.metadata.items() if k != OBSERVED_UNTIL}
    cases = [("before: the first 78 arrivals replayed alone, all matched",
              [[replace(scrape, trace=level_trace(level, f"{agg}#0", SEED + k, **{**options, "held": None}),
                        metadata=first_only)] for k in range(SEEDS)]),
             ("the scrape fit: every arrival replayed, those finished by 30 s matched",
              [[replace(scrape, trace=t)] for t in synthesized]),
             ("the real lengths (all 300, shuffled) on the synthesized arrivals",
              [[replace(scrape, trace=t.assign(**{c: rng.permutation(order[c].to_numpy()) for c in
                                                   ("num_prompt_tokens", "num_output_tokens")}))]
               for t, rng in zip(synthesized, map(np.random.default_rng, range(SEEDS)))]),
             ("the real requests (arrivals and lengths), latencies from the buckets",
              [[replace(scrape, trace=requests)]]),
             ("the real requests, exact statistics of those finished by 30 s",
              [[replace(scrape, trace=requests, targets=exact)]])]
    rows = []
    for name, variants in cases:
        rows.append({"loss": name, **_fitted(variants, score, cost)})
        print(name, rows[-1], flush=True)
    return pd.DataFrame(rows)


def attribution(req, scrape, whole: Path, score, cost) -> pd.DataFrame:
    """The whole-run scrape fit's losses, each alone (module docstring): one row per loss, the
    p50/p90 relative errors on ``score`` of the calibration fitted with it, for the synthesized
    ones the mean and the standard deviation over :data:`SEEDS` seeds (columns ``<stat>`` and
    ``<stat>_sd``; 0 for the others).

    ``req`` is the per-request run of the whole log, ``scrape`` the run of the whole-run scrapes'
    level 0 (read from ``whole``), ``cost`` the cost model fitted.
    """
    from dataclasses import replace

    from replay.analysis.metrics import statistics
    from traces.aggregate_workload import SEED, level_options, level_trace
    from traces.io import read_trace

    pcts = scrape.targets["ttft_s"][0]
    exact = {m: (pcts, statistics(req.trace[m].dropna().to_numpy(float), pcts)) for m in scrape.targets}
    hist = scrape.targets
    order = req.trace.sort_values("arrival_time_s").reset_index(drop=True)
    _, frame, meta = read_trace(whole)
    synthesized = [level_trace(frame[frame["level"] == 0], f"{whole}#0", SEED + k, **level_options(meta, whole, 0))
                   for k in range(SEEDS)]
    assert all(len(t) == len(order) for t in synthesized), "the synthesized level holds another count of requests"

    cases = [("per-request quantiles (the requests, whole run)", [req]),
             ("exact summary statistics (mean, p10-p90) of the requests", [replace(req, targets=exact)]),
             ("TTFT and E2E statistics from their buckets", [replace(req, targets={**exact, "ttft_s": hist["ttft_s"],
                                                                                  "e2e_s": hist["e2e_s"]})]),
             ("TPOT statistics from its buckets", [replace(req, targets={**exact, "tpot_s": hist["tpot_s"]})]),
             ("all latency statistics from their buckets", [replace(req, targets=hist)]),
             ("arrivals synthesized (exact statistics, real lengths)",
              [replace(req, targets=exact, trace=order.assign(arrival_time_s=t["arrival_time_s"].to_numpy()))
               for t in synthesized]),
             ("lengths synthesized (exact statistics, real arrivals)",
              [replace(req, targets=exact, trace=order.assign(num_prompt_tokens=t["num_prompt_tokens"].to_numpy(),
                                                              num_output_tokens=t["num_output_tokens"].to_numpy()))
               for t in synthesized]),
             ("prompts synthesized (real outputs)",
              [replace(req, targets=exact, trace=order.assign(num_prompt_tokens=t["num_prompt_tokens"].to_numpy()))
               for t in synthesized]),
             ("outputs synthesized (real prompts)",
              [replace(req, targets=exact, trace=order.assign(num_output_tokens=t["num_output_tokens"].to_numpy()))
               for t in synthesized]),
             ("outputs all at their exact mean (real prompts)",
              [replace(req, targets=exact, trace=order.assign(
                  num_output_tokens=int(round(order["num_output_tokens"].mean()))))]),
             ("lengths the real ones, shuffled (the order alone)",
              [replace(req, targets=exact, trace=order.assign(**{c: rng.permutation(order[c].to_numpy()) for c in
                                                                 ("num_prompt_tokens", "num_output_tokens")}))
               for rng in map(np.random.default_rng, range(SEEDS))]),
             ("all three (the scrape fit)", [replace(scrape, trace=t) for t in synthesized])]
    rows = []
    for name, variants in cases:
        rows.append({"loss": name, **_fitted([[r] for r in variants], score, cost)})
        print(name, rows[-1], flush=True)
    return pd.DataFrame(rows)


def summaries(data: Path, tmp: Path) -> pd.DataFrame:
    """Held-out errors of ``calibrate validate`` on the docs' two summaries (module docstring),
    their lengths read as the product reads them and filled with their mean as bucket bounds
    are: one row per summary and reading, the median and worst |p50/p90 error| of TTFT, TPOT
    and E2E on the scored requests (fractions)."""
    from click.testing import CliRunner

    from calibrate.umbrella import main as servecal
    from traces.aggregate_workload import BUCKET_BOUNDS
    from traces.io import read_trace, write_trace

    def cli(*args) -> None:
        res = CliRunner().invoke(servecal, [str(a) for a in args])
        assert res.exit_code == 0, res.output

    guidellm, llmperf = data / "guidellm_results_codellama34b_prefill_sweep.json", \
        data / "llmperf_leaderboard_anyscale_llama2_70b_summary.json"
    cli("traces", "import", "summary", "guidellm", guidellm, "--shared-prefix-tokens", "1024", "-o",
        tmp / "sweep_agg.parquet")
    cli("traces", "import", "guidellm", guidellm, "-o", tmp / "sweep.parquet")
    cli("traces", "import", "summary", "llmperf", llmperf, "-o", tmp / "llmperf_agg.parquet")
    cli("traces", "import", "llmperf", data / "llmperf_leaderboard_anyscale_llama2_70b_individual.json",
        "--concurrency", "5", "-o", tmp / "llmperf.parquet")
    cases = {"GuideLLM sweep, levels 0, 2, 3 -> benchmarks 1, 4": (
                 "sweep_agg", ["--fit-on", "{agg}#0", "--fit-on", "{agg}#2", "--fit-on", "{agg}#3", "--score-on",
                               f"{tmp}/sweep.parquet#1", "--score-on", f"{tmp}/sweep.parquet#4", "--model",
                               "codellama-34b", "--gpu", "h100-80gb", "--vllm-log",
                               str(data / "blis_eval_codellama34b_prefill_sweep_vllm.log")]),
             "LLMPerf summary -> its requests": (
                 "llmperf_agg", ["--fit-on", "{agg}", "--score-on", f"{tmp}/llmperf.parquet", "--concurrency", "5",
                                 "--model", "llama-2-70b", "--gpu", "h100-80gb", "--tp", "4"])}
    rows = []
    for name, (stem, args) in cases.items():
        kind, frame, meta = read_trace(tmp / f"{stem}.parquet")
        write_trace(frame, kind, tmp / f"{stem}_buckets.parquet", {**meta, "length_points": BUCKET_BOUNDS})
        for reading, agg in (("linear between percentiles (as imported)", stem),
                             ("filled with the mean (as bucket bounds)", f"{stem}_buckets")):
            cli("calibrate", "validate", *[a.format(agg=tmp / f"{agg}.parquet") for a in args], "--jobs", "1",
                "--table-out", tmp / "table.csv")
            t = pd.read_csv(tmp / "table.csv")
            t = t[(t["sample"] == "out") & t["metric"].isin(["ttft", "tpot", "e2e"])]
            errs = t[["rel_err_p50", "rel_err_p90"]].abs().to_numpy()
            rows.append({"summary": name, "lengths": reading, "median": float(np.nanmedian(errs)),
                         "worst": float(np.nanmax(errs))})
            print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def _loss_table(losses: pd.DataFrame, cols: list[str], head: str) -> list[str]:
    """The markdown rows of a table of losses (:func:`_fitted`'s columns and ``loss``, headed
    ``head``), in percent."""
    lines = [f"| {head} | seeds | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for _, d in losses.iterrows():
        cells = [f"{100 * d[c]:+.1f}%" + (f" ± {100 * d[c + '_sd']:.1f}" if d["seeds"] > 1 else "") for c in cols]
        lines.append(f"| {d['loss']} | {d['seeds']:g} | " + " | ".join(cells) + " |")
    return lines


def write(table: pd.DataFrame, window: pd.DataFrame, losses: pd.DataFrame, others: pd.DataFrame, out: Path,
          num_scrapes: int) -> None:
    """Write the calibrations' ``table``, the out-of-sample window's losses ``window``
    (:func:`window_losses`), the attribution ``losses`` and the summaries' errors ``others``
    (:func:`summaries`) after the ``<!-- table -->`` marker of ``out`` (the text above it is kept)."""
    cols = [c for c in table.columns if c.endswith(("p50", "p90"))]
    lines = ["| calibrated from | scored on | " + " | ".join(cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for r in table.itertuples(index=False):
        d = dict(zip(table.columns, r))
        lines.append(f"| {d['calibrated from']} | {d['scored on']} | "
                     + " | ".join(f"{100 * d[c]:+.1f}%" for c in cols) + " |")
    lines += ["", f"({num_scrapes} scrapes, every {SCRAPE_S:g} s; relative errors of predicted vs measured "
              "percentiles, run@15:)", "", "Out of sample (scrapes 0-30 s as one window; scored on run@15:; a "
              "synthesized workload: mean ± standard deviation over its seeds):", "",
              *_loss_table(window, cols, "fitted on"),
              "", "Attribution (whole run, in sample; scored on run@15:; a synthesized loss: mean ± standard "
              "deviation over its seeds):", "", *_loss_table(losses, cols, "loss, alone")]
    lines += ["", "The lengths' mean on summaries (held-out |p50/p90 error| of TTFT, TPOT and E2E, `calibrate "
              "validate`):", "", "| summary | lengths | median | worst |", "|---|---|---|---|"]
    lines += [f"| {d['summary']} | {d['lengths']} | {100 * d['median']:.1f}% | {100 * d['worst']:.1f}% |"
              for _, d in others.iterrows()]
    text = out.read_text() if out.exists() else ""
    marker = "<!-- table -->"
    head = text.split(marker)[0] if marker in text else "# Prometheus scrapes vs per-request log\n\n"
    out.write_text(head + marker + "\n" + "\n".join(lines) + "\n")

if __name__ == "__main__":
    main()
