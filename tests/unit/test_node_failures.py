"""A node's failure entries (chalicelib/domain/nodes.py), kept on the node
for auto-cordon: the job and tenant each names, also for entries written
before tenants were kept."""
from chalicelib.domain.nodes import failure_entry, failure_of


def test_an_entry_names_its_job_and_tenant():
    assert failure_of(failure_entry("2026-12-07T10:00:00.000Z", "job_a#3", "acme")) == (
        "job_a", "acme")


def test_an_entry_without_a_tenant_counts_as_a_tenant_of_its_own():
    """Entries written before tenants were kept (within the window after a
    deploy) can neither make two of one tenant nor hide a second tenant."""
    assert failure_of("2026-12-07T10:00:00.000Z|job_a#3") == ("job_a", "job:job_a")
