"""The fuzzer's mutation of a Parquet input (a request or step trace, a replay result): values,
nulls, columns dropped, renamed or retyped, rows duplicated, reversed or emptied, schema
metadata, list columns (token times) and raw bytes.

Part of the fuzzer of ``fuzzlib``; nothing here depends on pytest.
"""
from __future__ import annotations

import random
from pathlib import Path


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
