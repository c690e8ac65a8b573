"""The fuzzer's text mutators: values that break parsers (extreme numbers and dates, garbage
bytes) and the mutations of a CSV, JSON, JSON Lines, YAML or text input, one function each;
``mutate_text`` applies one to three of those that fit the file's kind.

Part of the fuzzer of ``fuzzlib``; nothing here depends on pytest.
"""
from __future__ import annotations

import json
import random
import re

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
