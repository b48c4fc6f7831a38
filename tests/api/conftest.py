import boto3
import pytest


@pytest.fixture
def iso(make_services, fresh_env):
    """Services on a stack of their own: placement reads whole tables."""
    return make_services(fresh_env)


@pytest.fixture
def iso_client(iso):
    from chalice.test import Client

    import app

    with Client(app.app) as c:
        yield c


@pytest.fixture
def sqs(aws_env):
    return boto3.client("sqs", endpoint_url=aws_env["GPUJOBS_AWS_ENDPOINT_URL"],
                        region_name="us-east-1")
