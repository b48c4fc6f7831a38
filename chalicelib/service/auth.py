"""Authentication and authorisation of bearer tokens."""
from __future__ import annotations

from typing import Protocol

from ..domain.errors import Forbidden, Unauthenticated
from ..domain.principal import Principal


class TokenLookup(Protocol):
    def lookup(self, token: str) -> Principal | None: ...


class Authenticator:
    def __init__(self, tokens: TokenLookup) -> None:
        self._tokens = tokens

    def authenticate(self, authorization: str | None) -> Principal:
        scheme, _, token = (authorization or "").strip().partition(" ")
        principal = self._tokens.lookup(token.strip()) if scheme.lower() == "bearer" else None
        if principal is None:
            raise Unauthenticated("a valid 'Authorization: Bearer <token>' header is required",
                                  field="Authorization")
        return principal

    def tenant(self, authorization: str | None) -> Principal:
        principal = self.authenticate(authorization)
        if not principal.is_tenant:
            raise Forbidden("this endpoint takes a tenant token", field="Authorization")
        return principal

    def agent(self, authorization: str | None) -> Principal:
        principal = self.authenticate(authorization)
        if principal.kind != "agent":
            raise Forbidden("this endpoint takes an agent token", field="Authorization")
        return principal
