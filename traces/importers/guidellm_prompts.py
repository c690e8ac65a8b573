"""The prompt text of GuideLLM's requests and the ``block_hashes`` derived from it
(:func:`traces.importers.guidellm.import_guidellm`, its Notes: one characters-per-token ratio
for the whole file, :func:`.block_hashes.text_block_hashes`)."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pandas as pd

from schemas.status import OK

from ..errors import TraceFormatError
from ._json import json_number
from .block_hashes import HASH_BLOCK_TOKENS, implied_prefix_cache_hits, shared_leading_blocks


def prompt_text(path, req: dict, row: int, where: str) -> str:
    """The prompt text of a request from ``request_args`` (dict, JSON or Python repr)."""
    col = f"{where}.request_args"
    args = req.get("request_args")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            try:
                args = ast.literal_eval(args)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                raise TraceFormatError(path, "request_args is neither JSON nor a Python literal", row=row,
                                       column=col, expected="the request's arguments, or --no-block-hashes") from None
    body = args.get("body") if isinstance(args, dict) else None
    if not isinstance(body, dict):
        body = args if isinstance(args, dict) else None
    if body is None:
        raise TraceFormatError(path, "request_args has no request body", row=row, column=col,
                               expected="{'body': {'prompt': ...}} (or --no-block-hashes)")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompt = "".join(prompt)
    if isinstance(prompt, str):
        return prompt
    msgs = body.get("messages")
    if isinstance(msgs, list) and msgs:
        parts = []
        for m in msgs:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, list):  # content parts
                c = "".join(p.get("text", "") for p in c if isinstance(p, dict))
            if not isinstance(c, str):
                raise TraceFormatError(path, "a chat message has no text content", row=row,
                                       column=col + ".body.messages", expected="text messages (or --no-block-hashes)")
            parts.append(f"{m.get('role', '')}\n{c}\n")
        return "".join(parts)
    raise TraceFormatError(path, "request body has no 'prompt' text nor 'messages'", row=row, column=col + ".body",
                           expected="a text prompt (or --no-block-hashes)")


def prompt_texts(path: Path, recs: list) -> tuple[dict[int, str], float]:
    """The prompt text of every request with a prompt count, by row, and the file's characters per token
    (all of ``recs``: a benchmark imported alone gets the same hashes)."""
    texts: dict[int, str] = {}
    tot_chars = tot_tokens = 0
    for b, kind, i, r, req in recs:
        n = req.get("prompt_tokens")
        if kind != "successful" and not isinstance(n, int):
            continue
        where = f"benchmarks[{b}].requests.{kind}[{i}]"
        n = json_number(path, n, column=f"{where}.prompt_tokens", row=r, integer=True, minimum=1)
        texts[r] = prompt_text(path, req, r, where)
        tot_chars += len(texts[r])
        tot_tokens += n
    return texts, tot_chars / tot_tokens


def hash_metadata(df: pd.DataFrame, benchmark: int | None, ratio: float) -> dict:
    """The metadata of the derived ``block_hashes``: the method, the shared leading blocks per benchmark
    and the prefix cache hit rate they imply over the imported requests."""
    ok = df["status"].isna() | (df["status"] == OK) if "status" in df else np.ones(len(df), bool)
    hs = df["block_hashes"].tolist()
    shared = {}
    groups = df["benchmark"].to_numpy() if "benchmark" in df else np.full(len(df), benchmark)
    for g in sorted(set(groups.tolist())):
        shared[str(g)] = shared_leading_blocks([h for h, gg in zip(hs, groups) if gg == g])
    hits = implied_prefix_cache_hits(hs, df["num_prompt_tokens"].to_numpy())
    ok = np.asarray(ok, bool)
    rate = float(hits[ok].sum() / df["num_prompt_tokens"].to_numpy()[ok].sum())
    return {
        "hash_block_tokens": str(HASH_BLOCK_TOKENS),
        "chars_per_token": f"{ratio:.6f}",
        "block_hashes_method": (f"derived from prompt text: BLAKE2b-64 of the text up to character round((k+1)*"
                                f"{HASH_BLOCK_TOKENS}*{ratio:.4f}) for block k (one chars/token ratio for the "
                                "file; an approximation of token boundaries)"),
        "shared_prefix_blocks": json.dumps(shared),
        "implied_prefix_cache_hit_rate": f"{rate:.4f}",
    }
