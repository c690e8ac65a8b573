"""Traces in and out (imports ``schemas`` only).

- ``io``: reading and writing the Parquet tables; ``importers/``: one module (or package) per source
  format (vLLM request stats, OTLP spans and server log, GuideLLM, vllm/sglang bench,
  GenAI-Perf, llmperf, Azure, BurstGPT, Mooncake, Vidur, any CSV, LLMServingSim profiles).
- ``synth``, ``transform``, ``describe``: synthetic workloads, windows and rate scaling,
  a trace's statistics.
- ``cli/``: the ``traces`` command, and (``cli/support``) the error mapping and ``--version``
  every servecal command shares; ``console``: the Ctrl-C guard every console script's entry runs its command under.
"""
