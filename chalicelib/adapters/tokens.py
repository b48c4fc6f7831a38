"""Bearer tokens, kept only as SHA-256 hashes.

The local stack reads ``[{"token": "t1", "tenant": "acme"}, {"token": "a1",
"agent": "node-1"}, {"token": "o1", "operator": "ops"}]`` from GPUJOBS_TOKENS_FILE and forgets the plain tokens
as soon as they are hashed.
"""
from __future__ import annotations

import hashlib
import json
import re

from ..domain.principal import Principal

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class TokenStore:
    def __init__(self, hashes: dict[str, Principal]) -> None:
        self._by_hash = dict(hashes)

    @classmethod
    def from_entries(cls, entries: list[dict]) -> "TokenStore":
        hashes = {}
        for e in entries:
            if "tenant" in e:
                p = Principal("tenant", str(e["tenant"]))
            elif "agent" in e:
                p = Principal("agent", str(e["agent"]))
            elif "operator" in e:
                p = Principal("operator", str(e["operator"]))
            else:
                raise ValueError("each token entry names a tenant, an agent or an operator")
            hashes[token_hash(str(e["token"]))] = p
        return cls(hashes)

    @classmethod
    def from_hashes_json(cls, text: str) -> "TokenStore":
        """``{"<sha256 hex of a token>": {"tenant": name} | {"agent": node or "*"} |
        {"operator": name}}``,
        the form kept in SSM on AWS: no plain token anywhere."""
        hashes = {}
        for digest, who in json.loads(text).items():
            if not _SHA256.match(digest) or not isinstance(who, dict) or len(who) != 1:
                raise ValueError("token hashes map 64 hex digits to {tenant: ...}, "
                                 "{agent: ...} or {operator: ...}")
            [(kind, name)] = who.items()
            if kind not in ("tenant", "agent", "operator"):
                raise ValueError(f"unknown principal kind {kind!r}")
            hashes[digest] = Principal(kind, str(name))
        return cls(hashes)

    @classmethod
    def from_file(cls, path: str) -> "TokenStore":
        with open(path, encoding="utf-8") as f:
            return cls.from_entries(json.load(f))

    def lookup(self, token: str) -> Principal | None:
        # a dict lookup on the hash: the plain token is never compared
        return self._by_hash.get(token_hash(token))
