"""Storage and identity against the doubles and moto: the add-on settings eksctl checks, the bucket, the pod identity."""

from __future__ import annotations

import json

import eksctl as eksctl_double  # tests/doubles, on sys.path through conftest
import pytest

from raydlc.config import load_config
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
