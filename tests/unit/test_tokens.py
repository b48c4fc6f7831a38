"""Tokens are kept only as hashes (API.md, authentication)."""
from chalicelib.adapters.tokens import TokenStore, token_hash


def test_the_store_keeps_hashes_never_the_tokens():
    store = TokenStore.from_entries([{"token": "t-secret", "tenant": "acme"},
                                     {"token": "a-secret", "agent": "*"}])
    kept = repr(vars(store))
    assert "t-secret" not in kept and "a-secret" not in kept
    assert token_hash("t-secret") in kept
    assert store.lookup("t-secret").name == "acme"
    assert store.lookup("nope") is None
