"""Authentication and authorisation of bearer tokens."""
from __future__ import annotations

from typing import Protocol

from ..domain.errors import Forbidden, Unauthenticated
from ..domain.principal import Principal

# the detail of each 401 (the status and code are the same: API.md)
MISSING = "an 'Authorization: Bearer <token>' header is required"
NOT_BEARER = "the Authorization header must be 'Bearer <token>'"
UNKNOWN = "the bearer token is not recognised"


class TokenLookup(Protocol):
    def lookup(self, token: str) -> Principal | None: ...


class Authenticator:
    def __init__(self, tokens: TokenLookup) -> None:
        self._tokens = tokens

    def authenticate(self, authorization: str | None) -> Principal:
        """The token's principal; else ``401 unauthenticated``, whose detail
        says which of the three it was: no header, a header that is not
        ``Bearer <token>``, or a token this API does not know."""
        header = (authorization or "").strip()
        if not header:
            raise Unauthenticated(MISSING, field="Authorization")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated(NOT_BEARER, field="Authorization")
        principal = self._tokens.lookup(token)
        if principal is None:
            raise Unauthenticated(UNKNOWN, field="Authorization")
        return principal

    def tenant(self, authorization: str | None) -> Principal:
        principal = self.authenticate(authorization)
        if not principal.is_tenant:
            raise Forbidden("this endpoint takes a tenant token", field="Authorization")
        return principal

    def operator(self, authorization: str | None) -> Principal:
        principal = self.authenticate(authorization)
        if not principal.is_operator:
            raise Forbidden("this endpoint takes an operator token", field="Authorization")
        return principal

    def agent(self, authorization: str | None) -> Principal:
        principal = self.authenticate(authorization)
        if principal.kind != "agent":
            raise Forbidden("this endpoint takes an agent token", field="Authorization")
        return principal
