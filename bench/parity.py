"""Parity of bench/endpoints.py's baselines with the adapters.

A baseline is the bare boto3 requests an endpoint needs at minimum, so its
items must be the items the adapter writes, or the ratio compares different
work. The baselines' requests are built by the adapters' own request builders
(adapters/job_store.create_writes, cancel_unplaced_writes, page_request;
transitions.request_cancel_writes: the code the store sends them by), for
twin fixtures. ``check_endpoints`` proves they leave the same items,
untimed, before every run (``--quick`` included, so the test suite's smoke test
checks it): every row that writes runs once, endpoint and baseline on twin
fixtures, and the items each left behind are read back and compared with
``harness.same_items`` (equal but for the ids and timestamps); the item both
sides update, the tenant's PENDING count, must move by as much for each.
bench/placement.py checks its baseline the same way after its warm-up round.
"""
from __future__ import annotations

from bench.harness import Fail, same_items

#: attributes whose values differ between twins for reasons other than the code
#: under test (the idempotency record's expiry counts from each side's own now)
_CLOCKED = ("ttl_epoch",)


def check_endpoints(bench, tenant: str) -> int:
    """Run every writing row of ``bench`` (a bench.endpoints.Bench, whose
    jobs are ``tenant``'s) once and compare what its endpoint and its
    baseline wrote; returns the number of items compared, and prints it."""
    from chalicelib.domain import idempotency

    cfg, ddb = bench.cfg, bench.cleanup
    compared = 0

    def item(table: str, key: dict) -> dict:
        found = ddb.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")
        if found is None:
            raise Fail(f"parity: no item {key} in {table}")
        return found

    def job(job_id: str) -> dict:
        return item(cfg.jobs_table, {"job_id": {"S": job_id}})

    def pair(name: str, table: str, keys: tuple[dict, dict], ids: list[str]) -> None:
        nonlocal compared
        same_items(name, item(table, keys[1]), item(table, keys[0]), ids=ids, ignore=_CLOCKED)
        compared += 1

    def pending() -> int:
        found = ddb.get_item(TableName=cfg.tenants_table, Key={"tenant": {"S": tenant}},
                             ConsistentRead=True).get("Item", {})
        return int(found.get("pending", {}).get("N", 0))

    for row in bench.rows:
        if not (row.name == "create" or row.name.startswith("cancel")):
            continue  # the others only read
        ctx = row.prepare()
        before = pending()
        response = row.endpoint(ctx)
        between = pending()
        baseline = row.baseline(ctx)
        row.check(ctx, response, baseline)
        # the counters the two sides share move alike: the tenant's PENDING count
        moved = (between - before, pending() - between)
        if moved[0] != moved[1]:
            raise Fail(f"parity {row.name}: the tenant's PENDING count moved by "
                       f"{moved[0]} for the endpoint, by {moved[1]} for the baseline")
        compared += 1
        if row.name == "create":
            e_id = response.json_body["id"]
            b_id = ctx["items"][1]["Put"]["Item"]["job_id"]["S"]
            e_idem = idempotency.record_id(tenant, ctx["headers"]["Idempotency-Key"])
            b_idem = ctx["items"][0]["Put"]["Item"]["idem_id"]["S"]
        else:
            e_id = ctx["path"].split("/")[3]
            b_id = ctx["job"].job_id
            e_idem, b_idem = job(e_id).get("idem_id", {}).get("S"), ctx["job"].idem_id
        ids = [e_id, b_id] + [i for i in (e_idem, b_idem) if i]
        pair(f"{row.name}: job", cfg.jobs_table,
             ({"job_id": {"S": e_id}}, {"job_id": {"S": b_id}}), ids)
        if e_idem or b_idem:
            pair(f"{row.name}: idempotency record", cfg.idempotency_table,
                 ({"idem_id": {"S": e_idem}}, {"idem_id": {"S": b_idem}}), ids)
        if row.name == "cancel placed":
            for intent in ("LAUNCH#1", "CANCEL#1"):
                keys = tuple({"job_id": {"S": j}, "intent_id": {"S": intent}}
                             for j in (e_id, b_id))
                pair(f"{row.name}: {intent} intent", cfg.outbox_table, keys, ids)
    bench.collect_garbage()
    print(f"parity: the baselines' {compared} items equal the adapters' (ids and times aside)")
    return compared
