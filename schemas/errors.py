"""Errors of the data contract.

Every user-facing problem with a file or a spec is a :class:`SchemaError`; the CLI maps
it to one message and exit code 1 (invalid data) without a traceback.
"""
from __future__ import annotations

from dataclasses import dataclass


def text_reason(path, exc: BaseException) -> str:
    """Why ``path`` could not be read as a text file (JSON, CSV), in a few words for a message:
    a Parquet file (``PAR1`` at its start) given where text is expected, bytes that are not
    UTF-8 text, else the first line of the parser's message (at most 80 characters), never a
    codec's byte positions."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        head = b""
    if head == b"PAR1":
        return "it is a Parquet file"
    if isinstance(exc, UnicodeError):
        return "not UTF-8 text"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else type(exc).__name__
    return first if len(first) <= 80 else first[:80].rsplit(" ", 1)[0] + " ..."


@dataclass(frozen=True)
class Problem:
    """One broken rule: where (file, column, rows) and what was expected."""

    rule: str
    column: str | None = None
    rows: tuple[int, ...] = ()
    expected: str = ""
    num_rows: int = 0

    def render(self) -> str:
        where = f"column '{self.column}'" if self.column else "table"
        rows = ""
        if self.rows:
            shown = ", ".join(str(r) for r in self.rows[:5])
            more = f" (+{self.num_rows - len(self.rows[:5])} more)" if self.num_rows > 5 else ""
            rows = f", row(s) {shown}{more}"
        exp = f"; expected {self.expected}" if self.expected else ""
        return f"{where}{rows}: {self.rule}{exp}"


class SchemaError(Exception):
    """Base class of data-contract errors (bad table, bad spec, unknown catalog key)."""


class ValidationError(SchemaError):
    """A table breaks one or more rules of its schema.

    Attributes
    ----------
    path : str
        The file (or a description of the source) that was validated.
    problems : list[Problem]
        Every broken rule, reported at once.
    """

    def __init__(self, path: str, problems: list[Problem]):
        self.path = path
        self.problems = list(problems)
        lines = [f"{path}: {len(self.problems)} problem(s)"]
        lines += [f"  - {p.render()}" for p in self.problems]
        super().__init__("\n".join(lines))


class SpecError(SchemaError):
    """A model or GPU spec is unknown, incomplete or inconsistent."""


class SpecFileError(SpecError):
    """A spec file given by path (a GPU spec JSON, a Hugging Face config.json) that is missing
    or whose content is not a valid spec: bad data (the CLI exits 1), where an unknown catalog
    key is bad usage (2)."""


class ParamError(SchemaError, ValueError):
    """A cost parameter unknown, not a number, or outside its declared range (:mod:`schemas.cost_params`)."""


class OutputError(SchemaError):
    """An output file cannot be written (missing folder, not writable, same as an input)."""
