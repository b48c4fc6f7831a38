"""Never-fitting jobs are parked until the fleet changes (issue 9): a run reads
the jobs that could fit, not a flood of ones that never can; a parked job keeps
a true pending_reason and is placed once a node it fits on registers."""
from datetime import timedelta

from chalicelib.adapters.models import FleetModel, JobModel
from chalicelib.domain.clock import utcnow
from chalicelib.domain.fleet import Fleet
from chalicelib.domain.principal import Principal

from .helpers import aws_calls, flood

AGENT = Principal("agent", "*")
READS = ("GetItem", "Query", "Scan", "BatchGetItem")


def register(s, node_id, gpus=8, gpu_type="park"):
    return s.nodes.register(AGENT, node_id, {"gpus": gpus, "gpu_type": gpu_type})


def create(s, tenant, ranks, gpus_per_rank=8, gpu_type="park"):
    job, _ = s.jobs.submit(tenant, {"command": ["x"], "ranks": ranks, "gpu_type": gpu_type,
                                    "gpus_per_rank": gpus_per_rank}, None)
    return job["job_id"]


def test_a_flood_of_never_fitting_jobs_is_read_once_then_costs_a_bounded_run(iso, tenants):
    register(iso, "p1")                                       # the fleet: 8 park GPUs
    iso.placer.settle_s = 0                                   # moto's indexes do not lag
    never = flood(iso, tenants.b, {"command": ["x"], "ranks": 2, "gpu_type": "park",
                                   "gpus_per_rank": 8}, 600)  # 16 GPUs each
    first = iso.placer.run()
    assert set(first.never) == set(never)
    job = iso.store.get(never[0])
    assert job.state.value == "PENDING"
    assert job.pending_reason == "can never fit: needs 16 park GPUs; the fleet has 8"

    small = create(iso, tenants.a, 1, 1)
    with aws_calls() as calls:
        report = iso.placer.run()
    assert report.placed == [small] and report.never == []
    reads = [op for svc, op in calls if svc == "dynamodb" and op in READS]
    # fleet generation, the PENDING partition (one page: the 600 are not in it),
    # the fleet of the small job's type, one page of candidates
    assert len(reads) <= 4, reads
    writes = [op for svc, op in calls if svc == "dynamodb" and op not in READS]
    assert writes == ["TransactWriteItems"], "only the small job's placement is written"
    assert iso.store.get(never[1]).pending_reason.startswith("can never fit: needs 16")


def test_a_parked_job_is_placed_after_a_node_of_its_type_registers(iso, tenants):
    register(iso, "q1", gpu_type="parkq")
    iso.placer.settle_s = 0
    wide = create(iso, tenants.a, 2, gpu_type="parkq")   # 16 GPUs: the fleet has 8
    wider = create(iso, tenants.a, 3, gpu_type="parkq")  # 24 GPUs
    nowhere = create(iso, tenants.a, 1, gpu_type="no-such-type")
    assert iso.placer.run().never == [], "parked by their creates"
    assert JobModel.get(wide).active_state == "PARKED#parkq"
    assert "no-such-type" in iso.store.get(nowhere).pending_reason
    register(iso, "q2", gpu_type="parkq")                # now 16
    report = iso.placer.run()
    assert report.placed == [wide], "the sweep put it back, the same run placed it"
    reason = iso.store.get(wider).pending_reason
    assert reason == "can never fit: needs 24 parkq GPUs; the fleet has 16", \
        "a still parked job's reason follows the fleet"
    assert JobModel.get(wider).active_state == "PARKED#parkq"
    assert JobModel.get(nowhere).active_state == "PARKED#no-such-type", \
        "a change of another type does not touch it"
    register(iso, "nowhere-1", gpu_type="no-such-type")
    assert iso.placer.run().placed == [nowhere]


def test_a_sweep_is_repeated_until_the_change_settled(iso, tenants):
    """A job parked just before a change may appear late in the index the sweep
    reads; the sweep counts only once the change is SETTLE_S old."""
    register(iso, "s1", gpu_type="settle")
    create(iso, tenants.a, 2, gpu_type="settle")
    iso.placer.settle_s = 3600
    iso.placer.run()
    everything = FleetModel.get("*", consistent_read=True)
    assert everything.swept_generation != everything.generation
    with aws_calls() as calls:
        iso.placer.run()
    assert ("dynamodb", "Scan") in calls, "not settled: looked again"
    iso.placer._clock = lambda: utcnow() + timedelta(hours=2)
    iso.placer.run()
    everything = FleetModel.get("*", consistent_read=True)
    assert everything.swept_generation == everything.generation
    with aws_calls() as calls:
        iso.placer.run()
    assert ("dynamodb", "Scan") not in calls


def test_a_job_is_not_parked_against_a_fleet_that_moved_on(iso, tenants):
    register(iso, "m1", gpu_type="moved")
    job_id = create(iso, tenants.a, 1, gpu_type="moved")
    stale = iso.node_store.fleet_of("moved")
    register(iso, "m2", gpu_type="moved")
    assert not iso.store.park(iso.store.get(job_id), "can never fit: stale", stale)
    assert JobModel.get(job_id).active_state == "PENDING"
    fresh = iso.node_store.fleet_of("moved")
    assert fresh.generation > stale.generation
    assert iso.store.park(iso.store.get(job_id), "can never fit: fresh", fresh)
    assert iso.node_store.fleet_of(None) != Fleet("*")


def test_a_parked_job_can_be_cancelled(iso, tenants):
    register(iso, "c1", gpu_type="parkc")
    job_id = create(iso, tenants.a, 4, gpu_type="parkc")
    assert JobModel.get(job_id).active_state == "PARKED#parkc", "parked by its create"
    assert iso.jobs.cancel(tenants.a, job_id, "no room").state.value == "CANCELLED"
    assert JobModel.get(job_id).active_state is None


def test_a_create_judged_against_a_fleet_that_moved_on_is_judged_again(iso, tenants):
    """On moto: the create of a job made parked is conditioned on the fleet's
    generation it read; lost, nothing is written and it is judged again."""
    register(iso, "f1", gpu_type="movedc")
    stale = iso.node_store.fleet_of("movedc")                 # 8 GPUs
    register(iso, "f2", gpu_type="movedc")                    # 16 now
    read = iso.jobs._fleets._read
    answers = [stale]
    iso.jobs._fleets._read = lambda gpu_type: answers.pop() if answers else read(gpu_type)
    try:
        job_id = create(iso, tenants.a, 2, gpu_type="movedc")  # 16: parked on the stale read
    finally:
        iso.jobs._fleets._read = read
    assert JobModel.get(job_id).active_state == "PENDING", "judged again on the fresh fleet"
