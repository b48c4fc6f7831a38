"""The HTTP entry point: Chalice, answering API Gateway's proxy events in one pass.

For every proxy event Chalice (1.34) builds a RestAPIEventHandler and a chain
of handler objects around its middleware, then checks the response against
the API's binary media types twice more (each check lower-cases, splits on a
regular expression and intersects sets), though this API has none. In a
request's flow, where a call to DynamoDB has just left the CPU's caches cold,
that machinery cost more than any single thing the app does per request
(docs/benchmarks.md).

:class:`RestApp` answers the same events with Chalice's own parts (its
``Request``, its routing, 405 and 415 answers and view error handling in
``_main_rest_api_handler``, the registered middleware in registration order,
``current_request``, thread-local under the local server) and skips only the
binary checks, for an API that declares no binary types and no CORS. With
either, it is Chalice's path unchanged.

Those parts are private methods of Chalice's ``RestAPIEventHandler``
(``create_request_object``, ``_main_rest_api_handler``,
``_unhandled_exception_to_response``, ``_validate_binary_response``), which
Chalice may change in any release; so this module refuses to import on any
Chalice but the one it was checked against, :data:`CHECKED_CHALICE`. On an
upgrade, check those methods again (tests/unit/test_rest.py holds every
answer equal to Chalice's), then move the version.
"""
from __future__ import annotations

from typing import Any, Callable

import chalice
from chalice import Chalice, Response
from chalice.app import RestAPIEventHandler

#: the Chalice whose private request path RestApp was checked against
CHECKED_CHALICE = "1.34.0"
if chalice.__version__ != CHECKED_CHALICE:
    raise ImportError(
        f"chalicelib.api.rest.RestApp was checked against Chalice {CHECKED_CHALICE}, "
        f"not {chalice.__version__}: it calls private methods of RestAPIEventHandler; "
        "check them again (tests/unit/test_rest.py), then update CHECKED_CHALICE")


class _NoBinaryHandler(RestAPIEventHandler):
    def _validate_binary_response(self, request_headers: Any, response_headers: Any) -> bool:
        # no binary media types: no response is binary (Chalice would call one
        # binary whose Content-Type names */*, which no route of this app sends)
        return True


class RestApp(Chalice):
    """Chalice, whose REST entry point calls the middleware directly and skips
    the binary checks when the API has no binary types and no route has CORS."""

    _plain: bool | None = None  # decided on the first request: routes are all declared

    def __call__(self, event: Any, context: Any) -> dict[str, Any]:
        if self._plain is None:
            self._plain = not self.api.binary_types and all(
                entry.cors is None for methods in self.routes.values()
                for entry in methods.values())
        if not self._plain:
            return super().__call__(event, context)
        self.lambda_context = context
        handler = _NoBinaryHandler(self.routes, self.api, self.log, self.debug)
        request = self.current_request = handler.create_request_object(event, context)

        def route(_request: Any) -> Response:
            return handler._main_rest_api_handler(event, context)

        answer: Callable[[Any], Response] = route
        for middleware in reversed([f for f, kind in self.middleware_handlers
                                    if kind in ("http", "all")]):
            answer = _layer(middleware, answer)
        try:
            response = answer(request)
        except Exception:  # noqa: BLE001 - as Chalice's outermost layer: a 500, logged
            response = handler._unhandled_exception_to_response()
        return response.to_dict()  # no binary types: never base64


def _layer(middleware: Callable[[Any, Callable], Response],
           inner: Callable[[Any], Response]) -> Callable[[Any], Response]:
    def call(request: Any) -> Response:
        return middleware(request, inner)
    return call
