"""The names of servecal's table kinds (``servecal.schema`` in a Parquet file's metadata).

A module of its own, without pyarrow, so that command-line modules can name the kinds
without paying for the Arrow schemas (:mod:`schemas.tables`) at ``--help`` time.
"""
REQUEST_TRACE = "request_trace/1"
STEP_TRACE = "step_trace/1"
REPLAY_RESULT = "replay_result/1"
VLLM_STATS = "vllm_stats/1"
AGGREGATE_TARGETS = "aggregate_targets/1"


def a_kind(kind: str) -> str:
    """``kind`` with its article, for messages: ``"a step_trace/1"``, ``"an aggregate_targets/1"``."""
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"
