"""Import DistServe benchmark results (``NAME.exp``: per-request timestamps of one run).

Format (LLMServe/DistServe ``evaluation/2-benchmark-serving/structs.py``, ``ReqResult`` and
``dump_req_result_list``; the alignment ground truth under
``simdistserve/benchmarks/alignment/data-ground-truth/``): line 1 is
``str([dataclasses.asdict(r) for r in results])``, a **Python literal** (single quotes), read
here with :func:`ast.literal_eval`, never ``eval``; one dict per request, in completion order::

    {'prompt_len': 55, 'output_len': 4, 'issue_time': 12450751.747537581,
     'first_token_time': 12450751.8171006, 'complete_time': 12450751.895573435,
     'ttft_ms': 69.56..., 'tpot_ms': 26.15..., 'latency_ms': 148.03...}

Lengths are tokens; ``issue_time``, ``first_token_time``, ``complete_time`` are seconds of the
client's monotonic clock (no epoch). The lines after it, when present, are DistServe's
``BenchmarkMetrics`` printout: ``{``, one ``<name>: <number>`` per line, ``}``; it is kept in
the metadata (``distserve_metrics``) and its ``num_requests`` must match the list.

DistServe derives ``ttft_ms = (first_token_time - issue_time) * 1000``, ``latency_ms =
(complete_time - issue_time) * 1000`` and ``tpot_ms = (complete_time - first_token_time) /
(output_len - 1) * 1000``, **0** (not undefined) when ``output_len <= 1``.

The run's settings are in its file name (DistServe's alignment runs, PROVENANCE.md):
``vllm-N-RATE`` is vLLM on one GPU; ``distserve-cTPPPdTPPP-N-RATE`` (e.g. ``c21d11``) is
DistServe with a prefill ("context") instance of tensor-parallel degree TP and pipeline degree
PP and a decode instance likewise; N requests at RATE req/s (Poisson).
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from schemas.metrics import tpot_s

from ..errors import TraceFormatError
from ._frame import assemble_frame
from ._json import json_number
from ._rows import RowStatus
from ._source import first_line, read_utf8_text

__all__ = ["import_distserve", "settings_from_name"]

#: Fields of a DistServe ``ReqResult``: lengths (tokens), instants (s), derived latencies (ms).
LENGTHS = ("prompt_len", "output_len")
INSTANTS = ("issue_time", "first_token_time", "complete_time")
DERIVED_MS = ("ttft_ms", "tpot_ms", "latency_ms")

#: How far DistServe's own ``*_ms`` may be from the timestamps' values: 1 us, plus 1e-9 of the value.
AGREE_MS = 1e-3

_NAME = re.compile(r"(?:^|_)(?P<engine>vllm|distserve-c(?P<tp_prefill>\d)(?P<pp_prefill>\d)"
                   r"d(?P<tp_decode>\d)(?P<pp_decode>\d))-(?P<n>\d+)-(?P<rate>\d+(?:\.\d+)?)\.exp$")


def settings_from_name(path: str | Path) -> dict[str, str]:
    """What a DistServe result's file name says about its run, as metadata (strings).

    Returns
    -------
    dict
        ``engine`` (``vllm`` or ``distserve``), ``request_rate`` (req/s, the Poisson rate the
        run was asked for), ``name_num_requests``; for DistServe ``engine_settings``, JSON
        ``{"scheduler": "disagg", "tp_prefill", "pp_prefill", "tp_decode", "pp_decode"}``
        (replay's names: ``replay`` and ``calibrate`` take them as the run's settings), one
        instance per pool. Empty when the
        name does not end in ``vllm-N-RATE.exp`` or ``distserve-cXYdXY-N-RATE.exp``.
    """
    m = _NAME.search(Path(path).name)
    if not m:
        return {}
    out = {"engine": "distserve" if m["engine"].startswith("distserve") else "vllm",
           "request_rate": repr(float(m["rate"])), "name_num_requests": str(int(m["n"]))}
    if out["engine"] == "distserve":
        out["engine_settings"] = json.dumps({"scheduler": "disagg", **{k: int(m[k]) for k in (
            "tp_prefill", "pp_prefill", "tp_decode", "pp_decode")}})
    return out


def _read(path: Path) -> tuple[list, dict]:
    """The request list of line 1 and the metrics block after it (name -> number)."""
    text = read_utf8_text(path, "a DistServe result (a Python list of dicts on line 1)")
    head, _, tail = text.partition("\n")
    why = None
    try:
        obj = ast.literal_eval(head.strip())
    except SyntaxError as exc:  # never evaluated: literal_eval only parses
        why = exc.msg
    except ValueError as exc:
        why = "names, calls or operators, not only values" if "malformed" in str(exc) else first_line(exc, 80)
    except (TypeError, MemoryError, RecursionError) as exc:
        why = {"RecursionError": "nested too deeply", "MemoryError": "too large"}.get(type(exc).__name__,
                                                                                       first_line(exc, 80))
    if why is not None:
        raise TraceFormatError(path, f"not a Python literal ({why})", line=1,
                               expected="a list of per-request dicts, as DistServe writes it", fold=True)
    if not isinstance(obj, list):
        raise TraceFormatError(path, f"is a Python {type(obj).__name__}", line=1,
                               expected="a list of per-request dicts")
    metrics = {}
    for lineno, line in enumerate(tail.splitlines(), start=2):
        s = line.strip()
        if s in ("", "{", "}"):
            continue
        name, sep, value = (x.strip() for x in s.partition(":"))
        try:
            if not (sep and name):
                raise ValueError(s)
            metrics[name] = float(value)
        except ValueError:
            raise TraceFormatError(path, "not a 'name: number' line of DistServe's metrics",
                                   line=lineno, expected="only the request list, then optionally the metrics "
                                                         "block ({, name: number lines, })") from None
    return obj, metrics


def import_distserve(path: str | Path, invalid: str = "error") -> tuple[pd.DataFrame, dict]:
    """Read one DistServe benchmark result.

    Parameters
    ----------
    path : str or Path
        A ``.exp`` file (see the module docstring).
    invalid : {"error", "flag", "drop"}
        A request with ``output_len`` 0, a first token before its issue or a completion before
        its first token, or a ``ttft_ms``/``latency_ms``/``tpot_ms`` that disagrees with the
        timestamps (by more than :data:`AGREE_MS` plus 1e-9 of the value) is invalid.

    Returns
    -------
    frame : pandas.DataFrame
        ``arrival_time_s`` = ``issue_time`` minus the run's first, sorted by arrival;
        ``ttft_s`` = first_token_time - issue_time, ``e2e_s`` = complete_time - issue_time
        (the timestamps are used, full float64 seconds; DistServe's ``ttft_ms`` and
        ``latency_ms`` are only checked against them); ``tpot_s`` = (E2E - TTFT)/(N - 1) =
        (complete_time - first_token_time)/(output_len - 1), DistServe's own definition, but
        NaN for one output token where DistServe writes 0; ``num_prompt_tokens`` =
        prompt_len, ``num_output_tokens`` = output_len; ``request_id`` = 1-based position in
        the file.
    metadata : dict
        ``source_format`` ``distserve``, the sources of each column, the file name's settings
        (:func:`settings_from_name`), ``distserve_metrics`` (JSON) when the block is present.

    Raises
    ------
    TraceFormatError
        Naming the file, and the 1-based request and field where there is one: line 1 not a
        Python literal list, a request that is not a dict, a missing field, a value that is not
        a finite number, a negative time or length, a fractional length, a metrics block whose
        ``num_requests`` is not the number of requests.
    """
    path = Path(path)
    obj, metrics = _read(path)
    if not obj:
        raise TraceFormatError(path, "has no requests", line=1, expected="a non-empty list of per-request dicts")
    n = len(obj)
    if "num_requests" in metrics and metrics["num_requests"] != n:
        raise TraceFormatError(path, f"the metrics block says num_requests {metrics['num_requests']:g} but line 1 "
                                     f"holds {n} requests", column="num_requests",
                               expected="the metrics of the same list (a truncated or edited file?)")
    status = RowStatus(path, invalid)
    c_out0 = status.invalid("0 output tokens", "output_len", ">= 1 token")
    c_order = status.invalid("timestamps out of order", "first_token_time",
                             "issue_time <= first_token_time <= complete_time")
    prompt, output = np.zeros(n, np.int64), np.zeros(n, np.int64)
    issue, ttft, e2e = np.zeros(n), np.full(n, np.nan), np.full(n, np.nan)
    codes = np.zeros(n, np.int16)
    for i, rec in enumerate(obj):
        r = i + 1
        if not isinstance(rec, dict):
            raise TraceFormatError(path, f"request is a Python {type(rec).__name__}", row=r, expected="a dict")
        for f in (*LENGTHS, *INSTANTS, *DERIVED_MS):
            if f not in rec:
                raise TraceFormatError(path, "missing field", row=r, column=f)
        prompt[i] = json_number(path, rec["prompt_len"], column="prompt_len", row=r, integer=True, minimum=1)
        output[i] = json_number(path, rec["output_len"], column="output_len", row=r, integer=True, minimum=0)
        t_issue, t_first, t_done = (json_number(path, rec[f], column=f, row=r, minimum=0) for f in INSTANTS)
        ms = {f: json_number(path, rec[f], column=f, row=r) for f in DERIVED_MS}  # checked below
        issue[i] = t_issue
        if output[i] == 0:
            codes[i] = c_out0
            continue
        if not t_issue <= t_first <= t_done:
            codes[i] = c_order
            continue
        ttft[i], e2e[i] = t_first - t_issue, t_done - t_issue
        theirs_tpot = (t_done - t_first) / (output[i] - 1) if output[i] > 1 else 0.0
        for f, ours in (("ttft_ms", ttft[i]), ("latency_ms", e2e[i]), ("tpot_ms", theirs_tpot)):
            if abs(ms[f] - ours * 1e3) > AGREE_MS + 1e-9 * abs(ms[f]):
                codes[i] = status.invalid(f"{f} disagrees with the timestamps", f,
                                          f"{f} within {AGREE_MS:g} ms of the value the timestamps give")
                ttft[i] = e2e[i] = np.nan
                break
    status.add(codes, 0)
    df, meta = assemble_frame(issue - issue.min(), prompt, output, status=status, codes=codes,
                              extra={"ttft_s": ttft, "e2e_s": e2e, "tpot_s": tpot_s(ttft, e2e, output)})
    meta.update({
        "source_format": "distserve",
        "source": str(path),
        "arrival_source": "recorded: issue_time (the client's monotonic clock at send), relative to the first",
        "latency_source": ("ttft_s, e2e_s from first_token_time, complete_time minus issue_time (DistServe's "
                           f"ttft_ms, latency_ms, tpot_ms checked to agree within {AGREE_MS:g} ms); tpot_s = "
                           "(e2e_s - ttft_s)/(output_len - 1), NaN for 1 token (DistServe writes 0)"),
        **settings_from_name(path),
    })
    if metrics:
        meta["distserve_metrics"] = json.dumps(metrics)
    return df, meta
