"""The Attempts port on DynamoDB: one placement of a job each, what its ranks
reported (one event per node report, domain/attempts.reported), and the GPUs
it holds until each node gives them back."""
from __future__ import annotations

from datetime import datetime

from botocore.exceptions import ClientError
from pynamodb.exceptions import TransactWriteError

from ..domain import events as ev
from ..domain.attempts import RANK_EVENTS, Attempt, from_runs, placement_of, reported
from ..domain.clock import iso, parse_iso
from ..domain.errors import ServiceUnavailable
from .dynamo import Changes, ConditionFailed, Dynamo, Table
from .fleet import room_types, room_update
from .jobs_table import OnDynamo
from .models import AttemptModel, NodeModel

ATTEMPTS = Table(AttemptModel)
NODES = Table(NodeModel)

#: a release that keeps losing to concurrent transactions on the summary: 503
_RELEASE_RETRIES = 5
#: the progress a report adds to: started, exited, stopped
RANK_SETS = tuple(RANK_EVENTS.values())


class _Contended(Exception):
    """A transaction cancelled by a concurrent one, not by a condition."""


def _too_large(e: ClientError) -> bool:
    """DynamoDB's answer to an item that would grow past 400 KB."""
    error = e.response.get("Error", {})
    return error.get("Code") == "ValidationException" and \
        "maximum allowed size" in str(error.get("Message", ""))


def _t(value: str | None) -> datetime | None:
    return parse_iso(value) if value else None


def attempt_from_item(item: dict) -> Attempt:
    """The Attempt of an attempt's raw item."""
    v = ATTEMPTS.values(item)
    node_ranks = {n: from_runs(runs) for n, runs in v["node_ranks"].items()}
    progress = reported((v["events"] or {}).values())
    for kind in RANK_SETS:  # sets an attempt written before its events held them has
        progress[kind] |= set(map(int, v[kind] or ()))
    progress["exit_codes"] = {**{int(k): int(c) for k, c in (v["exit_codes"] or {}).items()},
                              **progress["exit_codes"]}
    return Attempt(
        job_id=v["job_id"], attempt=int(v["attempt"]), state=v["state"],
        placement=placement_of(node_ranks), node_ranks=node_ranks, node_gpus=v["node_gpus"],
        world_size=int(v["world_size"]), created_at=parse_iso(v["created_at"]),
        finished_at=_t(v["finished_at"]), exit=v["exit"], **progress,
        released=set(v["released"] or ()), node_types=v["node_types"] or {},
    )


def read_attempt(dynamo: Dynamo, job_id: str, attempt: int) -> Attempt | None:
    item = dynamo.get(ATTEMPTS.get(ATTEMPTS.key(job_id, attempt)))
    return attempt_from_item(item) if item else None


class DynamoAttempts(OnDynamo):
    def attempt(self, job_id: str, attempt: int) -> Attempt | None:
        return read_attempt(self._dynamo, job_id, attempt)

    def attempts(self, job_id: str) -> list[dict]:
        # an attempt whose ranks started is running, though only the job's
        # state records it (the attempt's state is written when it ends)
        out = []
        request = ATTEMPTS.query(None, "#job_id = :job", {":job": ATTEMPTS.value("job_id", job_id)},
                                 consistent=True)
        for page in self._dynamo.pages(request):
            for item in page:
                a = attempt_from_item(item)
                out.append({"attempt": a.attempt, "placement": a.placement,
                            "state": "RUNNING" if a.state == "SCHEDULED" and a.started
                            else a.state,
                            "created_at": a.created_at, "finished_at": a.finished_at,
                            "exit": a.exit})
        return out

    def record_ranks(self, job_id: str, attempt: int, kind: str, ranks: list[int],
                     exit_code: int | None = None, node_id: str | None = None,
                     stacks: list[dict] | None = None) -> Attempt:
        """Record a report of ranks that ``started``, ``exited`` or ``stopped``:
        one event under the report's key, set once, so a repeated report
        changes nothing; the attempt's progress is worked out from its
        events (domain/attempts.reported). Raises
        dynamo.ConditionFailed when there is no such attempt. A stop's
        ``stacks`` go into its event; should they take the item past
        DynamoDB's 400 KB (an attempt of many nodes, each cancelled with
        deep stacks), the event is written without them: the stop matters,
        its stacks are evidence."""
        if kind not in RANK_SETS:
            raise ValueError(kind)
        key = ATTEMPTS.key(job_id, attempt)
        if not ranks:
            found = self.attempt(job_id, attempt)
            if found is None:
                raise ConditionFailed()
            return found
        code = exit_code if kind == "exited" else None
        now = self._now()

        def update(with_stacks: list[dict] | None) -> dict:
            changes = Changes(ATTEMPTS).event(ev.ranks_key(kind, ranks, code),
                          ev.rank_event(kind, now, attempt, ranks, code, node_id, with_stacks))
            return self._dynamo.update(changes.update(
                key, condition="attribute_exists(#job_id)", return_new=True))

        try:
            answer = update(stacks)
        except ClientError as e:
            if not stacks or not _too_large(e):
                raise
            answer = update(None)
        return attempt_from_item(answer["Attributes"])

    def release(self, attempt: Attempt, node_id: str,
                heard_at: datetime | None = None) -> bool:
        """Give a node back the GPUs this attempt reserved there, exactly once,
        and tell the waiting jobs of its type (the capacity summary) in the
        same transaction. ``heard_at``: the node's agent was heard then (its
        report or call-in gave them back): the node's ``last_seen_at``, in the
        same write. A transaction that lost only to a concurrent one (on the
        shared summary item) is tried again."""
        for _ in range(_RELEASE_RETRIES):
            try:
                return self._release(attempt, node_id, heard_at)
            except _Contended:
                continue
        raise ServiceUnavailable("capacity is being updated concurrently; retry")

    def _release(self, attempt: Attempt, node_id: str, heard_at: datetime | None) -> bool:
        gpus = int(attempt.node_gpus.get(node_id, 0))
        now = self._now()
        held = f"{attempt.job_id}#{attempt.attempt}"
        try:
            with self._dynamo.transaction() as tx:
                for t in room_types(attempt.node_types.get(node_id)):
                    tx.update(room_update(t, iso(now)))
                tx.update(Changes(ATTEMPTS).add("released", {node_id}).update(
                    ATTEMPTS.key(attempt.job_id, attempt.attempt),
                    condition="attribute_exists(#job_id) AND NOT contains(#released, :node)",
                    values={":node": {"S": node_id}}))
                node = Changes(NODES).add("gpus_free", gpus).delete("attempts", {held}) \
                    .delete("lost", {held})
                if heard_at is not None:
                    node = node.set("last_seen_at", iso(heard_at))
                tx.update(node.update(NODES.key(node_id), condition="attribute_exists(#node_id)"))
        except TransactWriteError as e:
            codes = [r.code if r is not None else None for r in e.cancellation_reasons or []]
            if "ConditionalCheckFailed" in codes:
                return False  # released before
            if "TransactionConflict" in codes:
                raise _Contended() from None
            raise
        return True
