"""The layers of docs/architecture.md, as the imports make them: each rule
here is one line of that page, checked on every module's own imports."""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
AWS = {"boto3", "botocore", "pynamodb", "chalice", "aws_lambda_powertools"}


def imports(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports, relative imports made absolute."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
                # `from . import x` may name a module: count both
                found.update(f"{module}.{a.name}" for a in node.names)
            else:
                module = node.module or ""
            found.add(module)
    return found


def modules(*globs: str) -> list[pathlib.Path]:
    return sorted(p for g in globs for p in ROOT.glob(g))


def offending(paths: list[pathlib.Path], refused) -> dict[str, list[str]]:
    out = {}
    for p in paths:
        bad = sorted(m for m in imports(p) if refused(m))
        if bad:
            out[str(p.relative_to(ROOT))] = bad
    return out


def top(module: str) -> str:
    return module.split(".")[0]


def under(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_the_domain_is_pure_python_with_no_aws_and_no_outer_layer():
    """No AWS, no outer layer, and no speed scaffolding: orjson and the
    stored JSON text (chalicelib.fastjson) stay in the layers that encode."""
    assert offending(modules("chalicelib/domain/*.py"), lambda m: top(m) in AWS | {"orjson"}
                     or under(m, "chalicelib.service", "chalicelib.adapters",
                              "chalicelib.api", "chalicelib.bootstrap", "chalicelib.config",
                              "chalicelib.fastjson")) == {}


def test_services_use_ports_not_adapters_nor_the_http_edge():
    assert offending(modules("chalicelib/service/*.py"), lambda m: top(m) in AWS or under(
        m, "chalicelib.adapters", "chalicelib.api", "chalicelib.bootstrap")) == {}


def test_the_http_edge_and_the_routes_reach_no_adapter_and_no_aws_client():
    refused = ({"boto3", "botocore", "pynamodb", "aws_lambda_powertools"}, (
        "chalicelib.adapters",))
    assert offending(modules("app.py", "chalicelib/api/*.py"), lambda m: top(m) in refused[0]
                     or under(m, *refused[1])) == {}


def test_adapters_know_nothing_of_http():
    assert offending(modules("chalicelib/adapters/*.py"), lambda m: top(m) == "chalice" or under(
        m, "chalicelib.api", "chalicelib.bootstrap")) == {}


#: where PynamoDB's schema, codecs and sending live (the one request path)
_PYNAMODB_HOMES = {"models.py", "items.py", "dynamo.py"}


@pytest.mark.parametrize("path", modules("chalicelib/adapters/*.py"),
                         ids=lambda p: p.name)
def test_requests_are_built_one_way_no_adapter_builds_pynamodb_objects(path):
    """Outside the schema (models.py), its codec (items.py) and the builder
    (dynamo.py), an adapter may name PynamoDB's errors and connection type,
    never its models, attributes, expressions or transactions."""
    if path.name in _PYNAMODB_HOMES:
        return
    allowed = ("pynamodb.exceptions", "pynamodb.connection")
    bad = sorted(m for m in imports(path)
                 if top(m) == "pynamodb" and not under(m, *allowed))
    assert bad == []


def test_the_agent_shares_only_the_wire_schema_with_the_control_plane():
    """The agent polls SQS itself (boto3), but of the control plane's code it
    imports the message schema alone, and the pure reading of a sampled stack
    (domain/stacks.py: which frame to show, the one-line summary), so the
    agent and the verdict read a stack alike."""
    assert offending(modules("agent/*.py", "agent/rankside/*.py"),
                     lambda m: top(m) == "chalicelib" and m not in (
                         "chalicelib.domain", "chalicelib.domain.wire",
                         "chalicelib.domain.stacks")) == {}


#: the services that tell what happened (domain/happened.py) instead of calling
#: the service that follows up, and the services they no longer import
FOLLOWED_BY_EVENTS = {
    "attempts": ("pipelines", "cordons"),  # a job's end, a rank's failure
    "placement": ("pipelines", "attempts"),  # a job's end, a child placed, a victim
    "nodes": ("attempts",),  # ranks confirmed gone
}


@pytest.mark.parametrize("service, replaced", sorted(FOLLOWED_BY_EVENTS.items()))
def test_what_follows_a_transition_is_an_event_not_a_call_to_another_service(service,
                                                                           replaced):
    """Each follow-up is subscribed once, in bootstrap.follow_ups; the service
    that wrote the transition publishes the event and imports none of them."""
    path = ROOT / "chalicelib" / "service" / f"{service}.py"
    assert offending([path], lambda m: any(under(m, f"chalicelib.service.{r}")
                                           for r in replaced)) == {}


def test_pipelines_ended_has_one_caller_the_bus():
    """What follows a job's end runs from one place (bootstrap.follow_ups)."""
    callers = [str(p.relative_to(ROOT)) for p in modules("chalicelib/**/*.py", "app.py")
               if "pipelines.ended(" in p.read_text(encoding="utf-8")]
    assert callers == ["chalicelib/bootstrap.py"]


def test_a_rule_here_can_fail():
    """The checker sees a refused import where there is one."""
    assert imports(ROOT / "chalicelib" / "bootstrap.py") & {
        "chalicelib.adapters.store", "chalicelib.adapters"}


def test_each_port_is_small_and_services_ask_for_the_parts_they_call():
    """A port declares at most ten methods of its own (the unions Jobs,
    Pipelines, JobTables and NodeStore, for the contract suite and bootstrap, declare
    none); a service asks for the parts it calls, not for a union of them."""
    from chalicelib.service import ports
    tree = ast.parse((ROOT / "chalicelib" / "service" / "ports.py").read_text(encoding="utf-8"))
    sizes = {node.name: sum(isinstance(n, ast.FunctionDef) for n in node.body)
             for node in tree.body if isinstance(node, ast.ClassDef)
             and any(getattr(b, "id", "") == "Protocol" for b in node.bases)}
    assert sizes and max(sizes.values()) <= 10, sizes
    unions = {"Jobs", "Pipelines", "JobTables", "NodeStore"}
    assert {name for name in unions if sizes[name]} == set()
    asking = offending(modules("chalicelib/service/*.py"), lambda m: m in {
        f"chalicelib.service.ports.{u}" for u in unions})
    assert asking == {}, "a service asks for a union of ports"
    assert hasattr(ports, "JobReads")


def test_the_store_is_its_adapters_side_by_side_none_built_on_another():
    """No inheritance chain builds the store: each adapter stands on OnDynamo
    (the sender, the clock, the reads they share) alone."""
    from chalicelib.adapters.jobs_table import OnDynamo
    from chalicelib.adapters.store import DynamoStore
    assert len(DynamoStore.__bases__) == 5
    assert {base.__name__: base.__bases__ for base in DynamoStore.__bases__} == {
        base.__name__: (OnDynamo,) for base in DynamoStore.__bases__}
