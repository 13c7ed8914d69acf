"""Send fuzz frames to a real broker process and record what goes wrong.

Frames go out in rounds over several connections at once. After each frame a probe
(ApiVersions v0) follows on the same connection, so the driver knows when the broker
is done with the frame even if it sends no reply (Produce with acks=0): replies come
back in request order. After each round: the process must be alive, a fresh
connection must get correct ApiVersions and Metadata answers, and the broker log
must hold no traceback. A round with a problem is replayed one frame at a time to
name the frame that causes it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import shutil
import socket
import struct
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from protocol import api
from protocol.client import KafkaClient
from tests.fuzz.frames import PROBE_CORRELATION_ID, Frame, Pools, advertised_apis, fuzz_frame
from tests.integration.conftest import Broker

PROBE = (
    struct.pack(">hhi", api.API_VERSIONS_KEY, 0, PROBE_CORRELATION_ID)
    + struct.pack(">h", 10)
    + b"fuzz-probe"
)
PROBLEM_EVENTS = {"request_failed", "connection_failed", "task_failed"}


class FuzzBroker(Broker):
    """The integration harness's broker process, logging JSON lines to scan."""

    def command(self) -> list[str]:
        return [*super().command(), "--log-format", "json"]

    def rss_kib(self) -> int:
        assert self.process is not None
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return -1


@dataclass
class Finding:
    kind: str  # "crash", "traceback", "bad_reply", "health"
    what: str
    frame: Frame | None = None
    index: int | None = None
    log: list[str] = field(default_factory=list)

    def render(self, seed: int) -> str:
        lines = [f"[{self.kind}] {self.what}"]
        if self.frame is not None:
            lines.append(f"  seed {seed}, frame #{self.index}: {self.frame.describe()}")
            lines.append(f"  frame hex: {self.frame.payload.hex()}")
        lines += [f"  log: {line[:2000]}" for line in self.log[:5]]
        return "\n".join(lines)


@dataclass
class Report:
    seed: int
    frames: int = 0
    elapsed_s: float = 0.0
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    mutations: collections.Counter[str] = field(default_factory=collections.Counter)
    findings: list[Finding] = field(default_factory=list)
    # MalformedRequest answered with an error instead of closing the connection: the
    # server's handling of the contract, counted apart from other tracebacks.
    malformed_answered: int = 0
    rss_before_kib: int = 0
    rss_after_kib: int = 0
    rss_max_kib: int = 0

    def count(self, kind: str) -> int:
        return sum(1 for f in self.findings if f.kind == kind)

    @property
    def ok(self) -> bool:
        return not self.count("crash") and not self.count("traceback") and not self.count("health")

    def summary(self) -> str:
        rate = self.frames / self.elapsed_s if self.elapsed_s else 0.0
        lines = [
            f"seed {self.seed}: {self.frames} frames in {self.elapsed_s:.1f}s "
            f"({rate:.0f} frames/s)",
            f"crashes {self.count('crash')}, tracebacks {self.count('traceback')}, "
            f"health failures {self.count('health')}, bad replies {self.count('bad_reply')}, "
            f"bare replies {self.outcomes['bare']}",
            "outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items())),
            "mutations: " + ", ".join(f"{k} {v}" for k, v in sorted(self.mutations.items())),
            f"broker RSS: before {self.rss_before_kib / 1024:.1f} MiB, "
            f"after {self.rss_after_kib / 1024:.1f} MiB, max {self.rss_max_kib / 1024:.1f} MiB",
        ]
        if self.malformed_answered:
            lines.append(
                f"malformed requests answered instead of closed: {self.malformed_answered} "
                "(server side of MalformedRequest)"
            )
        lines += [f.render(self.seed) for f in self.findings]
        return "\n".join(lines)


# -- replies -------------------------------------------------------------------------


def reply_problem(payload: bytes, reply: bytes, apis: dict[int, tuple[int, int]]) -> str | None:
    """None when `reply` is a valid answer to `payload`; "bare" for a bare error code
    where a schema exists; otherwise what is wrong."""
    api_key, version = struct.unpack_from(">hh", payload) if len(payload) >= 4 else (-1, -1)
    supported = apis.get(api_key)
    if api_key == api.API_VERSIONS_KEY and not (
        supported and supported[0] <= version <= supported[1]
    ):
        version = 0  # KIP-511: answered in v0
    try:
        cls = api.response_class(api_key, version)
    except api.UnknownApi:
        return None if len(reply) == 6 else f"{len(reply)}-byte reply to an api with no schema"
    offset = 4 + (1 if api.response_header_version(api_key, version) >= 1 else 0)
    try:
        _, size = api._reader(cls)(reply, offset)
    except Exception as exc:
        problem = f"reply does not decode as {cls.__name__} v{version}: {exc!r}"
    else:
        if offset + size == len(reply):
            return None
        problem = f"reply has {len(reply) - offset - size} bytes after its {cls.__name__} body"
    # Correlation id and error code alone (some v0 responses are exactly that).
    return "bare" if len(reply) == 6 else problem


# -- one connection ------------------------------------------------------------------


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, broker: Broker) -> Conn:
        reader, writer = await asyncio.open_connection(broker.host, broker.port)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    def close(self) -> None:
        self.writer.close()

    async def send(self, frame: Frame, rng: random.Random) -> None:
        data = struct.pack(">i", len(frame.payload) + (10 if frame.short else 0)) + frame.payload
        if frame.delivery == "whole":
            self.writer.write(data)
        else:
            at = 0
            while at < len(data):
                step = 1 if frame.delivery == "bytes" else rng.randint(1, max(len(data) // 3, 1))
                self.writer.write(data[at : at + step])
                await self.writer.drain()
                at += step
                await asyncio.sleep(0)
        await self.writer.drain()

    async def recv(self, timeout_s: float) -> bytes | None:
        """A reply frame, or None when the broker closed the connection."""
        try:
            head = await asyncio.wait_for(self.reader.readexactly(4), timeout_s)
            (size,) = struct.unpack(">i", head)
            return await asyncio.wait_for(self.reader.readexactly(size), timeout_s)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None


async def exchange(
    conn: Conn, frame: Frame, rng: random.Random, timeout_s: float
) -> tuple[str, bytes | None]:
    """Send a frame and a probe; return (outcome, reply to the frame or None).

    Outcomes: "answered", "silent" (no reply, e.g. acks=0), "closed", "timeout".
    """
    try:
        await conn.send(frame, rng)
        if frame.short:
            return "closed", None
        conn.writer.write(struct.pack(">i", len(PROBE)) + PROBE)
        await conn.writer.drain()
    except ConnectionError:
        return "closed", None
    reply: bytes | None = None
    while True:
        try:
            got = await conn.recv(timeout_s)
        except TimeoutError:
            return "timeout", reply
        if got is None:
            return "closed", reply
        (cid,) = struct.unpack_from(">i", got)
        if cid == PROBE_CORRELATION_ID:
            return ("answered" if reply is not None else "silent"), reply
        reply = got


# -- the broker log ------------------------------------------------------------------


class LogScanner:
    """New lines of the broker log since the last scan, sorted into problems."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def skip_to_end(self) -> None:
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def scan(self) -> tuple[list[str], int]:
        """(problem lines, count of MalformedRequest tracebacks)."""
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        # Only whole lines; a half-written one is read next time.
        end = data.rfind(b"\n") + 1
        self.offset += end
        problems: list[str] = []
        malformed = 0
        for raw in data[:end].decode(errors="replace").splitlines():
            line = raw.strip()
            if not line or line.startswith("====="):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if not isinstance(record, dict):
                if "Traceback" in line or "Error" in line or "Exception" in line:
                    problems.append(line)
                continue
            exc = str(record.get("exception", ""))
            bad = (
                bool(exc)
                or record.get("level") in ("error", "critical")
                or record.get("event") in PROBLEM_EVENTS
            )
            if not bad:
                continue
            if "MalformedRequest" in exc and record.get("event") == "request_failed":
                malformed += 1
            else:
                problems.append(line)
        return problems, malformed


# -- the run -------------------------------------------------------------------------


@dataclass
class Options:
    seed: int = 1
    frames: int = 100_000
    workers: int = 8
    round_size: int = 500
    timeout_s: float = 5.0
    data_dir: Path | None = None
    stop_on_crash: bool = True


class Run:
    def __init__(self, options: Options, out: Callable[[str], None] = print) -> None:
        self.options = options
        self.out = out
        self.report = Report(options.seed)
        self.apis = advertised_apis()
        self.api_ranges = {k: (lo, hi) for k, lo, hi in self.apis}
        self.pools = Pools()
        # A directory of our own is removed after a clean run, kept after a failing one.
        self._tmp: Path | None = None
        root = options.data_dir
        if root is None:
            root = self._tmp = Path(tempfile.mkdtemp(prefix="spool-fuzz-"))
        root.mkdir(parents=True, exist_ok=True)
        self.broker = FuzzBroker(root / "data", root / "broker.log")
        self.scanner = LogScanner(self.broker.log_path)
        self.signatures: collections.Counter[str] = collections.Counter()

    async def execute(self) -> Report:
        opts = self.options
        report = self.report
        self.broker.start()
        try:
            await self.setup()
            report.rss_before_kib = report.rss_max_kib = self.broker.rss_kib()
            self.scanner.skip_to_end()
            started = time.monotonic()
            next_index = 0
            while next_index < opts.frames:
                count = min(opts.round_size, opts.frames - next_index)
                indexes = range(next_index, next_index + count)
                next_index += count
                crashed = await self.round(indexes)
                report.frames = next_index
                report.elapsed_s = time.monotonic() - started
                if crashed and opts.stop_on_crash:
                    break
                rss = self.broker.rss_kib()
                report.rss_max_kib = max(report.rss_max_kib, rss)
                if next_index % (opts.round_size * 20) == 0:
                    self.out(
                        f"  {next_index} frames, {next_index / report.elapsed_s:.0f}/s, "
                        f"rss {rss / 1024:.1f} MiB, findings {len(report.findings)}"
                    )
            if self.broker.running:
                report.rss_after_kib = self.broker.rss_kib()
        finally:
            if self.broker.running:
                try:
                    self.broker.stop()
                except AssertionError as exc:
                    report.findings.append(Finding("crash", f"unclean shutdown: {exc}"))
            if self._tmp is not None and report.ok:
                shutil.rmtree(self._tmp, ignore_errors=True)
            elif self._tmp is not None:
                self.out(f"broker data and log kept in {self._tmp}")
        return report

    async def setup(self) -> None:
        client = await KafkaClient.connect(self.broker.host, self.broker.port, "fuzz-setup")
        try:
            await client.request(
                19,
                7,
                {
                    "topics": [
                        {"name": name, "num_partitions": 2, "replication_factor": 1}
                        for name in self.pools.topics
                    ],
                    "timeout": 10_000,
                },
            )
        finally:
            await client.close()
        await self.health()

    async def health(self) -> str | None:
        """None if the broker answers ApiVersions and Metadata correctly on a fresh
        connection (and refreshes the topic id pool), else what is wrong."""
        if not self.broker.running:
            return "process exited"
        try:
            client = await KafkaClient.connect(self.broker.host, self.broker.port, "fuzz-health")
        except OSError as exc:
            return f"cannot connect: {exc}"
        try:
            versions = await client.request(18, 3, {}, timeout_s=30)
            if int(versions.error_code) != 0:
                return f"ApiVersions error {versions.error_code}"
            listed = {int(k.api_key) for k in versions.api_keys}
            if listed != set(self.api_ranges):
                return f"ApiVersions lists {sorted(listed)}"
            metadata = await client.request(3, 12, {"topics": None}, timeout_s=30)
            if [(b.host, int(b.port)) for b in metadata.brokers] != [
                (self.broker.host, self.broker.port)
            ]:
                return f"Metadata brokers {metadata.brokers}"
            ids = [t.topic_id for t in metadata.topics if t.topic_id is not None]
            self.pools.topic_ids = ids[:16]
        except Exception as exc:
            return f"health request failed: {exc!r}"
        finally:
            await client.close()
        return None

    async def round(self, indexes: range) -> bool:
        """Send these frames over the workers; check health and the log; True on crash."""
        opts = self.options
        queue = collections.deque(indexes)
        sent: list[tuple[int, Frame]] = []

        async def worker(n: int) -> None:
            rng = random.Random(opts.seed * 7919 + indexes.start + n)
            conn: Conn | None = None
            while queue:
                index = queue.popleft()
                frame = fuzz_frame(opts.seed, index, self.apis, self.pools)
                sent.append((index, frame))
                if conn is None:
                    try:
                        conn = await Conn.open(self.broker)
                    except OSError:
                        return
                outcome = await self.one(conn, index, frame, rng)
                if outcome != "answered" and outcome != "silent":
                    conn.close()
                    conn = None
            if conn is not None:
                conn.close()

        await asyncio.gather(*(worker(n) for n in range(opts.workers)))
        problem = await self.health()
        if problem is not None:
            await self.find_crash(problem, sent)
            return True
        problems, malformed = self.scanner.scan()
        self.report.malformed_answered += malformed
        if problems:
            await self.find_tracebacks(problems, sent)
        return False

    async def one(self, conn: Conn, index: int, frame: Frame, rng: random.Random) -> str:
        report = self.report
        report.mutations[frame.mutation] += 1
        outcome, reply = await exchange(conn, frame, rng, self.options.timeout_s)
        report.outcomes[outcome] += 1
        if reply is not None:
            wrong = reply_problem(frame.payload, reply, self.api_ranges)
            if wrong == "bare":
                report.outcomes["bare"] += 1
                if report.count("bare_reply") < 5:
                    what = f"bare error reply {reply.hex()}"
                    report.findings.append(Finding("bare_reply", what, frame, index))
            elif wrong is not None and report.count("bad_reply") < 20:
                report.findings.append(Finding("bad_reply", wrong, frame, index))
        return outcome

    async def find_tracebacks(self, problems: list[str], sent: Sequence[tuple[int, Frame]]) -> None:
        """Name the frames behind the problems: replay the round's frames of the same
        api and version one by one. A problem already known is only counted."""
        for line in problems:
            signature = _signature(line)
            self.signatures[signature] += 1
            if self.signatures[signature] > 1:
                continue
            suspects = [
                (index, frame)
                for index, frame in sorted(sent, key=lambda item: item[0])
                if _matches(line, frame)
            ]
            found = False
            for index, frame in suspects[:200]:
                for got in await self.replay_one(frame):
                    # Whatever a frame replayed alone makes the broker log is its own.
                    again = _signature(got)
                    if again == signature:
                        found = True
                    elif again not in self.signatures:
                        self.signatures[again] += 1
                    else:
                        continue
                    self.report.findings.append(Finding("traceback", again, frame, index, [got]))
                if found:
                    break
            if not found:
                self.report.findings.append(
                    Finding("traceback", f"{signature} (not reproduced alone)", log=[line])
                )

    async def replay_one(self, frame: Frame) -> list[str]:
        try:
            conn = await Conn.open(self.broker)
        except OSError:
            return ["cannot connect"]
        try:
            await exchange(conn, frame, random.Random(0), self.options.timeout_s)
        finally:
            conn.close()
        await asyncio.sleep(0.002)
        problems, malformed = self.scanner.scan()
        self.report.malformed_answered += malformed
        return problems

    async def find_crash(self, problem: str, sent: Sequence[tuple[int, Frame]]) -> None:
        """The broker died or stopped answering: restart it and replay the round's
        frames one at a time until it fails again."""
        tail = self.broker.log_tail(30).splitlines()
        self.out(f"broker failed: {problem}; replaying {len(sent)} frames to find the cause")
        self.broker.kill9()
        self.broker.start()
        self.scanner.skip_to_end()
        for index, frame in sorted(sent, key=lambda item: item[0]):
            await self.replay_one(frame)
            again = await self.health()
            if again is not None:
                self.report.findings.append(
                    Finding("crash", f"{problem} (replay: {again})", frame, index, tail)
                )
                self.broker.kill9()
                self.broker.start()
                return
        self.report.findings.append(
            Finding("crash", f"{problem}; not reproduced by replaying frames alone", log=tail)
        )


def _signature(line: str) -> str:
    """Where a logged exception was raised and what it was: equal for repeats."""
    try:
        record = json.loads(line)
    except ValueError:
        return line[:200]
    exc = str(record.get("exception", ""))
    if not exc:
        return f"{record.get('event')}: {record.get('error', '')}"[:200]
    frames = [x.strip() for x in exc.splitlines() if x.strip().startswith("File ")]
    last = exc.strip().splitlines()[-1]
    return f"{record.get('event')} at {frames[-1] if frames else '?'}: {last}"[:300]


def _matches(line: str, frame: Frame) -> bool:
    """Whether a logged problem could come from this frame (same api and version)."""
    try:
        record = json.loads(line)
    except ValueError:
        return True
    if "api" not in record:
        return True
    if len(frame.payload) < 4:
        return False
    api_key, version = struct.unpack_from(">hh", frame.payload)
    return record["api"] == api.api_name(api_key) and record.get("api_version") in (None, version)


def run(options: Options, out: Callable[[str], None] = print) -> Report:
    return asyncio.run(Run(options, out).execute())


def replay(payload_hex: str, out: Callable[[str], None] = print) -> int:
    """Send one frame (hex, without its size prefix) to a fresh broker; report."""

    async def main() -> int:
        runner = Run(Options(frames=0), out)
        runner.broker.start()
        try:
            await runner.setup()
            runner.scanner.skip_to_end()
            payload = bytes.fromhex(payload_hex)
            api_key, version, cid = struct.unpack_from(">hhi", payload)
            frame = Frame(payload, api_key, version, cid, mutation="replay")
            conn = await Conn.open(runner.broker)
            outcome, reply = await exchange(conn, frame, random.Random(0), 10.0)
            conn.close()
            out(f"outcome: {outcome}")
            if reply is not None:
                out(f"reply: {reply.hex()}")
                out(f"reply check: {reply_problem(payload, reply, runner.api_ranges) or 'ok'}")
            await asyncio.sleep(0.05)
            problems, _ = runner.scanner.scan()
            for line in problems:
                out(f"log: {line}")
            health = await runner.health()
            out(f"health: {health or 'ok'}")
            return 0 if not problems and health is None else 1
        finally:
            if runner.broker.running:
                runner.broker.stop()
            if runner._tmp is not None:
                shutil.rmtree(runner._tmp, ignore_errors=True)

    return asyncio.run(main())
