"""How far LoRA lowers the loss on a laptop, and what it depends on: the base it adapts.

    PYTHONPATH=src python benchmarks/lora_fall.py [--steps 300] [--out DIR]

Five local runs of `raydlc train --json` (2 CPU workers, the local defaults), one JSON line each:
  1. full fine-tuning of the random-init `tiny` on the bundled corpus (the default local run);
  2. LoRA rank 8 on the same random `tiny` (`raydlc train --lora-rank 8`): its embedding, head and
     norms stay random, which is what holds the loss up;
  3. full fine-tuning of `tiny` on other text: the standard library's code with its docstrings removed;
  4. LoRA rank 8 on run 3's export, on the bundled corpus (docstrings): a pretrained base meeting a
     new domain, as LoRA is used;
  5. full fine-tuning of run 3's export on the same docstrings: what run 4's adapters are measured against.
Each line: first and final training loss, the fall, the eval loss, the checkpoint's bytes and, for
LoRA, its share of run 1's checkpoint. About 2.5 minutes a run on two cores.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any


def stdlib_code(max_chars: int = 2_000_000) -> str:
    """The standard library's top-level modules as code, their docstrings removed (ast.unparse drops comments)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    total = 0
    for path in sorted(root.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node) is not None:
                node.body = node.body[1:] or [ast.Pass()]
        parts.append(ast.unparse(tree))
        total += len(parts[-1])
        if total >= max_chars:
            break
    return "\n\n".join(parts)


def train(out: Path, name: str, *args: str) -> dict[str, Any]:
    """One `raydlc train --json` run under `out`; its result."""
    cmd = [sys.executable, "-m", "raydlc", "train", "--json", "--out", str(out), "--run-name", name, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def size(d: str) -> int:
    return sum(p.stat().st_size for p in Path(d).rglob("*") if p.is_file())


def line(name: str, r: dict[str, Any], full_bytes: int | None = None) -> dict[str, Any]:
    b = size(r["checkpoint"])
    row = {"run": name, "first_loss": round(r["first_loss"], 3), "final_loss": round(r["final_loss"], 3),
           "fall": round(r["loss_drop"], 3), "eval_loss": round(r["eval_loss"], 3), "checkpoint_bytes": b}
    return row | ({"share_of_full": round(b / full_bytes, 4)} if full_bytes else {})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", type=Path, default=Path("raydlc-out/lora-fall"))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    steps = ["--steps", str(a.steps)]
    full = train(a.out, "full", *steps)
    full_bytes = size(full["checkpoint"])
    print(json.dumps(line("full, random tiny", full)), flush=True)
    print(json.dumps(line("LoRA r8, random tiny", train(a.out, "lora", *steps, "--lora-rank", "8"), full_bytes)), flush=True)
    code = a.out / "stdlib-code.txt"
    code.write_text(stdlib_code())
    base = train(a.out, "code-base", *steps, "--data", str(code))
    print(json.dumps(line("full, tiny on stdlib code", base)), flush=True)
    adapted = train(a.out, "code-lora", *steps, "--model", base["export"], "--lora-rank", "8")
    print(json.dumps(line("LoRA r8 on the code base, docstrings", adapted, full_bytes)), flush=True)
    print(json.dumps(line("full, the code base on docstrings", train(a.out, "code-full", *steps, "--model", base["export"]))), flush=True)


if __name__ == "__main__":
    main()
