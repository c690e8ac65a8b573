"""``servecal``: one command that nests ``traces``, ``calibrate`` and ``replay``, plus ``demo``."""
from __future__ import annotations

import click

from replay.cli import add_load_to_describe, main as replay_main
from schemas.cli_support import version_option
from traces.cli import main as traces_main

from .cli import main as calibrate_main
from .demo import demo


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option()
def main():
    """servecal: does your simulator tell the truth about your cluster?

    \b
    Example:
      servecal demo
      servecal traces import vllm-request-stats run_requests.jsonl -o run.parquet
      servecal calibrate fit steps.parquet --model llama-3.1-8b --gpu rtx-pro-6000 -o cal.json
      servecal replay run.parquet --calibration cal.json
    """


#: ``traces`` with the replay-aware ``describe --calibration`` (the ``traces`` console script).
traces_cli = traces_main
add_load_to_describe(traces_cli.commands["describe"])

main.add_command(traces_cli, "traces")
main.add_command(calibrate_main, "calibrate")
main.add_command(replay_main, "replay")
main.add_command(demo, "demo")
