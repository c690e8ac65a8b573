"""What every servecal CLI shares: turning user errors into one message and an exit code.

It lives in the lowest CLI (``traces``), so the ``replay`` and ``calibrate`` commands import it
under the one-way layering while the data layer (``schemas``) stays free of click.

Exit codes: 1 invalid data (a bad file), 2 usage (a bad option), 3 a broken tolerance. Every
usage error fits 100 columns: the commands a user starts are :class:`FoldedGroup` or
:class:`FoldedCommand`, which fold click's own and the commands' alike.
"""
from __future__ import annotations

import contextlib
import functools

import click

from schemas.atomic import check_writable, expect_outputs, not_a_regular_file, release_sigint
from schemas.errors import SchemaError, SpecFileError

from schemas.text import wrap, wrap_error


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
#: Every option or argument that names a file to read belongs in INPUT_PARAMS (an output of
#: the same name would overwrite it), every file written in OUTPUT_PARAMS.
INPUT_PARAMS = ("src", "sources", "file", "trace", "traces", "fit_on", "score_on", "data", "calibration_path",
                "measured_timeseries", "fix_from", "model_config", "gpu_spec", "vllm_log", "guidellm", "align_to")
OUTPUT_PARAMS = ("output", "steps_out", "chrome_trace", "report", "sweep_out", "plot", "table_out", "timeseries_csv")
#: Parameters naming a catalog key or a spec file (``--model``, ``--gpu``): inputs when they name a file.
SPEC_PARAMS = ("model", "gpu")


def user_errors(data_errors: tuple = (), usage_errors: tuple = (), output_folders=None):
    """Decorate a click command so the named exceptions become one clear message, no traceback.

    ``SchemaError`` and every class in ``data_errors`` exit 1; ``usage_errors`` exit 2, their
    message folded to 100 columns (``Error: `` included; a data error, which names its file
    first, is folded where it is raised).
    Before the command runs, every output (parameters :data:`OUTPUT_PARAMS`) must be
    writable and differ from every input (:data:`INPUT_PARAMS`, and :data:`SPEC_PARAMS` that
    name a file) and from the other outputs (exit 2), so a bad second output never costs the
    first one. ``output_folders(kwargs)`` returns ``{option: (folder, what, names)}``, the
    folders an output writes ``what`` (files named ``names``) into besides its file (a
    Markdown report's figures): see :func:`check_outputs`.
    """
    data_errors = (SchemaError, *data_errors)

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            inputs = {}
            for name in INPUT_PARAMS:
                v = kwargs.get(name)
                if v:
                    inputs[_label(name)] = list(v) if isinstance(v, (list, tuple)) else [v]
            for name in SPEC_PARAMS:
                path = _spec_file(kwargs.get(name))
                if path:
                    inputs[_label(name)] = [path]
            outputs = {"--" + name.replace("_", "-") if name != "output" else "-o/--output": kwargs.get(name)
                       for name in OUTPUT_PARAMS}
            check_outputs(inputs, outputs, output_folders(kwargs) if output_folders else None)
            expect_outputs([p for p in outputs.values() if p])
            try:
                with notes_said():
                    return fn(*args, **kwargs)
            except SpecFileError as exc:  # a file's content, though other spec errors are usage
                raise DataError(str(exc)) from None
            except usage_errors as exc:
                raise click.UsageError(wrap_error(str(exc))) from None
            except data_errors as exc:
                raise DataError(str(exc)) from None
            except RecursionError:
                # a structure nested deeper than any reader expects (e.g. a JSON file);
                # readers name the file themselves, this is the last resort
                read = [str(p) for paths in inputs.values() for p in paths]
                raise DataError(f"{', '.join(read) or 'input'}: nested too deeply to read") from None
            finally:
                # a Ctrl-C after the last output was renamed into place was held: the work is
                # complete, so the command ends with its own exit code
                release_sigint()
                expect_outputs(None)

        return wrapper

    return deco


@contextlib.contextmanager
def notes_said():
    """While the block runs, each :class:`~schemas.hf_identity.SpecNote` (how a spec file was
    read: a type read as another, a name guessed) is printed once as a ``warning:`` line on
    stderr, folded to 100 columns, when it is raised; other warnings are left as they were."""
    import warnings

    from schemas.hf_identity import SpecNote

    said = set()
    with warnings.catch_warnings():
        warnings.simplefilter("always", SpecNote)
        show = warnings.showwarning

        def said_once(message, category, *args, **kwargs):
            if not issubclass(category, SpecNote):
                return show(message, category, *args, **kwargs)
            if str(message) not in said:
                said.add(str(message))
                click.echo(wrap(f"warning: {message}"), err=True)

        warnings.showwarning = said_once
        yield


def _label(name: str) -> str:
    """How the running command's parameter ``name`` is spelled: its long option, or its
    argument's metavar (``TRACE``)."""
    ctx = click.get_current_context(silent=True)
    for param in ctx.command.params if ctx is not None else ():
        if param.name == name:
            return max(param.opts, key=len) if isinstance(param, click.Option) else param.human_readable_name
    return "--" + name.replace("_", "-")


def _spec_file(value) -> str | None:
    """The file a ``--model``/``--gpu`` value reads when it names one (a model folder: its
    ``config.json``, see :func:`schemas.hf_config.model_from_hf_config`); None for a catalog key."""
    import os

    if not value:
        return None
    path = os.path.expanduser(str(value).strip())
    if os.path.isdir(path):
        return os.path.join(path, "config.json")
    return path if os.path.isfile(path) else None


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


def check_outputs(inputs, outputs: dict, folders: dict | None = None) -> None:
    """Refuse before any work an output that is an input or another output, or unwritable.

    Parameters
    ----------
    inputs : iterable of paths read by the command, or dict input name -> list of paths
    outputs : dict option name -> path (None when not given)
    folders : dict option name -> (folder, what, names), optional
        Folders an output writes more files into (``what``, e.g. "figures", under ``names``):
        the folder must not be a file and, when it exists, must be writable, and none of
        ``names`` in it may be other than a regular file (:func:`schemas.atomic.check_writable`);
        no input or other output may lie inside it (whatever the figures' names: the simple
        rule that holds for every name).

    Raises
    ------
    click.UsageError
        Naming the option, the file and what is expected.
    """
    import os

    if not isinstance(inputs, dict):
        inputs = {"": list(inputs)}
    files = [(os.path.realpath(_file_read(p)), f"input {name}".strip(), p)
             for name, paths in inputs.items() for p in paths if p]
    for option, path in outputs.items():
        if not path:
            continue
        real = os.path.realpath(path)
        same = [what for r, what, _ in files if r == real]
        if same:
            raise click.UsageError(f"{option} {path}: the same file as the {same[0]}; choose another output name")
        files.append((real, f"output {option}", path))
        try:
            check_writable(path)
        except SchemaError as exc:
            raise click.UsageError(f"{option} {exc}") from None
    for option, (folder, what, names) in (folders or {}).items():
        writer = f"{option} {outputs.get(option)}"
        if os.path.lexists(folder) and not os.path.isdir(folder):
            raise click.UsageError(wrap_error(f"{writer}: writes its {what} into the folder {folder}, but that is "
                                              f"a file; move it or choose another {option} name"))
        if os.path.isdir(folder) and not os.access(folder, os.W_OK | os.X_OK):
            raise click.UsageError(wrap_error(f"{writer}: writes its {what} into the folder {folder}, which is "
                                              "not writable"))
        for name in names:
            kind = not_a_regular_file(os.path.join(folder, name))
            if kind:
                raise click.UsageError(wrap_error(f"{writer}: writes its {what} into the folder {folder}, but "
                                                  f"{name} there {kind}"))
        inside = os.path.realpath(folder)
        for real, which, path in files:
            if os.path.commonpath([inside, real]) == inside:
                fix = ("choose another output name" if which.startswith("output") else
                       f"move it or choose another {option} name")
                raise click.UsageError(wrap_error(f"{which.split(' ', 1)[-1]} {path}: inside the folder {folder}, "
                                                  f"which {writer} fills with its {what} (replacing files of "
                                                  f"their names); {fix}"))
