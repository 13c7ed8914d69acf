"""Fuzz the SASL handshake: a SASL_PLAINTEXT listener (PLAIN, and SCRAM-SHA-256/512
when the broker has them) gets garbage frames, SASL frames in the wrong order,
malformed SaslAuthenticate tokens (PLAIN messages and SCRAM client-first and
client-final messages), requests before authentication and TLS ClientHellos, on many
connections at once; the PLAINTEXT listener gets ClientHellos too.

Every scenario is one connection and a function of (seed, index). Into many of them a
request that would change the broker if it were served is smuggled before the client
has authenticated: CreateTopics of a new `fuzz-preauth-*` topic, Produce to the topic
`fuzz-target`, DeleteTopics of `fuzz-target`. The run checks that:

- the broker process never ends, and logs no traceback or error;
- a smuggled request is never served: any reply to one carries an error code, and at
  the end no `fuzz-preauth-*` topic exists and `fuzz-target` exists and is empty,
  while the same CreateTopics from an authenticated client succeeds (so the check
  can fail);
- after every round a good client still authenticates on the SASL listener (PLAIN,
  and SCRAM when it has a credential) and is served.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import io
import random
import shutil
import ssl
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch

from protocol import api
from protocol.client import ClientSecurity, KafkaClient
from tests.fuzz.driver import FuzzBroker, LogScanner
from tests.integration.conftest import BrokerError, free_port

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
API_VERSIONS, METADATA, PRODUCE, CREATE_TOPICS, DELETE_TOPICS, LIST_OFFSETS = 18, 3, 0, 19, 20, 2
TARGET = "fuzz-target"
PREAUTH_PREFIX = "fuzz-preauth-"
ALLOWED_PREFIX = "fuzz-maybe-authenticated-"
CONTROL_TOPIC = "fuzz-handshake-control"
USERS = {"alice": "alice-secret", "admin": "admin-secret"}
JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    + " ".join(f'user_{u}="{p}"' for u, p in USERS.items())
    + ";"
)
SCRAM = ("SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAM_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
SMUGGLED_KEYS = (CREATE_TOPICS, PRODUCE, DELETE_TOPICS)


class HandshakeBroker(FuzzBroker):
    """PLAINTEXT on `port` (setup and checks), SASL_PLAINTEXT on `sasl_port`."""

    def __init__(self, root: Path, mechanisms: tuple[str, ...]) -> None:
        settings = {"sasl.enabled.mechanisms": ",".join(mechanisms)}
        for mechanism in mechanisms:
            jaas = JAAS if mechanism == "PLAIN" else SCRAM_JAAS
            settings[f"listener.name.sasl_plaintext.{mechanism.lower()}.sasl.jaas.config"] = jaas
        super().__init__(root / "data", root / "broker.log", settings)
        self.mechanisms = mechanisms
        self.sasl_port = free_port()
        self.settings["listeners"] = (
            f"PLAINTEXT://127.0.0.1:{self.port},SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}"
        )


# -- frames -----------------------------------------------------------------------------


def request(api_key: int, version: int, cid: int, body: dict[str, Any]) -> bytes:
    """A size-prefixed request frame."""
    entity = api.build(api.request_class(api_key, version), body)
    return api.encode_request(api_key, version, cid, "fuzz-handshake", entity)


def records(rng: random.Random) -> bytes:
    now = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    out = io.BytesIO()
    write_new_batch(
        out,
        NewRecordBatch(
            producer_id=-1,  # type: ignore[arg-type]
            producer_epoch=-1,  # type: ignore[arg-type]
            base_sequence=-1,  # type: ignore[arg-type]
            attributes=0,  # type: ignore[arg-type]
            records=(
                Record(
                    attributes=0,  # type: ignore[arg-type]
                    timestamp=now,  # type: ignore[arg-type]
                    offset=0,  # type: ignore[arg-type]
                    key=None,
                    value=rng.randbytes(8),
                    headers=(),
                ),
            ),
        ),
    )
    return out.getvalue()


def smuggled(rng: random.Random, cid: int, index: int, allowed: bool = False) -> bytes:
    """A request that changes the broker if served. `allowed`: one that may be served
    (the client may have authenticated), naming other topics than the checked ones."""
    key = rng.choice(SMUGGLED_KEYS)
    prefix, target = (
        (ALLOWED_PREFIX, ALLOWED_PREFIX + "target") if allowed else (PREAUTH_PREFIX, TARGET)
    )
    if key == CREATE_TOPICS:
        topic = {"name": f"{prefix}{index}", "num_partitions": 1, "replication_factor": 1}
        return request(CREATE_TOPICS, 7, cid, {"topics": [topic], "timeout": 5000})
    if key == DELETE_TOPICS:
        return request(DELETE_TOPICS, 6, cid, {"topics": [{"name": target}], "timeout": 5000})
    partition = {"index": 0, "records": records(rng)}
    body = {
        "transactional_id": None,
        "acks": 1,
        "timeout": 5000,
        "topic_data": [{"name": target, "partition_data": [partition]}],
    }
    return request(PRODUCE, 9, cid, body)


def client_hello() -> bytes:
    """The first flight of a real TLS client (Python's ssl over memory BIOs)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def plain_token(rng: random.Random) -> bytes:
    """A PLAIN message that must fail: wrong passwords, missing or extra NULs, empty
    fields, an authzid that differs, bytes that are not UTF-8, a huge one."""
    user = rng.choice([*USERS, "mallory", "", "a" * 300])
    password = rng.choice(["wrong", "", "alice-secret\x00", USERS["admin"] + "x"])
    roll = rng.randrange(8)
    if roll == 0:
        return rng.randbytes(rng.randint(0, 64))
    if roll == 1:
        return f"{user}\x00{password}".encode()  # two tokens
    if roll == 2:
        return f"\x00{user}\x00{password}\x00extra".encode()
    if roll == 3:
        return b"\x00" + rng.randbytes(8) + b"\x00\xff\xfe"
    if roll == 4:
        return f"someone-else\x00{user}\x00{password}".encode()
    if roll == 5:
        return b"\x00alice\x00" + b"x" * rng.choice([1000, 100_000])
    if roll == 6:
        return b""
    return f"\x00{user}\x00{password}".encode()


def scram_client_first(rng: random.Random, nonce: str) -> bytes:
    user = rng.choice(["alice", "nobody", "a=2Cb", "a,b", "", "=3D"])
    valid = f"n,,n={user},r={nonce}"
    roll = rng.randrange(9)
    if roll == 0:
        return valid.encode()
    if roll == 1:
        return rng.randbytes(rng.randint(0, 80))
    if roll == 2:
        return f"y,,n={user},r={nonce}".encode()  # claims channel binding support
    if roll == 3:
        return f"p=tls-unique,,n={user},r={nonce}".encode()  # asks for channel binding
    if roll == 4:
        return f"n,a=other,n={user},r={nonce}".encode()  # authzid other than the user
    if roll == 5:
        return f"n,,n={user}".encode()  # no nonce
    if roll == 6:
        return f"n,,n={user},r={nonce},tokenauth=true,e=x".encode()  # extensions
    if roll == 7:
        cut = rng.randint(0, len(valid))
        return valid[:cut].encode()
    return (valid + "\xff").encode("latin-1")


def scram_client_final(rng: random.Random, nonce: str) -> bytes:
    proof = rng.randbytes(rng.choice([0, 32, 64, 3])).hex()
    roll = rng.randrange(6)
    if roll == 0:
        return f"c=biws,r={nonce}extra,p={proof}".encode()
    if roll == 1:
        return f"c=biws,r=not-the-nonce,p={proof}".encode()
    if roll == 2:
        return f"c=eSws,r={nonce},p={proof}".encode()  # another gs2 header
    if roll == 3:
        return rng.randbytes(rng.randint(0, 100))
    if roll == 4:
        return f"c=biws,r={nonce}".encode()  # no proof
    return f"c=biws,r={nonce},p=!!notbase64!!".encode()


@dataclass
class Scenario:
    """One connection's frames; `forbidden` holds the correlation ids of requests
    smuggled in before authentication; `raw` frames carry no Kafka header."""

    kind: str
    frames: list[bytes] = field(default_factory=list)
    forbidden: dict[int, int] = field(default_factory=dict)  # correlation id -> api key
    port: str = "sasl"  # "sasl" or "plaintext"


def scenario(seed: int, index: int, mechanisms: tuple[str, ...]) -> Scenario:
    rng = random.Random(seed * 1_000_003 + index)
    cids = iter(range(1, 1_000))
    kinds = [
        "garbage",
        "preauth",
        "wrong_order",
        "plain_tokens",
        "scram_tokens",
        "unknown_mechanism",
        "raw_v0",
        "tls_hello",
        "mutated",
    ]
    kind = rng.choice(kinds)
    sc = Scenario(kind)

    # Whether the frames so far could have completed an authentication (a PLAIN
    # handshake v1 followed by the right password): requests after that are allowed.
    state = {"plain_v1": False, "maybe_authed": False}

    def smuggle() -> None:
        cid = next(cids)
        frame = smuggled(rng, cid, index, allowed=state["maybe_authed"])
        if not state["maybe_authed"]:
            sc.forbidden[cid] = struct.unpack_from(">h", frame, 4)[0]
        sc.frames.append(frame)

    def versions() -> None:
        sc.frames.append(request(API_VERSIONS, rng.choice([0, 3]), next(cids), {}))

    def handshake(mechanism: str, version: int = 1) -> None:
        state["plain_v1"] = state["plain_v1"] or (mechanism == "PLAIN" and version == 1)
        sc.frames.append(request(SASL_HANDSHAKE, version, next(cids), {"mechanism": mechanism}))

    def authenticate(token: bytes) -> None:
        version = rng.choice([0, 1, 2])
        sc.frames.append(request(SASL_AUTHENTICATE, version, next(cids), {"auth_bytes": token}))

    if kind == "garbage":
        for _ in range(rng.randint(1, 3)):
            body = rng.randbytes(rng.randint(0, 64))
            size = rng.choice([len(body), len(body), -1, 0, 2**31 - 1, len(body) + 7])
            sc.frames.append(struct.pack(">i", size) + body)
        if rng.random() < 0.5:
            smuggle()
    elif kind == "preauth":
        if rng.random() < 0.5:
            versions()
        if rng.random() < 0.5:
            handshake(rng.choice(mechanisms))
        smuggle()
        if rng.random() < 0.3:
            authenticate(f"\x00alice\x00{USERS['alice']}".encode())
            smuggle()  # on a connection that was closed for the first one
    elif kind == "wrong_order":
        steps = ["versions", "handshake", "authenticate", "smuggle", "good_plain"]
        for step in rng.choices(steps, k=rng.randint(2, 5)):
            if step == "versions":
                versions()
            elif step == "handshake":
                handshake(rng.choice([*mechanisms, "PLAIN"]), rng.choice([0, 1]))
            elif step == "authenticate":
                authenticate(plain_token(rng))
            elif step == "good_plain":
                authenticate(f"\x00alice\x00{USERS['alice']}".encode())
                state["maybe_authed"] = state["maybe_authed"] or state["plain_v1"]
            else:
                smuggle()
        if not sc.forbidden and rng.random() < 0.7:
            smuggle()
    elif kind == "plain_tokens":
        versions()
        handshake("PLAIN")
        authenticate(plain_token(rng))
        smuggle()
    elif kind == "scram_tokens":
        mechanism = rng.choice(SCRAM)
        nonce = rng.randbytes(12).hex()
        versions()
        handshake(mechanism)
        authenticate(scram_client_first(rng, nonce))
        if rng.random() < 0.5:
            smuggle()  # between the two SCRAM messages
        authenticate(scram_client_final(rng, nonce))
        smuggle()
    elif kind == "unknown_mechanism":
        handshake(rng.choice(["GSSAPI", "OAUTHBEARER", "", "plain", "X" * 200, "SCRAM-SHA-1"]))
        smuggle()
    elif kind == "raw_v0":
        # SaslHandshake v0: the token follows as a bare size-prefixed frame.
        handshake(rng.choice(mechanisms), 0)
        token = plain_token(rng) if rng.random() < 0.7 else rng.randbytes(30)
        sc.frames.append(struct.pack(">i", len(token)) + token)
        smuggle()
    elif kind == "tls_hello":
        sc.port = rng.choice(["sasl", "plaintext"])
        sc.frames.append(client_hello())
        if sc.port == "sasl":
            smuggle()
    else:  # a good PLAIN exchange with bits of the token flipped: it must fail
        versions()
        handshake("PLAIN")
        token = f"\x00alice\x00{USERS['alice']}".encode()
        frame = bytearray(request(SASL_AUTHENTICATE, 2, next(cids), {"auth_bytes": token}))
        start = len(frame) - 1 - len(token)  # v2 ends with an empty tagged-field section
        for at in rng.sample(range(start, start + len(token)), rng.randint(1, 3)):
            frame[at] ^= 1 << rng.randrange(8)  # distinct bytes: the flips never cancel
        sc.frames.append(bytes(frame))
        smuggle()
    return sc


# -- running scenarios -----------------------------------------------------------------


@dataclass
class HandshakeReport:
    seed: int
    scenarios: int = 0
    elapsed_s: float = 0.0
    kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    smuggled: int = 0
    problems: list[str] = field(default_factory=list)
    mechanisms: tuple[str, ...] = ()
    good_logins: tuple[str, ...] = ()  # the good client's mechanisms after each round

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        lines = [
            f"handshake seed {self.seed}: {self.scenarios} scenarios in {self.elapsed_s:.1f}s, "
            f"mechanisms {', '.join(self.mechanisms)}, {self.smuggled} requests smuggled "
            "before authentication",
            f"a good client logs in after each round with {', '.join(self.good_logins)}",
            "kinds: " + ", ".join(f"{k} {v}" for k, v in sorted(self.kinds.items())),
            "outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items())),
            f"problems: {len(self.problems)}",
        ]
        return "\n".join(lines + [f"  {p}" for p in self.problems[:20]])


def served(api_key: int, version: int, frame: bytes) -> str | None:
    """Why a reply to a smuggled request shows it was served (None: refused)."""
    try:
        _, body = api.decode_response(api_key, version, frame)
    except Exception as exc:
        return f"undecodable reply: {exc!r}"
    if int(getattr(body, "error_code", 0) or 0):
        return None
    if api_key == CREATE_TOPICS:
        codes = [int(t.error_code) for t in body.topics]
    elif api_key == DELETE_TOPICS:
        codes = [int(t.error_code) for t in body.responses]
    else:
        codes = [int(p.error_code) for t in body.responses for p in t.partition_responses]
    return None if all(codes) else f"answered without an error: {body!r}"[:300]


class HandshakeRun:
    def __init__(
        self,
        seed: int,
        scenarios: int,
        workers: int = 8,
        round_size: int = 200,
        timeout_s: float = 1.0,
        out: Callable[[str], None] = print,
    ) -> None:
        self.seed = seed
        self.count = scenarios
        self.workers = workers
        self.round_size = round_size
        self.timeout_s = timeout_s
        self.out = out
        self.report = HandshakeReport(seed)
        self.root = Path(tempfile.mkdtemp(prefix="spool-fuzz-handshake-"))
        self.broker: HandshakeBroker | None = None
        self.scram_user: str | None = None

    def start_broker(self) -> HandshakeBroker:
        """With SCRAM if this broker has it, else PLAIN alone."""
        for mechanisms in (("PLAIN", *SCRAM), ("PLAIN",)):
            broker = HandshakeBroker(self.root / "-".join(mechanisms), mechanisms)
            try:
                broker.start()
            except BrokerError as exc:
                if "SCRAM" in str(exc) and len(mechanisms) > 1:
                    continue
                raise
            return broker
        raise AssertionError("unreachable")

    async def execute(self) -> HandshakeReport:
        report = self.report
        broker = self.broker = self.start_broker()
        report.mechanisms = broker.mechanisms
        scanner = LogScanner(broker.log_path)
        try:
            await self.setup()
            scanner.skip_to_end()
            started = time.monotonic()
            done = 0
            while done < self.count:
                batch = range(done, min(done + self.round_size, self.count))
                await self.round(batch)
                done = batch.stop
                report.scenarios = done
                report.elapsed_s = time.monotonic() - started
                problem = await self.health()
                if problem is not None:
                    report.problems.append(f"after scenarios {batch.start}-{done}: {problem}")
                    break
                problems, _ = scanner.scan()
                report.problems += [f"logged: {line[:500]}" for line in problems[:5]]
            if broker.running:
                await self.final_checks()
        finally:
            if broker.running:
                try:
                    broker.stop()
                except AssertionError as exc:
                    report.problems.append(f"unclean shutdown: {exc}")
            if report.ok:
                shutil.rmtree(self.root, ignore_errors=True)
            else:
                self.out(f"broker data and log kept in {self.root}")
        return report

    async def plaintext(self) -> KafkaClient:
        assert self.broker is not None
        return await KafkaClient.connect(self.broker.host, self.broker.port, "fuzz-check")

    async def setup(self) -> None:
        client = await self.plaintext()
        try:
            topic = {"name": TARGET, "num_partitions": 1, "replication_factor": 1}
            resp = await client.request(CREATE_TOPICS, 7, {"topics": [topic], "timeout": 10_000})
            assert int(resp.topics[0].error_code) == 0, resp
            versions = await client.api_versions()
            if "SCRAM-SHA-256" in self.report.mechanisms and 51 in versions:
                self.scram_user = await self.add_scram_user(client)
        finally:
            await client.close()

    async def add_scram_user(self, client: KafkaClient) -> str:
        """A SCRAM credential (AlterUserScramCredentials) for the good client."""
        import hashlib
        import os

        salt = os.urandom(16)
        salted = hashlib.pbkdf2_hmac("sha256", USERS["alice"].encode(), salt, 4096)
        upsert = {
            "name": "alice",
            "mechanism": 1,
            "iterations": 4096,
            "salt": salt,
            "salted_password": salted,
        }
        resp = await client.request(51, 0, {"deletions": [], "upsertions": [upsert]})
        assert all(int(r.error_code) == 0 for r in resp.results), resp
        return "alice"

    async def round(self, indexes: range) -> None:
        queue = collections.deque(indexes)

        async def worker() -> None:
            while queue:
                index = queue.popleft()
                await self.run_scenario(index)

        await asyncio.gather(*(worker() for _ in range(self.workers)))

    async def run_scenario(self, index: int) -> None:
        assert self.broker is not None
        report = self.report
        sc = scenario(self.seed, index, self.broker.mechanisms)
        report.kinds[sc.kind] += 1
        report.smuggled += len(sc.forbidden)
        port = self.broker.sasl_port if sc.port == "sasl" else self.broker.port
        try:
            reader, writer = await asyncio.open_connection(self.broker.host, port)
        except OSError as exc:
            report.problems.append(f"scenario {index} ({sc.kind}): cannot connect: {exc}")
            return
        versions_of: dict[int, tuple[int, int]] = {}
        for frame in sc.frames:
            if len(frame) >= 12:
                key, version, cid = struct.unpack_from(">hhi", frame, 4)
                versions_of[cid] = (key, version)
        try:
            for frame in sc.frames:
                writer.write(frame)
            await writer.drain()
        except ConnectionError:
            pass
        outcome = "closed"
        try:
            while True:
                head = await asyncio.wait_for(reader.readexactly(4), self.timeout_s)
                (size,) = struct.unpack(">i", head)
                reply = await asyncio.wait_for(reader.readexactly(size), self.timeout_s)
                if len(reply) < 4:
                    continue
                (cid,) = struct.unpack_from(">i", reply)
                if cid in sc.forbidden:
                    key, version = versions_of[cid]
                    why = served(key, version, reply)
                    if why is not None:
                        report.problems.append(
                            f"scenario {index} ({sc.kind}): {api.api_name(key)} before "
                            f"authentication: {why}"
                        )
        except (asyncio.IncompleteReadError, ConnectionError):
            outcome = "closed"
        except TimeoutError:
            outcome = "open"  # waiting for more (a partial frame): the broker's timeouts
        finally:
            writer.close()
        report.outcomes[outcome] += 1

    async def health(self) -> str | None:
        """None if the broker runs and a good SASL client authenticates and is served."""
        assert self.broker is not None
        if not self.broker.running:
            return "the broker process ended"
        logins = [("PLAIN", "alice")]
        if self.scram_user is not None:
            logins.append(("SCRAM-SHA-256", self.scram_user))
        self.report.good_logins = tuple(mechanism for mechanism, _ in logins)
        for mechanism, user in logins:
            security = ClientSecurity("SASL_PLAINTEXT", mechanism, user, USERS.get(user, ""))
            try:
                client = await asyncio.wait_for(
                    KafkaClient.connect(
                        self.broker.host, self.broker.sasl_port, "fuzz-good", security
                    ),
                    30,
                )
            except Exception as exc:
                return f"a good {mechanism} client cannot authenticate: {exc!r}"
            try:
                md = await client.request(METADATA, 12, {"topics": [{"name": TARGET}]}, 30)
                if int(md.topics[0].error_code) != 0:
                    return f"Metadata for {TARGET} after {mechanism}: {md.topics[0]}"
            except Exception as exc:
                return f"a good {mechanism} client is not served: {exc!r}"
            finally:
                await client.close()
        return None

    async def final_checks(self) -> None:
        """Nothing smuggled was served; what was smuggled works once authenticated."""
        report = self.report
        client = await self.plaintext()
        try:
            md = await client.request(METADATA, 12, {"topics": None}, 30)
            names = {t.name for t in md.topics}
            created = sorted(n for n in names if n.startswith(PREAUTH_PREFIX))
            if created:
                report.problems.append(f"topics created before authentication: {created[:5]}")
            if TARGET not in names:
                report.problems.append(f"{TARGET} was deleted before authentication")
            else:
                body = {
                    "replica_id": -1,
                    "isolation_level": 0,
                    "topics": [
                        {"name": TARGET, "partitions": [{"partition_index": 0, "timestamp": -1}]}
                    ],
                }
                offsets = await client.request(LIST_OFFSETS, 7, body, 30)
                end = int(offsets.topics[0].partitions[0].offset)
                if end != 0:
                    report.problems.append(f"{end} records produced before authentication")
        finally:
            await client.close()
        # The control: the same CreateTopics from an authenticated client is served.
        assert self.broker is not None
        security = ClientSecurity("SASL_PLAINTEXT", "PLAIN", "alice", USERS["alice"])
        try:
            good = await KafkaClient.connect(
                self.broker.host, self.broker.sasl_port, "fuzz-control", security
            )
        except Exception as exc:
            report.problems.append(f"the control client cannot authenticate: {exc!r}")
            return
        try:
            topic = {"name": CONTROL_TOPIC, "num_partitions": 1, "replication_factor": 1}
            resp = await good.request(CREATE_TOPICS, 7, {"topics": [topic], "timeout": 10_000})
            if int(resp.topics[0].error_code) != 0:
                report.problems.append(f"an authenticated CreateTopics failed: {resp.topics[0]}")
        finally:
            await good.close()


def run_handshake(
    seed: int, scenarios: int, workers: int = 8, out: Callable[[str], None] = print
) -> HandshakeReport:
    return asyncio.run(HandshakeRun(seed, scenarios, workers, out=out).execute())


__all__ = ["HandshakeReport", "run_handshake", "scenario"]
