"""On AWS the page-token key and the token hashes come from SSM, never the repo."""
import json

import boto3
import pytest

from chalicelib import bootstrap
from chalicelib.adapters import aws
from chalicelib.adapters.parameters import SsmParameters
from chalicelib.adapters.tokens import TokenStore, token_hash
from chalicelib.config import Config, ConfigError


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
    env = {k: v for k, v in aws_env.items() if k != "GPUJOBS_PAGE_TOKEN_KEY"}
    env.update(GPUJOBS_PAGE_TOKEN_KEY_PARAM="/gpujobs/test/page-token-key",
               GPUJOBS_TOKEN_HASHES_PARAM="/gpujobs/test/token-hashes")
    return env


def test_the_page_token_key_is_read_from_ssm(ssm_env):
    assert bootstrap.build(Config.from_env(ssm_env)).config.page_token_key == b"from-ssm"


def test_the_configuration_names_the_parameters_and_reads_none(ssm_env):
    """Config is the environment only: an endpoint that answers nothing is
    never called while it is read."""
    config = Config.from_env({**ssm_env, "GPUJOBS_AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    assert (config.page_token_key, config.page_token_key_param, config.token_hashes_param) \
        == (b"", "/gpujobs/test/page-token-key", "/gpujobs/test/token-hashes")


def test_a_key_in_the_environment_wins_over_its_parameter(ssm_env):
    config = Config.from_env({**ssm_env, "GPUJOBS_PAGE_TOKEN_KEY": "local"})
    assert (config.page_token_key, config.page_token_key_param) == (b"local", None)
    assert bootstrap.build(config).config.page_token_key == b"local"


def test_building_the_services_reads_each_parameter_once(ssm_env):
    config = Config.from_env(ssm_env)
    reads: list[str] = []

    def read(params, **_):
        reads.append(params["Name"])

    event = "provide-client-params.ssm.GetParameter"
    ssm = aws.session_for(config.region, config.endpoint_url).client("ssm")
    ssm.meta.events.register(event, read)
    try:
        bootstrap.build(config)
    finally:
        ssm.meta.events.unregister(event, read)
    assert sorted(reads) == ["/gpujobs/test/page-token-key", "/gpujobs/test/token-hashes"]


def test_the_parameter_adapter_reads_a_secure_string_decrypted(ssm_env):
    parameters = SsmParameters("us-east-1", ssm_env["GPUJOBS_AWS_ENDPOINT_URL"])
    assert parameters.get("/gpujobs/test/page-token-key") == "from-ssm"
    boto3.client("ssm", endpoint_url=ssm_env["GPUJOBS_AWS_ENDPOINT_URL"],
                 region_name="us-east-1").put_parameter(
        Name="/gpujobs/test/page-token-key", Value="rotated", Type="SecureString",
        Overwrite=True)
    assert parameters.get("/gpujobs/test/page-token-key") == "rotated"


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
