"""On AWS the page-token key and the token hashes come from SSM, never the repo."""
import json

import boto3
import pytest

from chalicelib import bootstrap
from chalicelib.adapters.tokens import TokenStore, token_hash
from chalicelib.config import Config, ConfigError, ssm_parameter


@pytest.fixture
def ssm_env(aws_env):
    ssm = boto3.client("ssm", endpoint_url=aws_env["GPUJOBS_AWS_ENDPOINT_URL"],
                       region_name="us-east-1")
    ssm.put_parameter(Name="/gpujobs/test/page-token-key", Value="from-ssm",
                      Type="SecureString", Overwrite=True)
    hashes = {token_hash("agent-secret"): {"agent": "node-9"},
              token_hash("tenant-secret"): {"tenant": "acme"}}
    ssm.put_parameter(Name="/gpujobs/test/token-hashes", Value=json.dumps(hashes),
                      Type="SecureString", Overwrite=True)
    ssm_parameter.cache_clear()
    env = {k: v for k, v in aws_env.items() if k != "GPUJOBS_PAGE_TOKEN_KEY"}
    env.update(GPUJOBS_PAGE_TOKEN_KEY_PARAM="/gpujobs/test/page-token-key",
               GPUJOBS_TOKEN_HASHES_PARAM="/gpujobs/test/token-hashes")
    yield env
    ssm_parameter.cache_clear()


def test_the_page_token_key_is_read_from_ssm(ssm_env):
    assert Config.from_env(ssm_env).page_token_key == b"from-ssm"


def test_the_token_hashes_are_read_from_ssm(ssm_env):
    s = bootstrap.build(Config.from_env(ssm_env))
    assert s.auth.authenticate("Bearer tenant-secret").name == "acme"
    assert s.auth.authenticate("Bearer agent-secret").may_act_for_node("node-9")


def test_without_any_page_token_key_the_configuration_is_refused(aws_env):
    env = {k: v for k, v in aws_env.items() if k != "GPUJOBS_PAGE_TOKEN_KEY"}
    with pytest.raises(ConfigError):
        Config.from_env(env)


@pytest.mark.parametrize("text", ['{"abc": {"tenant": "x"}}', '{"%s": {"root": "x"}}' % ("0" * 64),
                                  '{"%s": "acme"}' % ("0" * 64)])
def test_malformed_token_hashes_are_refused(text):
    with pytest.raises(ValueError):
        TokenStore.from_hashes_json(text)
