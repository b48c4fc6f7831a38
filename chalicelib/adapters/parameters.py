"""Secrets kept in SSM Parameter Store: the page-token key and the token hashes.

Only the composition root (bootstrap.py) reads them, while it builds the
services: once per process, on the first request (never at import), so a
Lambda container reads each parameter once. Nothing is made until a first read:
the SSM client comes from the container's one session (adapters/aws.py).
"""
from __future__ import annotations

from . import aws


class SsmParameters:
    def __init__(self, region: str, endpoint_url: str | None) -> None:
        self._aws = aws.session_for(region, endpoint_url)

    def get(self, name: str) -> str:
        """The value of the (SecureString) parameter ``name``, decrypted."""
        answer = self._aws.client("ssm").get_parameter(Name=name, WithDecryption=True)
        return answer["Parameter"]["Value"]
