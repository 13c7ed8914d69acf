"""docker-compose.yml and the Dockerfile refer only to things that exist.

No Docker engine runs here or in CI, so nothing is built or started: these tests read
the files and check each reference against the project itself. Every service's image
or build, its command (a `spool` subcommand and flags parse with spool's own CLI parser;
a Spark class and its flags are in the Spark jars pyspark installs; a container path it
names is mounted), its volumes (named ones declared, bind sources present) and its
ports (published ports are what the command listens on or the image exposes); the
Dockerfile's COPY sources (present and not excluded by .dockerignore), its default
command and health check; and Apache's Spark image at the version of the installed
pyspark (a standalone master, worker and driver of different Spark versions do not
talk to each other). And who reaches the broker: its PLAINTEXT port published on the
host's loopback only, or, with docker-compose.sasl.yml on top, a SASL_PLAINTEXT listener
whose generated admin credential the broker and the admin tools both accept.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import io
import itertools
import json
import re
import shlex
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
SPARK_IMAGE = "apache/spark"
# Where Apache's image keeps Spark (its Dockerfile's SPARK_HOME).
SPARK_IMAGE_HOME = "/opt/spark"
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


# ------------------------------------------------------------------ reading the files


def interpolate(value: Any) -> Any:
    """Compose's `${VAR:-default}` with no variables set: the defaults."""
    if isinstance(value, str):
        return _INTERPOLATION.sub(lambda m: m.group(2) or "", value)
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    return value


def load_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict) and data.get("services"), "docker-compose.yml has no services"
    result: dict[str, Any] = interpolate(data)
    return result


@dataclass
class Instruction:
    keyword: str
    args: str
    heredoc: str | None = None


@dataclass
class Dockerfile:
    instructions: list[Instruction]
    heredocs: dict[str, str] = field(default_factory=dict)  # COPY <<EOF target -> text

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def one(self, keyword: str) -> Instruction:
        found = self.all(keyword)
        assert len(found) == 1, f"Dockerfile has {len(found)} {keyword} instructions, not 1"
        return found[0]


def parse_dockerfile(text: str | None = None) -> Dockerfile:
    """Instructions with continuation lines joined and comments dropped; a heredoc
    (`COPY <<'EOF' /path`) keeps its body."""
    lines = (DOCKERFILE.read_text() if text is None else text).splitlines()
    instructions: list[Instruction] = []
    heredocs: dict[str, str] = {}
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        while line.endswith("\\") and i < len(lines):
            nxt = lines[i].strip()
            i += 1
            if nxt.startswith("#"):
                continue
            line = line[:-1].rstrip() + " " + nxt
        keyword, _, args = line.partition(" ")
        instruction = Instruction(keyword.upper(), args.strip())
        marker = re.match(r"<<-?['\"]?(\w+)['\"]?\s+(\S+)$", instruction.args)
        if marker:
            end, target = marker.groups()
            body = []
            while i < len(lines) and lines[i] != end:
                body.append(lines[i])
                i += 1
            assert i < len(lines), f"heredoc {end} for {target} is never closed"
            i += 1
            instruction.heredoc = "\n".join(body) + "\n"
            heredocs[target] = instruction.heredoc
        instructions.append(instruction)
    return Dockerfile(instructions, heredocs)


def exec_form(args: str) -> list[str]:
    """A JSON-array (exec form) CMD/ENTRYPOINT/HEALTHCHECK CMD argument list."""
    parsed = json.loads(args)
    assert isinstance(parsed, list) and all(isinstance(a, str) for a in parsed), args
    return parsed


def healthcheck_command(dockerfile: Dockerfile | None = None) -> list[str]:
    """The HEALTHCHECK's exec-form command (options like --interval dropped)."""
    args = (dockerfile or parse_dockerfile()).one("HEALTHCHECK").args
    _, sep, command = args.partition("CMD ")
    assert sep, f"HEALTHCHECK without CMD: {args}"
    return exec_form(command.strip())


def healthcheck_script() -> str:
    """The body of the script the HEALTHCHECK runs (written by a COPY heredoc)."""
    dockerfile = parse_dockerfile()
    program = healthcheck_command(dockerfile)[0]
    for target, body in dockerfile.heredocs.items():
        if Path(target).name == program:
            return body
    raise AssertionError(f"the HEALTHCHECK runs {program}, which no COPY heredoc writes")


def dockerignore_patterns() -> list[str]:
    if not DOCKERIGNORE.exists():
        return []
    lines = (line.strip() for line in DOCKERIGNORE.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def ignored(path: str, patterns: list[str]) -> str | None:
    """The .dockerignore pattern that keeps `path` (or a folder above it) out of the
    build context, if any. Exclusions (`!`) are not used by this project."""
    parts = Path(path).parts
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    for pattern in patterns:
        assert not pattern.startswith("!"), "extend `ignored` for ! patterns"
        bare = pattern.removeprefix("**/")
        for prefix in prefixes:
            if fnmatch.fnmatch(prefix, pattern) or fnmatch.fnmatch(Path(prefix).name, bare):
                return pattern
    return None


# ------------------------------------------------------------------ what a command is


def spool_parser() -> argparse.ArgumentParser:
    from broker.cli import build_parser

    return build_parser()


def parse_spool(argv: list[str]) -> argparse.Namespace:
    """`spool ...` parsed by spool's own CLI parser; fails with argparse's message."""
    assert argv and argv[0] == "spool", argv
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return spool_parser().parse_args(argv[1:])
    except SystemExit:
        pytest.fail(f"`{shlex.join(argv)}` does not parse: {stderr.getvalue().strip()}")


def commands_of(service: dict[str, Any]) -> list[list[str]]:
    """The argv lists a service runs: its command, or each `&&` step of `sh -c`."""
    command = service.get("command")
    if command is None:
        return []
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    if argv[:2] == ["sh", "-c"]:
        return [shlex.split(step) for step in argv[2].split("&&")]
    return [argv]


def flag_values(argv: list[str]) -> dict[str, str]:
    values = {}
    for flag, value in itertools.pairwise(argv):
        if flag.startswith("--") and not value.startswith("--"):
            values[flag] = value
    return values


def spark_jars() -> Path:
    pyspark = pytest.importorskip("pyspark")
    return Path(pyspark.__file__).parent / "jars"


def spark_class_bytes(class_name: str) -> bytes:
    """The compiled class from the Spark jars pyspark installed; fails if it is absent."""
    member = class_name.replace(".", "/") + ".class"
    for jar in sorted(spark_jars().glob("spark-*.jar")):
        with zipfile.ZipFile(jar) as archive:
            if member in archive.namelist():
                return archive.read(member)
    pytest.fail(f"no Spark jar pyspark installed has {class_name}")


# Each launcher class's flags live as string constants in its arguments parser.
SPARK_ARGUMENT_CLASSES = {
    "org.apache.spark.deploy.master.Master": "org.apache.spark.deploy.master.MasterArguments",
    "org.apache.spark.deploy.worker.Worker": "org.apache.spark.deploy.worker.WorkerArguments",
}


def mounts(service: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(kind 'volume' or 'bind', source, container path) of each volume entry."""
    for entry in service.get("volumes", []):
        if isinstance(entry, dict):
            kind, source, target = entry["type"], str(entry["source"]), str(entry["target"])
        else:
            source, _, rest = str(entry).partition(":")
            target = rest.split(":")[0]
            kind = "bind" if source.startswith((".", "/", "~")) else "volume"
        yield kind, source, target


def container_ports(service: dict[str, Any]) -> list[tuple[str | None, int]]:
    """(host port or None, container port) of each `ports` entry."""
    result: list[tuple[str | None, int]] = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            host = entry.get("published")
            result.append((str(host) if host is not None else None, int(entry["target"])))
            continue
        parts = str(entry).split("/")[0].split(":")
        result.append((parts[-2] if len(parts) > 1 else None, int(parts[-1])))
    return result


def uses_project_image(service: dict[str, Any]) -> bool:
    return "build" in service


def endpoint_port(value: str) -> int:
    return int(value.rpartition(":")[2])


# ------------------------------------------------------------------ the tests


COMPOSE = load_compose() if COMPOSE_FILE.exists() else {"services": {}}
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]


def test_compose_has_the_broker_spark_cluster_and_pipeline() -> None:
    assert {"broker", "spark-master", "spark-worker", "pipeline"} <= set(SERVICES)


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_has_an_image_or_a_build_that_exists(name: str) -> None:
    service = SERVICES[name]
    assert "image" in service or "build" in service, f"{name}: neither image nor build"
    if "build" in service:
        build = service["build"]
        context = REPO_ROOT / (build if isinstance(build, str) else build.get("context", "."))
        dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "")
        assert context.is_dir(), f"{name}: build context {context} does not exist"
        assert (context / (dockerfile or "Dockerfile")).is_file(), f"{name}: no {dockerfile}"
    else:
        assert ":" in service["image"], f"{name}: image {service['image']} has no pinned tag"


def test_services_built_from_the_project_share_one_image_name() -> None:
    names = {s.get("image") for s in SERVICES.values() if uses_project_image(s)}
    assert len(names) == 1 and None not in names, names


def test_spark_image_is_the_installed_pyspark_version() -> None:
    pyspark = pytest.importorskip("pyspark")
    installed = tuple(pyspark.__version__.split(".")[:2])
    images = [s["image"] for s in SERVICES.values() if s.get("image", "").startswith(SPARK_IMAGE)]
    assert images, f"no service runs {SPARK_IMAGE}"
    for image in images:
        tag = image.partition(":")[2]
        assert tuple(tag.split("-")[0].split(".")[:2]) == installed, (
            f"{image} is not Spark {'.'.join(installed)}, the pyspark installed "
            "(pyproject): the driver's Spark must match the cluster's"
        )


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_service_commands_exist(name: str) -> None:
    """`spool` steps parse with the CLI parser; Spark launcher classes and their flags
    are in Spark's jars; container paths a step names are mounted (or /tmp, or inside
    Apache's Spark install for its image)."""
    service = SERVICES[name]
    steps = commands_of(service)
    assert steps, f"{name}: no command"
    mounted = [target for _, _, target in mounts(service)]
    for argv in steps:
        if argv[0] == "spool":
            args = parse_spool(argv)
            assert getattr(args, "run", None), f"{name}: `{shlex.join(argv)}` runs nothing"
        else:
            launcher = argv[0]
            if uses_project_image(service):
                assert launcher == "spark-class", f"{name}: {launcher} is not in the image"
                assert (spark_jars().parent / "bin" / "spark-class").is_file()
            else:
                assert launcher == f"{SPARK_IMAGE_HOME}/bin/spark-class", launcher
            main_class = argv[1]
            spark_class_bytes(main_class)
            constants = spark_class_bytes(SPARK_ARGUMENT_CLASSES[main_class])
            for flag in (a for a in argv[2:] if a.startswith("--")):
                assert flag.encode() in constants, f"{name}: {main_class} has no {flag}"
        for value in argv[1:]:
            if not value.startswith("/") or value.startswith(SPARK_IMAGE_HOME):
                continue
            # Scratch space: /tmp, or the home the Dockerfile gives the image's user.
            scratch = ("/tmp/", *(h + "/" for h in _user_homes()))
            assert value.startswith(scratch) or any(
                value == m or value.startswith(m + "/") for m in mounted
            ), f"{name}: {value} is neither a mounted volume nor scratch space"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_spark_master_urls_name_a_service_on_its_port(name: str) -> None:
    for argv in commands_of(SERVICES[name]):
        for value in argv:
            url = re.fullmatch(r"spark://([\w.-]+):(\d+)", value)
            if not url:
                continue
            host, port = url.group(1), url.group(2)
            assert host in SERVICES, f"{name}: {value} names no service"
            master = commands_of(SERVICES[host])[0]
            assert flag_values(master).get("--port") == port, f"{host} is not on port {port}"
            assert "org.apache.spark.deploy.master.Master" in master


def test_spark_hosts_are_the_service_names() -> None:
    """Master, worker and driver advertise names the others can resolve."""
    for name in ("spark-master", "spark-worker"):
        assert flag_values(commands_of(SERVICES[name])[0]).get("--host") == name
    pipeline = SERVICES["pipeline"]
    assert pipeline.get("hostname") == "pipeline"
    environment = pipeline.get("environment", {})
    # spool's Spark session advertises SPARK_LOCAL_IP as spark.driver.host.
    assert (
        environment.get("SPARK_LOCAL_IP") == environment.get("SPARK_LOCAL_HOSTNAME") == "pipeline"
    )


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_volumes_are_declared_or_bind_mount_project_paths(name: str) -> None:
    declared = set(COMPOSE.get("volumes") or {})
    for kind, source, target in mounts(SERVICES[name]):
        assert target.startswith("/"), f"{name}: mount target {target} is not absolute"
        if kind == "volume":
            assert source in declared, f"{name}: volume {source} is not declared"
        else:
            path = (REPO_ROOT / source).resolve()
            assert path.exists(), f"{name}: bind source {source} does not exist"
            assert path.is_relative_to(REPO_ROOT), f"{name}: {source} is outside the project"


def test_executors_see_the_drivers_files_at_the_same_paths() -> None:
    """The worker's executors read the data and write the audit output the driver
    names, so the worker mounts the pipeline's volumes at the same paths."""
    worker = {(s, t) for kind, s, t in mounts(SERVICES["spark-worker"]) if kind == "volume"}
    pipeline = {(s, t) for kind, s, t in mounts(SERVICES["pipeline"]) if kind == "volume"}
    assert pipeline and pipeline <= worker
    broker = set(mounts(SERVICES["broker"]))
    assert {("spool-data", "/data")} <= {(s, t) for _, s, t in broker}
    assert ("spool-data", "/data") in pipeline


def test_pipeline_runs_compact_then_audit_on_the_brokers_data() -> None:
    steps = commands_of(SERVICES["pipeline"])
    assert [argv[:2] for argv in steps] == [["spool", "compact"], ["spool", "audit"]]
    broker_data = flag_values(commands_of(SERVICES["broker"])[0])["--data-dir"]
    for argv in steps:
        args = parse_spool(argv)
        assert str(args.data_dir) == broker_data
        assert args.master == "spark://spark-master:7077"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_published_ports_are_what_the_service_listens_on(name: str) -> None:
    """A container port is a port flag of the command (--listen, --port, --webui-port)
    or, for the project image, one the Dockerfile EXPOSEs."""
    service = SERVICES[name]
    listening: set[int] = set()
    for argv in commands_of(service):
        for flag, value in flag_values(argv).items():
            if flag in ("--listen", "--port", "--webui-port"):
                listening.add(endpoint_port(value))
    exposed = {
        int(p.split("/")[0])
        for i in parse_dockerfile().all("EXPOSE")
        for p in i.args.split()
        if uses_project_image(service)
    }
    for _, port in container_ports(service):
        assert port in listening, f"{name}: publishes {port}, listens on {sorted(listening)}"
        if uses_project_image(service) and name == "broker":
            assert port in exposed, f"{name}: {port} is not EXPOSEd by the Dockerfile"
    for port in service.get("expose", []):
        assert int(port) in listening, f"{name}: exposes {port}, listens on {listening}"


def test_broker_advertises_the_port_published_on_the_host() -> None:
    broker = SERVICES["broker"]
    flags = flag_values(commands_of(broker)[0])
    host, _, port = flags["--advertise"].rpartition(":")
    published = {h: c for h, c in container_ports(broker)}
    assert host == "localhost"
    assert published.get(port) == endpoint_port(flags["--listen"]), (
        f"clients on the host are told {flags['--advertise']}, which is not published"
    )
    assert flags["--listen"].startswith("0.0.0.0:"), "a container must listen beyond loopback"


def test_only_the_broker_keeps_the_images_broker_health_check() -> None:
    for name, service in SERVICES.items():
        if uses_project_image(service) and name != "broker":
            assert service.get("healthcheck", {}).get("disable") is True, (
                f"{name} runs the spool image without a broker: its health check must be off"
            )
    pipeline_deps = SERVICES["pipeline"]["depends_on"]
    assert pipeline_deps["broker"]["condition"] == "service_healthy"
    assert set(pipeline_deps) <= set(SERVICES)


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_dependencies_are_services(name: str) -> None:
    deps = SERVICES[name].get("depends_on", [])
    assert set(deps) <= set(SERVICES), f"{name} depends on {set(deps) - set(SERVICES)}"


# ------------------------------------------------------------------ the Dockerfile


def test_dockerfile_copy_sources_exist_and_are_in_the_build_context() -> None:
    dockerfile = parse_dockerfile()
    patterns = dockerignore_patterns()
    copies = dockerfile.all("COPY") + dockerfile.all("ADD")
    assert copies
    for instruction in copies:
        if instruction.heredoc is not None:
            continue
        args = [a for a in shlex.split(instruction.args) if not a.startswith("--")]
        for source in args[:-1]:
            assert (REPO_ROOT / source).exists(), f"COPY {source}: no such file in the project"
            pattern = ignored(source, patterns)
            assert pattern is None, f"COPY {source} is excluded by .dockerignore ({pattern})"


def test_dockerfile_copies_every_package_the_project_installs() -> None:
    copied = {
        Path(a).name
        for i in parse_dockerfile().all("COPY")
        if i.heredoc is None
        for a in shlex.split(i.args)[:-1]
    }
    for package in ("protocol", "persister", "coordinator", "broker"):
        assert package in copied, f"the image would lack the {package} package"
    assert {"pyproject.toml", "README.md"} <= copied


def test_dockerfile_base_user_java_and_volume() -> None:
    dockerfile = parse_dockerfile()
    assert dockerfile.one("FROM").args.startswith("python:3.11-slim")
    user = dockerfile.all("USER")[-1].args
    assert user not in ("root", "0"), "the image must not run as root"
    assert any("openjdk-17-jre-headless" in i.args for i in dockerfile.all("RUN"))
    assert "9092" in dockerfile.one("EXPOSE").args.split()
    volumes = exec_form(dockerfile.one("VOLUME").args)
    args = parse_spool(exec_form(dockerfile.one("CMD").args))
    assert args.run.__name__ == "serve_command"
    assert [str(args.data_dir)] == volumes
    assert args.listen == ("0.0.0.0", 9092)


def test_healthcheck_probes_the_exposed_broker_port_with_a_script_the_image_writes() -> None:
    command = healthcheck_command()
    assert endpoint_port(command[-1]) == 9092
    script = healthcheck_script()
    compile(script, "spool-healthcheck", "exec")
    assert "from protocol.client import KafkaClient" in script


def _user_homes() -> list[str]:
    """The home directories the Dockerfile creates (`useradd --home-dir DIR`)."""
    import re

    return re.findall(r"--home-dir\s+(\S+)", DOCKERFILE.read_text())


# ------------------------------------------------------------------ who reaches the broker

SASL_COMPOSE_FILE = REPO_ROOT / "docker-compose.sasl.yml"


def published_host_ips(service: dict[str, Any]) -> list[str | None]:
    """The host address each `ports` entry binds (None: every interface)."""
    result: list[str | None] = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            result.append(entry.get("host_ip"))
            continue
        parts = str(entry).split("/")[0].split(":")
        result.append(parts[0] if len(parts) == 3 else None)
    return result


def test_the_plaintext_broker_port_is_published_on_the_hosts_loopback_only() -> None:
    """Anyone who reaches a PLAINTEXT port may do anything: docker-compose.yml
    publishes it on 127.0.0.1, not on every interface of the host."""
    ips = published_host_ips(SERVICES["broker"])
    assert ips and all(ip == "127.0.0.1" for ip in ips), ips


def merged_with_sasl() -> dict[str, Any]:
    """docker-compose.yml with docker-compose.sasl.yml on top, as `docker compose -f
    docker-compose.yml -f docker-compose.sasl.yml` merges them: a command replaces
    the base's, ports and volumes add to it, mappings merge."""
    base = load_compose()
    override = interpolate(yaml.safe_load(SASL_COMPOSE_FILE.read_text()))
    merged = {**base, "services": dict(base["services"])}
    for name, service in override["services"].items():
        target = dict(merged["services"].get(name, {}))
        for key, value in service.items():
            if key in ("ports", "volumes") and key in target:
                target[key] = [*target[key], *value]
            elif isinstance(value, dict) and isinstance(target.get(key), dict):
                target[key] = {**target[key], **value}
            else:
                target[key] = value
        merged["services"][name] = target
    merged["volumes"] = {**(base.get("volumes") or {}), **(override.get("volumes") or {})}
    return merged


def credentials_script() -> str:
    dockerfile = parse_dockerfile()
    for target, body in dockerfile.heredocs.items():
        if Path(target).name == "spool-credentials":
            return body
    raise AssertionError("no COPY heredoc writes spool-credentials")


def run_credentials(directory: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "spool-credentials"
    script.write_text(credentials_script())
    return subprocess.run(
        [sys.executable, str(script), str(directory)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )


def test_sasl_variant_generates_a_credential_the_broker_and_the_tools_agree_on(
    tmp_path: Path,
) -> None:
    from broker.config import BrokerConfig, load_static
    from broker.listeners import listeners_from_config, sasl_from_config
    from broker.sasl import plain_authenticate
    from broker.tools.common import read_properties, security_settings

    secrets_dir = tmp_path / "secrets"
    first = run_credentials(secrets_dir, tmp_path)
    broker_toml, client = secrets_dir / "broker.toml", secrets_dir / "admin.properties"
    assert (broker_toml.stat().st_mode & 0o777) == 0o600
    assert (client.stat().st_mode & 0o777) == 0o600

    props = read_properties(client)
    password = props["sasl.password"]
    assert len(password) >= 24
    assert password not in first.stdout + first.stderr
    security = security_settings(props)
    assert (security.protocol, security.mechanism, security.username) == (
        "SASL_PLAINTEXT",
        "PLAIN",
        "admin",
    )

    # The broker's command as the merged compose file gives it, with that config.
    broker = merged_with_sasl()["services"]["broker"]
    args = parse_spool(commands_of(broker)[0])
    assert str(args.config) == "/secrets/broker.toml"
    settings = load_static(broker_toml, args.set, environ={})
    config = BrokerConfig(settings)
    by_name = {listener.name: listener for listener in listeners_from_config(config)}
    assert by_name["SASL_PLAINTEXT"].security_protocol == "SASL_PLAINTEXT"
    assert by_name["SASL_PLAINTEXT"].port == 9093
    assert by_name["PLAINTEXT"].port == 9092  # the image's health check probes it
    assert str(settings["super.users"]) == "User:admin"
    assert "StandardAuthorizer" in str(settings["authorizer.class.name"])
    users = sasl_from_config(config, "SASL_PLAINTEXT").plain_users
    assert plain_authenticate(f"\x00admin\x00{password}".encode(), users) == "admin"

    # A later start keeps the credential.
    second = run_credentials(secrets_dir, tmp_path)
    assert "keeping" in second.stdout
    assert read_properties(client)["sasl.password"] == password


def test_sasl_variant_services_fit_together() -> None:
    merged = merged_with_sasl()
    services = merged["services"]
    broker, credentials = services["broker"], services["credentials"]
    # The SASL port is published on every interface and advertised on that port.
    published = dict(zip(published_host_ips(broker), container_ports(broker), strict=True))
    assert published[None] == ("9093", 9093)
    assert published["127.0.0.1"] == ("9092", 9092)
    advertised = next(
        v.partition("=")[2] for v in broker["command"] if v.startswith("advertised.listeners=")
    )
    assert "SASL_PLAINTEXT://localhost:9093" in advertised.split(",")
    exposed = parse_dockerfile().one("EXPOSE").args.split()
    assert {"9092", "9093"} <= set(exposed)
    # The credentials are written where the broker reads them, before it starts.
    assert broker["depends_on"]["credentials"]["condition"] == "service_completed_successfully"
    volume_of = {t: s for _, s, t in mounts(credentials)}
    assert ("volume", volume_of["/secrets"], "/secrets") in set(mounts(broker))
    assert volume_of["/secrets"] in merged["volumes"]
    assert commands_of(credentials)[0][:2] == ["spool-credentials", "/secrets"]
    assert credentials.get("image") == services["broker"].get("image")
    assert credentials["build"] == services["broker"]["build"]
    assert credentials["healthcheck"]["disable"] is True
    compile(credentials_script(), "spool-credentials", "exec")
    # The image makes /secrets for its non-root user (a new volume copies that).
    assert "/secrets" in " ".join(i.args for i in parse_dockerfile().all("RUN"))
