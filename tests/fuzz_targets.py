"""The fuzzer's targets: what is mutated and the command that reads it. One target per importer
(seeded with fixtures and, when present, real files), the Parquet targets (``traces validate``,
``replay``, ``calibrate fit``, calibration files) and the output-path target (:mod:`output_paths`).

Part of the fuzzer of ``fuzzlib``; nothing here depends on pytest.
"""
from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path

import output_paths

DATA = Path(__file__).resolve().parent / "data"


@dataclass
class Target:
    """A fuzz target: seed files (one of which is mutated per input) and the command line."""

    name: str
    seeds: dict                      # file name in the job folder -> bytes (text) or Path (parquet)
    argv: object                     # callable(job_dir, files: dict name->Path, rng) -> list[str]
    mutate: list                     # names of the seed files that may be mutated
    kind: dict = field(default_factory=dict)   # file name -> csv/json/jsonl/yaml/parquet/text
    output: str | None = "out.parquet"
    output_kind: str | None = "request_trace/1"   # or step_trace/1, replay_result/1, calibration
    optional: bool = False           # a command another branch adds: skipped when absent


def _head(path: Path, n: int) -> bytes:
    with open(path, "rb") as fh:
        return b"".join(fh.readline() for _ in range(n))


def _json_head(path: Path, n: int) -> bytes:
    obj = json.loads(path.read_text())
    return json.dumps(obj[:n], indent=1).encode()


def _invalid(rng) -> list[str]:
    return ["--invalid", rng.choice(["error", "error", "flag", "drop"])]


def importer_targets(real: Path | None) -> list[Target]:
    """One target per importer, seeded with real files (when ``real`` exists) and fixtures."""
    T = []

    def imp(fmt, extra=lambda rng: []):
        return lambda d, f, rng: ["traces", "import", fmt, str(f[next(iter(f))]), "-o", str(d / "out.parquet"),
                                  *extra(rng)]

    T.append(Target("burstgpt", {"b.csv": (DATA / "burstgpt_small.csv").read_bytes()},
                    imp("burstgpt", lambda rng: _invalid(rng) + (["--model", "ChatGPT"] if rng.random() < .3 else [])),
                    ["b.csv"], {"b.csv": "csv"}))
    T.append(Target("vllm-bench", {"v.json": (DATA / "vllm_bench_small.json").read_bytes()},
                    imp("vllm-bench", lambda rng: _invalid(rng) + rng.choice([[], ["--arrivals", "zero"],
                                                                              ["--arrivals", "synth"]])),
                    ["v.json"], {"v.json": "json"}))
    T.append(Target("sglang-bench", {"s.jsonl": (DATA / "sglang_bench_small.jsonl").read_bytes()},
                    imp("sglang-bench", lambda rng: _invalid(rng) + ["--arrivals", "synth"]
                        + rng.choice([[], ["--run", "2"]])),
                    ["s.jsonl"], {"s.jsonl": "jsonl"}))
    T.append(Target("genai-perf", {"g.json": (DATA / "genai_perf_profile_export.json").read_bytes()},
                    imp("genai-perf", lambda rng: _invalid(rng) + rng.choice([[], ["--prompt-tokens", "128"]])),
                    ["g.json"], {"g.json": "json"}))
    blis = {"t.yaml": (DATA / "blis_observe_trace.yaml").read_bytes(),
            "t.csv": (DATA / "blis_observe_trace.csv").read_bytes()}
    T.append(Target("blis-observe", blis,
                    lambda d, f, rng: ["traces", "import", "blis-observe", str(f["t.yaml"]),
                                       "-o", str(d / "out.parquet"), *_invalid(rng),
                                       *rng.choice([[], ["--data", str(f["t.csv"])]])],
                    list(blis), {"t.yaml": "yaml", "t.csv": "csv"}))
    # Prometheus scrapes of vLLM (traces import prometheus): 5 scrapes in one file, '# scrape at' parts
    T.append(Target("prometheus", {"m.txt": (DATA / "vllm_metrics_scrapes.txt").read_bytes()},
                    lambda d, f, rng: ["traces", "import", "prometheus", str(f["m.txt"]), "-o", str(d / "out.parquet"),
                                       *rng.choice([[], ["--window-s", "30"], ["--by-label", "model_name"]])],
                    ["m.txt"], {"m.txt": "text"}, output_kind="aggregate_targets/1"))
    # inference-perf (its per-request file, the first 12 entries; its stage files and config.yaml) and
    # AIPerf (its per-request records; its aggregate), laid out as the tools write them
    ip, ai = DATA / "inference_perf", DATA / "aiperf"
    per_request = json.dumps(json.loads((ip / "per_request_lifecycle_metrics.json").read_text())[:12], indent=1)
    T.append(Target("inference-perf", {"per_request_lifecycle_metrics.json": per_request.encode()},
                    imp("inference-perf", _invalid), ["per_request_lifecycle_metrics.json"],
                    {"per_request_lifecycle_metrics.json": "json"}))
    stages = {name: (ip / name).read_bytes() for name in ("config.yaml", "stage_0_lifecycle_metrics.json",
                                                          "stage_1_lifecycle_metrics.json")}
    T.append(Target("inference-perf-stages", stages,
                    lambda d, f, rng: ["traces", "import", "inference-perf", str(f["stage_0_lifecycle_metrics.json"]),
                                       str(f["stage_1_lifecycle_metrics.json"]), "-o", str(d / "out.parquet")],
                    list(stages), {k: "yaml" if k.endswith("yaml") else "json" for k in stages},
                    output_kind="aggregate_targets/1"))
    T.append(Target("aiperf", {"profile_export.jsonl": _head(ai / "profile_export.jsonl", 16)},
                    imp("aiperf", _invalid), ["profile_export.jsonl"], {"profile_export.jsonl": "jsonl"}))
    T.append(Target("aiperf-summary", {"profile_export_aiperf.json": (ai / "profile_export_aiperf.json").read_bytes()},
                    imp("aiperf"), ["profile_export_aiperf.json"], {"profile_export_aiperf.json": "json"},
                    output_kind="aggregate_targets/1"))
    if real is None or not real.is_dir():
        return T
    T.append(Target("azure", {"a.csv": _head(real / "azure_llm_2023_code.csv", 60)},
                    imp("azure", _invalid), ["a.csv"], {"a.csv": "csv"}))
    T.append(Target("vidur", {"v.csv": _head(real / "vidur_splitwise_conv.csv", 60)},
                    imp("vidur", _invalid), ["v.csv"], {"v.csv": "csv"}))
    T.append(Target("csv", {"c.csv": _head(real / "vidur_splitwise_conv.csv", 60)},
                    imp("csv", lambda rng: _invalid(rng) + [
                        "--map", "arrived_at=arrival_time_s", "--map", "num_prefill_tokens=num_prompt_tokens",
                        "--map", "num_decode_tokens=num_output_tokens"] + rng.choice([[], ["--time-unit", "ms"]])),
                    ["c.csv"], {"c.csv": "csv"}))
    T.append(Target("mooncake", {"m.jsonl": _head(real / "mooncake_conversation_trace.jsonl", 40)},
                    imp("mooncake", _invalid), ["m.jsonl"], {"m.jsonl": "jsonl"}))
    T.append(Target("vllm-request-stats",
                    {"r.jsonl": _head(real / "lss_vllm_rtxpro6000_llama31_8b_requests.jsonl", 40)},
                    imp("vllm-request-stats", lambda rng: rng.choice([[], ["--arrival-clock", "wall"]])),
                    ["r.jsonl"], {"r.jsonl": "jsonl"}))
    T.append(Target("llmperf", {"l.json": _json_head(real / "llmperf_leaderboard_anyscale_llama2_70b_individual.json",
                                                     30)},
                    imp("llmperf", lambda rng: _invalid(rng) + ["--concurrency", "5"]), ["l.json"], {"l.json": "json"}))
    # the first 20 requests of a real DistServe run (line 1, no metrics block), under a name with settings
    ds = ast.literal_eval((real / "distserve_opt13b_a100_distserve-c21d11-300-3.exp").read_text().split("\n", 1)[0])
    T.append(Target("distserve", {"distserve-c21d11-20-3.exp": (str(ds[:20]) + "\n").encode()},
                    imp("distserve", _invalid), ["distserve-c21d11-20-3.exp"], {"distserve-c21d11-20-3.exp": "text"}))
    p = "lss_profile_rtx4090_llama31_8b_"
    prof = {"p_meta.yaml": (real / f"{p}meta.yaml").read_bytes(),
            "p_tp1_dense.csv": (real / f"{p}tp1_dense.csv").read_bytes(),
            "p_tp1_attention.csv": _head(real / f"{p}tp1_attention.csv", 400),
            "p_tp1_per_sequence.csv": (real / f"{p}tp1_per_sequence.csv").read_bytes()}
    T.append(Target("llmservingsim-profile", prof,
                    lambda d, f, rng: ["traces", "import", "llmservingsim-profile", *[str(f[k]) for k in prof],
                                       "-o", str(d / "out.parquet"), *rng.choice([[], ["--num-layers", "32"]])],
                    list(prof), {k: "yaml" if k.endswith("yaml") else "csv" for k in prof},
                    output_kind="step_trace/1"))
    # importers added on other branches: fuzzed when their command exists
    if (real / "guidellm_results_codellama34b_prefill_sweep.json").exists():
        guidellm_json = (real / "guidellm_results_codellama34b_prefill_sweep.json").read_bytes()
        T.append(Target("guidellm", {"g.json": guidellm_json},
                        imp("guidellm"), ["g.json"], {"g.json": "json"}))
    # aggregate results (traces import summary): the real LLMPerf summary, the real GuideLLM
    # report's aggregate metrics (those read; its per-request lists left out: 8 kB, not 4 MB),
    # the vLLM and SGLang fixtures
    summary = {"llmperf": ("l.json", (real / "llmperf_leaderboard_anyscale_llama2_70b_summary.json").read_bytes()),
               "vllm-bench": ("v.json", (DATA / "vllm_bench_summary.json").read_bytes()),
               "sglang-bench": ("s.jsonl", (DATA / "sglang_bench_small.jsonl").read_bytes())}
    if (real / "guidellm_results_codellama34b_prefill_sweep.json").exists():
        report = json.loads((real / "guidellm_results_codellama34b_prefill_sweep.json").read_text())
        read = ("time_to_first_token_ms", "request_latency", "prompt_token_count", "output_token_count")
        report["benchmarks"] = [{"config": {"strategy": b["config"]["strategy"]},
                                 "metrics": {k: {"successful": b["metrics"][k]["successful"]} for k in read}}
                                for b in report["benchmarks"]]
        summary["guidellm"] = ("g.json", json.dumps(report, indent=1).encode())
    for fmt, (name, data) in summary.items():
        T.append(Target(f"summary-{fmt}", {name: data},
                        lambda d, f, rng, fmt=fmt: ["traces", "import", "summary", fmt, *map(str, f.values()),
                                                    "-o", str(d / "out.parquet")],
                        [name], {name: "jsonl" if name.endswith("jsonl") else "json"},
                        output_kind="aggregate_targets/1"))
    if (real / "vllm_otlp_spans_codellama34b_prefill_sweep.jsonl").exists():
        T.append(Target("vllm-otlp", {"o.jsonl": _head(real / "vllm_otlp_spans_codellama34b_prefill_sweep.jsonl", 60)},
                        imp("vllm-otlp"), ["o.jsonl"], {"o.jsonl": "jsonl"}))
    if (real / "blis_eval_codellama34b_prefill_sweep_vllm.log").exists():
        T.append(Target("vllm-log", {"v.log": (real / "blis_eval_codellama34b_prefill_sweep_vllm.log").read_bytes()},
                        imp("vllm-log"), ["v.log"], {"v.log": "text"}, output_kind="vllm_stats/1"))
    return T


def parquet_targets(base: dict[str, Path]) -> list[Target]:
    """validate / replay / fit over mutated tables, and replay over mutated calibrations.

    ``base`` holds valid files: ``requests`` (with measured latencies), ``tokens`` (with
    ``token_times_s`` and statuses), ``steps`` (a step trace), ``result`` (a replay
    result) and ``cal`` (a calibration JSON).
    """
    cal = base["cal"]

    def validate(d, f, rng):
        return ["traces", "validate", str(f["t.parquet"])]

    def replay(d, f, rng):
        return ["replay", str(f["t.parquet"]), "--calibration", str(cal), "-o", str(d / "out.parquet"),
                *rng.choice([[], ["--scheduler", "fcfs"], ["--scheduler", "sjf"],
                             ["--scheduler", "edf", "--slo-ttft-s", "1"], ["--replicas", "2"], ["--exact-steps"]])]

    def fit(d, f, rng):
        return ["calibrate", "fit", str(f["t.parquet"]), "--model", "llama-3.1-8b", "--gpu", "rtx-4090",
                "-o", str(d / "out.json"), *rng.choice([[], ["--variants", "max"], ["--variants", "sum,blend"]])]

    def replay_cal(d, f, rng):
        return ["replay", str(base["requests"]), "--calibration", str(f["cal.json"]), "-o", str(d / "out.parquet")]

    def tables(*names):
        return {"t.parquet": [base[n] for n in names]}

    return [
        Target("validate", tables("requests", "tokens", "steps", "result"), validate, ["t.parquet"],
               {"t.parquet": "parquet"}, output=None, output_kind=None),
        Target("replay", tables("requests", "tokens"), replay, ["t.parquet"], {"t.parquet": "parquet"},
               output_kind="replay_result/1"),
        Target("fit", tables("steps"), fit, ["t.parquet"], {"t.parquet": "parquet"}, output="out.json",
               output_kind="calibration"),
        Target("calibration", {"cal.json": cal.read_bytes()}, replay_cal, ["cal.json"], {"cal.json": "json"},
               output_kind="replay_result/1"),
    ]


def output_target() -> Target:
    """Outputs given a path that must never be written (a device, a FIFO, a folder, a link, ...):
    refused with exit 2 and left as they were (:mod:`output_paths`), before any input is read:
    the inputs hold the (mutated) placeholder."""
    return Target("output-path", {"in.txt": b"placeholder\n"}, output_paths.fuzz_argv, ["in.txt"],
                  {"in.txt": "text"}, output=None, output_kind=None)
