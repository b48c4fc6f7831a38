"""Domain errors carry only codes; the edge's one table (chalicelib/api/problems.py)
gives each code its status and headers, and builds the problem body."""
from __future__ import annotations

import json

import pytest

from chalicelib.api.problems import ANSWERS, answer, body, problem, status_of
from chalicelib.domain import errors
from chalicelib.domain.errors import (
    ApiError,
    MethodNotAllowed,
    QuotaExceeded,
    RequestInProgress,
    ServiceUnavailable,
)

CLASSES = [ApiError, *ApiError.__subclasses__()]


def test_every_domain_error_code_has_exactly_one_entry_in_the_table():
    codes = [cls.code for cls in CLASSES]
    assert len(codes) == len(set(codes)), "two error classes share a code"
    assert set(codes) == set(ANSWERS), (
        f"codes without a status: {sorted(set(codes) - set(ANSWERS))}; "
        f"statuses for no error: {sorted(set(ANSWERS) - set(codes))}")


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.code)
def test_a_domain_error_answers_with_its_codes_status_in_header_and_body(cls):
    status, headers, text = answer(cls("detail"))
    assert status == ANSWERS[cls.code][0] == json.loads(text)["status"]
    assert headers["Content-Type"] == "application/problem+json"


def test_the_domain_holds_no_http():
    """No status and no header dict on a domain error: those are the edge's."""
    for cls in CLASSES:
        err = cls("detail")
        assert not hasattr(err, "status") and not hasattr(err, "headers"), cls.__name__


def test_an_unknown_code_is_a_500():
    # an instance's code, not a subclass: ApiError.__subclasses__() is the list
    # of served codes that tests/test_openapi.py holds to the document
    unlisted = ApiError("detail")
    unlisted.code = "not_in_the_table"
    assert status_of("not_in_the_table") == 500
    status, headers, text = answer(unlisted)
    assert (status, json.loads(text)["status"]) == (500, 500)
    assert "Retry-After" not in headers


def test_unavailable_is_503_with_retry_after_from_the_edge():
    # the adapters raise ServiceUnavailable("...") with no header of their own
    status, headers, _ = answer(ServiceUnavailable("tables unreachable"))
    assert (status, headers["Retry-After"]) == (503, "1")


def test_request_in_progress_is_409_with_retry_after_and_its_seconds_ride_as_data():
    assert answer(RequestInProgress("in flight"))[:2] == (
        409, {"Content-Type": "application/problem+json", "Retry-After": "1"})
    assert answer(RequestInProgress("in flight", retry_after_s=5))[1]["Retry-After"] == "5"


def test_a_quota_says_when_to_retry():
    status, headers, _ = answer(QuotaExceeded("over max_pending_jobs"))
    assert (status, headers["Retry-After"]) == (429, "60")


def test_method_not_allowed_names_the_allowed_methods():
    status, headers, _ = answer(MethodNotAllowed("no", allow="GET, PUT"))
    assert (status, headers["Allow"]) == (405, "GET, PUT")


def test_no_answer_shares_its_headers_with_the_table():
    _, headers, _ = answer(ServiceUnavailable("x"))
    headers["Retry-After"] = "999"
    assert answer(ServiceUnavailable("x"))[1]["Retry-After"] == "1"
    assert ANSWERS["unavailable"][1] == {"Retry-After": "1"}


def test_the_body_is_the_rfc_9457_problem_compact_and_ascii():
    err = errors.InvalidArgument("bad \udcff value é", field="ranks")
    assert body(err) == {"type": "urn:gpujobs:problem:invalid_argument",
                         "title": "Invalid argument", "status": 400,
                         "detail": "bad \udcff value é", "code": "invalid_argument",
                         "field": "ranks"}
    response = problem(err)
    assert response.status_code == 400
    assert response.body.isascii() and ", " not in response.body and ": " not in response.body
    assert json.loads(response.body) == body(err)
    assert "field" not in body(errors.NotFound("no job j"))
