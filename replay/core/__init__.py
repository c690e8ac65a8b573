"""The discrete-event engine: one replica's steps (``engine``), their events, ends and decode
runs, requests and their KV cache, routers, the variants (pipeline parallelism, prefill/decode
disaggregation, closed loop) and the tables a replay returns (``result_columns``).
The policies that choose each batch are in ``replay.schedulers``; the step time in ``replay.cost``."""
