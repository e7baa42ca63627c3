"""A job that did not succeed is one line: the program's own `error:` line (exit 2 when it was the
user's input), or Ray's first line and the log's last, never the whole log again."""

from __future__ import annotations

from raydlc.edges.ray_dashboard import Job
from raydlc.errors import InputError, TrainError
from raydlc.jobs.control import failure

LOG = "\n".join(f"line {i}" for i in range(500))


def job(message: str, code: int | None) -> Job:
    return Job("j1", "02000000", "FAILED", "python -m raydlc.train", message, 1.0, 2.0, {}, code, {})


def test_the_programs_own_error_line_and_exit_code_are_kept() -> None:
    msg = ("Job entrypoint command failed with exit code 2, last available logs (truncated to 20,000 chars):\n" + LOG +
           "\nerror: --data ./nope.jsonl: no such file or directory\n  hint: pass a .txt/.jsonl file or a directory of them\n")
    e = failure(job(msg, 2), hint="raydlc job logs j1 --local")
    assert isinstance(e, InputError) and e.exit_code == 2
    assert e.message == "job j1 FAILED: --data ./nope.jsonl: no such file or directory"
    assert e.hint == "pass a .txt/.jsonl file or a directory of them"


def test_another_failure_is_ray_s_first_line_and_the_logs_last() -> None:
    msg = "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n" + LOG + "\nZeroDivisionError: division by zero\n"
    e = failure(job(msg, 1), hint="raydlc job logs j1 --local")
    assert type(e) is TrainError and e.exit_code == 1 and "line 250" not in e.message
    assert e.message.startswith("job j1 FAILED: Job entrypoint command failed with exit code 1") and e.message.endswith("... ZeroDivisionError: division by zero")
    assert e.hint == "raydlc job logs j1 --local" and len(e.message.splitlines()) == 1
    assert failure(job("", None), hint="h").message == "job j1 FAILED"
