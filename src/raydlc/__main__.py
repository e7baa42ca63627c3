"""`python -m raydlc`: the command line, as the kubeconfig's exec plugin runs it when raydlc is not a script."""

from raydlc.cli import run

run()
