"""Bad input to the importers: deterministic malformed inputs exit 1 naming the file, a property
test (mutated inputs never give a traceback nor a partial output), and the schema validation
rules the importers rely on. The sample inputs and ``cli`` are ``test_ingest_cases.py``'s.
"""
from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traces.cli import main
from traces.io import read_trace

from test_ingest_cases import BR14, BR17, DATA, cli


# ---------------------------------------------------------------------------
# Deterministic malformed inputs: exit 1 with the file named, no output
# ---------------------------------------------------------------------------

MALFORMED = [
    ("azure", "a.csv", ""),
    ("azure", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"),
    ("azure", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,-5,10\n"),
    ("azure", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,12,NaN\n"),
    ("azure", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,12,10\n"),
    ("azure", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,12\n"),
    ("azure", "a.csv", "TIMESTAMP,Context,GeneratedTokens\n2023-11-16 18:17:03.9799600,12,10\n"),
    ("vidur", "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\nNaN,5,5\n"),
    ("vidur", "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,5.5,5\n"),
    ("vidur", "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n-1,5,5\n"),
    ("mooncake", "m.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n{"timest'),
    ("mooncake", "m.jsonl", '{"timestamp": 0, "input_length": -10, "output_length": 2}\n'),
    ("mooncake", "m.jsonl", '{"timestamp": "0", "input_length": 10, "output_length": 2}\n'),
    ("mooncake", "m.jsonl", "\n\n"),
    ("vllm-bench", "v.json", '{"input_lens": [1]}'),
    ("vllm-bench", "v.json", '[1, 2]'),
    ("vllm-bench", "v.json", json.dumps(dict(BR17, input_lens=[500, 600, 700]))),
    ("vllm-bench", "v.json", json.dumps(dict(BR17, ttfts=[0.1, 0.0, float("nan"), 0.1])).replace("NaN", "NaN")),
    ("llmperf", "l.json", '{"a": 1}'),
    ("llmperf", "l.json", '[{"ttft_s": 1}]'),
    ("genai-perf", "g.json", '{"experiments": []}'),
    ("sglang-bench", "s.jsonl", '{"backend": "sglang"}\n'),
]


@pytest.mark.parametrize("fmt,name,text", MALFORMED, ids=[f"{m[0]}-{i}" for i, m in enumerate(MALFORMED)])
def test_malformed_inputs_exit_1_naming_the_file(tmp_path, fmt, name, text):
    src = tmp_path / name
    src.write_text(text)
    out = tmp_path / "o.parquet"
    extra = ["--concurrency", "2"] if fmt == "llmperf" else []
    res = cli("import", fmt, src, "-o", out, *extra)
    assert res.exit_code == 1, res.output
    assert str(src) in res.output
    assert "Traceback" not in res.output
    assert not out.exists()


def test_missing_file_names_the_file(tmp_path):
    for fmt in ("azure", "vidur", "burstgpt", "mooncake", "vllm-bench", "genai-perf", "sglang-bench"):
        res = cli("import", fmt, tmp_path / "nope.x", "-o", tmp_path / "o.parquet")
        assert res.exit_code == 1 and "nope.x" in res.output, (fmt, res.output)


# ---------------------------------------------------------------------------
# Property: mutated inputs never give a traceback nor a partial output
# ---------------------------------------------------------------------------

def _sources():
    """(format, file name, valid text, extra options) for every importer."""
    csv_generic = ("id,ts,p,o,extra\n" + "".join(f"q{i},{1000 + 0.5 * i},{10 + i},{1 + i % 3},x\n" for i in range(6)))
    return [
        ("azure", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
            f"2023-11-16 18:17:0{i}.{i}799600,{100 + i},{10 + i}\n" for i in range(6)), []),
        ("vidur", "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n" + "".join(
            f"{0.25 * i},{100 + i},{5 + i}\n" for i in range(6)), []),
        ("burstgpt", "b.csv", (DATA / "burstgpt_small.csv").read_text(), []),
        ("mooncake", "m.jsonl", BR14.replace('"hash_ids": [0, 1]}\n{"timestamp": 1000', '"hash_ids": [0]}\n'
                                                                                     '{"timestamp": 1000'), []),
        ("vllm-bench", "v.json", (DATA / "vllm_bench_small.json").read_text(), []),
        ("sglang-bench", "s.jsonl", (DATA / "sglang_bench_small.jsonl").read_text(), ["--arrivals", "synth"]),
        ("llmperf", "l.json", json.dumps([{"error_code": None, "error_msg": "", "ttft_s": 0.1 * (i + 1),
                                           "end_to_end_latency_s": 1.0 + i, "number_input_tokens": 50 + i,
                                           "number_output_tokens": 10 + i} for i in range(4)], indent=1),
         ["--concurrency", "2"]),
        ("genai-perf", "g.json", (DATA / "genai_perf_profile_export.json").read_text(), []),
        ("csv", "c.csv", csv_generic, ["--map", "id=request_id", "--map", "ts=arrival_time_s",
                                       "--map", "p=num_prompt_tokens", "--map", "o=num_output_tokens"]),
    ]


SOURCES = _sources()
JUNK = ["", "abc", "NaN", "nan", "-5", "-0", "0", "1e400", "inf", "null", "1.5", "[]", "{}", '"', ",", "\\",
        "\x00", "\u00e9\u20ac", "9223372036854775808", "true", "2023-13-45 99:99:99.1", "\n"]
TOKEN = re.compile(r'-?\d+(?:\.\d+)?(?:e-?\d+)?|"[^"\n]*"|[A-Za-z_]+')


@st.composite
def mutated(draw):
    fmt, name, text, extra = draw(st.sampled_from(SOURCES))
    lines = text.splitlines(keepends=True)
    op = draw(st.sampled_from(["truncate", "token", "token", "dup", "swap", "drop", "empty", "unknown", "binary"]))
    if op == "truncate":
        text = text[:draw(st.integers(0, max(0, len(text) - 1)))]
    elif op == "token":
        for _ in range(draw(st.integers(1, 3))):
            toks = list(TOKEN.finditer(text))
            if not toks:
                break
            m = toks[draw(st.integers(0, len(toks) - 1))]
            text = text[:m.start()] + draw(st.sampled_from(JUNK)) + text[m.end():]
    elif op in ("dup", "swap", "drop") and len(lines) > 1:
        i = draw(st.integers(0, len(lines) - 1))
        j = draw(st.integers(0, len(lines) - 1))
        if op == "dup":
            lines.insert(j, lines[i])
        elif op == "swap":
            lines[i], lines[j] = lines[j], lines[i]
        else:
            del lines[i]
        text = "".join(lines)
    elif op == "empty":
        text = ""
    elif op == "unknown":
        if name.endswith(".csv"):
            text = "".join((ln.rstrip("\n") + (",zz_unknown\n" if k == 0 else ",1\n")) for k, ln in enumerate(lines))
        else:
            text = text.replace("{", '{"zz_unknown": [1, "x"], ', 1)
    else:
        pos = draw(st.integers(0, len(text)))
        text = text[:pos] + "\udcff" + text[pos:]
    return fmt, name, text, extra


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mutated())
def test_mutated_inputs_never_give_a_traceback(case):
    fmt, name, text, extra = case
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / name, Path(d) / "out.parquet"
        src.write_bytes(text.encode("utf-8", errors="surrogateescape"))
        res = CliRunner().invoke(main, ["import", fmt, str(src), "-o", str(out), *extra])
        assert res.exception is None or isinstance(res.exception, SystemExit), (
            f"traceback for {fmt}: {res.exception!r}\n{text[:500]!r}")
        if res.exit_code == 0:
            assert out.exists()
            val = CliRunner().invoke(main, ["validate", str(out)])
            assert val.exit_code == 0, val.output
            _, df, _ = read_trace(out)
            assert (np.diff(df["arrival_time_s"].to_numpy()) >= 0).all()
        else:
            assert res.exit_code in (1, 2), res.output
            assert str(src) in res.output, res.output
            assert not out.exists()
            assert [p.name for p in Path(d).iterdir()] == [name]  # no temp file left behind


# ---------------------------------------------------------------------------
# Schema validation rules the importers rely on
# ---------------------------------------------------------------------------

def _table(**cols):
    from schemas.tables import to_table

    base = {"request_id": ["1", "2", "3"], "arrival_time_s": [0.0, 0.5, 1.0], "num_prompt_tokens": [5, 5, 5],
            "num_output_tokens": [3, 0, 2]}
    base.update(cols)
    return to_table("request_trace/1", base)


def test_zero_output_tokens_only_with_a_non_ok_status():
    from schemas.errors import ValidationError
    from schemas.validate import validate

    validate(_table(status=["ok", "failed: timeout", None]), "t")
    with pytest.raises(ValidationError, match=r"num_output_tokens', row\(s\) 1: is below 1"):
        validate(_table(status=["ok", "ok", "ok"]), "t")
    with pytest.raises(ValidationError, match="num_output_tokens"):
        validate(_table(), "t")


@pytest.mark.parametrize("ids,dup", [(["1", "2", "1"], True), (["7", "007", "8"], False), (["a", "b", "a"], True),
                                     (["10", "2", "3"], False), (["x", "1", "01"], False)])
def test_duplicate_request_ids(ids, dup):
    from schemas.errors import ValidationError
    from schemas.validate import validate

    t = _table(request_id=ids, num_output_tokens=[1, 1, 1])
    if dup:
        with pytest.raises(ValidationError, match="duplicate"):
            validate(t, "t")
    else:
        validate(t, "t")
