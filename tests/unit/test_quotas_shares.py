"""Guaranteed shares and fair-share weights in the tenants' limits (issue 28)."""
import pytest

from chalicelib.domain import placement
from chalicelib.domain.quotas import TenantLimits, type_key


def test_guarantees_and_weights_are_read_from_the_tenant_limits():
    limits = TenantLimits.parse(None, None, '{"acme": {"guaranteed_gpus": {"h100": 16, "*": 4},'
                                            ' "weight": 2}}')
    acme = limits.of("acme")
    assert (dict(acme.guaranteed_gpus), acme.weight) == ({"h100": 16, "*": 4}, 2.0)
    assert limits.of("globex").guaranteed_gpus == {} and limits.of("globex").weight == 1.0
    assert type_key(None) == "*" and type_key("h100") == "h100"


@pytest.mark.parametrize("entry, says", [
    ('{"guaranteed_gpus": 8}', "guaranteed_gpus maps GPU types"),
    ('{"guaranteed_gpus": {"h100": -1}}', "guaranteed_gpus['h100']"),
    ('{"weight": 0}', "weight must be a number above 0"),
    ('{"weight": "2"}', "weight must be a number above 0"),
])
def test_a_bad_share_setting_is_named(entry, says):
    with pytest.raises(ValueError) as caught:
        TenantLimits.parse(None, None, '{"acme": %s}' % entry)
    assert says in str(caught.value) and "GPUJOBS_TENANT_LIMITS['acme']" in str(caught.value)


def test_fair_order_divides_each_tenant_s_share_by_its_weight():
    queues = {"acme": [("acme", i) for i in range(6)], "globex": [("globex", i) for i in range(6)]}
    order = placement.fair_order(queues, {}, lambda j: 1, lambda t: 2.0 if t == "acme" else 1.0)
    taken, placed = [], None
    for _ in range(6):
        job = order.send(placed)
        taken.append(job[0])
        placed = 1
    assert taken.count("acme") == 4 and taken.count("globex") == 2
