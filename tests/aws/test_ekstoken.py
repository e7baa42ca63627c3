"""EKS tokens from botocore's presigner, replayed to moto's STS as the EKS authenticator does."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from raydlc.edges import aws, eks_token
from raydlc.errors import CredentialsError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doubles"))
from servers import refusing_sts


def url_of(token: str) -> str:
    assert token.startswith("k8s-aws-v1.") and "=" not in token
    body = token[len("k8s-aws-v1."):]
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()


def test_the_token_is_a_presigned_get_caller_identity_with_the_cluster_header_signed(aws_env: str) -> None:
    url = url_of(eks_token.mint(aws.session("eu-central-1"), "my-cluster"))
    q = parse_qs(urlsplit(url).query)
    assert q["Action"] == ["GetCallerIdentity"] and q["Version"] == ["2011-06-15"]
    assert q["X-Amz-Expires"] == ["60"] and q["X-Amz-SignedHeaders"] == ["host;x-k8s-aws-id"]
    assert q["X-Amz-Credential"][0].startswith("testing/") and "/eu-central-1/sts/aws4_request" in q["X-Amz-Credential"][0]
    assert url.startswith(aws_env)  # AWS_ENDPOINT_URL applies, as it does to every client


def test_sts_accepts_the_token_replayed_with_its_header(aws_env: str) -> None:
    assert eks_token.check(aws.session("eu-central-1"), "my-cluster").startswith("arn:aws:sts::123456789012:")


def test_a_token_sts_refuses_is_a_credentials_error_that_never_shows_the_token(aws_env: str, monkeypatch) -> None:
    with refusing_sts() as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL_STS", url)
        with pytest.raises(CredentialsError) as e:
            eks_token.check(aws.session("eu-central-1"), "my-cluster")
    assert "InvalidClientTokenId" in e.value.message and url in e.value.message
    assert "k8s-aws-v1." not in e.value.message and "X-Amz-Signature" not in e.value.message
    assert e.value.exit_code == 2 and e.value.hint == "aws sts get-caller-identity"


def test_an_sts_that_cannot_be_reached_is_named(aws_env: str, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:9")
    with pytest.raises(aws.UnreachableError, match=r"cannot reach STS at http://127.0.0.1:9"):
        eks_token.check(aws.session("eu-central-1"), "my-cluster")


@pytest.mark.parametrize(("info", "want"), [
    ("", "client.authentication.k8s.io/v1beta1"),
    ('{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential"}', "client.authentication.k8s.io/v1"),
    ('{"apiVersion": "client.authentication.k8s.io/v1alpha1"}', "client.authentication.k8s.io/v1beta1"),
    ("not json", "client.authentication.k8s.io/v1beta1"),
])
def test_the_exec_credential_answers_in_the_version_the_client_asked_for(info: str, want: str) -> None:
    assert eks_token.exec_api_version({"KUBERNETES_EXEC_INFO": info}) == want


def test_eks_token_prints_only_the_exec_credential_and_loads_no_heavy_module(aws_env: str) -> None:
    code = ("import sys; from raydlc.cli import main; rc = main(['eks-token', '--cluster', 'c1', '--region', 'eu-central-1']);"
            "heavy = sorted(m for m in ('torch', 'ray', 'kubernetes', 'transformers') if m in sys.modules);"
            "sys.stderr.write(repr(heavy)); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == "[]", r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert (doc["kind"], doc["apiVersion"], doc["spec"]) == ("ExecCredential", "client.authentication.k8s.io/v1beta1", {})
    assert url_of(doc["status"]["token"]).startswith(aws_env)
    assert doc["status"]["expirationTimestamp"].endswith("Z")
    assert r.stdout.count("\n") == 1


FAST = ("import runpy, sys; sys.argv = ['raydlc', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('raydlc', run_name='__main__')\nexcept SystemExit as e:\n    rc = e.code\n"
        "sys.stderr.write(repr(sorted(m for m in ('raydlc.cli', 'typer', 'rich', 'raydlc.config') if m in sys.modules)))\n"
        "sys.exit(rc)")


@pytest.mark.parametrize(("args", "cli"), [
    (["eks-token", "--cluster", "c1", "--region", "eu-central-1"], []),  # the kubeconfig's form: the fast path
    (["eks-token", "--region", "eu-central-1", "--cluster", "c1"], ["raydlc.cli", "raydlc.config", "rich", "typer"]),
])
def test_python_m_raydlc_mints_the_kubeconfigs_form_without_the_cli_and_leaves_any_other_to_it(
        aws_env: str, args: list[str], cli: list[str]) -> None:
    r = subprocess.run([sys.executable, "-c", FAST, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == repr(cli), r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert (doc["kind"], doc["apiVersion"]) == ("ExecCredential", "client.authentication.k8s.io/v1beta1")
    assert url_of(doc["status"]["token"]).startswith(aws_env)


def test_eks_token_without_credentials_is_one_error_line(aws_env: str, monkeypatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    r = subprocess.run([sys.executable, "-m", "raydlc", "eks-token", "--cluster", "c1", "--region", "eu-central-1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.startswith("error: no AWS credentials found")
