"""A job as it is read and shown, not changed: its view.

A view holds the fields a Job declares shown (domain/jobs.py ``VIEW_FIELDS``:
a field's ``Column``), under their stored names, with times already as API
text (``clock.iso``) and each JSON value as the JSON text the store holds,
undecoded (:class:`~chalicelib.fastjson.RawJSON`; the representation's
encoder writes it out verbatim). The store makes views straight from its
items (adapters/jobs_table.py ``view_from_item``: no Job, no time parsed and
formatted again); anything else makes them from a Job with :func:`view_of`,
to the same values. A JSON value is shown, not read: ``view["spec"]["ranks"]``
fails everywhere, and a service that must read it decodes it
(``view["spec"].value()``), or reads the Job.
"""
from __future__ import annotations

from typing import Any, Callable

from ..domain.clock import iso_or_none
from ..domain.jobs import COLUMNS, COUNTS, JSON, SPEC, STATE, TIME, Job, array_values
from ..fastjson import RawJSON

#: a job's view: its shown fields by stored name (see the module's text)
JobView = dict[str, Any]


def _json(value: Any) -> RawJSON | None:
    return None if value is None else RawJSON.of(value)


#: a shown field's value in a view, by how it is stored
_SHOWN: dict[str, Callable[[Any], Any]] = {
    TIME: iso_or_none, JSON: _json, STATE: lambda state: state.value,
    SPEC: lambda spec: RawJSON.of(spec.to_json())}


def view_of(job: Job) -> JobView:
    """The job as it is shown: what the store's view of the same job is."""
    out: JobView = {}
    for name, column in COLUMNS.items():
        if not column.view:
            continue
        value = getattr(job, name)
        if column.empty_is_none and not value:
            value = None
        if column.kind == COUNTS:
            out.update(array_values(value))
        else:
            shown = _SHOWN.get(column.kind)
            out[name] = value if shown is None else shown(value)
    return out

