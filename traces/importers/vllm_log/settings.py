"""vLLM's engine settings as a log tells them: what was asked, what was printed, else the V1 defaults."""
from __future__ import annotations

#: The vLLM version whose defaults fill settings absent from a log.
DEFAULTS_VERSION = "0.11.0"

#: vLLM V1 defaults (``vllm serve``, CUDA) of the settings servecal uses, when the log has
#: neither the option nor a line showing its resolved value. ``None`` means the default
#: depends on the hardware or model and cannot be known from the log. Source: vLLM 0.11.0
#: ``vllm/engine/arg_utils.py`` (``EngineArgs`` fields and ``_set_default_args``) and
#: ``vllm/config/cache.py``.
V1_DEFAULTS: dict[str, tuple[object, str]] = {
    "tensor_parallel_size": (1, "EngineArgs default"),
    "pipeline_parallel_size": (1, "EngineArgs default"),
    "data_parallel_size": (1, "EngineArgs default"),
    "enable_prefix_caching": (True, "V1 default for generative models"),
    "enable_chunked_prefill": (True, "V1 default for generative models"),
    "block_size": (16, "CacheConfig default on CUDA"),
    "gpu_memory_utilization": (0.9, "EngineArgs default"),
    "max_num_seqs": (None, "GPU-dependent V1 API-server default: 1024 on GPUs with >= 70 GiB other than A100, "
                           "else 256"),
    "max_num_batched_tokens": (None, "GPU-dependent V1 API-server default: 8192 on GPUs with >= 70 GiB other than "
                                     "A100, else 2048 (printed as 'Chunked prefill is enabled with "
                                     "max_num_batched_tokens=N' when chunked prefill is on)"),
    "max_model_len": (None, "from the model's config.json (printed as 'Using max model len N')"),
}


def resolve_settings(non_default_args: dict, printed: dict) -> tuple[dict, dict]:
    """The engine settings of one log and where each came from.

    Parameters
    ----------
    non_default_args : dict
        The ``non-default args: {...}`` dict as logged (what the user asked for).
    printed : dict
        Option -> (value, source) of the values the engine printed once resolved.

    Returns
    -------
    settings, sources : dict
        Option -> value, and option -> its source (``non-default args``, a log line, a
        ratio of two lines, or a default of :data:`V1_DEFAULTS`).
    """
    settings: dict = {}
    sources: dict = {}
    # 1. what the user asked for
    for k, v in non_default_args.items():
        settings[k] = v
        sources[k] = "non-default args"
    # 2. values the engine printed once resolved win (they agree with 1 when both exist)
    for k, (v, src) in printed.items():
        if k == "model" and "model" in settings:
            continue
        settings[k] = v
        sources[k] = src
    if isinstance(settings.get("served_model_name"), list) and len(settings["served_model_name"]) == 1:
        settings["served_model_name"] = settings["served_model_name"][0]
    # 3. the block size: KV cache tokens / blocks when both are printed
    if "block_size" not in settings and settings.get("gpu_kv_cache_size_tokens") and settings.get("num_gpu_blocks"):
        tokens, blocks = settings["gpu_kv_cache_size_tokens"], settings["num_gpu_blocks"]
        if tokens % blocks == 0:
            settings["block_size"] = tokens // blocks
            sources["block_size"] = f"GPU KV cache size / num_gpu_blocks = {tokens} / {blocks}"
    # 4. defaults
    for k, (v, why) in V1_DEFAULTS.items():
        if k not in settings:
            settings[k] = v
            sources[k] = f"default (vLLM {DEFAULTS_VERSION} V1): {why}"
    return settings, sources
