"""A seeded fuzzer of the servecal CLI: mutated real and fixture files through every importer,
``traces validate``, ``calibrate fit`` and ``replay``, and every command's outputs given paths
that must never be written (a device, a FIFO, a folder, a link: target ``output-path``).

Every input is a job (a command line over mutated files in a fresh folder). Jobs run in a
long-lived worker process (``fuzz_worker.py``) that invokes the CLI in-process, so an abort
or a segfault of a native library kills the worker, not the test, and a job that outlives
its timeout is a hang; the worker is then restarted. A sample of jobs also runs through the
installed console scripts in a subprocess with a timeout (entry points, real stderr).

The outcome rule, per job: exit 0 with an output that passes ``traces validate`` (a
calibration that loads, for ``calibrate fit``), or exit 1/2 with one ``Error:`` message that
names an input file, no output and no temporary file left behind; never a traceback, a
RuntimeWarning on the terminal, a signal death or a hang.

Used by ``tests/test_fuzz.py`` (a quick profile in the default run, a long one behind
``-m fuzz``). Nothing here depends on pytest.
"""
from __future__ import annotations

import ast
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import output_paths

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"

# ---------------------------------------------------------------------------
# Values that break things
# ---------------------------------------------------------------------------

EXTREME_NUMBERS = [
    "1e300", "-1e300", "1e-300", "1e308", "4.9e-324", "-1", "0", "-0", "1.5", "0.5", str(2 ** 64), str(2 ** 63),
    str(2 ** 63 - 1), str(-2 ** 63 - 1), "9" * 400, "9" * 5000, "nan", "NaN", "inf", "-inf", "Infinity",
    "-Infinity", "1e19", "9007199254740993", "1e9", "5e15", "", "abc", "null", "true", "0x10", "1_000", " 5 ",
    "1e", "--1", "1.7976931348623157e308", "2.5e-8",
]
EXTREME_DATES = [
    "9999-12-31 23:59:59.9999999", "0001-01-01 00:00:00", "2023-02-30 00:00:00", "1677-09-21 00:12:43.145224",
    "2262-04-11 23:47:16.854775807", "2023-11-16T18:17:03Z", "2023-11-16 18:17:03+05:00", "2023-11-16",
    "18:17:03", "2023-13-01 00:00:00",
]
GARBAGE = [b"\x00", b"\xff\xfe", b"\xc3\x28", b'"', b",", b"\n", b"\r", b"\r\n", b"\t", b"\\", b"{", b"[",
           b"}", b"]", b":", b"\xef\xbb\xbf", b"\x1b[31m", "\u00e9\u4e2d".encode(), b"\x80" * 8, b" " * 3]
_NUM_RE = re.compile(rb"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?![\w.])")
_DATE_RE = re.compile(rb"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:\.\d+)?")


def _lines(b: bytes) -> list[bytes]:
    return b.split(b"\n")


def m_header_spaces(rng, data: bytes, kind: str) -> bytes:
    """Leading/trailing spaces around names: CSV header cells, or JSON keys."""
    if kind == "csv":
        ls = _lines(data)
        cells = ls[0].split(b",")
        for i in rng.sample(range(len(cells)), k=rng.randint(1, len(cells))):
            cells[i] = rng.choice([b" ", b"", b"  "]) + cells[i].strip() + rng.choice([b" ", b"  ", b"\t", b""])
        ls[0] = b",".join(cells)
        return b"\n".join(ls)
    keys = list(set(re.findall(rb'"([A-Za-z_][\w ]*)"\s*:', data)))
    if not keys:
        return data
    k = rng.choice(keys)
    return data.replace(b'"' + k + b'"', b'"' + k + b' "', rng.randint(1, 3))


def m_number(rng, data: bytes, kind: str) -> bytes:
    """Replace one or a few numbers (not in the CSV header) by extreme values."""
    start = data.find(b"\n") + 1 if kind == "csv" else 0
    hits = [m for m in _NUM_RE.finditer(data, start)]
    if not hits:
        return data
    out = data
    for m in sorted(rng.sample(hits, k=min(len(hits), rng.choice([1, 1, 1, 2, 5]))), key=lambda m: -m.start()):
        v = rng.choice(EXTREME_NUMBERS).encode()
        if kind == "json" and v in (b"", b"abc", b"0x10", b"1_000", b" 5 ", b"1e", b"--1"):
            v = b'"' + v + b'"'
        out = out[:m.start()] + v + out[m.end():]
    return out


def m_date(rng, data: bytes, kind: str) -> bytes:
    hits = list(_DATE_RE.finditer(data))
    if not hits:
        return m_number(rng, data, kind)
    m = rng.choice(hits)
    return data[:m.start()] + rng.choice(EXTREME_DATES).encode() + data[m.end():]


def m_lines(rng, data: bytes, kind: str) -> bytes:
    """Delete, duplicate, swap or shuffle lines (the header too, sometimes)."""
    ls = _lines(data)
    if len(ls) < 2:
        return data
    op = rng.choice(["del", "dup", "swap", "shuffle", "reverse", "blank"])
    lo = 0 if rng.random() < 0.2 else 1
    i, j = rng.randrange(lo, len(ls)), rng.randrange(lo, len(ls))
    if op == "del":
        del ls[i]
    elif op == "dup":
        ls.insert(i, ls[j])
    elif op == "swap":
        ls[i], ls[j] = ls[j], ls[i]
    elif op == "shuffle":
        body = ls[1:]
        rng.shuffle(body)
        ls = ls[:1] + body
    elif op == "reverse":
        ls = ls[:1] + ls[1:][::-1]
    else:
        ls.insert(i, b"")
    return b"\n".join(ls)


def m_truncate(rng, data: bytes, kind: str) -> bytes:
    return data[:rng.randrange(0, max(1, len(data)))]


def m_garbage(rng, data: bytes, kind: str) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        pos = rng.randrange(0, len(out) + 1)
        out[pos:pos] = rng.choice(GARBAGE)
    return bytes(out)


def m_flip(rng, data: bytes, kind: str) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        out[rng.randrange(len(out))] = rng.randrange(256)
    return bytes(out)


def m_encoding(rng, data: bytes, kind: str) -> bytes:
    op = rng.choice(["bom", "crlf", "cr", "utf16", "latin1", "nul"])
    if op == "bom":
        return b"\xef\xbb\xbf" + data
    if op == "crlf":
        return data.replace(b"\n", b"\r\n")
    if op == "cr":
        return data.replace(b"\n", b"\r")
    if op == "utf16":
        return data.decode("utf-8", "replace").encode("utf-16")
    if op == "latin1":
        return data.replace(b"e", b"\xe9", 3)
    return data.replace(b",", b",\x00", 1)


def m_empty(rng, data: bytes, kind: str) -> bytes:
    return rng.choice([b"", b"\n", b"   \n\n", _lines(data)[0] + b"\n", _lines(data)[0], b"\xef\xbb\xbf"])


def m_csv_quotes(rng, data: bytes, kind: str) -> bytes:
    ls = _lines(data)
    i = rng.randrange(0, len(ls))
    cells = ls[i].split(b",")
    j = rng.randrange(len(cells))
    cells[j] = rng.choice([b'"' + cells[j], b'"' + cells[j] + b'"', b'"a\nb"', b'""', b'"' + cells[j] + b'""',
                           cells[j] + b',extra', b''])
    ls[i] = b",".join(cells)
    return b"\n".join(ls)


def m_csv_columns(rng, data: bytes, kind: str) -> bytes:
    """Rename, drop or duplicate a header column; add a column to every row."""
    ls = _lines(data)
    cells = ls[0].split(b",")
    op = rng.choice(["rename", "drop", "dup", "add"])
    j = rng.randrange(len(cells))
    if op == "rename":
        cells[j] = cells[j].upper() if rng.random() < 0.5 else cells[j] + b"_x"
        ls[0] = b",".join(cells)
    elif op == "drop":
        ls = [b",".join(c for k, c in enumerate(l.split(b",")) if k != j) for l in ls]
    elif op == "dup":
        ls[0] = b",".join(cells + [cells[j]])
        ls[1:] = [l + b",1" if l else l for l in ls[1:]]
    else:
        ls[0] += b",extra"
        ls[1:] = [l + b",x" if l else l for l in ls[1:]]
    return b"\n".join(ls)


def m_deep_json(rng, data: bytes, kind: str) -> bytes:
    """Replace a value by a very deeply nested array or object (RecursionError bait)."""
    n = rng.choice([2000, 100_000, 1_000_000])
    deep = (b"[" * n + b"]" * n) if rng.random() < 0.5 else (b'{"a":' * n + b"1" + b"}" * n)
    hits = list(_NUM_RE.finditer(data))
    if not hits:
        return deep
    m = rng.choice(hits)
    return data[:m.start()] + deep + data[m.end():]


def _json_mutate_value(rng, v):
    choice = rng.randrange(12)
    if choice == 0:
        return None
    if choice == 1:
        return "x" if not isinstance(v, str) else 17
    if choice == 2:
        return [] if not isinstance(v, list) else {}
    if choice == 3:
        return [v, v]
    if choice == 4:
        return -v if isinstance(v, (int, float)) and not isinstance(v, bool) else -1
    if choice == 5:
        return True
    if choice == 6:
        return 10 ** 30
    if choice == 7:
        return float("nan") if rng.random() < 0.5 else float("inf")
    if choice == 8:
        return 1e300
    if choice == 9:
        return 2 ** 64
    if choice == 10:
        return ""
    return {"nested": v}


def m_json_struct(rng, data: bytes, kind: str) -> bytes:
    """Parse (each line for JSONL), change one node: delete a key, change a type or a value, empty a list."""
    text = data.decode("utf-8", "replace")
    if kind == "jsonl":
        ls = text.split("\n")
        idx = [i for i, l in enumerate(ls) if l.strip()]
        if not idx:
            return data
        i = rng.choice(idx)
        try:
            obj = json.loads(ls[i])
        except (ValueError, RecursionError):
            return data
        ls[i] = json.dumps(_mutate_tree(rng, obj))
        return "\n".join(ls).encode()
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return data
    return json.dumps(_mutate_tree(rng, obj)).encode()


def _mutate_tree(rng, obj, depth=0):
    nodes = []

    def walk(o, d):
        if d > 6:
            return
        if isinstance(o, dict):
            nodes.append(o)
            for v in list(o.values())[:50]:
                walk(v, d + 1)
        elif isinstance(o, list):
            nodes.append(o)
            for v in o[:20]:
                walk(v, d + 1)

    walk(obj, 0)
    if not nodes:
        return _json_mutate_value(rng, obj)
    for _ in range(rng.choice([1, 1, 2, 4])):
        node = rng.choice(nodes)
        if isinstance(node, dict) and node:
            k = rng.choice(list(node))
            op = rng.randrange(4)
            if op == 0:
                del node[k]
            elif op == 1:
                node[k + " "] = node.pop(k)
            else:
                node[k] = _json_mutate_value(rng, node[k])
        elif isinstance(node, list) and node:
            i = rng.randrange(len(node))
            op = rng.randrange(5)
            if op == 0:
                del node[i]
            elif op == 1:
                node.clear()
            elif op == 2:
                node.reverse()
            else:
                node[i] = _json_mutate_value(rng, node[i])
    return obj


TEXT_MUTATORS = {
    "csv": [m_header_spaces, m_header_spaces, m_number, m_number, m_number, m_date, m_lines, m_truncate, m_garbage,
            m_flip, m_encoding, m_empty, m_csv_quotes, m_csv_columns],
    "json": [m_header_spaces, m_number, m_number, m_number, m_truncate, m_garbage, m_flip, m_encoding, m_empty,
             m_deep_json, m_json_struct, m_json_struct, m_json_struct],
    "jsonl": [m_header_spaces, m_number, m_number, m_number, m_lines, m_truncate, m_garbage, m_flip, m_encoding,
              m_empty, m_deep_json, m_json_struct, m_json_struct, m_json_struct],
    "yaml": [m_number, m_lines, m_truncate, m_garbage, m_flip, m_empty, m_encoding],
    "text": [m_number, m_number, m_lines, m_truncate, m_garbage, m_flip, m_encoding, m_empty],
}


def mutate_text(rng: random.Random, data: bytes, kind: str) -> tuple[bytes, list[str]]:
    names = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        m = rng.choice(TEXT_MUTATORS[kind])
        data = m(rng, data, kind)
        names.append(m.__name__)
    return data, names


# ---------------------------------------------------------------------------
# Parquet mutations
# ---------------------------------------------------------------------------

def mutate_table_file(rng: random.Random, src: Path, dst: Path) -> list[str]:
    """Write a mutated copy of the Parquet file ``src`` to ``dst``; return what was done."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(src)
    done = []
    for _ in range(rng.choice([1, 1, 2])):
        op = rng.choice(["value", "value", "value", "null", "drop", "rename", "type", "dup", "reverse", "empty",
                         "meta", "meta", "lists", "lists", "identical", "bytes"])
        n = t.num_rows
        done.append(op)
        if op in ("value", "null") and n:
            name = rng.choice(t.column_names)
            col = t.column(name).combine_chunks()
            i = rng.randrange(n)
            typ = col.type
            if op == "null":
                vals = col.to_pylist()
                vals[i] = None
                new = pa.array(vals, typ)
            elif pa.types.is_floating(typ):
                v = rng.choice([float("nan"), float("inf"), -float("inf"), 1e300, -1.0, 0.0, 1e-300, -0.0, 5e9,
                                1e-12, 1e15])
                arr = col.to_numpy(zero_copy_only=False).copy()
                arr[i] = v
                new = pa.array(arr, typ)
            elif pa.types.is_integer(typ):
                v = rng.choice([-1, 0, 2 ** 62, 2 ** 63 - 1, -2 ** 63, 10 ** 12, 1])
                vals = col.to_pylist()
                vals[i] = v
                new = pa.array(vals, typ)
            elif pa.types.is_string(typ):
                vals = col.to_pylist()
                vals[i] = rng.choice(["", "x" * 1000, "\u00e9\u4e2d", "ok", "failed: x", vals[0]])
                new = pa.array(vals, typ)
            else:
                continue
            t = t.set_column(t.schema.get_field_index(name), pa.field(name, typ), new)
            done[-1] += f":{name}"
        elif op == "drop" and t.num_columns > 1:
            name = rng.choice(t.column_names)
            t = t.drop_columns([name])
            done[-1] += f":{name}"
        elif op == "rename":
            names = list(t.column_names)
            j = rng.randrange(len(names))
            names[j] = rng.choice([names[j] + " ", " " + names[j], names[j].upper()])
            t = t.rename_columns(names)
        elif op == "type":
            name = rng.choice(t.column_names)
            col = t.column(name)
            to = rng.choice([pa.string(), pa.float64(), pa.int32(), pa.timestamp("us"), pa.float32(), pa.bool_()])
            try:
                new = col.cast(to)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                new = pa.array([str(x) for x in col.to_pylist()], pa.string())
            t = t.set_column(t.schema.get_field_index(name), pa.field(name, new.type), new)
            done[-1] += f":{name}->{new.type}"
        elif op == "dup" and n:
            t = pa.concat_tables([t, t.slice(rng.randrange(n), 1)])
        elif op == "reverse" and n:
            t = t.take(pa.array(np.arange(n)[::-1]))
        elif op == "empty":
            t = t.slice(0, 0)
        elif op == "identical" and n:
            t = t.take(pa.array(np.zeros(rng.choice([2, 50, 500]), np.int64)))
        elif op == "meta":
            meta = dict(t.schema.metadata or {})
            what = rng.choice(["schema-bytes", "other-bytes", "pandas", "pandas-bytes", "schema-unknown", "none"])
            if what == "schema-bytes":
                meta[b"servecal.schema"] = b"\xff\xfe" + (meta.get(b"servecal.schema") or b"")
            elif what == "other-bytes":
                meta[b"servecal.source\xff"] = b"\xc3\x28\x80"
            elif what == "pandas":
                meta[b"pandas"] = b'{"columns": 3, "index_columns": [{"kind": "range"}]}'
            elif what == "pandas-bytes":
                meta[b"pandas"] = b"\xff\xfe{"
            elif what == "schema-unknown":
                meta[b"servecal.schema"] = b"request_trace/9"
            else:
                meta = {}
            t = t.replace_schema_metadata(meta)
        elif op == "lists":
            lists = [c for c in t.column_names if pa.types.is_list(t.column(c).type)]
            if not lists or not n:
                continue
            name = rng.choice(lists)
            vals = t.column(name).to_pylist()
            i = rng.randrange(n)
            v = list(vals[i] or [0.0, 0.1])
            how = rng.choice(["nan", "inf", "decreasing", "beyond", "empty", "short", "negative", "none"])
            if how == "nan":
                v[rng.randrange(len(v))] = float("nan")
            elif how == "inf":
                v[-1] = float("inf")
            elif how == "decreasing" and len(v) > 1:
                v[0], v[-1] = v[-1], v[0]
            elif how == "beyond":
                v[-1] = v[-1] * 10 + 100
            elif how == "empty":
                v = []
            elif how == "short":
                v = v[:1]
            elif how == "negative":
                v[0] = -1.0
            else:
                v = None
            if v is not None and pa.types.is_integer(t.column(name).type.value_type):
                v = [int(x) if x == x and abs(x) < 2 ** 62 else 0 for x in v]
            vals[i] = v
            new = pa.array(vals, t.column(name).type)
            t = t.set_column(t.schema.get_field_index(name), t.schema.field(name), new)
            done[-1] += f":{name}:{how}"
    pq.write_table(t, dst)
    if "bytes" in done:
        b = bytearray(dst.read_bytes())
        for _ in range(rng.randint(1, 16)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        if rng.random() < 0.3:
            b = b[:rng.randrange(len(b))]
        dst.write_bytes(bytes(b))
    return done


# ---------------------------------------------------------------------------
# Targets: what is mutated and the command that reads it
# ---------------------------------------------------------------------------

@dataclass
class Target:
    """A fuzz target: seed files (one of which is mutated per input) and the command line."""

    name: str
    seeds: dict                      # file name in the job folder -> bytes (text) or Path (parquet)
    argv: object                     # callable(job_dir, files: dict name->Path, rng) -> list[str]
    mutate: list                     # names of the seed files that may be mutated
    kind: dict = field(default_factory=dict)   # file name -> csv/json/jsonl/yaml/parquet/text
    output: str | None = "out.parquet"
    output_kind: str | None = "request_trace/1"   # or step_trace/1, replay_result/1, calibration
    optional: bool = False           # a command another branch adds: skipped when absent


def _head(path: Path, n: int) -> bytes:
    with open(path, "rb") as fh:
        return b"".join(fh.readline() for _ in range(n))


def _json_head(path: Path, n: int) -> bytes:
    obj = json.loads(path.read_text())
    return json.dumps(obj[:n], indent=1).encode()


def _invalid(rng) -> list[str]:
    return ["--invalid", rng.choice(["error", "error", "flag", "drop"])]


def importer_targets(real: Path | None) -> list[Target]:
    """One target per importer, seeded with real files (when ``real`` exists) and fixtures."""
    T = []

    def imp(fmt, extra=lambda rng: []):
        return lambda d, f, rng: ["traces", "import", fmt, str(f[next(iter(f))]), "-o", str(d / "out.parquet"),
                                  *extra(rng)]

    T.append(Target("burstgpt", {"b.csv": (DATA / "burstgpt_small.csv").read_bytes()},
                    imp("burstgpt", lambda rng: _invalid(rng) + (["--model", "ChatGPT"] if rng.random() < .3 else [])),
                    ["b.csv"], {"b.csv": "csv"}))
    T.append(Target("vllm-bench", {"v.json": (DATA / "vllm_bench_small.json").read_bytes()},
                    imp("vllm-bench", lambda rng: _invalid(rng) + rng.choice([[], ["--arrivals", "zero"],
                                                                              ["--arrivals", "synth"]])),
                    ["v.json"], {"v.json": "json"}))
    T.append(Target("sglang-bench", {"s.jsonl": (DATA / "sglang_bench_small.jsonl").read_bytes()},
                    imp("sglang-bench", lambda rng: _invalid(rng) + ["--arrivals", "synth"]
                        + rng.choice([[], ["--run", "2"]])),
                    ["s.jsonl"], {"s.jsonl": "jsonl"}))
    T.append(Target("genai-perf", {"g.json": (DATA / "genai_perf_profile_export.json").read_bytes()},
                    imp("genai-perf", lambda rng: _invalid(rng) + rng.choice([[], ["--prompt-tokens", "128"]])),
                    ["g.json"], {"g.json": "json"}))
    blis = {"t.yaml": (DATA / "blis_observe_trace.yaml").read_bytes(),
            "t.csv": (DATA / "blis_observe_trace.csv").read_bytes()}
    T.append(Target("blis-observe", blis,
                    lambda d, f, rng: ["traces", "import", "blis-observe", str(f["t.yaml"]),
                                       "-o", str(d / "out.parquet"), *_invalid(rng),
                                       *rng.choice([[], ["--data", str(f["t.csv"])]])],
                    list(blis), {"t.yaml": "yaml", "t.csv": "csv"}))
    # Prometheus scrapes of vLLM (traces import prometheus): 5 scrapes in one file, '# scrape at' parts
    T.append(Target("prometheus", {"m.txt": (DATA / "vllm_metrics_scrapes.txt").read_bytes()},
                    lambda d, f, rng: ["traces", "import", "prometheus", str(f["m.txt"]), "-o", str(d / "out.parquet"),
                                       *rng.choice([[], ["--window-s", "30"], ["--by-label", "model_name"]])],
                    ["m.txt"], {"m.txt": "text"}, output_kind="aggregate_targets/1"))
    # inference-perf (its per-request file, the first 12 entries; its stage files and config.yaml) and
    # AIPerf (its per-request records; its aggregate), laid out as the tools write them
    ip, ai = DATA / "inference_perf", DATA / "aiperf"
    per_request = json.dumps(json.loads((ip / "per_request_lifecycle_metrics.json").read_text())[:12], indent=1)
    T.append(Target("inference-perf", {"per_request_lifecycle_metrics.json": per_request.encode()},
                    imp("inference-perf", _invalid), ["per_request_lifecycle_metrics.json"],
                    {"per_request_lifecycle_metrics.json": "json"}))
    stages = {name: (ip / name).read_bytes() for name in ("config.yaml", "stage_0_lifecycle_metrics.json",
                                                          "stage_1_lifecycle_metrics.json")}
    T.append(Target("inference-perf-stages", stages,
                    lambda d, f, rng: ["traces", "import", "inference-perf", str(f["stage_0_lifecycle_metrics.json"]),
                                       str(f["stage_1_lifecycle_metrics.json"]), "-o", str(d / "out.parquet")],
                    list(stages), {k: "yaml" if k.endswith("yaml") else "json" for k in stages},
                    output_kind="aggregate_targets/1"))
    T.append(Target("aiperf", {"profile_export.jsonl": _head(ai / "profile_export.jsonl", 16)},
                    imp("aiperf", _invalid), ["profile_export.jsonl"], {"profile_export.jsonl": "jsonl"}))
    T.append(Target("aiperf-summary", {"profile_export_aiperf.json": (ai / "profile_export_aiperf.json").read_bytes()},
                    imp("aiperf"), ["profile_export_aiperf.json"], {"profile_export_aiperf.json": "json"},
                    output_kind="aggregate_targets/1"))
    if real is None or not real.is_dir():
        return T
    T.append(Target("azure", {"a.csv": _head(real / "azure_llm_2023_code.csv", 60)},
                    imp("azure", _invalid), ["a.csv"], {"a.csv": "csv"}))
    T.append(Target("vidur", {"v.csv": _head(real / "vidur_splitwise_conv.csv", 60)},
                    imp("vidur", _invalid), ["v.csv"], {"v.csv": "csv"}))
    T.append(Target("csv", {"c.csv": _head(real / "vidur_splitwise_conv.csv", 60)},
                    imp("csv", lambda rng: _invalid(rng) + [
                        "--map", "arrived_at=arrival_time_s", "--map", "num_prefill_tokens=num_prompt_tokens",
                        "--map", "num_decode_tokens=num_output_tokens"] + rng.choice([[], ["--time-unit", "ms"]])),
                    ["c.csv"], {"c.csv": "csv"}))
    T.append(Target("mooncake", {"m.jsonl": _head(real / "mooncake_conversation_trace.jsonl", 40)},
                    imp("mooncake", _invalid), ["m.jsonl"], {"m.jsonl": "jsonl"}))
    T.append(Target("vllm-request-stats",
                    {"r.jsonl": _head(real / "lss_vllm_rtxpro6000_llama31_8b_requests.jsonl", 40)},
                    imp("vllm-request-stats", lambda rng: rng.choice([[], ["--arrival-clock", "wall"]])),
                    ["r.jsonl"], {"r.jsonl": "jsonl"}))
    T.append(Target("llmperf", {"l.json": _json_head(real / "llmperf_leaderboard_anyscale_llama2_70b_individual.json",
                                                     30)},
                    imp("llmperf", lambda rng: _invalid(rng) + ["--concurrency", "5"]), ["l.json"], {"l.json": "json"}))
    # the first 20 requests of a real DistServe run (line 1, no metrics block), under a name with settings
    ds = ast.literal_eval((real / "distserve_opt13b_a100_distserve-c21d11-300-3.exp").read_text().split("\n", 1)[0])
    T.append(Target("distserve", {"distserve-c21d11-20-3.exp": (str(ds[:20]) + "\n").encode()},
                    imp("distserve", _invalid), ["distserve-c21d11-20-3.exp"], {"distserve-c21d11-20-3.exp": "text"}))
    p = "lss_profile_rtx4090_llama31_8b_"
    prof = {"p_meta.yaml": (real / f"{p}meta.yaml").read_bytes(),
            "p_tp1_dense.csv": (real / f"{p}tp1_dense.csv").read_bytes(),
            "p_tp1_attention.csv": _head(real / f"{p}tp1_attention.csv", 400),
            "p_tp1_per_sequence.csv": (real / f"{p}tp1_per_sequence.csv").read_bytes()}
    T.append(Target("llmservingsim-profile", prof,
                    lambda d, f, rng: ["traces", "import", "llmservingsim-profile", *[str(f[k]) for k in prof],
                                       "-o", str(d / "out.parquet"), *rng.choice([[], ["--num-layers", "32"]])],
                    list(prof), {k: "yaml" if k.endswith("yaml") else "csv" for k in prof},
                    output_kind="step_trace/1"))
    # importers added on other branches: fuzzed when their command exists
    if (real / "guidellm_results_codellama34b_prefill_sweep.json").exists():
        guidellm_json = (real / "guidellm_results_codellama34b_prefill_sweep.json").read_bytes()
        T.append(Target("guidellm", {"g.json": guidellm_json},
                        imp("guidellm"), ["g.json"], {"g.json": "json"}))
    # aggregate results (traces import summary): the real LLMPerf summary, the real GuideLLM
    # report's aggregate metrics (those read; its per-request lists left out: 8 kB, not 4 MB),
    # the vLLM and SGLang fixtures
    summary = {"llmperf": ("l.json", (real / "llmperf_leaderboard_anyscale_llama2_70b_summary.json").read_bytes()),
               "vllm-bench": ("v.json", (DATA / "vllm_bench_summary.json").read_bytes()),
               "sglang-bench": ("s.jsonl", (DATA / "sglang_bench_small.jsonl").read_bytes())}
    if (real / "guidellm_results_codellama34b_prefill_sweep.json").exists():
        report = json.loads((real / "guidellm_results_codellama34b_prefill_sweep.json").read_text())
        read = ("time_to_first_token_ms", "request_latency", "prompt_token_count", "output_token_count")
        report["benchmarks"] = [{"config": {"strategy": b["config"]["strategy"]},
                                 "metrics": {k: {"successful": b["metrics"][k]["successful"]} for k in read}}
                                for b in report["benchmarks"]]
        summary["guidellm"] = ("g.json", json.dumps(report, indent=1).encode())
    for fmt, (name, data) in summary.items():
        T.append(Target(f"summary-{fmt}", {name: data},
                        lambda d, f, rng, fmt=fmt: ["traces", "import", "summary", fmt, *map(str, f.values()),
                                                    "-o", str(d / "out.parquet")],
                        [name], {name: "jsonl" if name.endswith("jsonl") else "json"},
                        output_kind="aggregate_targets/1"))
    if (real / "vllm_otlp_spans_codellama34b_prefill_sweep.jsonl").exists():
        T.append(Target("vllm-otlp", {"o.jsonl": _head(real / "vllm_otlp_spans_codellama34b_prefill_sweep.jsonl", 60)},
                        imp("vllm-otlp"), ["o.jsonl"], {"o.jsonl": "jsonl"}))
    if (real / "blis_eval_codellama34b_prefill_sweep_vllm.log").exists():
        T.append(Target("vllm-log", {"v.log": (real / "blis_eval_codellama34b_prefill_sweep_vllm.log").read_bytes()},
                        imp("vllm-log"), ["v.log"], {"v.log": "text"}, output_kind="vllm_stats/1"))
    return T


def parquet_targets(base: dict[str, Path]) -> list[Target]:
    """validate / replay / fit over mutated tables, and replay over mutated calibrations.

    ``base`` holds valid files: ``requests`` (with measured latencies), ``tokens`` (with
    ``token_times_s`` and statuses), ``steps`` (a step trace), ``result`` (a replay
    result) and ``cal`` (a calibration JSON).
    """
    cal = base["cal"]

    def validate(d, f, rng):
        return ["traces", "validate", str(f["t.parquet"])]

    def replay(d, f, rng):
        return ["replay", str(f["t.parquet"]), "--calibration", str(cal), "-o", str(d / "out.parquet"),
                *rng.choice([[], ["--scheduler", "fcfs"], ["--scheduler", "sjf"],
                             ["--scheduler", "edf", "--slo-ttft-s", "1"], ["--replicas", "2"], ["--exact-steps"]])]

    def fit(d, f, rng):
        return ["calibrate", "fit", str(f["t.parquet"]), "--model", "llama-3.1-8b", "--gpu", "rtx-4090",
                "-o", str(d / "out.json"), *rng.choice([[], ["--variants", "max"], ["--variants", "sum,blend"]])]

    def replay_cal(d, f, rng):
        return ["replay", str(base["requests"]), "--calibration", str(f["cal.json"]), "-o", str(d / "out.parquet")]

    def tables(*names):
        return {"t.parquet": [base[n] for n in names]}

    return [
        Target("validate", tables("requests", "tokens", "steps", "result"), validate, ["t.parquet"],
               {"t.parquet": "parquet"}, output=None, output_kind=None),
        Target("replay", tables("requests", "tokens"), replay, ["t.parquet"], {"t.parquet": "parquet"},
               output_kind="replay_result/1"),
        Target("fit", tables("steps"), fit, ["t.parquet"], {"t.parquet": "parquet"}, output="out.json",
               output_kind="calibration"),
        Target("calibration", {"cal.json": cal.read_bytes()}, replay_cal, ["cal.json"], {"cal.json": "json"},
               output_kind="replay_result/1"),
    ]


def output_target() -> Target:
    """Outputs given a path that must never be written (a device, a FIFO, a folder, a link, ...):
    refused with exit 2 and left as they were (:mod:`output_paths`), before any input is read:
    the inputs hold the (mutated) placeholder."""
    return Target("output-path", {"in.txt": b"placeholder\n"}, output_paths.fuzz_argv, ["in.txt"],
                  {"in.txt": "text"}, output=None, output_kind=None)


def make_job(target: Target, seed: int, index: int, root: Path, mutate: bool = True) -> dict:
    """Write the input files of one job under ``root`` and return the job (a JSON-able dict)."""
    rng = random.Random(f"{seed}/{target.name}/{index}")
    d = root / f"{target.name}-{index:05d}"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    files, mutations = {}, []
    victim = rng.choice(target.mutate) if mutate else None
    for name, content in target.seeds.items():
        p = d / name
        files[name] = p
        if isinstance(content, list):  # parquet: one of several bases
            src = rng.choice(content)
            if name == victim:
                mutations = mutate_table_file(rng, src, p)
            else:
                shutil.copyfile(src, p)
            continue
        data = content
        if name == victim:
            data, mutations = mutate_text(rng, data, target.kind[name])
        p.write_bytes(data)
    argv, special = target.argv(d, files, rng), None
    if isinstance(argv, tuple):  # the output-path target: the command line and the path it must not write
        argv, special = argv
    return {"target": target.name, "index": index, "dir": str(d), "argv": argv, "special": special,
            "inputs": [str(p) for p in files.values()] + [a for a in argv if a.endswith(".json") and "out" not in a],
            "output": str(d / target.output) if target.output else None, "output_kind": target.output_kind,
            "mutations": mutations}


# ---------------------------------------------------------------------------
# Judging one outcome (runs in the worker, where the CLI ran)
# ---------------------------------------------------------------------------

def judge(job: dict, exit_code: int, text: str) -> tuple[str, str]:
    """``("ok", "")`` or ``(fault, detail)`` for one finished job (not traceback/crash/hang)."""
    if job.get("special"):
        return output_paths.judge_special(job, exit_code, text)
    out = Path(job["output"]) if job["output"] else None
    folder = Path(job["dir"])
    if "RuntimeWarning" in text or "DeprecationWarning" in text:
        return "warning", _last(text)
    leftovers = [p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    if leftovers:
        return "temp-left", ", ".join(leftovers)
    if exit_code == 0:
        if out is None:
            return "ok", ""
        if not out.exists():
            return "no-output", _last(text)
        try:
            check_output(out, job["output_kind"])
        except Exception as exc:  # noqa: BLE001 - any failure to read back is a finding
            return "bad-output", f"{type(exc).__name__}: {str(exc)[:300]}"
        return "ok", ""
    if exit_code not in (1, 2):
        return "exit-code", f"{exit_code}: {_last(text)}"
    if out is not None and out.exists():
        return "partial-output", _last(text)
    errors = [l for l in text.splitlines() if l.startswith("Error:")]
    if len(errors) != 1:
        return "message", _last(text)
    msg = text[text.index("Error:"):]
    names = [p for p in job["inputs"]]
    if not any(p in msg or os.path.basename(p) in msg for p in names) and not _option_message(msg):
        return "no-file-named", msg[:300]
    return "ok", ""


def _option_message(msg: str) -> bool:
    """A usage error about an option (exit 2) names the option, not a file."""
    return bool(re.search(r"(^|\s)--[a-z]", msg))


def _last(text: str) -> str:
    s = [l for l in text.strip().splitlines() if l.strip()]
    return " | ".join(s[-3:])[:400]


def check_output(path: Path, kind: str) -> None:
    """Raise unless the output reads back: ``traces validate`` rules, or a loadable calibration."""
    if kind == "calibration":
        from schemas.calibration import Calibration

        Calibration.read(path)
        return
    from traces.io import read_trace

    got, frame, _ = read_trace(path)
    if got != kind:
        raise AssertionError(f"kind {got}, expected {kind}")


# ---------------------------------------------------------------------------
# Running jobs: a worker process with a per-job timeout
# ---------------------------------------------------------------------------

class Worker:
    """A ``fuzz_worker.py`` process fed one job at a time; restarted after a crash or a hang."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.proc = None

    def _start(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen([sys.executable, str(HERE / "fuzz_worker.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(HERE.parent),
                                     start_new_session=True)
        line = self._readline(120)
        if line is None or line.strip() != b"ready":
            err = self.proc.stderr.read1(4000) if self.proc.poll() is not None else b""
            raise RuntimeError(f"fuzz worker did not start: {line!r} {err!r}")

    def _readline(self, timeout):
        fd = self.proc.stdout.fileno()
        buf = b""
        end = time.monotonic() + timeout
        while not buf.endswith(b"\n"):
            left = end - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return buf if buf else b""
            buf += chunk
        return buf

    def run(self, job: dict) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        t0 = time.monotonic()
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()
        line = self._readline(self.timeout_s)
        dt = time.monotonic() - t0
        if line is None:
            self.kill()
            return {**job, "fault": "hang", "detail": f"no answer in {self.timeout_s:g} s", "seconds": dt}
        if not line:
            rc = self.proc.wait()
            err = self.proc.stderr.read().decode("utf-8", "replace")[-600:]
            self.proc = None
            return {**job, "fault": "crash", "detail": f"worker died, returncode {rc}: {err}", "seconds": dt}
        res = json.loads(line)
        return {**job, **res, "seconds": dt}

    def kill(self):
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            self.proc = None

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None


def run_console(job: dict, timeout_s: float) -> dict:
    """Run one job through the installed console script (``traces``, ``replay``, ``calibrate``;
    ``servecal`` for the commands only it has, ``plan`` and ``demo``)."""
    argv = list(job["argv"])
    if argv[0] not in ("traces", "replay", "calibrate"):
        argv = ["servecal", *argv]
    exe = shutil.which(argv[0]) or argv[0]
    folder = Path(job["dir"])
    for p in folder.iterdir():  # the in-process run's output
        if p.name.startswith("out."):
            p.unlink()
    try:
        cp = subprocess.run([exe, *argv[1:]], capture_output=True, timeout=timeout_s, cwd=str(folder))
    except subprocess.TimeoutExpired:
        return {**job, "fault": "hang", "detail": f"console script ran over {timeout_s:g} s"}
    text = (cp.stdout + cp.stderr).decode("utf-8", "replace")
    if cp.returncode < 0:
        return {**job, "fault": "crash", "detail": f"killed by signal {-cp.returncode}: {_last(text)}"}
    if "Traceback" in text:
        return {**job, "fault": "traceback", "detail": _last(text)}
    fault, detail = judge(job, cp.returncode, text)
    return {**job, "fault": None if fault == "ok" else fault, "detail": detail, "exit": cp.returncode}


def summarize(results: list[dict]) -> dict:
    """Counts by target and by fault."""
    by = {}
    for r in results:
        t = by.setdefault(r["target"], {"inputs": 0, "exit0": 0, "exit1": 0, "exit2": 0})
        t["inputs"] += 1
        if r.get("fault"):
            t[r["fault"]] = t.get(r["fault"], 0) + 1
        elif r.get("exit") in (0, 1, 2):
            t[f"exit{r['exit']}"] += 1
    return by


# ---------------------------------------------------------------------------
# Profiles
# ---------------------------------------------------------------------------

def _cli(*argv) -> None:
    from click.testing import CliRunner

    import calibrate.umbrella as umbrella

    res = CliRunner().invoke(umbrella.main, [str(a) for a in argv])
    if res.exit_code != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))}: {res.output}")


def build_bases(root: Path, real: Path) -> dict[str, Path]:
    """Valid files the Parquet targets mutate: a request trace with measured latencies, one with
    token times and statuses, a step trace (80 steps of a real profile), a calibration fitted on
    it and a replay result."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    b = {k: root / f"base_{k}.parquet" for k in ("requests", "tokens", "steps", "result")}
    b["cal"] = root / "base_cal.json"
    (root / "r.jsonl").write_bytes(_head(real / "lss_vllm_rtxpro6000_llama31_8b_requests.jsonl", 40))
    _cli("traces", "import", "vllm-request-stats", root / "r.jsonl", "-o", b["requests"])
    _cli("traces", "import", "vllm-bench", DATA / "vllm_bench_small.json", "-o", b["tokens"])
    p = "lss_profile_rtx4090_llama31_8b_"
    _cli("traces", "import", "llmservingsim-profile", *[real / f"{p}{k}" for k in
         ("meta.yaml", "tp1_dense.csv", "tp1_attention.csv", "tp1_per_sequence.csv")], "-o", root / "all_steps.parquet")
    t = pq.read_table(root / "all_steps.parquet")
    idx = np.linspace(0, t.num_rows - 1, 80).astype(np.int64)
    pq.write_table(t.take(pa.array(idx)), b["steps"])
    _cli("calibrate", "fit", b["steps"], "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "-o", b["cal"])
    _cli("replay", b["requests"], "--calibration", b["cal"], "-o", b["result"])
    return b


def all_targets(root: Path, real: Path | None) -> list[Target]:
    targets = importer_targets(real) + [output_target()]
    if real is not None and real.is_dir():
        targets += parquet_targets(build_bases(root / "bases", real))
    return targets


def available(target: Target) -> bool:
    """Whether the command of ``target`` exists (importers of other branches may not yet)."""
    if not target.optional:
        return True
    from calibrate.umbrella import traces_cli

    return target.name in traces_cli.commands["import"].commands


def run_profile(root: Path, real: Path | None, per_target: dict | int, *, seed: int = 0, timeout_s: float = 60,
                console_every: int = 0, console_timeout_s: float = 120, workers: int = 1,
                console_targets=None, log=None) -> list[dict]:
    """Run ``per_target`` mutated inputs of every target (plus the unmutated seed, index 0).

    ``console_every`` > 0 also runs every n-th input through the console script in a
    subprocess (crash and hang detection with real entry points and stderr).
    Returns one result per run (``fault`` None when the outcome rule held).
    """
    import concurrent.futures as cf

    targets = [t for t in all_targets(root, real) if available(t)]
    jobs = []
    for t in targets:
        n = per_target if isinstance(per_target, int) else per_target.get(t.name, per_target["default"])
        for i in range(n + 1):
            jobs.append((t, i))
    results = []
    pool = [Worker(timeout_s) for _ in range(workers)]

    skipped = set()

    def run_slice(w: Worker, part):
        out = []
        for t, i in part:
            if t.name in skipped:
                continue
            job = make_job(t, seed, i, root / "jobs", mutate=i > 0)
            r = w.run(job)
            if i == 0 and r.get("fault") is None and r.get("exit") != 0 and not job["special"]:  # a refusal is right
                if t.optional:  # another branch's importer whose options this harness guessed wrong
                    skipped.add(t.name)
                    continue
                r = {**r, "fault": "seed-fails", "detail": r.get("message", "")}
            out.append(r)
            if console_every and i % console_every == 1 and (console_targets is None or t.name in console_targets):
                c = run_console(job, console_timeout_s)
                c["target"] = t.name + "@console"
                out.append(c)
            shutil.rmtree(job["dir"], ignore_errors=True) if r.get("fault") is None else None
            if log:
                log(r)
        return out

    try:
        results += run_slice(pool[0], [j for j in jobs if j[1] == 0])  # the seeds first: skips are known
        jobs = [j for j in jobs if j[1] > 0]
        with cf.ThreadPoolExecutor(workers) as ex:
            futs = [ex.submit(run_slice, pool[k], jobs[k::workers]) for k in range(workers)]
            for f in futs:
                results += f.result()
    finally:
        for w in pool:
            w.close()
    return results
