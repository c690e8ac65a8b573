"""What every servecal CLI shares: turning user errors into one message and an exit code.

Exit codes: 1 invalid data (a bad file), 2 usage (a bad option), 3 a broken tolerance.
"""
from __future__ import annotations

import functools

import click

from .errors import SchemaError


class DataError(click.ClickException):
    """Invalid data: printed as ``Error: <message>``, exit code 1."""

    exit_code = 1


def user_errors(data_errors: tuple = (), usage_errors: tuple = ()):
    """Decorate a click command so the named exceptions become one clear message, no traceback.

    ``SchemaError`` and every class in ``data_errors`` exit 1; ``usage_errors`` exit 2.
    """
    data_errors = (SchemaError, *data_errors)

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except usage_errors as exc:
                raise click.UsageError(str(exc)) from None
            except data_errors as exc:
                raise DataError(str(exc)) from None

        return wrapper

    return deco


def version_option():
    """``--version`` with the installed distribution's version."""
    return click.version_option(package_name="servecal", prog_name="servecal")
