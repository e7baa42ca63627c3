"""Storage and identity against the doubles and moto: the add-on settings eksctl checks, the bucket, the pod identity."""

from __future__ import annotations

import ast
import json

import eksctl as eksctl_double  # tests/doubles, on sys.path through conftest
import pytest

from raydlc.config import load_config
from raydlc.errors import InputError
from raydlc.render.eksctl import render_eksctl


def test_rendered_addons_pass_eksctls_addon_validation(tmp_path) -> None:
    cfg = load_config(env={}, cwd=tmp_path)
    cc = render_eksctl(cfg, ["us-east-2a", "us-east-2b"])
    for addon in cc["addons"]:
        eksctl_double.check_addon(addon)  # raises SystemExit as eksctl exits, when it would refuse
    vpc_cni = next(a for a in cc["addons"] if a["name"] == "vpc-cni")
    assert json.loads(vpc_cni["configurationValues"])["enableNetworkPolicy"] == "true"


def test_eksctl_double_refuses_configuration_values_that_are_neither_json_nor_yaml(capsys) -> None:
    with pytest.raises(SystemExit):
        eksctl_double.check_addon({"name": "vpc-cni", "configurationValues": "{enableNetworkPolicy: [true"})
    assert 'invalid configuration for "vpc-cni" addon' in capsys.readouterr().err


# ---------------------------------------------------------------------- the bucket against moto

BUCKET = "raydlc-123456789012-us-east-2-eks-cluster"  # moto's account, the default region and cluster


def bucket_facts(s3, name: str) -> dict:
    """The bucket's settings as S3 answers them (moto over HTTP)."""
    return {
        "block": s3.get_public_access_block(Bucket=name)["PublicAccessBlockConfiguration"],
        "sse": [r["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"]
                for r in s3.get_bucket_encryption(Bucket=name)["ServerSideEncryptionConfiguration"]["Rules"]],
        "tags": {t["Key"]: t["Value"] for t in s3.get_bucket_tagging(Bucket=name)["TagSet"]},
        "rules": s3.get_bucket_lifecycle_configuration(Bucket=name)["Rules"],
        "versioning": s3.get_bucket_versioning(Bucket=name).get("Status"),
        "region": s3.get_bucket_location(Bucket=name)["LocationConstraint"],
    }


def buckets(world) -> list[str]:
    return [b["Name"] for b in world.client("s3").list_buckets()["Buckets"]]


@pytest.mark.slow
def test_up_makes_a_private_encrypted_tagged_bucket_and_a_second_up_changes_nothing(world) -> None:
    from raydlc import lifecycle

    run = lifecycle.up(world.config(), only="storage")
    assert run.ok, [r.reason for r in run.results]
    (step,) = run.results
    assert (step.step, step.action) == ("storage", "create")
    assert f"runs go to s3://{BUCKET}/runs" in step.reason
    facts = bucket_facts(world.client("s3"), BUCKET)
    assert facts["block"] == {"BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True,
                              "RestrictPublicBuckets": True}
    assert facts["sse"] == ["AES256"] and facts["versioning"] is None and facts["region"] == "us-east-2"
    assert facts["tags"]["raydlc.io/cluster"] == "eks-cluster"
    (rule,) = facts["rules"]
    assert rule["Status"] == "Enabled" and rule["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"] == 7
    again = lifecycle.up(world.config(), only="storage")
    assert [(r.action, r.outcome) for r in again.results] == [("none", "done")]


@pytest.mark.slow
def test_up_puts_the_code_zip_the_rayjob_names_once_and_reports_it_apart_from_the_runs(world) -> None:
    from raydlc import lifecycle
    from raydlc.render import codezip
    from raydlc.render.bucket import for_cluster
    from raydlc.render.raycluster import render_rayjob

    s3 = world.client("s3")
    code = codezip.build()
    run = lifecycle.up(world.config(), only="storage")
    assert run.ok and f"s3:PutObject s3://{BUCKET}/{code.key}" in run.results[0].commands, run.results
    named = render_rayjob(for_cluster(world.config(), lambda: "123456789012"), code.uri(BUCKET))["spec"]["runtimeEnvYAML"]
    assert json.loads(named)["py_modules"] == [f"s3://{BUCKET}/{code.key}"]
    assert s3.get_object(Bucket=BUCKET, Key=code.key)["Body"].read() == code.data  # what `kubectl apply` of the RayJob fetches
    first = s3.head_object(Bucket=BUCKET, Key=code.key)["LastModified"]
    s3.delete_bucket_encryption(Bucket=BUCKET)  # drift unrelated to the zip: repaired without uploading it again
    again = lifecycle.up(world.config(), only="storage")
    assert [(r.action, r.outcome) for r in again.results] == [("repair", "done")]
    assert not [c for c in again.results[0].commands if "PutObject" in c]
    assert s3.head_object(Bucket=BUCKET, Key=code.key)["LastModified"] == first
    status = lifecycle.status(world.config()).to_dict()["storage"]
    assert (status["objects"], status["size_bytes"], status["code_zips"], status["code_size_bytes"]) == (0, 0, 1, len(code.data))
    s3.delete_object(Bucket=BUCKET, Key=code.key)  # gone (deleted by hand): status says so, and up puts it back
    row = next(s for s in lifecycle.status(world.config()).to_dict()["steps"] if s["step"] == "storage")
    assert row["state"] == "degraded" and f"raydlc's code zip {code.key}" in row["reason"]
    assert lifecycle.up(world.config(), only="storage").ok and s3.get_object(Bucket=BUCKET, Key=code.key)["Body"].read() == code.data


@pytest.mark.slow
def test_render_uploads_the_code_zip_once_the_bucket_exists_and_never_fails_for_want_of_it(world, capsys) -> None:
    from raydlc import lifecycle
    from raydlc.cli import main
    from raydlc.render import codezip

    code, s3 = codezip.build(), world.client("s3")
    uri = code.uri(BUCKET)
    assert main(["render", "--only", "rayjob"]) == 0
    assert (f"raydlc's code zip {uri} is not uploaded (S3 bucket {BUCKET} does not exist yet, so raydlc's code zip has "
            "nowhere to go): `raydlc up` or `raydlc submit --rayjob` uploads it") in capsys.readouterr().err
    assert buckets(world) == []  # render makes no bucket
    assert lifecycle.up(world.config(), only="storage").ok
    s3.delete_object(Bucket=BUCKET, Key=code.key)
    assert main(["render", "--only", "rayjob", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["code_zip"] == {"uri": uri, "uploaded": True, "present": True, "why": None}
    assert json.loads(doc["files"]["rayjob.yaml"]["spec"]["runtimeEnvYAML"])["py_modules"] == [uri]
    assert s3.get_object(Bucket=BUCKET, Key=code.key)["Body"].read() == code.data
    assert main(["render", "--only", "rayjob"]) == 0
    assert f"raydlc's code zip {uri} is in the bucket already" in capsys.readouterr().err


@pytest.mark.slow
def test_an_owned_tagged_bucket_is_adopted_and_its_missing_settings_repaired(world) -> None:
    from raydlc import lifecycle

    s3 = world.client("s3")
    name = "team-a-checkpoints"
    s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "us-east-2"})
    s3.put_object(Bucket=name, Key="runs/old/checkpoint_000010/model.pt", Body=b"x" * 100)
    s3.put_bucket_tagging(Bucket=name, Tagging={"TagSet": [{"Key": "raydlc.io/cluster", "Value": "eks-cluster"}]})
    run = lifecycle.up(world.config(RAYDLC_STORAGE_BUCKET=name), only="storage")
    assert [(r.action, r.outcome) for r in run.results] == [("repair", "done")], run.results
    assert bucket_facts(s3, name)["sse"] == ["AES256"]
    assert buckets(world) == [name]  # adopted: nothing else made, the object still there
    assert s3.get_object(Bucket=name, Key="runs/old/checkpoint_000010/model.pt")["Body"].read() == b"x" * 100


@pytest.mark.slow
@pytest.mark.parametrize("tags, region, needle", [
    ([], "us-east-2", "is not tagged raydlc.io/cluster=eks-cluster (no such tag)"),
    ([{"Key": "raydlc.io/cluster", "Value": "other"}], "us-east-2", "(tagged for other)"),
    ([{"Key": "raydlc.io/cluster", "Value": "eks-cluster"}], "eu-west-1", "is in eu-west-1, the cluster in us-east-2"),
])
def test_a_bucket_raydlc_may_not_adopt_is_refused_and_left_as_it_was(world, tags, region, needle) -> None:
    from raydlc import lifecycle
    from raydlc.edges import aws

    s3 = world.client("s3")
    name = "someone-elses-bucket"
    maker = aws.client(aws.session(region), "s3")  # S3 takes a bucket's location only at its region's endpoint
    maker.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": region})
    if tags:
        s3.put_bucket_tagging(Bucket=name, Tagging={"TagSet": tags})
    run = lifecycle.up(world.config(RAYDLC_STORAGE_BUCKET=name), only="storage")
    (step,) = run.results
    assert step.outcome == "failed" and needle in step.reason
    assert isinstance(step.error, InputError) and step.error.hint
    assert s3.list_objects_v2(Bucket=name).get("KeyCount") == 0
    with pytest.raises(s3.exceptions.ClientError):
        s3.get_bucket_encryption(Bucket=name)  # nothing was applied to it


@pytest.mark.slow
def test_down_keeps_the_bucket_and_says_so_and_delete_storage_empties_and_removes_it(world) -> None:
    from raydlc import lifecycle
    from raydlc.render import codezip

    assert lifecycle.up(world.config(), only="storage").ok
    s3 = world.client("s3")
    s3.put_object(Bucket=BUCKET, Key="runs/r1/checkpoint_000002/a.bin", Body=b"a" * 2048)
    s3.put_object(Bucket=BUCKET, Key="runs/r1/checkpoint_000010/a.bin", Body=b"b" * 2048)
    s3.create_multipart_upload(Bucket=BUCKET, Key="runs/r1/checkpoint_000012/big.bin")
    status = lifecycle.status(world.config()).to_dict()
    code = codezip.build()
    assert status["storage"] == {"bucket": BUCKET, "uri": f"s3://{BUCKET}/runs", "objects": 2, "size_bytes": 4096,
                                 "newest_checkpoints": {"r1": f"s3://{BUCKET}/runs/r1/checkpoint_000010"},
                                 "code_zips": 1, "code_size_bytes": len(code.data)}
    kept = lifecycle.down(world.config())
    assert kept.ok, [r.reason for r in kept.results]
    doc = kept.to_dict()
    assert doc["kept"] == [f"S3 bucket {BUCKET} (2 objects, 4.0 KiB, plus 1 code zip)"]
    assert not any(BUCKET in a for a in doc["absent"]) and BUCKET in buckets(world)
    gone = lifecycle.down(world.config(), delete_storage=True)
    assert gone.ok, [r.reason for r in gone.results]
    assert f"S3 bucket {BUCKET}" in gone.to_dict()["removed"] and BUCKET not in buckets(world)


@pytest.mark.slow
def test_up_gives_the_ray_pods_a_pod_identity_and_down_leaves_the_bucket_and_nothing_else(world) -> None:
    """eksctl (the double, as pkg/actions/podidentityassociation does) makes the role stack, the role with the
    rendered policy and the service account; down removes all of it but the bucket."""
    from raydlc import lifecycle
    from raydlc.lifecycle import Timings
    from raydlc.render.bucket import Bucket, pod_policy, role_name, worker_role_name

    slow = Timings(poll_s=0.1, cluster_s=240, nodegroup_s=240, stack_s=240, helm_s=60, nodes_s=30, plugins_s=60, pods_s=90)
    cfg = world.config()
    for part in ({"until": "cluster"}, {"only": "storage"}):
        run = lifecycle.up(cfg, timings=slow, **part)
        assert run.ok, [(r.step, r.reason) for r in run.failed]
    stacks = [s["StackName"] for s in world.client("cloudformation").list_stacks()["StackSummaries"]
              if s["StackStatus"] == "CREATE_COMPLETE"]
    assert "eksctl-eks-cluster-podidentityrole-ray-train-raydlc-ray" in stacks
    iam = world.client("iam")
    role = role_name(cfg)
    trust = iam.get_role(RoleName=role)["Role"]["AssumeRolePolicyDocument"]
    assert trust["Statement"][0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    (policy,) = iam.list_role_policies(RoleName=role)["PolicyNames"]
    doc = iam.get_role_policy(RoleName=role, PolicyName=policy)["PolicyDocument"]
    # moto 5.2's CloudFormation keeps an inline policy given as a mapping as its Python repr (real IAM answers
    # JSON, which botocore decodes); given as JSON text, moto takes ~20 s per stack. So the repr is read back here.
    doc = ast.literal_eval(doc) if isinstance(doc, str) else doc
    assert doc == pod_policy(Bucket(BUCKET, "runs"))
    for account in ("raydlc-ray", "raydlc-ray-worker"):  # the head's and the workers' service accounts
        sa = world.kube.snapshot().get(f"/v1/serviceaccounts/ray-train/{account}")
        assert sa is not None, sorted(k for k in world.kube.snapshot() if "serviceaccount" in k)
    assert "eksctl-eks-cluster-podidentityrole-ray-train-raydlc-ray-worker" in stacks
    worker_doc = iam.get_role_policy(RoleName=worker_role_name(cfg), PolicyName=policy)["PolicyDocument"]
    assert (ast.literal_eval(worker_doc) if isinstance(worker_doc, str) else worker_doc) == pod_policy(Bucket(BUCKET, "runs"))
    down = lifecycle.down(cfg, timings=slow)
    assert down.ok, [(r.step, r.reason) for r in down.failed]
    assert world.tagged("eks-cluster") == {} and buckets(world) == [BUCKET]
    assert not any(s["StackName"].endswith("podidentityrole-ray-train-raydlc-ray")
                   for s in world.client("cloudformation").list_stacks()["StackSummaries"]
                   if s["StackStatus"] != "DELETE_COMPLETE")


def test_eksctl_double_refuses_pod_identities_without_the_agent_addon(tmp_path, capsys) -> None:
    cfg = load_config(env={}, overrides={"STORAGE_BUCKET": "raydlc-test-runs"}, cwd=tmp_path)
    cc = render_eksctl(cfg, ["us-east-2a", "us-east-2b"])
    eksctl_double.check_pod_identities(cc)  # as rendered: accepted
    cc["addons"] = [a for a in cc["addons"] if a["name"] != "eks-pod-identity-agent"]
    with pytest.raises(SystemExit):
        eksctl_double.check_pod_identities(cc)
    assert '"eks-pod-identity-agent" addon must be installed' in capsys.readouterr().err
