"""Row status and row errors: ``ok`` / ``failed: ...`` / ``invalid: ...``, the ``--invalid`` policy.

Conventions
-----------
* ``row`` is the 1-based position of a request in its source (CSV data row without the
  header, JSONL record, element of a JSON array); ``line`` is the 1-based physical line of
  a text file (the CSV header is line 1).
* Every problem is a :class:`~traces.errors.TraceFormatError` naming the file, the row, the
  line (for CSV files) and the column.
"""
from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from schemas.status import FAILED, INVALID, OK, because

from ..errors import TraceFormatError


#: What ``--invalid`` may say about rows that break a rule of their format.
INVALID_POLICIES = ("error", "flag", "drop")


@dataclass
class RowStatus:
    """Per-row status codes, built while a file is read.

    Code 0 is ``ok``. Every other code is a reason: ``failed: ...`` (the source says the
    request failed; always kept, excluded from replay) or ``invalid: ...`` (the row breaks a
    rule of its format; handled by the ``--invalid`` policy).

    Parameters
    ----------
    path : str or Path
        The source file, named in errors.
    policy : {"error", "flag", "drop"}
        ``error``: stop at the first invalid row. ``flag``: keep it with status
        ``invalid: <rule>`` (replay and compare skip it). ``drop``: leave it out and count it.
    lines : bool
        Whether the source is line-oriented text (CSV), so errors can name the line.
    """

    path: Path
    policy: str = "error"
    lines: bool = False
    reasons: list = field(default_factory=lambda: [OK])
    _meta: dict = field(default_factory=dict)
    _chunks: list = field(default_factory=list)

    def __post_init__(self):
        if self.policy not in INVALID_POLICIES:
            raise TraceFormatError(self.path, f"unknown --invalid policy {self.policy!r}",
                                   expected=" or ".join(INVALID_POLICIES))

    def code(self, reason: str, column: str | None = None, expected: str | None = None) -> int:
        """The code of ``reason`` (``failed: ...`` or ``invalid: ...``), registering it once."""
        if reason not in self.reasons:
            self.reasons.append(reason)
            self._meta[reason] = (column, expected)
        return self.reasons.index(reason)

    def failed(self, why: str) -> int:
        """The code of ``failed: <why>`` (the source says the request failed)."""
        return self.code(because(FAILED, why))

    def invalid(self, rule: str, column: str | None = None, expected: str | None = None) -> int:
        """The code of ``invalid: <rule>`` (the row breaks ``rule``; ``column`` and ``expected`` for the error)."""
        return self.code(because(INVALID, rule), column, expected)

    def add(self, codes: np.ndarray, row0: int = 0, rows: np.ndarray | None = None) -> None:
        """Record the codes of rows ``row0 + 1 ...`` (or of the 1-based ``rows``).

        Under the ``error`` policy, raise at once for the first invalid row.
        """
        codes = np.asarray(codes, dtype=np.int16)
        if self.policy == "error":
            bad = np.flatnonzero([self.reasons[c].startswith(INVALID) for c in range(len(self.reasons))])
            hit = np.flatnonzero(np.isin(codes, bad))
            if hit.size:
                i = int(hit[0])
                reason = self.reasons[int(codes[i])]
                column, expected = self._meta[reason]
                row = int(rows[i]) if rows is not None else row0 + i + 1
                fail_at_row(self.path, reason.removeprefix(because(INVALID, "")), row, column=column,
                            expected=expected, lines=self.lines,
                            hint="or --invalid flag to keep such rows marked, --invalid drop to leave them out")
        self._chunks.append(codes)

    def all_codes(self) -> np.ndarray:
        return np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)

    def metadata(self, codes: np.ndarray) -> dict[str, str]:
        """Counts of failed and invalid rows for the file metadata (``codes`` as read)."""
        counts = np.bincount(codes, minlength=len(self.reasons)) if codes.size else np.zeros(len(self.reasons), int)
        failed = sum(int(n) for r, n in zip(self.reasons, counts) if r.startswith(FAILED))
        invalid = sum(int(n) for r, n in zip(self.reasons, counts) if r.startswith(INVALID))
        meta = {"num_failed": str(failed), "num_invalid": str(invalid), "invalid_policy": self.policy}
        by = {r: int(n) for r, n in zip(self.reasons[1:], counts[1:]) if n}
        if by:
            meta["status_counts"] = json.dumps(by, sort_keys=True)
        return meta


def line_of_row(path: str | os.PathLike, row: int) -> int | None:
    """The physical line of 1-based data ``row`` of a CSV file (blank lines skipped, as Arrow does).

    Only called when an error is reported, so a full scan is acceptable.
    """
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as fh:
            reader = csv.reader(fh)
            next(reader, None)
            n = 0
            for rec in reader:
                if not rec:
                    continue
                n += 1
                if n == row:
                    return reader.line_num
    except (OSError, csv.Error):
        return None
    return None


def fail_at_row(path, rule: str, row: int, *, column: str | None = None, expected: str | None = None,
                lines: bool = False, hint: str = ""):
    """Raise :class:`TraceFormatError` for 1-based ``row`` (with its line for CSV files)."""
    line = line_of_row(path, row) if lines else None
    if hint:
        expected = f"{expected} ({hint})" if expected else hint
    raise TraceFormatError(path, rule, row=row, column=column, expected=expected, line=line)


def check_rows(path, mask: np.ndarray, row0: int, rule: str, *, column: str, expected: str, lines: bool,
               rows: np.ndarray | None = None) -> None:
    """Raise for the first row where ``mask`` is True (a structural error, always fatal).

    The row is ``row0 + i + 1``, or ``rows[i]`` when the 1-based rows are given.
    """
    if mask.any():
        i = int(np.flatnonzero(mask)[0])
        row = int(rows[i]) if rows is not None else row0 + i + 1
        fail_at_row(path, rule, row, column=column, expected=expected, lines=lines)
