"""Request parsing and schema validation (fastjsonschema: compiled validators;
its import cost is in docs/benchmarks.md, "Cold start"), with errors naming the field."""
from __future__ import annotations

import json
import math
from typing import Any, Callable

import fastjsonschema

from .. import fastjson
from ..domain import retry
from ..domain.errors import InvalidArgument, PayloadTooLarge, UnsupportedMediaType
from . import schemas

MAX_BODY_BYTES = 64 * 1024
#: a heartbeat batch of 1,024 ranks with steps and times is about 90 KB
MAX_HEARTBEATS_BYTES = 256 * 1024
#: what the gateway admits before any route looks at it
MAX_ANY_BODY_BYTES = MAX_HEARTBEATS_BYTES
_validators: dict[str, Callable[[Any], Any]] = {}


def _validator(name: str) -> Callable[[Any], Any]:
    # compiled on first use, so a cold start pays only for what it serves
    v = _validators.get(name)
    if v is None:
        v = _validators[name] = fastjsonschema.compile(getattr(schemas, name))
    return v


def _finite_float(s: str) -> float | int:
    f = float(s)
    if not math.isfinite(f):
        raise ValueError("number out of range")
    # 2.0 is the integer 2 in JSON Schema; keep it an int so it stays one
    return int(f) if f.is_integer() and abs(f) < 2**53 else f


def _reject_constant(s: str) -> None:
    raise ValueError(f"{s} is not JSON")


#: ``json.loads(text, parse_float=_finite_float, parse_constant=_reject_constant)``
#: without a new decoder per call (json's own module-level one is shared alike)
_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_reject_constant)


def parse_json(raw: bytes | None, *, required: bool, content_type: str | None,
               max_bytes: int = MAX_BODY_BYTES) -> Any:
    """Bytes to a JSON value, or a 4xx naming what is wrong. Never raises anything else."""
    if raw is not None and len(raw) > max_bytes:
        raise PayloadTooLarge(f"request body exceeds {max_bytes} bytes", field="body")
    if not raw:
        if required:
            raise InvalidArgument("request body is required", field="body")
        return None
    if content_type and "json" not in content_type.split(";")[0].lower():
        raise UnsupportedMediaType("request body must be application/json",
                                   field="Content-Type")
    try:
        value = _DECODER.decode(raw.decode("utf-8"))
        # lone surrogates parse but cannot be stored as UTF-8 (orjson refuses
        # them, and json's text then fails to encode); only a \u escape makes
        # one (raw surrogate bytes are not UTF-8), so only then is it checked
        if b"\\u" in raw:
            fastjson.dumps(value).encode("utf-8")
    except (ValueError, UnicodeError, RecursionError):
        raise InvalidArgument("request body is not valid JSON", field="body") from None
    return value


def _field(path: list[str]) -> str:
    return ".".join(str(p) for p in path[1:]) or "body"


def _program_named(spec: dict) -> None:
    """A command's first element names the program the agent runs: an empty
    one could never start (JSON Schema, in the form both fastjsonschema and
    OpenAPI 3.1 read, cannot constrain one element alone)."""
    if not spec["command"][0]:
        raise InvalidArgument("command[0], the program to run, must not be empty",
                              field="command")


def _lifecycle(spec: dict) -> None:
    """Rules that match on something, and a warning that comes before its limit."""
    bad = retry.check_rules((spec.get("retry") or {}).get("rules") or [])
    if bad is not None:
        raise InvalidArgument(bad[1], field=bad[0])
    warn, limit = spec.get("warn_before_s"), spec.get("max_runtime_s")
    if warn is not None and (limit is None or warn >= limit):
        raise InvalidArgument("warn_before_s must be less than max_runtime_s (and needs it)",
                              field="warn_before_s")
    if "warn_signal" in spec and warn is None:
        raise InvalidArgument("warn_signal needs warn_before_s", field="warn_signal")


def _array(spec: dict) -> None:
    """Every env list holds a value per index, and a failure budget below the size."""
    a = spec.get("array")
    if a is None:
        return
    for name, values in (a.get("env") or {}).items():
        if len(values) != a["size"]:
            raise InvalidArgument(f"array.env.{name} holds {len(values)} values; the array "
                                  f"has {a['size']} indexes, one value each",
                                  field=f"array.env.{name}")
    if a.get("max_failed_indexes") is not None and a["max_failed_indexes"] >= a["size"]:
        raise InvalidArgument("max_failed_indexes must be less than the array's size",
                              field="array.max_failed_indexes")


def _job_create(spec: dict) -> None:
    _program_named(spec)
    _lifecycle(spec)
    _array(spec)


#: what a body must also be, past its schema
_CHECKS = {"JOB_CREATE": _job_create}


def validate(schema_name: str, value: Any) -> Any:
    try:
        value = _validator(schema_name)(value)
    except fastjsonschema.JsonSchemaValueException as e:
        path = list(e.path or ["data"])
        rule, definition = e.rule, e.rule_definition
        if rule == "required" and isinstance(e.value, dict):
            missing = [k for k in definition if k not in e.value]
            name = ".".join(path[1:] + [missing[0]]) if missing else _field(path)
            raise InvalidArgument(f"{name} is required", field=name) from None
        if rule == "additionalProperties" and isinstance(e.value, dict):
            allowed = set(e.definition.get("properties", {}))
            extra = sorted(k for k in e.value if k not in allowed)
            name = ".".join(path[1:] + [str(extra[0])]) if extra else _field(path)
            raise InvalidArgument(f"{name} is not a known field", field=name) from None
        name = _field(path)
        if rule == "propertyNames":
            raise InvalidArgument(f"{name} has a key that is not allowed: keys must match "
                                  f"{definition}", field=name) from None
        message = e.message.replace(e.name, name, 1) if e.name else e.message
        raise InvalidArgument(message, field=name) from None
    except RecursionError:
        raise InvalidArgument("request body is nested too deeply", field="body") from None
    check = _CHECKS.get(schema_name)
    if check is not None:
        check(value)
    return value
