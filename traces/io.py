"""Reading and writing validated servecal traces."""
from __future__ import annotations

import os

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


def write_trace(frame: pd.DataFrame, kind: str, path: str | os.PathLike, metadata: dict | None = None,
                source: str | None = None) -> None:
    """Validate ``frame`` as ``kind`` and write it atomically as Parquet.

    ``source`` (the file the frame was imported from) is named in validation messages,
    whose rows are then rows of the imported table.

    Raises
    ------
    schemas.errors.SchemaError
        If the frame breaks the contract (nothing is written).
    """
    table = to_table(kind, frame, metadata)
    table = validate(table, f"{source} (rows of the imported table)" if source else str(path), kind)
    write_table(table, path)
