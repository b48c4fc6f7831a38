"""A job's usage on GET /v1/jobs/{id} (domain/usage.py) on the moto stack:
a job that failed once, then succeeded, held its GPUs for both attempts,
lost the first attempt's time after its start to ``failed_attempt`` and
made the second's productive. The services' clock is moved by hand, so each
figure is the attempts' own times, to the GPU-second."""
import pytest

from chalicelib.domain.clock import parse_iso
from chalicelib.domain.principal import Principal

from .test_events import event, placed

AGENT = Principal("agent", "*")


@pytest.fixture
def cluster(iso):
    return {n: iso.nodes.register(AGENT, n, {"gpus": 2}).inbox_queue_url for n in ("n1", "n2")}


def test_a_failed_then_retried_job_has_its_loss_and_its_productive_time(iso, iso_client, tenants,
                                                                        cluster, clock):
    job_id, by_node = placed(iso, iso_client, tenants, max_attempts=2)
    clock.advance(10)
    for n, ranks in by_node.items():
        event(iso_client, tenants, job_id, 1, {"type": "STARTED", "ranks": ranks, "node_id": n})
    clock.advance(90)
    event(iso_client, tenants, job_id, 1,
          {"type": "EXITED", "ranks": by_node["n1"][:1], "exit_code": 3, "node_id": "n1"})
    event(iso_client, tenants, job_id, 1, {"type": "STOPPED", "ranks": by_node["n1"][1:],
                                           "node_id": "n1"})
    event(iso_client, tenants, job_id, 1, {"type": "STOPPED", "ranks": by_node["n2"],
                                           "node_id": "n2"})
    clock.advance(10)
    assert iso.placer.run().placed == [job_id]
    clock.advance(20)
    for n, ranks in by_node.items():
        event(iso_client, tenants, job_id, 2, {"type": "STARTED", "ranks": ranks, "node_id": n})
    clock.advance(200)
    for n, ranks in by_node.items():
        event(iso_client, tenants, job_id, 2,
              {"type": "EXITED", "ranks": ranks, "exit_code": 0, "node_id": n})
    clock.advance(600)
    r = iso_client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers())
    assert r.status_code == 200 and r.json_body["state"] == "SUCCEEDED"
    u = r.json_body["usage"]
    # the attempts' own times, 4 GPUs each: what GET .../attempts shows
    attempts = iso_client.http.get(f"/v1/jobs/{job_id}/attempts",
                                   headers=tenants.headers()).json_body["attempts"]
    held = sum(4 * (parse_iso(a["finished_at"]) - parse_iso(a["created_at"])).total_seconds()
               for a in attempts)
    assert abs(u["gpu_seconds"] - held) <= 4 and u["gpu_seconds"] == pytest.approx(4 * (100 + 220), abs=4)
    assert u["lost_gpu_seconds"]["failed_attempt"] == pytest.approx(4 * 90, abs=4)
    assert u["lost_gpu_seconds"]["startup"] == pytest.approx(4 * 30, abs=4)
    assert set(u["lost_gpu_seconds"]) == {"failed_attempt", "startup"}
    assert u["productive_gpu_seconds"] == pytest.approx(4 * 200, abs=4)
    assert u["productive_gpu_seconds"] + sum(u["lost_gpu_seconds"].values()) == u["gpu_seconds"]
    assert u["goodput"] == round(u["productive_gpu_seconds"] / u["gpu_seconds"], 4)
    assert u["estimated"] is True, "no steps were recorded"
    listed = iso_client.http.get("/v1/jobs", headers=tenants.headers()).json_body["jobs"]
    assert [j["usage"] for j in listed if j["id"] == job_id] == [None], "GET of one job only"
