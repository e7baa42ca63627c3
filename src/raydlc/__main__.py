"""`raydlc` and `python -m raydlc`: the command line's entry (the console script is `run`).

kubectl runs the plugin (`eks-token --cluster C --region R`, the exact form `lifecycle.kubeconfig` writes)
before every request it makes, so that one call skips the CLI's import (typer, rich, the config schema:
about 0.55 s of each call's 1.55 s, measured) and goes straight to the token; any other form, a typo included, is the
CLI's to parse and refuse.
"""

import sys


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[0] == "eks-token" and argv[1] == "--cluster" and argv[3] == "--region":
        from raydlc.edges.eks_token import plugin

        return plugin(argv[2], argv[4])
    from raydlc.cli import main as cli

    return cli(argv)


def run() -> None:
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    run()
