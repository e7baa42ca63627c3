"""A command's AWS reads share one budget against AWS that does not answer (`COMMAND_SILENCE_S`):
an endpoint that stayed silent is not asked again in the same command, and no attempt starts that
would cross the budget. Silent endpoints here are TCP listeners on 127.0.0.1 that accept and
never answer, one per service, as a network that drops AWS's replies looks; what is asserted is
which endpoints were asked and how often, not how long it took."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from raydlc.edges import aws


class Silent:
    """Accepts every connection and holds it open without a byte in reply; counts them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.held: list[socket.socket] = []
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


@pytest.fixture
def silent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, Silent]]:
    holes = {svc: Silent() for svc in ("EC2", "EKS", "STS", "CLOUDFORMATION", "SERVICE_QUOTAS")}
    for k in [k for k in __import__("os").environ if k.startswith(("AWS_", "RAYDLC_"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path))
    for k, v in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_CONFIG_FILE": "/nonexistent",
                 "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "2"}.items():
        monkeypatch.setenv(k, v)
    for svc, h in holes.items():
        monkeypatch.setenv(f"AWS_ENDPOINT_URL_{svc}", h.url)
    yield holes
    for h in holes.values():
        h.close()


def test_a_silent_endpoint_is_asked_once_per_command(silent: dict[str, Silent]) -> None:
    sess = aws.session("us-west-2")
    eks = aws.client(sess, "eks")
    with aws.command_budget("status"):
        with pytest.raises(aws.UnreachableError):
            aws.call(eks, "describe_cluster", name="a")
        asked = len(silent["EKS"].held)
        with pytest.raises(aws.UnreachableError, match="did not answer earlier in `raydlc status`; not asked again"):
            aws.call(eks, "describe_cluster", name="b")
    assert 1 <= asked <= 2 and len(silent["EKS"].held) == asked  # the second call never connected
    # A new command asks again.
    with aws.command_budget("status"), pytest.raises(aws.UnreachableError, match=r"cannot reach|no answer from"):
        aws.call(eks, "describe_cluster", name="c")
    assert len(silent["EKS"].held) > asked


def test_no_attempt_starts_that_would_cross_the_commands_budget(silent: dict[str, Silent]) -> None:
    sess = aws.session("us-west-2")
    eks, ec2, cfn = (aws.client(sess, s) for s in ("eks", "ec2", "cloudformation"))
    budget = aws.CALL_BUDGET_S + 1  # one silent call spends it: no other endpoint is asked
    with aws.command_budget("capacity", seconds=budget):
        with pytest.raises(aws.UnreachableError):
            aws.call(eks, "describe_cluster", name="a")
        for cli, method in ((ec2, "describe_availability_zones"), (cfn, "describe_stacks")):
            with pytest.raises(aws.UnreachableError, match=rf"left `raydlc capacity` without an answer for \d+ s of its {budget} s budget"):
                aws.call(cli, method)
    assert (len(silent["EC2"].held), len(silent["CLOUDFORMATION"].held)) == (0, 0)


def test_status_against_silent_endpoints_asks_each_at_most_once(silent: dict[str, Silent]) -> None:
    """The whole use case: before, `status` chained ~7 calls of ~16 s each against a silent EKS endpoint."""
    import raydlc.api as api

    with pytest.raises(aws.UnreachableError):
        api.status()
    assert sum(len(h.held) for h in silent.values()) <= 2 * aws.DEFAULT_MAX_ATTEMPTS
    assert len(silent["EKS"].held) <= 2
