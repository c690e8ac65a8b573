"""The commands ``calibrate advise`` prints parse with each tool's documented options.

Each spec below is written from the tool's documentation, not its code (none is installed here):

- GuideLLM, "Run a Benchmark" (vllm-project/guidellm docs/getting-started/benchmark.md) and the
  ``guidellm benchmark`` options of its ``__main__.py``: ``--target``, ``--model``, ``--data``,
  ``--rate-type`` (synchronous, concurrent, throughput, constant, poisson, sweep), ``--rate`` (requests/s
  for constant/poisson, concurrent requests for concurrent), ``--max-seconds``, ``--max-requests``;
  ``--data`` as ``prompt_tokens=N,output_tokens=M`` for synthetic data.
- ``vllm bench serve`` (docs.vllm.ai CLI reference, v0.10-v0.11): ``--base-url``, ``--host``, ``--port``,
  ``--model``, ``--dataset-name`` (random among others), ``--random-input-len``, ``--random-output-len``,
  ``--random-range-ratio``, ``--ignore-eos``, ``--num-prompts``, ``--request-rate``, ``--burstiness``,
  ``--max-concurrency``, ``--seed``.
- inference-perf (kubernetes-sigs/inference-perf docs/config.md): ``inference-perf --config_file FILE``;
  the YAML's ``load`` (``type`` constant|poisson|concurrent, ``stages`` of ``rate``/``duration`` or
  ``concurrency_level``/``num_requests``), ``api``, ``server``, ``tokenizer``, ``data`` (``random`` with
  ``input_distribution``/``output_distribution`` of min, max, mean, std_dev, total_count).
"""
import argparse
import shlex

import pytest
import yaml

from calibrate.advise_candidates import Workload
from calibrate.advise_commands import command, folded, server_command

RATE = Workload(3017, 31, 142, rate_rps=1.185)
CONC = Workload(805, 169, 128, concurrency=16, engine=(("max_num_batched_tokens", 8192),))


def parser(prog: str, flags: dict) -> argparse.ArgumentParser:
    """An argparse spec of ``flags`` (flag -> type, choices tuple or ``bool`` for a switch); unknown flags fail."""
    p = argparse.ArgumentParser(prog=prog, exit_on_error=False, add_help=False)
    for flag, kind in flags.items():
        if kind is bool:
            p.add_argument(flag, action="store_true")
        elif isinstance(kind, tuple):
            p.add_argument(flag, choices=kind)
        else:
            p.add_argument(flag, type=kind)
    return p


def words(text: str, head: int) -> list:
    """The command's words after its ``head`` words (the shell's continuations joined)."""
    return shlex.split(text.replace("\\\n", " "))[head:]


GUIDELLM = {"--target": str, "--model": str, "--data": str, "--max-seconds": float, "--max-requests": int,
            "--rate": float, "--output-path": str,
            "--rate-type": ("synchronous", "concurrent", "throughput", "constant", "poisson", "sweep")}
VLLM_BENCH = {"--base-url": str, "--host": str, "--port": int, "--model": str, "--endpoint": str,
              "--dataset-name": ("sharegpt", "burstgpt", "sonnet", "random", "hf", "custom", "prefix_repetition"),
              "--random-input-len": int, "--random-output-len": int, "--random-range-ratio": float,
              "--ignore-eos": bool, "--num-prompts": int, "--request-rate": float, "--burstiness": float,
              "--max-concurrency": int, "--seed": int}


@pytest.mark.parametrize("run", [RATE, CONC], ids=["rate", "concurrency"])
def test_the_guidellm_command_parses_with_its_documented_flags(run):
    text = folded(command(run, "guidellm", "org/model"))
    assert text.startswith("guidellm benchmark ")
    args = parser("guidellm benchmark", GUIDELLM).parse_args(words(text, 2))
    assert args.rate_type == ("concurrent" if run.concurrency else "constant")
    assert args.rate == pytest.approx(run.concurrency or run.rate_rps, rel=1e-3)
    assert args.max_requests == run.num_requests
    data = dict(kv.split("=") for kv in args.data.split(","))
    assert {k: int(v) for k, v in data.items()} == {"prompt_tokens": run.prompt_tokens,
                                                    "output_tokens": run.output_tokens}
    assert all(len(line) <= 100 for line in text.splitlines())


@pytest.mark.parametrize("run", [RATE, CONC], ids=["rate", "concurrency"])
def test_the_vllm_bench_command_parses_with_its_documented_flags(run):
    text = folded(command(run, "vllm-bench", "org/model"))
    assert text.startswith("vllm bench serve ")
    args = parser("vllm bench serve", VLLM_BENCH).parse_args(words(text, 3))
    assert (args.dataset_name, args.random_input_len, args.random_output_len) == ("random", run.prompt_tokens,
                                                                                run.output_tokens)
    assert args.random_range_ratio == 0 and args.ignore_eos and args.num_prompts == run.num_requests
    if run.concurrency:
        assert args.max_concurrency == run.concurrency and args.request_rate is None
    else:
        assert args.request_rate == pytest.approx(run.rate_rps, rel=1e-3) and args.max_concurrency is None


#: inference-perf's documented configuration keys, by section (docs/config.md).
INFERENCE_PERF = {
    "load": {"type", "interval", "stages", "num_workers", "worker_max_concurrency", "worker_max_tcp_connections",
             "request_timeout", "base_seed", "sweep"},
    "api": {"type", "streaming", "headers", "slo_unit", "slo_tpot_header", "slo_ttft_header"},
    "server": {"type", "model_name", "base_url", "ignore_eos", "api_key", "cert_path", "key_path"},
    "tokenizer": {"pretrained_model_name_or_path", "trust_remote_code", "token"},
    "data": {"type", "path", "input_distribution", "output_distribution", "shared_prefix"},
}
DISTRIBUTION = {"min": int, "max": int, "mean": (int, float), "std_dev": (int, float), "total_count": int}


@pytest.mark.parametrize("run", [RATE, CONC], ids=["rate", "concurrency"])
def test_the_inference_perf_config_has_only_documented_keys_of_the_right_types(run):
    config = yaml.safe_load(command(run, "inference-perf", "org/model"))
    assert set(config) <= set(INFERENCE_PERF)
    for section, keys in INFERENCE_PERF.items():
        assert set(config.get(section, {})) <= keys, section
    load = config["load"]
    assert load["type"] in ("constant", "poisson", "concurrent")
    (stage,) = load["stages"]
    if run.concurrency:
        assert load["type"] == "concurrent" and stage == {"concurrency_level": 16, "num_requests": 128}
    else:
        assert set(stage) == {"rate", "duration"} and isinstance(stage["rate"], float)
        assert isinstance(stage["duration"], int) and stage["duration"] * stage["rate"] >= run.num_requests
    assert config["data"]["type"] == "random" and config["api"] == {"type": "completion", "streaming": True}
    for name, tokens in (("input_distribution", run.prompt_tokens), ("output_distribution", run.output_tokens)):
        dist = config["data"][name]
        assert set(dist) <= set(DISTRIBUTION)
        assert all(isinstance(dist[k], DISTRIBUTION[k]) for k in dist)
        assert dist["min"] == dist["max"] == dist["mean"] == tokens and dist["std_dev"] == 0
    assert config["server"]["ignore_eos"] is True and config["server"]["base_url"].startswith("http")


def test_a_run_that_changes_the_engine_restarts_the_server_with_vllm_flags():
    assert server_command(RATE, "m") is None
    assert server_command(CONC, "org/model") == "vllm serve org/model --max-num-batched-tokens 8192"


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="guidellm"):
        command(RATE, "genai-perf", "m")
