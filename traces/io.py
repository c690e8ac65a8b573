"""Reading and writing validated servecal traces."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import pandas as pd

from schemas.tables import table_kind, table_metadata, read_table, to_table, write_table
from schemas.validate import validate


def read_trace(path: str | os.PathLike, kind: str | None = None) -> tuple[str, pd.DataFrame, dict]:
    """Read and validate a servecal Parquet table.

    Parameters
    ----------
    path : path of a Parquet file written by servecal (or with its columns and metadata).
    kind : expected kind, optional; default the file's ``servecal.schema``.

    Returns
    -------
    kind : str
    frame : pandas.DataFrame
        Contract dtypes: float64 seconds, int64 tokens (nullable columns keep Arrow types).
    metadata : dict[str, str]
        The file's ``servecal.*`` metadata.

    Raises
    ------
    schemas.errors.SchemaError
        Unreadable file, or every rule the table breaks (ValidationError).
    """
    table = read_table(path)
    table = validate(table, str(path), kind)
    return table_kind(table), table.to_pandas(), table_metadata(table)


def write_trace(frame: pd.DataFrame, kind: str, path: str | os.PathLike, metadata: dict | None = None) -> None:
    """Validate ``frame`` as ``kind`` and write it atomically as Parquet.

    Raises
    ------
    schemas.errors.SchemaError
        If the frame breaks the contract (nothing is written).
    """
    table = to_table(kind, frame, metadata)
    table = validate(table, str(path), kind)
    write_table(table, path)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; rename it to ``path`` only if the block succeeds.

    A failure (or an interrupt) never leaves a partial or overwritten output file.

    Examples
    --------
    >>> with atomic_output("plot.png") as tmp:          # doctest: +SKIP
    ...     fig.savefig(tmp, format="png")
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make the output private
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
