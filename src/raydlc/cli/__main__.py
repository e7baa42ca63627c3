"""`python -m raydlc.cli`: the command line, as `raydlc` runs it."""

from raydlc.cli.app import run

run()
