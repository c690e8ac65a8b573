"""Read a series of Prometheus scrapes: ``/metrics`` dumps and ``query_range`` JSON exports.

A scrape is the value of every sample of one ``/metrics`` page at one instant. Sources, and
how each gives the instant (unix seconds):

* **A folder of dumps, or dump files, one scrape each**, the instant in the file name: the
  last run of 9 or more digits, with an optional fraction (``metrics-1718000000.txt``,
  ``vllm_1718000000.25.prom``; 13 or more digits are milliseconds), as a loop such as
  ``while sleep 15; do curl -s host:8000/metrics > metrics-$(date +%s).txt; done`` writes.
  Files of a folder whose names start with ``.`` are skipped.
* **One file holding several scrapes**, each opened by a comment line ``# scrape at <unix
  seconds>`` (``while sleep 15; do echo "# scrape at $(date +%s.%N)"; curl -s
  host:8000/metrics; done >> scrapes.txt``): Prometheus' parsers skip such comments, so each
  part is still a valid exposition. Lines before the first marker must be blank.
* **A Prometheus HTTP API ``query_range`` export** (a ``.json`` file: ``{"status":
  "success", "data": {"resultType": "matrix", "result": [{"metric": {"__name__": ...,
  labels}, "values": [[unix_s, "value"], ...]}]}}``, e.g. ``curl
  'prom:9090/api/v1/query_range?query={__name__=~"vllm:.*"}&start=...&end=...&step=15'``):
  one scrape per evaluation instant (the union over series and files).

An exposition is parsed with ``prometheus_client``'s parsers: the OpenMetrics one
(``prometheus_client.openmetrics.parser``) when the scrape ends with ``# EOF``, else the
Prometheus text format's (``prometheus_client.parser``). Samples' own timestamps are not used
(vLLM and SGLang write none). Scrapes are returned in time order; two at the same instant are
an error.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TraceFormatError
from ._json import read_json
from ._source import first_line, read_utf8_text

__all__ = ["Scrape", "read_scrapes"]

_MARKER = re.compile(r"#\s*scrape at\s+(\S*)\s*")
_NAME_TIME = re.compile(r"(\d{9,}(?:\.\d+)?)")
_EXPECTED = ("scrapes of a vLLM or SGLang /metrics page: files named with their unix time (metrics-<unix s>.txt), "
             "a file of scrapes each opened by '# scrape at <unix s>', or a query_range JSON export")


@dataclass
class Scrape:
    """One scrape: ``time_s`` (unix seconds), ``where`` (file, and line of its marker) and
    ``samples``: (sample name, labels as a sorted tuple of (name, value) pairs) -> value."""

    time_s: float
    where: str
    samples: dict = field(default_factory=dict)


def _time_from_name(path: Path) -> float | None:
    found = _NAME_TIME.findall(path.name)
    if not found:
        return None
    t = float(found[-1])
    return t / 1000.0 if len(found[-1].split(".")[0]) >= 13 else t


def _bad_line(path: Path, lines: list[str], first: int, exc: Exception) -> TraceFormatError:
    """The error of a part that does not parse, naming its first line that does not parse alone."""
    from prometheus_client.parser import text_string_to_metric_families

    for k, text in enumerate(lines):
        if text.strip() == "# EOF":
            continue
        try:
            list(text_string_to_metric_families(text + "\n"))
        except Exception:  # noqa: BLE001  (the parser raises ValueError, IndexError, ... on bad input)
            return TraceFormatError(path, f"not the Prometheus text format: {text.strip()[:60]!r} "
                                          f"({first_line(exc, 60)})", line=first + k,
                                    expected="'name{label=\"value\",...} number' samples (a truncated scrape?)",
                                    fold=True)
    return TraceFormatError(path, f"not a valid exposition ({first_line(exc, 80)})", line=first,
                            expected="a complete scrape (a truncated scrape, a histogram without le=\"+Inf\"?)",
                            fold=True)


def _parse(path: Path, lines: list[str], first: int, time_s: float) -> Scrape:
    """Parse the exposition ``lines`` (starting at line ``first`` of ``path``)."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
    from prometheus_client.parser import text_string_to_metric_families as text_format

    body = "\n".join(lines) + "\n"
    parser = openmetrics if any(s.strip() == "# EOF" for s in lines[-3:]) else text_format
    scrape = Scrape(time_s, f"{path}, line {first}" if first > 1 else str(path))
    try:
        for family in parser(body):
            for s in family.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                if key in scrape.samples:
                    raise TraceFormatError(path, f"sample {s.name}{dict(key[1])} appears twice in one scrape",
                                           line=first, expected="one value per series per scrape", fold=True)
                scrape.samples[key] = float(s.value)
    except TraceFormatError:
        raise
    except Exception as exc:  # noqa: BLE001  (prometheus_client raises ValueError, IndexError, ...)
        raise _bad_line(path, lines, first, exc) from None
    return scrape


def _expositions(path: Path) -> list[Scrape]:
    """The scrapes of one text file: its ``# scrape at`` parts, else the whole file at its name's time."""
    lines = read_utf8_text(path, _EXPECTED, fold=True).splitlines()
    marks = [(k, _MARKER.fullmatch(s)) for k, s in enumerate(lines)]
    marks = [(k, m) for k, m in marks if m]
    if not marks:
        t = _time_from_name(path)
        if t is None:
            raise TraceFormatError(path, "no scrape time: the name holds no unix time and no line is "
                                         "'# scrape at <unix s>'", expected="metrics-<unix seconds>.txt, or "
                                   "'# scrape at <unix seconds>' before each scrape", fold=True)
        return [_parse(path, lines, 1, t)]
    if any(s.strip() for s in lines[:marks[0][0]]):
        raise TraceFormatError(path, "samples before the first '# scrape at' line", line=1,
                               expected="'# scrape at <unix seconds>' before each scrape")
    out = []
    for i, (k, m) in enumerate(marks):
        try:
            t = float(m.group(1))
        except ValueError:
            t = math.nan
        if not math.isfinite(t) or t < 0:
            raise TraceFormatError(path, f"scrape time {m.group(1)[:30]!r} is not a unix time", line=k + 1,
                                   expected="'# scrape at <unix seconds>' (date +%s)")
        end = marks[i + 1][0] if i + 1 < len(marks) else len(lines)
        out.append(_parse(path, lines[k + 1:end], k + 2, t))
    return out


def _query_range(path: Path) -> list[Scrape]:
    """The scrapes of a ``query_range`` export: one per evaluation instant."""
    obj = read_json(path)
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise TraceFormatError(path, "is not a query_range result", column="data.resultType",
                               expected='{"status": "success", "data": {"resultType": "matrix", "result": [...]}}',
                               fold=True)
    by_time: dict[float, Scrape] = {}
    for k, series in enumerate(data["result"]):
        col = f"data.result[{k}]"
        metric, values = (series.get("metric"), series.get("values")) if isinstance(series, dict) else (None, None)
        if not isinstance(metric, dict) or not isinstance(metric.get("__name__"), str) or not isinstance(values, list):
            raise TraceFormatError(path, "series without metric.__name__ and values", column=col,
                                   expected='{"metric": {"__name__": "vllm:...", ...}, "values": [[t, "v"], ...]}',
                                   fold=True)
        labels = tuple(sorted((str(a), str(b)) for a, b in metric.items() if a != "__name__"))
        for j, point in enumerate(values):
            try:
                t, v = float(point[0]), float(point[1])
            except (TypeError, ValueError, IndexError, KeyError):
                raise TraceFormatError(path, f"point {str(point)[:40]} is not [unix_s, \"value\"]",
                                       column=f"{col}.values[{j}]") from None
            if not math.isfinite(t) or t < 0 or math.isnan(v):
                raise TraceFormatError(path, f"point {str(point)[:40]} has no valid time and value",
                                       column=f"{col}.values[{j}]", expected="a unix time and a number")
            by_time.setdefault(t, Scrape(t, f"{path}, time {t:.3f}")).samples[(metric["__name__"], labels)] = v
    return list(by_time.values())


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
        if not files:
            raise TraceFormatError(path, "folder holds no file", expected=_EXPECTED, fold=True)
        return files
    return [path]


def read_scrapes(paths) -> list[Scrape]:
    """Every scrape of ``paths`` (files or folders, see the module's docstring), in time order.

    Raises
    ------
    TraceFormatError
        Naming the file and line (or JSON field): a missing or empty file, no scrape time, a
        line the parser rejects (a truncated scrape), an OpenMetrics scrape without ``# EOF``
        or a histogram without ``le="+Inf"`` (the OpenMetrics parser checks it), a series twice
        in one scrape, two scrapes at the same instant, fewer than two scrapes.
    """
    scrapes: list[Scrape] = []
    for path in map(Path, paths):
        for f in _files(path):
            head = read_utf8_text(f, _EXPECTED, fold=True).lstrip()[:1]
            scrapes += _query_range(f) if head in ("{", "[") else _expositions(f)
    scrapes.sort(key=lambda s: s.time_s)
    for a, b in zip(scrapes, scrapes[1:]):
        if a.time_s == b.time_s:
            raise TraceFormatError(b.where, f"a second scrape at unix time {b.time_s:.3f} (also {a.where})",
                                   expected="one scrape per instant", fold=True)
    if len(scrapes) < 2:
        where = ", ".join(map(str, paths))
        raise TraceFormatError(where, f"{len(scrapes)} scrape(s)", expected="at least two scrapes: counters and "
                               "histograms are read as their increase between scrapes", fold=True)
    return scrapes
