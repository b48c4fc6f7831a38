"""What the service tests do to get a job where a test starts: nodes
registered and jobs submitted as the routes do it, or a job already placed."""
from __future__ import annotations

from chalicelib.domain.principal import Principal

AGENTS = Principal("agent", "*")


def register(svc, node_id: str, gpus: int = 8, gpu_type: str = "a100"):
    return svc.nodes.register(AGENTS, node_id, {"gpus": gpus, "gpu_type": gpu_type})


def submit(svc, tenant: str = "acme", key: str | None = None, **body):
    """A job submitted as the route submits it (JobsService.submit), read back
    as the Job the store holds."""
    body = {"command": ["python", "train.py"], "ranks": 2, "gpu_type": "a100", **body}
    view, _ = svc.jobs.submit(tenant, body, key)
    return svc.store.get(view["job_id"])


def placed(svc, world, ranks=4, **body):
    """A job of ``ranks`` placed over n1 and n2 (2 GPUs each), its LAUNCHes
    taken from their inboxes."""
    register(svc, "n1", gpus=2)
    register(svc, "n2", gpus=2)
    job = submit(svc, ranks=ranks, **body)
    assert svc.placer.run().placed == [job.job_id]
    for n in ("n1", "n2"):
        world.inbox.drain(world.inbox.ensure(n))
    return job
