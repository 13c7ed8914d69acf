"""The handler table: one entry per API, each handler typed with exactly the kio
request classes of the versions it is registered for."""

from __future__ import annotations

import json
import pkgutil
import types
import typing
from pathlib import Path

import pytest
from kio.static.constants import EntityType

from broker.broker import Broker
from broker.config import BrokerConfig, load_static
from broker.handlers import APIS, requests
from broker.server import Endpoint, RequestContext
from protocol import api, request_check
from tests.unit.fresh import run_fresh


def test_each_api_is_listed_once() -> None:
    keys = [a.key for a in APIS]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("entry", APIS, ids=lambda a: api.api_name(a.key))
def test_request_type_is_the_union_of_the_served_versions(entry: typing.Any) -> None:
    # The handlers import the request unions for type checking only (loading every
    # served version's kio classes at startup took most of a restart).
    hint = typing.get_type_hints(entry.handler, localns=vars(requests))["req"]
    annotated = set(typing.get_args(hint)) if isinstance(hint, types.UnionType) else {hint}
    served = {
        api.request_class(entry.key, version)
        for version in range(entry.min_version, entry.max_version + 1)
    }
    assert annotated == served


@pytest.mark.parametrize("entry", APIS, ids=lambda a: api.api_name(a.key))
def test_response_type_is_a_response_entity_of_the_api(entry: typing.Any) -> None:
    # mypy checks a handler's body against its return annotation; this checks that the
    # annotation is its own API's response (kio classes, read through the lazily
    # loaded `broker.handlers.responses`), so a handler answering another API's entity
    # or a mapping fails `mypy --strict`.
    hint = typing.get_type_hints(entry.handler, localns=vars(requests))["return"]
    answered = set(typing.get_args(hint)) if isinstance(hint, types.UnionType) else {hint}
    answered.discard(type(None))  # Produce with acks=0
    assert answered
    for cls in answered:
        assert cls.__api_key__ == entry.key, cls
        assert cls.__type__ == EntityType.response, cls
        # A version this handler's table entry serves, or one kio has next to them.
        assert api.response_class(entry.key, cls.__version__) is cls


@pytest.mark.parametrize("entry", APIS, ids=lambda a: api.api_name(a.key))
def test_handler_is_a_module_level_function_named_for_its_api(entry: typing.Any) -> None:
    handler = entry.handler
    assert handler.__name__ == api.api_name(entry.key)  # Kafka's name: metadata, share_fetch
    assert handler.__qualname__ == handler.__name__  # not a closure or a method
    assert handler.__module__.startswith("broker.handlers.")


def test_the_broker_serves_exactly_the_table() -> None:
    broker = Broker(
        BrokerConfig(load_static(None, [])), Path("/nonexistent"), Endpoint("127.0.0.1", 0)
    )
    served = [(e.api_key, e.min_version, e.max_version) for e in broker.table.entries()]
    assert served == sorted((a.key, a.min_version, a.max_version) for a in APIS)


@pytest.mark.parametrize(
    ("guard", "api_key", "narrowed"),
    [
        ("broker.handlers.cluster:_batched", 10, requests.FindCoordinatorBatchRequest),
        ("broker.handlers.produce_fetch:_has_session", 1, requests.FetchSessionRequest),
        ("broker.handlers.topics:_by_id", 20, requests.DeleteTopicsByIdRequest),
        ("broker.handlers.transactions:_batched", 24, requests.AddPartitionsToTxnBatchRequest),
    ],
)
def test_version_guards_pick_exactly_the_narrowed_versions(
    guard: str, api_key: int, narrowed: typing.Any
) -> None:
    # The handlers tell versions apart by kio's `__version__` (the unions are for type
    # checking only): each guard holds for exactly the classes of its narrowed union.
    check = pkgutil.resolve_name(guard)
    entry = next(a for a in APIS if a.key == api_key)
    members = set(typing.get_args(narrowed)) or {narrowed}
    for version in range(entry.min_version, entry.max_version + 1):
        request = api.build(api.request_class(api_key, version), {})
        assert check(request) == (type(request) in members), version


_WARM_UP = """
import asyncio, json, sys
from pathlib import Path
from broker.broker import Broker
from broker.server import Endpoint, RequestContext
from broker.config import BrokerConfig, load_static
from kio.schema.index import api_key_map, schema_name_map

broker = Broker(BrokerConfig(load_static(None, [])), Path("/nonexistent"), Endpoint("127.0.0.1", 0))
served = [(e.api_key, v) for e in broker.table.entries()
          for v in range(e.min_version, e.max_version + 1)]

def loaded():
    return [(key, v) for key, v in served
            if all(schema_name_map[api_key_map[key]][v][kind].rpartition(".")[0] in sys.modules
                   for kind in schema_name_map[api_key_map[key]][v])]

before = loaded()
ticks = 0
async def main():
    global ticks
    warming = asyncio.ensure_future(broker.warm_up())
    while not warming.done():
        ticks += 1
        await asyncio.sleep(0)
    return warming.result()

count = asyncio.run(main())
print(json.dumps({"served": len(served), "before": len(before), "after": len(loaded()),
                  "count": count, "ticks": ticks}))
"""


def test_warm_up_loads_every_served_version_and_lets_the_loop_run_between() -> None:
    got = json.loads(run_fresh(_WARM_UP))
    # A broker that is built but not warmed has loaded few versions' classes (those
    # the handler modules use at import): a start does not pay for the rest.
    assert got["before"] < got["served"] // 4
    assert got["count"] == got["served"]
    assert got["after"] == got["served"]
    # One version per turn of the loop: another task ran between every two versions.
    assert got["ticks"] >= got["served"] - 1


async def test_a_failed_warm_up_is_logged_and_freezes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # e.g. no descriptor left to import a schema module: each request then loads its own
    # version's classes when it comes, and the broker goes on serving.
    from structlog.testing import capture_logs

    from broker import cli

    class FailingBroker:
        async def warm_up(self) -> int:
            raise OSError(24, "Too many open files")

    frozen: list[bool] = []
    monkeypatch.setattr(cli.gc, "freeze", lambda: frozen.append(True))
    with capture_logs() as logs:
        await cli._warm_up(FailingBroker())
    assert [e["event"] for e in logs] == ["schema_warm_up_failed"]
    assert "Too many open files" in logs[0]["error"]
    assert frozen == []

    class WarmBroker:
        async def warm_up(self) -> int:
            return 145

    with capture_logs() as logs:
        await cli._warm_up(WarmBroker())
    assert frozen == [True]  # once warm, the classes leave the collector's reach


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(lambda: api.build_response(1, 18, {}), id="another API's response"),
        pytest.param(lambda: api.build(api.request_class(3, 12), {}), id="a request"),
    ],
)
async def test_a_handler_answering_the_wrong_entity_is_refused_before_the_wire(
    answer: typing.Any,
) -> None:
    # mypy refuses such a handler (its return annotation, checked above); one that got
    # past it anyway raises here, which the connection answers UNKNOWN_SERVER_ERROR.
    broker = Broker(
        BrokerConfig(load_static(None, [])), Path("/nonexistent"), Endpoint("127.0.0.1", 0)
    )

    async def metadata(ctx: RequestContext, req: typing.Any) -> typing.Any:
        return answer()

    broker.table = api.ApiTable()
    broker.table.register(3, 12, 12, metadata)
    request = api.build(api.request_class(3, 12), {"topics": None})
    frame = api.encode_request(3, 12, 7, "unit", request)[4:]
    header, offset = request_check.decode_request_header(frame)
    with pytest.raises(api.WrongResponse, match="the metadata handler answered"):
        await broker.dispatch(RequestContext(header, "127.0.0.1", 1), frame, offset)
