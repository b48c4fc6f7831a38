"""RestApp answers every proxy event as Chalice does, in one pass: the same
responses for the same events, middleware in the same order, and Chalice's
own path where the API has binary types."""
from __future__ import annotations

import base64

import pytest
from chalice import BadRequestError, Chalice, Response

from chalicelib.api.rest import RestApp


def _event(method: str, resource: str, path_params=None, body=None, headers=None):
    return {
        "multiValueQueryStringParameters": None, "headers": headers or {},
        "pathParameters": path_params, "body": body, "isBase64Encoded": False,
        "stageVariables": None,
        "requestContext": {"httpMethod": method, "resourcePath": resource},
    }


def _app(cls, calls: list[str], *, binary: bool = False):
    app = cls(app_name="t")
    app.api.binary_types = ["application/octet-stream"] if binary else []

    @app.middleware("all")
    def outer(event, get_response):
        calls.append(f"outer {app.current_request.method}")
        response = get_response(event)
        response.headers["X-Outer"] = "1"
        return response

    @app.middleware("http")
    def inner(event, get_response):
        calls.append("inner")
        if event.headers.get("x-fail") == "middleware":
            raise RuntimeError("a middleware bug")
        return get_response(event)

    @app.route("/items/{item}", methods=["GET"])
    def get_item(item):
        if item == "bad":
            raise BadRequestError("bad item")
        if item == "bug":
            raise RuntimeError("a view bug")
        return {"item": item, "ctx": app.lambda_context}

    @app.route("/items", methods=["POST"])
    def post_item():
        return Response(body=app.current_request.raw_body.decode(), status_code=201,
                        headers={"Content-Type": "text/plain"})

    @app.route("/blob", methods=["GET"])
    def blob():
        return Response(body=b"\x00\x01", headers={"Content-Type": "application/octet-stream"})

    return app


EVENTS = [
    _event("GET", "/items/{item}", {"item": "a"}),
    _event("GET", "/items/{item}", {"item": "bad"}),
    _event("GET", "/items/{item}", {"item": "bug"}),
    _event("DELETE", "/items/{item}", {"item": "a"}),  # 405 with Allow
    _event("POST", "/items", body="hello", headers={"Content-Type": "application/json"}),
    _event("POST", "/items", body="hello", headers={"Content-Type": "text/csv"}),  # 415
    _event("GET", "/items/{item}", {"item": "a"}, headers={"X-Fail": "middleware"}),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: f"{e['requestContext']['httpMethod']} "
                         f"{e['pathParameters'] or ''} {e['headers']}")
def test_each_event_gets_the_answer_chalice_gives(event):
    chalice_calls, rest_calls = [], []
    expected = _app(Chalice, chalice_calls)(dict(event), "context")
    assert _app(RestApp, rest_calls)(dict(event), "context") == expected
    assert rest_calls == chalice_calls == ["outer " + event["requestContext"]["httpMethod"],
                                           "inner"]


def test_the_one_pass_is_taken_only_without_binary_types():
    """With a binary type Chalice's path runs, and encodes the binary body."""
    app = _app(RestApp, [], binary=True)
    event = _event("GET", "/blob", headers={"Accept": "application/octet-stream"})
    answer = app(event, None)
    assert answer["isBase64Encoded"] and base64.b64decode(answer["body"]) == b"\x00\x01"
    assert app._plain is False
    plain = _app(RestApp, [])
    plain(_event("GET", "/items/{item}", {"item": "a"}), None)
    assert plain._plain is True


def _load_rest_module():
    """chalicelib/api/rest.py imported afresh, under a name of its own (the
    module everyone else imported stays as it is)."""
    import importlib.util

    from chalicelib.api import rest
    spec = importlib.util.spec_from_file_location("rest_under_test", rest.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_restapp_refuses_to_import_on_a_chalice_it_was_not_checked_against(monkeypatch):
    """RestApp calls private methods of Chalice's RestAPIEventHandler: on another
    Chalice, import fails and names the version it was checked against."""
    import chalice
    assert _load_rest_module().CHECKED_CHALICE == chalice.__version__ == "1.34.0"
    monkeypatch.setattr(chalice, "__version__", "1.35.0")
    with pytest.raises(ImportError, match=r"checked against Chalice 1\.34\.0, not 1\.35\.0"):
        _load_rest_module()
