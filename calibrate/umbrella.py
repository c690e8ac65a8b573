"""``servecal``: one command that nests ``traces``, ``calibrate`` and ``replay``, plus ``demo``."""
from __future__ import annotations

import click

from replay.cli import main as replay_main
from replay.cli.describe_load import with_load
from replay.cli.plan import plan
from traces.cli.support import FoldedGroup, version_option
from traces.cli import main as traces_main


def _calibrate_command() -> click.Command:
    from .cli import main as command

    return command


def _demo_command() -> click.Command:
    from .demo import demo

    return demo


class _LazyGroup(FoldedGroup):
    """A group whose commands in :attr:`lazy` are imported when one of them is run or asked for
    its help: ``calibrate`` and ``demo`` pull in numpy, pandas, scipy and lmfit, which
    ``servecal --help`` does not need. The one-line help of each is given here (a test checks
    it against the command's own)."""

    #: name -> (function importing the command of this package, one-line help shown by the group's --help)
    lazy = {
        "calibrate": (_calibrate_command, "Fit the simulator's cost model to measured traces."),
        "demo": (_demo_command, "Run import -> fit -> replay -> compare on a SYNTHETIC cluster and workload."),
    }

    def list_commands(self, ctx):
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx, cmd_name):
        if cmd_name in self.lazy and cmd_name not in self.commands:
            self.add_command(self.lazy[cmd_name][0](), cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx, formatter):
        rows = []
        for name in self.list_commands(ctx):
            if name in self.lazy and name not in self.commands:
                rows.append((name, self.lazy[name][1]))
                continue
            cmd = super().get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd))
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            rows = [(name, click.Command(name, help=text).get_short_help_str(limit) if isinstance(text, str)
                     else text.get_short_help_str(limit)) for name, text in rows]
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@version_option()
def main():
    """servecal: does your simulator tell the truth about your cluster?

    \b
    Example:
      servecal demo
      servecal traces import vllm-request-stats run_requests.jsonl -o run.parquet
      servecal calibrate fit steps.parquet --model llama-3.1-8b --gpu rtx-pro-6000 -o cal.json
      servecal replay run.parquet --calibration cal.json
      servecal plan run.parquet --calibration cal.json --rate 3 --slo ttft_p90=2s --replicas 1:8
    """


#: ``traces`` with the replay-aware ``describe --calibration`` (the ``traces`` console script): a
#: group of its own, so ``traces.cli.main`` and its ``describe`` stay as the traces package made them.
traces_cli = FoldedGroup(traces_main.name, commands={**traces_main.commands,
                                                     "describe": with_load(traces_main.commands["describe"])},
                         callback=traces_main.callback, params=traces_main.params, help=traces_main.help,
                         context_settings=traces_main.context_settings, epilog=traces_main.epilog,
                         short_help=traces_main.short_help)

main.add_command(traces_cli, "traces")
main.add_command(replay_main, "replay")
main.add_command(plan, "plan")
