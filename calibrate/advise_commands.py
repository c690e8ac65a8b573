"""An advised run (:class:`calibrate.advise_candidates.Workload`) as the command of a benchmark tool.

The flags are the tools' documented ones (``tests/calibrate/test_advise_commands.py`` parses each
emitted command with a spec written from that documentation):

- GuideLLM (``guidellm benchmark``, vllm-project/guidellm, docs "Run a Benchmark"): ``--target``,
  ``--model``, ``--rate-type constant|concurrent``, ``--rate`` (requests/s, or concurrent requests),
  ``--max-requests``, ``--data "prompt_tokens=P,output_tokens=O"`` (synthetic prompts of fixed lengths);
- ``vllm bench serve`` (docs.vllm.ai, CLI reference "vllm bench serve"): ``--base-url``, ``--model``,
  ``--dataset-name random``, ``--random-input-len``, ``--random-output-len``, ``--random-range-ratio 0``
  (fixed lengths), ``--ignore-eos``, ``--num-prompts``, ``--request-rate`` (Poisson arrivals) or
  ``--max-concurrency``, ``--seed``;
- inference-perf (kubernetes-sigs/inference-perf, docs/config.md): ``inference-perf --config_file F``
  with F the YAML printed: ``load.type`` ``constant`` with ``stages: [{rate, duration}]`` or
  ``concurrent`` with ``stages: [{concurrency_level, num_requests}]``; ``data.type: random`` with
  ``input_distribution``/``output_distribution`` of ``min = max = mean`` and ``std_dev: 0``;
  ``server: {type: vllm, model_name, base_url, ignore_eos: true}``; ``api: {type: completion,
  streaming: true}``.

A run that changes the engine's limits needs the server restarted with them: :func:`server_command`.
"""
from __future__ import annotations

import math
import shlex

#: ``--format`` choices.
FORMATS = ("guidellm", "vllm-bench", "inference-perf")
#: The server the commands target unless ``--target`` says otherwise.
DEFAULT_TARGET = "http://localhost:8000"
#: vLLM's flag of each engine limit a run may change.
ENGINE_FLAGS = {"max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens"}


def model_id(name: str) -> str:
    """The Hugging Face id of catalog model ``name`` (the name itself when the catalog has none)."""
    from schemas.specs import list_models

    return next((m["hf_id"] for m in list_models() if m["key"] == name and m["hf_id"]), name)


def poisson_arrivals(fmt: str) -> bool:
    """Whether the tool of ``fmt`` sends a rate as Poisson arrivals (``vllm bench serve``) rather than
    evenly spaced ones (GuideLLM ``constant``, inference-perf ``constant``)."""
    return fmt == "vllm-bench"


def server_command(w, model: str) -> str | None:
    """``vllm serve MODEL --max-num-seqs ...`` with the limits ``w`` changes (None: it changes none)."""
    if not w.engine:
        return None
    flags = " ".join(f"{ENGINE_FLAGS[k]} {v}" for k, v in w.engine)
    return f"vllm serve {shlex.quote(model)} {flags}"


def command(w, fmt: str, model: str, target: str = DEFAULT_TARGET) -> str:
    """The command (GuideLLM, vllm bench) or the YAML config (inference-perf) that runs ``w``.

    Raises
    ------
    ValueError
        ``fmt`` not one of :data:`FORMATS`.
    """
    q = shlex.quote
    if fmt == "guidellm":
        load = (f"--rate-type concurrent --rate {w.concurrency}" if w.concurrency
                else f"--rate-type constant --rate {w.rate_rps:.4g}")
        data = q(f"prompt_tokens={w.prompt_tokens},output_tokens={w.output_tokens}")
        return (f"guidellm benchmark --target {q(target)} --model {q(model)} {load} --max-requests {w.num_requests} "
                f"--data {data}")
    if fmt == "vllm-bench":
        load = f"--max-concurrency {w.concurrency}" if w.concurrency else f"--request-rate {w.rate_rps:.4g}"
        return (f"vllm bench serve --base-url {q(target)} --model {q(model)} --dataset-name random "
                f"--random-input-len {w.prompt_tokens} --random-output-len {w.output_tokens} --random-range-ratio 0 "
                f"--ignore-eos --num-prompts {w.num_requests} {load} --seed 0")
    if fmt == "inference-perf":
        return inference_perf_yaml(w, model, target)
    raise ValueError(f"format {fmt!r}: expected one of {', '.join(FORMATS)}")


def inference_perf_yaml(w, model: str, target: str) -> str:
    """The inference-perf config of ``w`` (YAML text; run it with ``inference-perf --config_file FILE``)."""
    import yaml

    if w.concurrency:
        load = {"type": "concurrent", "stages": [{"concurrency_level": w.concurrency, "num_requests": w.num_requests}]}
    else:
        load = {"type": "constant", "stages": [{"rate": float(f"{w.rate_rps:.4g}"),
                                                "duration": math.ceil(w.num_requests / w.rate_rps)}]}

    def fixed(n):
        return {"min": n, "max": n, "mean": n, "std_dev": 0, "total_count": w.num_requests}

    config = {"load": load, "api": {"type": "completion", "streaming": True},
              "server": {"type": "vllm", "model_name": model, "base_url": target, "ignore_eos": True},
              "tokenizer": {"pretrained_model_name_or_path": model},
              "data": {"type": "random", "input_distribution": fixed(w.prompt_tokens),
                       "output_distribution": fixed(w.output_tokens)}}
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=False).rstrip()


def folded(text: str, width: int = 100, indent: str = "    ") -> str:
    """A one-line command folded into lines of at most ``width`` columns (where its flags allow) with
    the shell's `` \\`` continuations, each flag beside its value; the words of the command hold no
    spaces of their own (values are quoted without them)."""
    lead = text[:len(text) - len(text.lstrip())]
    units: list[str] = []
    for word in text.strip().split(" "):
        if units and not word.startswith("-") and units[-1].startswith("-") and " " not in units[-1]:
            units[-1] += " " + word
        else:
            units.append(word)
    lines, line = [], lead + units.pop(0)
    for unit in units:
        if line and len(line) + 1 + len(unit) + 2 > width:
            lines.append(line + " \\")
            line = indent + unit
        else:
            line = f"{line} {unit}"
    return "\n".join([*lines, line])
