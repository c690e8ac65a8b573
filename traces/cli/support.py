"""What every servecal CLI shares: turning user errors into one message and an exit code.

It lives in the lowest CLI (``traces``), so the ``replay`` and ``calibrate`` commands import it
under the one-way layering while the data layer (``schemas``) stays free of click.

Exit codes: 1 invalid data (a bad file), 2 usage (a bad option), 3 a broken tolerance. Every
usage error fits 100 columns: the commands a user starts are :class:`FoldedGroup` or
:class:`FoldedCommand`, which fold click's own and the commands' alike.
"""
from __future__ import annotations

import functools

import click

from schemas.atomic import check_writable, expect_outputs, release_sigint
from schemas.errors import SchemaError

from schemas.text import wrap_error


class DataError(click.ClickException):
    """Invalid data: printed as ``Error: <message>``, exit code 1."""

    exit_code = 1


def folded(exc: click.UsageError) -> click.UsageError:
    """``exc`` with its message folded so that click's ``Error: <message>`` line, a
    :class:`click.BadParameter`'s ``Invalid value for --fix: `` included, fits 100 columns.

    ``exc`` itself when it fits already, or when it is not printed as an error line (click's
    help for a group run without a command)."""
    message = exc.format_message()
    if type(exc).show is not click.UsageError.show or wrap_error(message) == message:
        return exc
    return click.UsageError(wrap_error(message), exc.ctx)


class FoldedErrors:
    """Mixin of the commands a user starts (``traces``, ``replay``, ``calibrate``, ``servecal``):
    every usage error (exit 2) is :func:`folded`, whether click's parsing of the options
    raised it (``Invalid value for '--link': 'x' is not one of ...``) or a command did
    (``click.BadParameter``, ``click.UsageError``), here or in a subcommand."""

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as exc:
            raise folded(exc) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise folded(exc) from None


class FoldedGroup(FoldedErrors, click.Group):
    """A :class:`click.Group` whose usage errors fit 100 columns (:class:`FoldedErrors`)."""


class FoldedCommand(FoldedErrors, click.Command):
    """A :class:`click.Command` whose usage errors fit 100 columns (:class:`FoldedErrors`)."""


#: Parameter names of the files commands read and write, checked by :func:`user_errors`.
INPUT_PARAMS = ("src", "sources", "file", "trace", "traces", "fit_on", "score_on", "data", "calibration_path",
                "measured_timeseries", "fix_from")
OUTPUT_PARAMS = ("output", "steps_out", "chrome_trace", "report", "sweep_out", "plot", "table_out")


def user_errors(data_errors: tuple = (), usage_errors: tuple = ()):
    """Decorate a click command so the named exceptions become one clear message, no traceback.

    ``SchemaError`` and every class in ``data_errors`` exit 1; ``usage_errors`` exit 2, their
    message folded to 100 columns (``Error: `` included; a data error, which names its file
    first, is folded where it is raised).
    Before the command runs, every output (parameters :data:`OUTPUT_PARAMS`) must be
    writable and differ from every input (:data:`INPUT_PARAMS`) and from the other outputs
    (exit 2), so a bad second output never costs the first one.
    """
    data_errors = (SchemaError, *data_errors)

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            inputs = []
            for name in INPUT_PARAMS:
                v = kwargs.get(name)
                inputs += list(v) if isinstance(v, (list, tuple)) else [v]
            outputs = {"--" + name.replace("_", "-") if name != "output" else "-o/--output": kwargs.get(name)
                       for name in OUTPUT_PARAMS}
            check_outputs(inputs, outputs)
            expect_outputs([p for p in outputs.values() if p])
            try:
                return fn(*args, **kwargs)
            except usage_errors as exc:
                raise click.UsageError(wrap_error(str(exc))) from None
            except data_errors as exc:
                raise DataError(str(exc)) from None
            except RecursionError:
                # a structure nested deeper than any reader expects (e.g. a JSON file);
                # readers name the file themselves, this is the last resort
                raise DataError(f"{', '.join(str(p) for p in inputs if p) or 'input'}: nested too deeply to read"
                                ) from None
            finally:
                # a Ctrl-C after the last output was renamed into place was held: the work is
                # complete, so the command ends with its own exit code
                release_sigint()
                expect_outputs(None)

        return wrapper

    return deco


def version_option():
    """``--version`` with the installed distribution's version."""
    return click.version_option(package_name="servecal", prog_name="servecal")


def _file_read(path) -> str:
    """The file an input names: ``FILE`` of a run spec ``FILE#K`` or ``FILE@START:END``
    (``calibrate``'s), when only that exists."""
    import os

    text = str(path)
    if not os.path.exists(text):
        for sep in ("#", "@"):
            head = text.split(sep, 1)[0]
            if head != text and os.path.exists(head):
                return head
    return text


def check_outputs(inputs, outputs: dict) -> None:
    """Refuse before any work an output that is an input or another output, or unwritable.

    Parameters
    ----------
    inputs : iterable of paths read by the command
    outputs : dict option name -> path (None when not given)

    Raises
    ------
    click.UsageError
        Naming the option.
    """
    import os

    seen = {os.path.realpath(_file_read(p)): "input" for p in inputs if p}
    for option, path in outputs.items():
        if not path:
            continue
        real = os.path.realpath(path)
        if real in seen:
            raise click.UsageError(f"{option} {path}: the same file as the {seen[real]}; "
                                   "choose another output name")
        seen[real] = option
        try:
            check_writable(path)
        except SchemaError as exc:
            raise click.UsageError(f"{option} {exc}") from None
