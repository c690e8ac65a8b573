"""Import vLLM's OpenTelemetry request spans (OTLP/JSON lines, server side).

Format: vLLM started with ``--otlp-traces-endpoint`` exports one ``llm_request`` span per
request (vllm/tracing.py ``SpanAttributes``; ``vllm/v1/engine/output_processor.py``
``do_tracing``); an OpenTelemetry collector's ``file`` exporter writes them as OTLP/JSON,
one ``ExportTraceServiceRequest`` per line::

    {"resourceSpans": [{"resource": {...}, "scopeSpans": [{"scope": {"name": "vllm.llm_engine"},
      "spans": [{"name": "llm_request", "startTimeUnixNano": "1768918269342362112",
                 "endTimeUnixNano": "...", "status": {},
                 "attributes": [{"key": "gen_ai.request.id", "value": {"stringValue": "cmpl-...-0"}},
                                {"key": "gen_ai.usage.prompt_tokens", "value": {"intValue": "2998"}},
                                {"key": "gen_ai.latency.e2e", "value": {"doubleValue": 2.75}}, ...]}]}]}]}

OTLP/JSON writes 64-bit integers (``intValue``, ``*UnixNano``) as decimal strings; both
strings and numbers are accepted. ``startTimeUnixNano`` is the request's arrival at the
engine (vLLM sets the span's start to the request's ``arrival_time``). Latency attributes
are seconds: ``gen_ai.latency.time_to_first_token``, ``.e2e``, ``.time_in_queue``,
``.time_in_model_prefill``, ``.time_in_model_decode``, ``.time_in_model_inference``.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from schemas.metrics import tpot_s

from ..errors import TraceFormatError
from ._frame import assemble_frame
from ._json import iter_jsonl
from ._rows import RowStatus
from ._source import Progress
from ._time import relative_seconds

__all__ = ["import_vllm_otlp", "join_guidellm", "SPAN_NAME"]

#: Name of vLLM's per-request span.
SPAN_NAME = "llm_request"

_ID = "gen_ai.request.id"
_PROMPT = "gen_ai.usage.prompt_tokens"
_COMPLETION = "gen_ai.usage.completion_tokens"
_TTFT = "gen_ai.latency.time_to_first_token"
_E2E = "gen_ai.latency.e2e"
_QUEUE = "gen_ai.latency.time_in_queue"
#: Optional per-phase times (s), kept as extra columns of the request trace.
_PHASES = {"gen_ai.latency.time_in_model_prefill": "prefill_time_s",
           "gen_ai.latency.time_in_model_decode": "decode_time_s",
           "gen_ai.latency.time_in_model_inference": "inference_time_s"}


def _value(path, v, *, row, line, column):
    """The Python value of an OTLP ``AnyValue`` (``{"intValue": "12"}`` -> 12)."""
    if not isinstance(v, dict) or len(v) == 0:
        raise TraceFormatError(path, f"value {v!r:.60} is not an OTLP AnyValue", row=row, line=line, column=column,
                               expected='{"stringValue" | "intValue" | "doubleValue" | "boolValue": ...}')
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        x = v["intValue"]
        if isinstance(x, str):
            try:
                x = int(x)
            except ValueError:
                raise TraceFormatError(path, f"intValue {x!r:.40} is not an integer", row=row, line=line,
                                       column=column) from None
        if isinstance(x, bool) or not isinstance(x, int):
            raise TraceFormatError(path, f"intValue {x!r:.40} is not an integer", row=row, line=line, column=column)
        if not -2**63 <= x < 2**63:
            raise TraceFormatError(path, "intValue beyond a 64-bit integer", row=row, line=line, column=column)
        return x
    if "doubleValue" in v:
        x = v["doubleValue"]
        if isinstance(x, str):  # proto3 JSON: "NaN", "Infinity", or a quoted number
            try:
                return float(x)
            except (ValueError, OverflowError):
                raise TraceFormatError(path, f"doubleValue {x!r:.40} is not a number", row=row, line=line,
                                       column=column) from None
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise TraceFormatError(path, f"doubleValue {x!r:.40} is not a number", row=row, line=line, column=column)
        try:
            return float(x)
        except OverflowError:
            raise TraceFormatError(path, "doubleValue beyond a 64-bit float", row=row, line=line,
                                   column=column) from None
    if "boolValue" in v:
        return v["boolValue"]
    return v  # arrays, kvlists, bytes: not read


def _seconds(path, attrs, key, *, row, line, required: bool = True) -> float:
    if key not in attrs:
        if required:
            raise TraceFormatError(path, "missing attribute", row=row, line=line, column=key)
        return math.nan
    x = attrs[key]
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        raise TraceFormatError(path, f"value {x!r:.40} is not a finite number of seconds >= 0", row=row, line=line,
                               column=key)
    return float(x)


def _count(path, attrs, key, *, row, line, minimum: int) -> int:
    if key not in attrs:
        raise TraceFormatError(path, "missing attribute", row=row, line=line, column=key)
    x = attrs[key]
    if isinstance(x, float) and x == int(x):
        x = int(x)
    if isinstance(x, bool) or not isinstance(x, int) or x < minimum:
        raise TraceFormatError(path, f"value {x!r:.40} is not a whole number >= {minimum}", row=row, line=line,
                               column=key)
    return x


def _nanos(path, v, *, row, line, column) -> int:
    if isinstance(v, str):
        try:
            v = int(v)
        except ValueError:
            raise TraceFormatError(path, f"value {v!r:.40} is not an integer of nanoseconds", row=row, line=line,
                                   column=column) from None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2 ** 63:
        raise TraceFormatError(path, f"value {v!r:.40} is not an integer of nanoseconds", row=row, line=line,
                               column=column, expected="epoch nanoseconds (a decimal string in OTLP/JSON)")
    return v


def _spans(path, obj, line):
    """Yield ``(json path, span)`` of every span of one OTLP/JSON line."""
    rss = obj.get("resourceSpans") if isinstance(obj, dict) else None
    if not isinstance(rss, list):
        raise TraceFormatError(path, "no 'resourceSpans' list", line=line, column="resourceSpans",
                               expected="one OTLP/JSON ExportTraceServiceRequest per line (collector file exporter)")
    for a, rs in enumerate(rss):
        sss = rs.get("scopeSpans", rs.get("instrumentationLibrarySpans", [])) if isinstance(rs, dict) else None
        if not isinstance(sss, list):
            raise TraceFormatError(path, "no 'scopeSpans' list", line=line, column=f"resourceSpans[{a}].scopeSpans")
        for b, ss in enumerate(sss):
            spans = ss.get("spans", []) if isinstance(ss, dict) else None
            if not isinstance(spans, list):
                raise TraceFormatError(path, "no 'spans' list", line=line,
                                       column=f"resourceSpans[{a}].scopeSpans[{b}].spans")
            for c, sp in enumerate(spans):
                where = f"resourceSpans[{a}].scopeSpans[{b}].spans[{c}]"
                if not isinstance(sp, dict):
                    raise TraceFormatError(path, "span is not an object", line=line, column=where)
                yield where, sp


def import_vllm_otlp(path: str | Path, invalid: str = "error", progress: Progress | None = None,
                     ) -> tuple[pd.DataFrame, dict]:
    """Read vLLM's ``llm_request`` spans from an OTLP/JSON lines file.

    Parameters
    ----------
    path : str or Path
    invalid : {"error", "flag", "drop"}
        A span with 0 completion tokens, TTFT > E2E or time in queue > TTFT: stop, keep it with
        ``status = 'invalid: ...'``, or leave it out. A span with an error status
        (``status.code`` 2) is kept with ``status = 'failed: <message>'``.
    progress : callable, optional
        Called with bytes read.

    Returns
    -------
    frame : pandas.DataFrame
        One row per ``llm_request`` span, sorted by arrival:
        ``request_id`` = ``gen_ai.request.id``; ``arrival_time_s`` = ``startTimeUnixNano``
        minus the earliest (exact in int64 ns, then seconds); ``ttft_s``, ``e2e_s``,
        ``queue_wait_s`` = ``gen_ai.latency.time_to_first_token``, ``.e2e``,
        ``.time_in_queue`` (s); ``tpot_s`` = (e2e - ttft) / (completion_tokens - 1), NaN for
        one token; ``num_prompt_tokens``, ``num_output_tokens`` = ``gen_ai.usage.prompt_tokens``,
        ``.completion_tokens``; extra float columns ``prefill_time_s``, ``decode_time_s``,
        ``inference_time_s`` = ``gen_ai.latency.time_in_model_prefill``, ``_decode``,
        ``_inference`` (s; vLLM's time from scheduled to first token, first to last token,
        and their sum), when the spans have them.
    metadata : dict
        ``num_spans`` (llm_request), ``num_other_spans`` and ``other_span_names`` (ignored),
        ``time_origin_unix_ns``, ``service_name``.

    Raises
    ------
    TraceFormatError
        Naming the file, the span (1-based ``llm_request`` span, and its line) and the
        attribute: a truncated or non-JSON line, not OTLP, a missing or non-numeric
        attribute, a duplicate request id, no ``llm_request`` span at all.
    """
    path = Path(path)
    status = RowStatus(path, invalid)
    checks = (status.invalid("0 completion tokens", _COMPLETION, ">= 1 generated token"),
              status.invalid("time_to_first_token > e2e", _TTFT, f"{_TTFT} <= {_E2E}"),
              status.invalid("time_in_queue > time_to_first_token", _QUEUE, f"{_QUEUE} <= {_TTFT}"))
    cols = _Columns()
    other: dict[str, int] = {}
    services: set[str] = set()
    n = 0
    for _, line, obj in iter_jsonl(path, progress):
        services |= _service_names(obj)
        for where, sp in _spans(path, obj, line):
            name = sp.get("name")
            if name != SPAN_NAME:
                other[str(name)] = other.get(str(name), 0) + 1
                continue
            n += 1
            _read_span(path, sp, where, n, line, cols, status, checks)
    if n == 0:
        raise TraceFormatError(path, f"has no '{SPAN_NAME}' spans" + (f" (only {other})" if other else ""),
                               expected="vLLM's request spans (vllm serve --otlp-traces-endpoint ...)")
    codes_a = np.array(cols.codes, np.int16)
    status.add(codes_a, rows=np.array(cols.rows))
    ticks = np.array(cols.start, np.int64)
    arrival = relative_seconds(ticks, 1)
    out_a = np.array(cols.output, np.int64)
    ttft_a, e2e_a = np.array(cols.ttft), np.array(cols.e2e)
    extra = {"queue_wait_s": np.array(cols.queue), "ttft_s": ttft_a, "e2e_s": e2e_a,
             "tpot_s": tpot_s(ttft_a, e2e_a, out_a)}
    if np.all(np.isnan(extra["queue_wait_s"])):
        del extra["queue_wait_s"]
    for col, vals in cols.phases.items():
        v = np.array(vals)
        if not np.all(np.isnan(v)):
            extra[col] = v
    df, meta = assemble_frame(arrival, np.array(cols.prompt, np.int64), out_a, status=status, codes=codes_a,
                              rows=np.array(cols.rows, np.int64), request_ids=cols.ids, extra=extra)
    meta.update({
        "source_format": "vllm-otlp",
        "source": str(path),
        "num_spans": str(n),
        "num_other_spans": str(sum(other.values())),
        "other_span_names": ",".join(sorted(other)),
        "service_name": ",".join(sorted(services)),
        "time_origin_unix_ns": str(int(ticks.min())),
        "time_origin_unix_s": repr(int(ticks.min()) / 1e9),
        "arrival_source": "span startTimeUnixNano (the engine's arrival_time) minus the earliest",
        "latency_source": "gen_ai.latency.* attributes (engine side, s)",
        "tpot_source": "(gen_ai.latency.e2e - time_to_first_token) / (completion_tokens - 1)",
    })
    return df, meta


def _service_names(obj) -> set[str]:
    """The ``service.name`` of every resource of one OTLP/JSON line."""
    services = set()
    rss = obj.get("resourceSpans") if isinstance(obj, dict) else None
    for rs in rss if isinstance(rss, list) else []:
        res = rs.get("resource") if isinstance(rs, dict) else None
        attributes = res.get("attributes") if isinstance(res, dict) else None
        for a in attributes if isinstance(attributes, list) else []:
            if isinstance(a, dict) and a.get("key") == "service.name" and isinstance(a.get("value"), dict):
                services.add(str(a["value"].get("stringValue")))
    return services


class _Columns:
    """The columns of the ``llm_request`` spans read so far, one entry per span (latencies NaN unless ok)."""

    def __init__(self):
        self.start: list[int] = []  # startTimeUnixNano
        self.ids: list[str] = []
        self.prompt: list[int] = []
        self.output: list[int] = []
        self.ttft: list[float] = []
        self.e2e: list[float] = []
        self.queue: list[float] = []
        self.rows: list[int] = []
        self.codes: list[int] = []
        self.phases: dict[str, list[float]] = {c: [] for c in _PHASES.values()}
        self.seen: dict[str, int] = {}  # request id -> its span's row


def _attributes(path: Path, sp: dict, where: str, n: int, line: int) -> dict:
    """The attributes of span ``sp`` (the ``n``-th request span, at JSON path ``where``) by key."""
    attrs = {}
    if not isinstance(sp.get("attributes") or [], list):
        raise TraceFormatError(path, "attributes is not a list", row=n, line=line, column=f"{where}.attributes")
    for k, a in enumerate(sp.get("attributes") or []):
        if not isinstance(a, dict) or not isinstance(a.get("key"), str):
            raise TraceFormatError(path, "attribute without a key", row=n, line=line,
                                   column=f"{where}.attributes[{k}]")
        attrs[a["key"]] = _value(path, a.get("value"), row=n, line=line, column=a["key"])
    return attrs


def _read_span(path: Path, sp: dict, where: str, n: int, line: int, cols: _Columns, status: RowStatus,
               checks: tuple[int, int, int]) -> None:
    """Append request span ``sp`` (the ``n``-th) to ``cols``: its start, id, counts and latencies, and
    its status code (the span's error, or the first of ``checks`` it breaks: 0 completion tokens,
    TTFT above E2E, queue time above TTFT)."""
    attrs = _attributes(path, sp, where, n, line)
    if "startTimeUnixNano" not in sp:
        raise TraceFormatError(path, "missing field", row=n, line=line, column=f"{where}.startTimeUnixNano")
    cols.start.append(_nanos(path, sp["startTimeUnixNano"], row=n, line=line, column=f"{where}.startTimeUnixNano"))
    rid = attrs.get(_ID)
    if not isinstance(rid, str) or not rid:
        raise TraceFormatError(path, "missing or empty request id", row=n, line=line, column=_ID)
    if rid in cols.seen:
        raise TraceFormatError(path, f"duplicate request id {rid!r} (first in span {cols.seen[rid]})", row=n,
                               line=line, column=_ID, expected="one llm_request span per request")
    cols.seen[rid] = n
    cols.ids.append(rid)
    cols.prompt.append(_count(path, attrs, _PROMPT, row=n, line=line, minimum=1))
    out = _count(path, attrs, _COMPLETION, row=n, line=line, minimum=0)
    cols.output.append(out)
    t = _seconds(path, attrs, _TTFT, row=n, line=line)
    e = _seconds(path, attrs, _E2E, row=n, line=line)
    q = _seconds(path, attrs, _QUEUE, row=n, line=line, required=False)
    for key, col in _PHASES.items():
        cols.phases[col].append(_seconds(path, attrs, key, row=n, line=line, required=False))
    st = sp.get("status") if isinstance(sp.get("status"), dict) else {}
    c_out0, c_order, c_queue = checks
    code = 0
    if st.get("code") in (2, "STATUS_CODE_ERROR"):
        code = status.failed(str(st.get('message') or 'span status error')[:100])
    elif out == 0:
        code = c_out0
    elif t > e * (1 + 1e-12):
        code = c_order
    elif q > t * (1 + 1e-12):
        code = c_queue
    cols.codes.append(code)
    cols.rows.append(n)
    ok = code == 0
    cols.ttft.append(t if ok else math.nan)
    cols.e2e.append(e if ok else math.nan)
    cols.queue.append(q if ok else math.nan)


def join_guidellm(frame: pd.DataFrame, meta: dict, guidellm_path: str | Path,
                  block_hashes: bool = True) -> tuple[pd.DataFrame, dict]:
    """Add GuideLLM's ``benchmark`` (and ``block_hashes``) to spans, joined on the request id.

    Parameters
    ----------
    frame, meta
        From :func:`import_vllm_otlp`.
    guidellm_path : str or Path
        The GuideLLM report of the same run (the client's view of the same requests), read
        with :func:`~traces.importers.guidellm.import_guidellm`; its ``request_id`` is
        ``response_id + "-0"``, vLLM's ``gen_ai.request.id``.
    block_hashes : bool
        Also carry the ``block_hashes`` derived from the prompt text (and the
        ``hash_block_tokens`` metadata), so the engine-side trace can replay with prefix caching.

    Returns
    -------
    frame : pandas.DataFrame
        With ``benchmark`` (nullable Int64: null for a span GuideLLM does not have) and
        ``block_hashes``.
    metadata : dict
        ``guidellm_source``, ``guidellm_num_matched``, ``guidellm_num_unmatched_spans``,
        ``benchmarks`` (strategies, from the report).

    Raises
    ------
    TraceFormatError
        The report's own errors, or no span matching any GuideLLM request (not the same run).
    """
    from .guidellm import import_guidellm

    gdf, gmeta = import_guidellm(guidellm_path, block_hashes=block_hashes)
    by_id = pd.Series(np.arange(len(gdf)), index=gdf["request_id"].astype(str).to_numpy())
    pos = by_id.reindex(frame["request_id"].astype(str).to_numpy()).to_numpy()
    matched = ~np.isnan(pos)
    if not matched.any():
        raise TraceFormatError(guidellm_path, f"none of its {len(gdf)} requests matches a span's gen_ai.request.id "
                                              f"in {meta.get('source')}", column="response_id",
                               expected="the GuideLLM report of the same run (response_id + '-0' = gen_ai.request.id)")
    out = frame.copy()
    idx = pos[matched].astype(np.int64)
    bench = pd.array([pd.NA] * len(out), dtype="Int64")
    bench[matched] = gdf["benchmark"].to_numpy()[idx]
    out["benchmark"] = bench
    m = dict(meta)
    if block_hashes and "block_hashes" in gdf:
        hs = np.empty(len(out), dtype=object)
        src = gdf["block_hashes"].to_numpy()
        for k, j in zip(np.flatnonzero(matched), idx):
            hs[k] = src[j]
        out["block_hashes"] = hs
        for k in ("hash_block_tokens", "chars_per_token", "block_hashes_method"):
            m[k] = gmeta[k]
    m.update({"guidellm_source": str(guidellm_path), "guidellm_num_matched": str(int(matched.sum())),
              "guidellm_num_unmatched_spans": str(int((~matched).sum())),
              "guidellm_num_requests": str(len(gdf)), "benchmarks": gmeta["benchmarks"],
              "guidellm_version": gmeta.get("guidellm_version", "")})
    return out, m
