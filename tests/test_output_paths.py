"""An output path that exists and is not a regular file is refused (exit 2, one message naming
the option and the path) before any work, and is left as it was: a device (``/dev/null``, also
as root), a FIFO, a folder, a socket, a symbolic link (to a file, a folder, a device, nowhere,
itself). Every output of every command (issue 21, item 1)."""
import os
import re
import stat
from pathlib import Path

import click
import pytest

from calibrate.umbrella import main as servecal
from helpers import flat, invoke_servecal as invoke
from output_paths import KINDS, OUTPUTS, SPELLED, make_inputs, make_special, snapshot
from schemas.atomic import atomic_output, check_writable, not_a_regular_file, write_text_atomic
from schemas.errors import OutputError
from traces.cli.support import OUTPUT_PARAMS


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_inputs(tmp_path)
    return tmp_path


def test_every_output_of_every_command_is_in_the_table():
    """OUTPUTS names every output option of every command (a new one cannot escape these tests)."""
    def commands(cmd, path):
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for sub in cmd.list_commands(ctx):
                yield from commands(cmd.get_command(ctx, sub), path + (sub,))
        else:
            yield path, cmd

    have = {(path, p.name) for path, cmd in commands(servecal, ()) for p in cmd.params if p.name in OUTPUT_PARAMS}
    table = {(path, "output" if option == "-o" else option.lstrip("-").replace("-", "_"))
             for path, _, option in OUTPUTS}
    assert have == table


#: Every output with the issue's kinds (a device, a FIFO, a folder, a link to a file); every kind
#: with outputs of each of the three CLIs (the check is one function for all, schemas.atomic).
CASES = ([(out, kind) for out in OUTPUTS for kind in ("device", "fifo", "directory", "symlink-file")]
         + [(out, kind) for out in OUTPUTS if out[0] in (("traces", "synth"), ("calibrate", "fit"))
            or out[2] == "--steps-out"
            for kind in KINDS if kind not in ("device", "fifo", "directory", "symlink-file")])


@pytest.mark.parametrize("out,kind", CASES, ids=[f"{' '.join(o[0])} {o[2]} {k}" for o, k in CASES])
def test_an_output_that_is_not_a_regular_file_is_refused(folder, out, kind):
    path, args, option = out
    given = make_special(folder, kind, "out.x")
    before = snapshot(given)
    res = invoke(*path, *args, option, given)
    assert res.exit_code == 2, res.output
    msg = flat(res.output)
    assert SPELLED.get(option, option) in msg and given in msg
    assert sum(line.startswith("Error:") for line in res.output.splitlines()) == 1
    assert snapshot(given) == before
    assert not (folder / "new.parquet").exists()
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) == []  # no temporary file


def test_dev_null_survives_as_root_too(folder):
    """The issue's case: ``-o /dev/null`` as a habit for a dry run. Root may replace a device;
    the check does not depend on rights (here we are root when the tests run as root)."""
    st = os.stat(os.devnull)
    res = invoke("traces", "synth", "--requests", "5", "--rate", "1", "-o", os.devnull)
    assert res.exit_code == 2
    assert "Error: -o/--output /dev/null: is a character device; expected a regular file or a new name" in res.output
    after = os.stat(os.devnull)
    assert stat.S_ISCHR(after.st_mode) and (after.st_rdev, after.st_ino) == (st.st_rdev, st.st_ino)


@pytest.mark.parametrize("kind,message", [
    ("fifo", "out.x: is a FIFO (named pipe); expected a regular file or a new name"),
    ("socket", "out.x: is a socket; expected a regular file or a new name"),
    ("directory", "out.x: is a directory; expected a file name"),
    ("symlink-file", "out.x: is a symbolic link to {d}/victim; expected a regular file or a new name, never a link"),
    ("symlink-dangling",
     "out.x: is a symbolic link to {d}/nowhere; expected a regular file or a new name, never a link"),
    ("symlink-loop", "out.x: is a symbolic link to out.x; expected a regular file or a new name, never a link"),
])
def test_the_message_says_what_the_path_is(folder, kind, message):
    make_special(folder, kind, "out.x")
    with pytest.raises(OutputError) as err:
        check_writable("out.x")
    assert str(err.value) == message.format(d=folder)


def test_a_regular_file_or_a_new_name_is_written(folder):
    assert not_a_regular_file("new.txt") is None and not_a_regular_file("in.csv") is None
    write_text_atomic("a\n", "in.csv")
    write_text_atomic("b\n", "new.txt")
    assert (folder / "in.csv").read_text() == "a\n" and (folder / "new.txt").read_text() == "b\n"
    # a link to a folder on the way to the output is a folder, not an output path
    (folder / "sub").mkdir()
    (folder / "via").symlink_to(folder / "sub")
    write_text_atomic("c\n", "via/x.txt")
    assert (folder / "sub" / "x.txt").read_text() == "c\n"


def test_a_fifo_made_while_the_command_ran_is_not_replaced(folder):
    """Checked again just before the rename: a long run's output turned into a FIFO meanwhile."""
    with pytest.raises(OutputError, match=r"late.x: is a FIFO \(named pipe\)"):
        with atomic_output("late.x") as tmp:
            Path(tmp).write_text("data")
            os.mkfifo("late.x")
    assert stat.S_ISFIFO(os.lstat("late.x").st_mode)
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []


# --- a Markdown report's figures, and the demo's folder ---------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "symlink-file", "directory"])
@pytest.mark.parametrize("cmd", [["replay", "t.parquet", "--calibration", "cal.json"],
                                 ["plan", "t.parquet", "--calibration", "cal.json", "--slo", "ttft_p90=2s"]])
def test_a_figure_of_a_markdown_report_that_is_not_a_regular_file_is_refused(folder, cmd, kind):
    (folder / "rp_files").mkdir()
    out = make_special(folder / "rp_files", kind, "cdf.png")
    before = snapshot(out)
    res = invoke(*cmd, "--report", "rp.md")
    assert res.exit_code == 2, res.output
    assert "--report rp.md: writes its figures into the folder rp_files, but cdf.png there is a" in flat(res.output)
    assert snapshot(out) == before and not (folder / "rp.md").exists()


def test_every_figure_name_is_known_to_the_check():
    """The figures' names the reports write are all in FIGURE_NAMES (checked before any work)."""
    from replay.report import FIGURE_NAMES

    src = Path(__file__).parents[1] / "replay" / "report"
    used = {m for f in src.glob("*.py") for m in re.findall(r'"(\w+\.png)"', f.read_text())}
    assert used == set(FIGURE_NAMES)


@pytest.mark.parametrize("kind", ["fifo", "symlink-file", "symlink-device", "directory"])
def test_the_demo_refuses_a_file_in_its_folder_that_is_not_a_regular_file(folder, kind):
    (folder / "d").mkdir()
    out = make_special(folder / "d", kind, "steps.parquet")
    before = snapshot(out)
    res = invoke("demo", "--out-dir", "d", "--requests", "10")
    assert res.exit_code == 2 and "SYNTHETIC" not in res.output
    assert "Error: --out-dir d/steps.parquet: is a" in res.output
    assert snapshot(out) == before and sorted(p.name for p in (folder / "d").iterdir()) == ["steps.parquet"] + (
        ["victim"] if kind == "symlink-file" else [])


@pytest.mark.parametrize("kind", ["device", "fifo", "symlink-file", "socket"])
def test_the_demo_refuses_an_out_dir_that_is_not_a_folder(folder, kind):
    out = make_special(folder, kind, "d")
    before = snapshot(out)
    res = invoke("demo", "--out-dir", out, "--requests", "10")
    assert res.exit_code == 2 and "SYNTHETIC" not in res.output
    msg = flat(res.output)
    assert (f"Error: --out-dir {out}: exists and is not a folder; expected a folder or a new name" in msg
            or f"Error: Invalid value for '--out-dir': Directory '{out}' is a file." in msg)  # click's, a regular file
    assert snapshot(out) == before
