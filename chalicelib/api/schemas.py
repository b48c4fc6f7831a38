"""JSON Schemas of request bodies: one source for validation and OpenAPI.

``docs/openapi.yaml`` embeds these same schemas; a test checks they agree.
"""
from __future__ import annotations

from typing import Any, cast

from ..domain import (
    arrays as _arrays,
    dependencies as _deps,
    retry as _retry,
    threshold as _t,
    webhooks as _webhooks,
    wire,
)

#: a year: the longest time limit a spec may set
_YEAR_S = 365 * 86400

RETRY_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["action"],
    "description": "Matches an attempt's failure when every criterion it gives matches "
                   "(each list: any of); at least one of reasons, exit_codes, signals.",
    "properties": {
        "reasons": {"type": "array", "minItems": 1, "maxItems": len(_retry.REASONS),
                    "uniqueItems": True, "items": {"enum": list(_retry.REASONS)}},
        "exit_codes": {"type": "array", "minItems": 1, "maxItems": 255, "uniqueItems": True,
                       "items": {"type": "integer", "minimum": 1, "maximum": 255}},
        "signals": {"type": "array", "minItems": 1, "maxItems": len(_retry.SIGNALS),
                    "uniqueItems": True, "items": {"enum": list(_retry.SIGNALS)}},
        "action": {"enum": list(_retry.ACTIONS),
                   "description": "retry (counted against max_attempts), retry_uncounted "
                                  "(under retry.max_uncounted_retries), or fail now."},
    },
}

RETRY = {
    "type": "object",
    "additionalProperties": False,
    "description": "What follows a failed attempt. The first matching rule decides; "
                   "with none matching, node_lost, preempted, agent_lost and port_in_use "
                   "are retried "
                   "without counting, anything else is retried while max_attempts allows.",
    "properties": {
        "rules": {"type": "array", "maxItems": _retry.MAX_RULES, "items": RETRY_RULE},
        "max_uncounted_retries": {"type": "integer", "minimum": 0, "maximum": 1000,
                                  "description": "How many retries may go uncounted; "
                                                 "past it they count. Default 10."},
    },
}

# ranges that keep the stall threshold's arithmetic bounded (domain/threshold.py)
HEARTBEAT = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "interval_s": {"type": "number", "minimum": _t.INTERVAL_S_MIN,
                       "maximum": _t.INTERVAL_S_MAX},
        "false_positive_budget_per_hour": {"type": "number", "minimum": _t.BUDGET_MIN,
                                           "maximum": _t.BUDGET_MAX},
        "miss_probability": {"type": "number", "minimum": _t.MISS_PROBABILITY_MIN,
                             "maximum": _t.MISS_PROBABILITY_MAX},
        "startup_grace_s": {"type": "number", "minimum": 0,
                            "maximum": _t.STARTUP_GRACE_S_MAX},
        "mode": {"enum": ["auto", "beats", "process", "off"]},
        "max_busy_s": {"type": "number", "minimum": 0, "maximum": 86400},
        "idle_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400},
        "slow_score": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1,
                       "description": "A rank whose slow_score (the fastest rank's "
                                      "step_time_s over its own) stays below this across "
                                      "a sustained window is called slow: one rank_slow "
                                      "event an episode. Default 0.7."},
    },
}

DEPENDS_ON = {
    "type": "array",
    "maxItems": _deps.MAX_DEPENDENCIES,
    "description": "Jobs this one waits for, each an existing job of the same tenant "
                   "(so no cycle can form). It stays PENDING, out of the queue, with "
                   "pending_reason 'waiting for job_x to succeed', until every one has "
                   "ended as its condition asks; the moment one cannot, it ends FAILED "
                   "with reason dependency_failed naming it (and so on down the chain).",
    "items": {
        "type": "object",
        "additionalProperties": False,
        "required": ["job_id"],
        "properties": {
            "job_id": {"type": "string", "minLength": 1, "maxLength": 64},
            "condition": {"enum": list(_deps.CONDITIONS),
                          "description": "succeeded (default): it must end SUCCEEDED; "
                                         "failed: FAILED or CANCELLED; ended: any end."},
        },
    },
}

ARRAY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["size"],
    "description": "Makes this job an array: a parent that never runs itself, and `size` "
                   "children (indexes 0 to size-1), each an ordinary job with its own "
                   "retries, with GPUJOBS_ARRAY_INDEX and GPUJOBS_ARRAY_SIZE in its env.",
    "properties": {
        "size": {"type": "integer", "minimum": 1, "maximum": _arrays.MAX_SIZE},
        "max_parallel": {"type": "integer", "minimum": 1, "maximum": _arrays.MAX_SIZE,
                         "description": "At most this many indexes are open (made and not "
                                        "ended) at once. Default: "
                                        f"{_arrays.FEED_WINDOW}."},
        "max_failed_indexes": {"type": "integer", "minimum": 0,
                               "maximum": _arrays.MAX_SIZE - 1,
                               "description": "When more indexes than this have failed "
                                              "(after their own retries), the array fails: "
                                              "no more are started and the open ones are "
                                              "cancelled. Default: no limit."},
        "env": {"type": "object", "maxProperties": 16,
                "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]{0,254}$"},
                "additionalProperties": {"type": "array", "minItems": 1,
                                         "maxItems": _arrays.MAX_SIZE,
                                         "items": {"type": "string", "maxLength": 1024}},
                "description": "Env values by index: each list holds `size` values, and "
                               "index i gets the i-th of each."},
    },
}

JOB_CREATE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["command", "ranks"],
    "properties": {
        "name": {"type": "string", "maxLength": 128},
        "command": {"type": "array", "minItems": 1, "maxItems": 1024,
                    "items": {"type": "string", "maxLength": 8192},
                    "description": "The program and its arguments. The first element, "
                                   "the program, must not be empty (400, field command)."},
        "working_dir": {"type": "string", "pattern": wire.WORKING_DIR_PATTERN,
                        "description": "The directory every rank runs in (an absolute path "
                                       "on the hosts); a relative path in the command is "
                                       "read against it. Default: the agent's own "
                                       "working directory. It is entered as the rank's "
                                       "uid, after root is dropped: a directory that uid "
                                       "cannot pass fails the rank at start (exit code "
                                       "127, the reason in its log)."},
        "env": {"type": "object", "maxProperties": 512,
                "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]{0,254}$"},
                "additionalProperties": {"type": "string", "maxLength": 8192}},
        "ranks": {"type": "integer", "minimum": 1, "maximum": 65536},
        "gpus_per_rank": {"type": "integer", "minimum": 1, "maximum": 64},
        "gpu_type": {"type": "string", "minLength": 1, "maxLength": 64},
        "priority": {"type": "integer", "minimum": -1000000, "maximum": 1000000,
                     "description": "Orders the tenant's own jobs within their priority "
                                    "class (higher first). Default 0."},
        "priority_class": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$",
                           "description": "One of the operator's priority classes "
                                          "(GPUJOBS_PRIORITY_CLASSES); an unknown one is "
                                          "a 400. Higher classes are placed first, and "
                                          "a class that preempts takes GPUs from running "
                                          "jobs of lower classes. Default: default."},
        "max_attempts": {"type": "integer", "minimum": 1, "maximum": 100},
        "retry": RETRY,
        "max_runtime_s": {"type": "integer", "minimum": 1, "maximum": _YEAR_S,
                          "description": "The longest one attempt may run, from its "
                                         "launch; then SIGTERM, the grace period, "
                                         "SIGKILL, and the attempt ends as timeout. "
                                         "Default: no limit."},
        "warn_before_s": {"type": "integer", "minimum": 1, "maximum": _YEAR_S,
                          "description": "Send warn_signal to every rank this long before "
                                         "max_runtime_s (less than it), so it can "
                                         "checkpoint. Default: no warning."},
        "warn_signal": {"enum": list(wire.WARN_SIGNALS),
                        "description": "The warning signal. Default SIGUSR1."},
        "max_pending_s": {"type": "integer", "minimum": 1, "maximum": _YEAR_S,
                          "description": "The longest the job may wait to be placed, each "
                                         "time it waits; then it ends FAILED with reason "
                                         "pending_timeout, its pending_reason kept. "
                                         "Default: no limit."},
        "checkpoint_dir": {"type": "string", "pattern": wire.WORKING_DIR_PATTERN,
                           "description": "Shared storage every node mounts: each rank of "
                                          "every attempt gets GPUJOBS_CHECKPOINT_DIR="
                                          "<checkpoint_dir>/<job_id>, the same across "
                                          "attempts, made if missing: by the agent under a "
                                          "root its operator allows (--job-roots), else by "
                                          "the ranks as their own uid; never through a "
                                          "symbolic link, never in the agent's state."},
        "heartbeat": HEARTBEAT,
        "on_stall": {"enum": ["report", "restart"]},
        "depends_on": DEPENDS_ON,
        "array": ARRAY,
        "labels": {"type": "object", "maxProperties": 64,
                   "propertyNames": {"minLength": 1, "maxLength": 128},
                   "additionalProperties": {"type": "string", "maxLength": 256}},
    },
}

CANCEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"reason": {"type": "string", "maxLength": 1024}},
}

CORDON = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"reason": {"type": "string", "minLength": 1, "maxLength": 1024,
                              "description": "Why; shown with the node."}},
}

DRAIN = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "reason": {"type": "string", "minLength": 1, "maxLength": 1024,
                   "description": "Why; shown with the node and in each preempted job's "
                                  "retry decision."},
        "wait": {"type": "boolean",
                 "description": "true: let the running jobs finish (no preemption); "
                                "default false: preempt them now."},
    },
}

NODE_PUT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["gpus"],
    "properties": {
        "gpus": {"type": "integer", "minimum": 1, "maximum": 1024},
        "gpu_type": {"type": "string", "minLength": 1, "maxLength": 64,
                     "pattern": "^[A-Za-z0-9._-]+$"},
        "labels": {"type": "object", "maxProperties": 64,
                   "propertyNames": {"minLength": 1, "maxLength": 128},
                   "additionalProperties": {"type": "string", "maxLength": 256}},
        "address": {"type": "string", "minLength": 1, "maxLength": 255},
        "isolation": {"enum": ["user", "none"]},
        "inbox_missing": {"type": "boolean",
                          "description": "true: the agent's receive was told its inbox does not "
                                         "exist (it was deleted): the server makes it again. The "
                                         "inbox is otherwise made once per node, not on every "
                                         "call-in."},
        "running": {"type": "array", "maxItems": 4096, "items": {
            "type": "object", "additionalProperties": False, "required": ["job_id", "attempt"],
            "properties": {"job_id": {"type": "string", "minLength": 1, "maxLength": 128},
                           "attempt": {"type": "integer", "minimum": 1}}}},
    },
}

#: a node call-in carried by a heartbeat POST (``call_in``): the PUT
#: /v1/nodes/{node_id} body and the node's id, so that a busy agent makes one
#: request an interval, not two
NODE_CALL_IN: dict[str, Any] = {
    **NODE_PUT,
    "required": ["node_id", "gpus"],
    "properties": {"node_id": {"type": "string", "minLength": 1, "maxLength": 63},
                   **cast(dict, NODE_PUT["properties"])},
}

#: a rank's sampled Python stack, innermost frame first, each as py-spy prints
#: it (``forward (train.py:88)``); domain/stacks.py reads them
STACK_FRAMES = {"type": "array", "maxItems": 16, "items": {"type": "string", "maxLength": 200}}
STACK = {
    "type": "object",
    "additionalProperties": False,
    "required": ["frames"],
    "properties": {
        "frames": STACK_FRAMES,
        "code": {"type": "string", "maxLength": 200},
        "age_s": {"type": "number", "minimum": 0, "maximum": 3600},
    },
}

ATTEMPT_EVENT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["type"],
    "properties": {
        "type": {"enum": ["STARTED", "EXITED", "STOPPED", "TIMED_OUT"],
                 "description": "TIMED_OUT (an extension of the contract): the attempt "
                                "passed its max_runtime_s on this node, whose agent is "
                                "stopping its ranks there (STOPPED follows); the attempt "
                                "ends at once as `timeout`, and the other nodes get a "
                                "CANCEL (400 for a job without max_runtime_s)."},
        "ranks": {"type": "array", "maxItems": 65536,
                  "items": {"type": "integer", "minimum": 0, "maximum": 65535}},
        "exit_code": {"type": "integer", "minimum": -255, "maximum": 255},
        "not_started": {"enum": ["port_in_use"],
                        "description": "An extension of the contract, EXITED only: the "
                                       "agent did not start these ranks, for a cause "
                                       "outside the job. `port_in_use`: the attempt's "
                                       "MASTER_PORT was held on the node of rank 0. The "
                                       "attempt then ends as `port_in_use`, an "
                                       "infrastructure cause: retried at once by default, "
                                       "on a new port, not counted against max_attempts, "
                                       "and never counted by auto-cordon."},
        "node_id": {"type": "string", "minLength": 1, "maxLength": 63},
        "stacks": {"type": "array", "maxItems": 64, "items": {
            "type": "object", "additionalProperties": False, "required": ["rank", "frames"],
            "properties": {"rank": {"type": "integer", "minimum": 0, "maximum": 65535},
                           "where": {"type": "string", "maxLength": 512},
                           "frames": STACK_FRAMES}}},
    },
}

HEARTBEATS = {
    "type": "object",
    "additionalProperties": False,
    "required": ["attempt", "ranks"],
    "properties": {
        "attempt": {"type": "integer", "minimum": 1, "maximum": 1000000},
        "call_in": {**NODE_CALL_IN,
                    "description": "An extension of the contract: the node's call-in "
                                   "(the PUT /v1/nodes/{node_id} body, with its node_id), "
                                   "carried by this request. The answer then has `node`, "
                                   "PUT's answer. The beats are checked first and nothing "
                                   "is recorded when they are refused."},
        "ranks": {
            "type": "array", "minItems": 1, "maxItems": 1024,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["rank"],
                "properties": {
                    "rank": {"type": "integer", "minimum": 0, "maximum": 65535},
                    "step": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                    "sent_at": {"type": "string", "maxLength": 64},
                    "age_s": {"type": "number", "minimum": 0, "maximum": 3600},
                    "step_time_s": {"type": "number", "minimum": 0, "maximum": 86400,
                                    "description": "The median of the rank's recent "
                                                   "steps' time outside collectives (s, "
                                                   "its own monotonic clock; steps with a "
                                                   "declared pause left out)."},
                    "proc": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "cpu": {"type": "number", "minimum": 0, "maximum": 65536},
                            "io_bps": {"type": "number", "minimum": 0, "maximum": 1e13},
                            "write_bps": {"type": "number", "minimum": 0, "maximum": 1e13},
                            "state": {"type": "string", "maxLength": 8},
                            "procs": {"type": "integer", "minimum": 0, "maximum": 1000000},
                            "gpu_util": {"type": "number", "minimum": 0, "maximum": 100},
                            "gpu_mem_b": {"type": "integer", "minimum": 0,
                                          "maximum": 2**63 - 1},
                            "wchan": {"type": "string", "maxLength": 64},
                            "stack": STACK,
                        },
                    },
                    "resumed": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["age_s", "gap_s"],
                        "properties": {
                            "age_s": {"type": "number", "minimum": 0, "maximum": 3600},
                            "gap_s": {"type": "number", "minimum": 0, "maximum": 86400},
                        },
                    },
                    "collective": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["seq"],
                        "properties": {
                            "seq": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                            "name": {"type": "string", "maxLength": 32},
                        },
                    },
                    "pause": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["remaining_s"],
                        "properties": {
                            "reason": {"type": "string", "maxLength": 128},
                            "remaining_s": {"type": "number", "minimum": 0,
                                            "maximum": 86400},
                        },
                    },
                },
            },
        },
    },
}

#: POST /v1/webhooks (issue 45). The URL rule and the known types are checked
#: past the schema (domain/webhooks.py), each a 400 naming its field
WEBHOOK_CREATE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["url"],
    "properties": {
        "url": {"type": "string", "minLength": 1, "maxLength": _webhooks.MAX_URL_CHARS,
                "description": "https, to a public address (the local stack also takes "
                               "http and loopback)."},
        "types": {"type": "array", "maxItems": 32, "items": {"type": "string", "maxLength": 64},
                  "description": "The event types to deliver; absent: all of them."},
        "description": {"type": "string", "maxLength": _webhooks.MAX_DESCRIPTION_CHARS},
    },
}
