"""Import GuideLLM benchmark reports (``benchmarks.json``: one request per row, client side).

Format (vllm-project/guidellm, ``guidellm benchmark ... --output-path benchmarks.json``;
read here from version 0.6.0.dev5, the file in ``shared/data/real``)::

    {"metadata": {"guidellm_version": "0.6.0.dev5", ...},
     "benchmarks": [
       {"config": {"strategy": {"type_": "constant", "rate": 0.76, "max_concurrency": 512, ...}},
        "start_time": 1768918376.48, "end_time": ...,
        "requests": {"successful": [REQ, ...], "errored": [...], "incomplete": [...]}}, ...]}

    REQ = {"response_id": "cmpl-...", "request_id": "<uuid>",
           "request_args": "{'body': {'prompt': '...', ...}, ...}",      (a Python repr, or a dict)
           "info": {"status": "completed", "error": null,
                    "timings": {"request_start": 1768918269.31, "first_token_iteration": ...,
                                "last_token_iteration": ..., "request_end": ..., ...}},
           "prompt_tokens": 2998, "output_tokens": 56,                      (the server's usage counts)
           "time_to_first_token_ms": ..., "time_per_output_token_ms": ..., ...}

All ``timings`` are client wall-clock epoch seconds (``time.time()``). ``response_id`` is the
server's completion id; vLLM's request id (its OTLP ``gen_ai.request.id``) is
``response_id + "-0"`` (choice 0), so this trace joins ``traces import vllm-otlp``.

``time_per_output_token_ms`` in the report is ``request_latency / output_tokens``: it
includes the TTFT and is **not** servecal's TPOT; neither it nor the other ``*_ms`` summaries
are read. Latencies are recomputed from ``timings`` (see :func:`import_guidellm`).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from schemas.metrics import tpot_s

from ..errors import TraceFormatError
from ._frame import assemble_frame
from ._json import json_number, read_json
from ._rows import RowStatus
from .block_hashes import text_block_hashes
from .guidellm_prompts import hash_metadata, prompt_text, prompt_texts

__all__ = ["import_guidellm"]

_LISTS = ("successful", "errored", "incomplete")


def _strategy(bench: dict) -> dict:
    cfg = bench.get("config") if isinstance(bench.get("config"), dict) else {}
    st = cfg.get("strategy") if isinstance(cfg.get("strategy"), dict) else {}
    return {"type": st.get("type_", st.get("type")), "rate": st.get("rate"),
            "max_concurrency": st.get("max_concurrency"), "worker_count": st.get("worker_count")}


def import_guidellm(path: str | Path, benchmark: int | None = None, block_hashes: bool = True,
                    invalid: str = "error") -> tuple[pd.DataFrame, dict]:
    """Read the requests of a GuideLLM report: one benchmark, or all of them.

    Parameters
    ----------
    path : str or Path
    benchmark : int, optional
        0-based index of the benchmark in file order (a sweep's strategies in the order they
        ran). Default: all benchmarks, with an int ``benchmark`` column.
    block_hashes : bool
        Derive ``block_hashes`` from the prompt text (see Notes).
    invalid : {"error", "flag", "drop"}
        A successful request whose timings go backwards (request_start <= first token <=
        last token) or with 0 output tokens: stop, keep it with ``status = 'invalid: ...'``,
        or leave it out.

    Returns
    -------
    frame : pandas.DataFrame
        One row per request, sorted by arrival:

        * ``request_id`` = ``response_id + "-0"`` (vLLM's request id, as in its OTLP spans);
          GuideLLM's own ``request_id`` when a request has no ``response_id``.
        * ``arrival_time_s`` = ``info.timings.request_start`` (s, client clock) minus the
          earliest ``request_start`` of the imported benchmark(s): with all benchmarks one
          origin (the first benchmark's first request), so they keep their real order and gaps.
        * ``ttft_s`` = ``first_token_iteration - request_start``.
        * ``e2e_s`` = ``last_token_iteration - request_start``, **not** ``request_end``:
          ``request_end`` also holds the end of the HTTP stream after the last token (the
          usage chunk and ``[DONE]``: 0.2-3.8 ms in the real file), which is no token. With
          the last token, E2E = TTFT + (N - 1) TPOT holds exactly, as servecal defines them.
        * ``tpot_s`` = ``(last_token_iteration - first_token_iteration) / (output_tokens - 1)``,
          NaN for one token. (GuideLLM's ``time_per_output_token_ms`` = latency / N, with the
          TTFT in it, is not used.)
        * ``num_prompt_tokens``, ``num_output_tokens`` = ``prompt_tokens``, ``output_tokens``
          (the server's usage counts).
        * ``benchmark`` (int, 0-based), only when all benchmarks are imported.
        * ``block_hashes`` (list<int64>, one per full 16-token block), unless ``block_hashes=False``.
        * ``status``: ``failed: errored: <error>`` / ``failed: incomplete`` for GuideLLM's
          errored and incomplete requests (kept, no latencies, skipped by replay; their prompt
          count falls back to ``input_metrics.text_tokens``, GuideLLM's own tokenizer count).
          Such a request that never started (no ``request_start``) or has no prompt count at
          all is left out and counted in ``num_dropped_unstarted``.

    metadata : dict
        ``guidellm_version``, ``benchmark`` (index or ``all``), ``benchmarks`` (JSON: per
        benchmark its index, strategy type, rate, max_concurrency, worker_count and request
        counts), and with one benchmark ``strategy_type``, ``strategy_rate``,
        ``strategy_max_concurrency``; ``time_origin_unix_s`` (the epoch of ``arrival_time_s =
        0``); with hashes ``hash_block_tokens`` = 16 (read by replay), ``chars_per_token``,
        ``shared_prefix_blocks`` (JSON: per benchmark, the leading blocks all its prompts
        share) and ``implied_prefix_cache_hit_rate`` (:func:`.block_hashes.implied_prefix_cache_hits` over
        the imported requests in arrival order).

    Raises
    ------
    TraceFormatError
        Naming the file, the request (1-based, in file order over all benchmarks and lists)
        and the field as a JSON path (``benchmarks[2].requests.successful[7].info.timings.
        request_start``): not a GuideLLM report, a benchmark index out of range, a missing or
        non-numeric timing or token count, unreadable ``request_args`` (with hashes on).

    Notes
    -----
    GuideLLM logs the prompt text but no token ids, so ``block_hashes`` are derived from
    text: one characters-per-token ratio for the whole file, ``r = sum(len(prompt)) /
    sum(prompt_tokens)`` over every request of every benchmark (so a benchmark imported
    alone gets the same hashes), puts the end of block ``k`` at character ``round((k + 1) *
    16 * r)``; see :func:`.block_hashes.text_block_hashes`. Two prompts share block ``k`` exactly when their
    texts agree up to that character. This is an approximation (a tokenizer would be exact):
    on the real sweep (r = 4.936 chars/token; each benchmark's prompts open with their own
    1,024-token prefix, 4,996-5,149 characters) it finds 63-65 shared leading blocks per
    benchmark where the tokens share exactly 64. The hit rate these hashes imply (requests in
    the order vLLM scheduled them, from its OTLP spans) stays within 0.3 percentage points of
    the "Prefix cache hit rate" vLLM logged every 10 s for the same run, and ends at 32.8 %
    where the log ends at 32.7 % (exactly 64 shared blocks would give 32.7 %;
    tests/traces/test_import_vllm_log.py).
    """
    path = Path(path)
    obj = read_json(path)
    benches = _benchmarks(path, obj, benchmark)
    status = RowStatus(path, invalid)
    c_order = status.invalid("timings out of order", None,
                             "request_start <= first_token_iteration <= last_token_iteration")
    checks = (status.invalid("successful with 0 output tokens", None, ">= 1 output token"), c_order)
    recs, summaries = _requests(path, benches)
    chosen = [r for r in recs if benchmark is None or r[0] == benchmark]
    if not any(kind == "successful" for _, kind, *_ in chosen):
        which = f"benchmark {benchmark}" if benchmark is not None else "the file"
        raise TraceFormatError(path, f"{which} has no successful requests", column="requests.successful")
    texts, ratio = prompt_texts(path, recs) if block_hashes else ({}, None)
    cols = _Columns(len(chosen))
    for j, (b, kind, i, r, req) in enumerate(chosen):
        where = f"benchmarks[{b}].requests.{kind}[{i}]"
        cols.rows[j], cols.bench[j] = r, b
        info = req.get("info") if isinstance(req.get("info"), dict) else {}
        tim = info.get("timings") if isinstance(info.get("timings"), dict) else None
        cols.ids.append(_request_id(path, req, info, kind, r, where, cols))
        if kind != "successful":
            _read_failed(path, req, info, tim, kind, (j, r, where), cols, status, texts, ratio)
        else:
            _read_successful(path, req, tim, (j, r, where), cols, texts, ratio, checks)
    # rows in the order read, so an error names the first bad request of the file
    status.add(cols.codes, rows=cols.rows)
    tpot = tpot_s(cols.ttft, cols.e2e, cols.output)
    idx = np.flatnonzero(cols.keep)
    origin = float(np.min(cols.start[idx]))
    extra = {"ttft_s": cols.ttft[idx], "e2e_s": cols.e2e[idx], "tpot_s": tpot[idx]}
    if benchmark is None:
        extra["benchmark"] = cols.bench[idx]
    if block_hashes:
        kept_hashes = np.empty(idx.size, dtype=object)
        kept_hashes[:] = [cols.hashes[k] for k in idx]
        extra["block_hashes"] = kept_hashes
    df, meta = assemble_frame(cols.start[idx] - origin, cols.prompt[idx], cols.output[idx], status=status,
                              codes=cols.codes[idx], rows=cols.rows[idx], request_ids=[cols.ids[k] for k in idx],
                              extra=extra)
    meta.update(_metadata(path, obj, benchmark, summaries, origin, cols))
    if block_hashes:
        meta.update(hash_metadata(df, benchmark, ratio))
    return df, meta


def _benchmarks(path: Path, obj, benchmark: int | None) -> list:
    """The ``benchmarks`` list of report ``obj``; refused when there is none or ``benchmark`` is out of range."""
    if not isinstance(obj, dict) or not isinstance(obj.get("benchmarks"), list):
        raise TraceFormatError(path, "has no 'benchmarks' list", column="benchmarks",
                               expected="a GuideLLM benchmark report (guidellm benchmark --output-path x.json)",
                               fold=True)
    benches = obj["benchmarks"]
    if not benches:
        raise TraceFormatError(path, "has no benchmarks", column="benchmarks")
    if benchmark is not None and not 0 <= benchmark < len(benches):
        raise TraceFormatError(path, f"benchmark {benchmark} is out of range", column="benchmarks",
                               expected=f"--benchmark 0..{len(benches) - 1} (0-based, in file order)")
    return benches


def _requests(path: Path, benches: list) -> tuple[list, list[dict]]:
    """Every request of every benchmark, ``(benchmark, list name, index in the list, 1-based row, request)``
    in file order, and per benchmark its strategy and request counts."""
    recs, summaries, row = [], [], 0
    for b, bench in enumerate(benches):
        if not isinstance(bench, dict) or not isinstance(bench.get("requests"), dict):
            raise TraceFormatError(path, "benchmark has no 'requests' object", column=f"benchmarks[{b}].requests",
                                   expected="{'successful': [...], 'errored': [...], 'incomplete': [...]}")
        counts = {}
        for kind in _LISTS:
            lst = bench["requests"].get(kind) or []
            if not isinstance(lst, list):
                raise TraceFormatError(path, f"is a {type(lst).__name__}", column=f"benchmarks[{b}].requests.{kind}",
                                       expected="a list of requests")
            counts[kind] = len(lst)
            for i, req in enumerate(lst):
                row += 1
                if not isinstance(req, dict):
                    raise TraceFormatError(path, f"request is a JSON {type(req).__name__}", row=row,
                                           column=f"benchmarks[{b}].requests.{kind}[{i}]", expected="an object")
                recs.append((b, kind, i, row, req))
        summaries.append({"index": b, **_strategy(bench), **{f"num_{k}": v for k, v in counts.items()}})
    return recs, summaries


class _Columns:
    """The columns of the chosen requests, filled request by request (index ``j``, in file order)."""

    def __init__(self, n: int):
        self.start = np.full(n, np.nan)
        self.prompt = np.zeros(n, np.int64)
        self.output = np.zeros(n, np.int64)
        self.ttft, self.e2e = np.full(n, np.nan), np.full(n, np.nan)
        self.bench = np.zeros(n, np.int64)
        self.codes = np.zeros(n, np.int16)
        self.ids: list[str] = []
        self.rows = np.zeros(n, np.int64)
        self.hashes = np.empty(n, dtype=object)
        self.keep = np.ones(n, bool)  # False: a failed request that never started, left out
        self.end_gap: list[float] = []  # request_end - last_token_iteration, seconds
        self.ids_from_guidellm = 0


def _request_id(path: Path, req: dict, info: dict, kind: str, r: int, where: str, cols: _Columns) -> str:
    """vLLM's id of request ``req`` (``response_id + "-0"``), else GuideLLM's (counted in ``cols``)."""
    rid = req.get("response_id")
    if isinstance(rid, str) and rid:
        return rid + "-0"
    rid = req.get("request_id") or info.get("request_id")
    if not isinstance(rid, str) or not rid:
        if kind == "successful":
            raise TraceFormatError(path, "no response_id nor request_id", row=r, column=f"{where}.response_id",
                                   expected="the server's completion id")
        rid = f"guidellm-row-{r}"
    cols.ids_from_guidellm += 1
    return rid


def _read_failed(path: Path, req: dict, info: dict, tim: dict | None, kind: str, at: tuple, cols: _Columns,
                 status: RowStatus, texts: dict, ratio: float | None) -> None:
    """An errored or incomplete request (``at``: its index, row and JSON path): kept as failed, or left
    out when it never started or has no prompt count; hashed when ``ratio`` (hashes on) and its prompt reads."""
    j, r, where = at
    st = tim.get("request_start") if tim else None
    n_in = req.get("prompt_tokens")
    if not isinstance(n_in, int) or isinstance(n_in, bool) or n_in < 1:
        im = req.get("input_metrics") if isinstance(req.get("input_metrics"), dict) else {}
        n_in = im.get("text_tokens")
    if (not isinstance(st, (int, float)) or isinstance(st, bool) or not isinstance(n_in, int)
            or isinstance(n_in, bool) or n_in < 1):
        cols.keep[j] = False
        return
    cols.start[j] = float(st)
    cols.prompt[j] = n_in
    out = req.get("output_tokens")
    cols.output[j] = out if isinstance(out, int) and not isinstance(out, bool) and out >= 0 else 0
    err = info.get("error") or req.get("error")
    reason = "incomplete" if kind == "incomplete" else "errored" + (
        f": {str(err).strip().splitlines()[-1][:100]}" if err and str(err).strip() else "")
    cols.codes[j] = status.failed(reason)
    if ratio is not None:
        text = texts.get(r)
        if text is None:
            try:
                text = prompt_text(path, req, r, where)
            except TraceFormatError:
                text = None  # a failed request without a readable prompt: no hashes
        if text is not None:
            cols.hashes[j] = text_block_hashes(text, n_in, ratio)


def _read_successful(path: Path, req: dict, tim: dict | None, at: tuple, cols: _Columns, texts: dict,
                     ratio: float | None, checks: tuple[int, int]) -> None:
    """A successful request (``at``: its index, row and JSON path): its timings and counts, or the code
    of ``checks`` (0 output tokens, timings out of order) it breaks."""
    j, r, where = at
    if tim is None:
        raise TraceFormatError(path, "missing field", row=r, column=f"{where}.info.timings")
    t = {}
    for f in ("request_start", "first_token_iteration", "last_token_iteration"):
        if f not in tim:
            raise TraceFormatError(path, "missing field", row=r, column=f"{where}.info.timings.{f}")
        t[f] = json_number(path, tim[f], column=f"{where}.info.timings.{f}", row=r, minimum=0)
    for f in ("prompt_tokens", "output_tokens"):
        if f not in req:
            raise TraceFormatError(path, "missing field", row=r, column=f"{where}.{f}")
    cols.prompt[j] = json_number(path, req["prompt_tokens"], column=f"{where}.prompt_tokens", row=r, integer=True,
                                 minimum=1)
    cols.output[j] = json_number(path, req["output_tokens"], column=f"{where}.output_tokens", row=r, integer=True,
                                 minimum=0)
    cols.start[j] = t["request_start"]
    if ratio is not None:
        cols.hashes[j] = text_block_hashes(texts[r], cols.prompt[j], ratio)
    c_out0, c_order = checks
    if cols.output[j] == 0:
        cols.codes[j] = c_out0
        return
    if not t["request_start"] <= t["first_token_iteration"] <= t["last_token_iteration"]:
        cols.codes[j] = c_order
        return
    cols.ttft[j] = t["first_token_iteration"] - t["request_start"]
    cols.e2e[j] = t["last_token_iteration"] - t["request_start"]
    re_ = tim.get("request_end")
    if isinstance(re_, (int, float)) and not isinstance(re_, bool):
        cols.end_gap.append(float(re_) - t["last_token_iteration"])


def _metadata(path: Path, obj: dict, benchmark: int | None, summaries: list[dict], origin: float,
              cols: _Columns) -> dict:
    """The importer's metadata: the report, the benchmark(s), the time origin and the columns' sources."""
    gl_meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    meta = {
        "source_format": "guidellm",
        "source": str(path),
        "guidellm_version": str(gl_meta.get("guidellm_version", "")),
        "benchmark": "all" if benchmark is None else str(benchmark),
        "benchmarks": json.dumps(summaries),
        "time_origin_unix_s": repr(origin),
        "arrival_source": "info.timings.request_start (client epoch s) minus the earliest of the imported "
                          "benchmark(s)",
        "ttft_source": "first_token_iteration - request_start",
        "e2e_source": "last_token_iteration - request_start (request_end adds the stream's close, no token)",
        "tpot_source": "(last_token_iteration - first_token_iteration) / (output_tokens - 1)",
        "token_counts_source": "prompt_tokens, output_tokens (server usage)",
        "request_id_source": f"response_id + '-0' (vLLM's request id); GuideLLM request_id for "
                             f"{cols.ids_from_guidellm}",
        "num_dropped_unstarted": str(int((~cols.keep).sum())),
    }
    if cols.end_gap:
        meta["request_end_minus_last_token_max_s"] = f"{max(cols.end_gap):.6f}"
    if benchmark is not None:
        s = summaries[benchmark]
        meta.update({"strategy_type": str(s["type"]), "strategy_rate": str(s["rate"]),
                     "strategy_max_concurrency": str(s["max_concurrency"])})
    return meta
