"""docker-compose.cluster.yml: three brokers on one PostgreSQL, wired as they must be.

No Docker engine runs here or in CI: these tests read the file (and the Makefile) and
check its wiring against spool itself, as tests/unit/test_compose.py does for the
single-broker docker-compose.yml. Each broker's command and environment parse with
spool's own CLI parser and config loader, and what they configure is read back from
spool's objects: the storage URL names the postgres service with its user and database
and no password; the password comes from the file the postgres service was initialised
with, on a volume both mount, generated once by the `pg-password` service; node ids are
distinct; each broker's EXTERNAL listener is published on the host's loopback on a port
of its own and advertised as that port, its PLAINTEXT listener advertised under its
service name (for containers); every broker waits for a healthy postgres, whose
healthcheck needs its TCP server; the pipeline's compact and audit read the brokers'
database with the same password file on Spark's standalone cluster; the Makefile's
compose targets name this file by default and docker-compose.yml on request.
tests/integration/test_compose_cluster.py runs the same brokers as processes.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.unit.test_compose import (
    REPO_ROOT,
    SPARK_ARGUMENT_CLASSES,
    commands_of,
    container_ports,
    flag_values,
    healthcheck_command,
    interpolate,
    mounts,
    parse_dockerfile,
    parse_spool,
    published_host_ips,
    spark_class_bytes,
)

yaml = pytest.importorskip("yaml")

CLUSTER_FILE = REPO_ROOT / "docker-compose.cluster.yml"
SINGLE_FILE = REPO_ROOT / "docker-compose.yml"
MAKEFILE = REPO_ROOT / "Makefile"
POSTGRES_PORT = 5432


def load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict) and data.get("services"), f"{path.name} has no services"
    result: dict[str, Any] = interpolate(data)
    return result


CLUSTER = load(CLUSTER_FILE)
SERVICES: dict[str, dict[str, Any]] = CLUSTER["services"]


def brokers() -> dict[str, dict[str, Any]]:
    """The services that run `spool serve`."""
    found = {
        name: s
        for name, s in SERVICES.items()
        if commands_of(s) and commands_of(s)[0][:2] == ["spool", "serve"]
    }
    assert found, "no service runs spool serve"
    return found


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(entry.partition("=")[::2] for entry in env)
    return {str(k): str(v) for k, v in env.items()}


def broker_config(service: dict[str, Any]) -> tuple[Any, Any]:
    """(the parsed command, the BrokerConfig) a broker service starts with: its command
    and environment read by spool's CLI and config loader, as `spool serve` reads them."""
    from broker.cli import apply_listen_shorthands, apply_node_id
    from broker.config import BrokerConfig, load_static

    args = parse_spool(commands_of(service)[0])
    static = load_static(args.config, args.set, environ=environment(service))
    apply_listen_shorthands(static, args.listen, args.advertise)
    apply_node_id(static, args.node_id)
    if args.storage is not None:
        static["storage"] = args.storage
    return args, BrokerConfig(static)


def listeners(service: dict[str, Any]) -> dict[str, Any]:
    from broker.listeners import listeners_from_config

    return {lc.name: lc for lc in listeners_from_config(broker_config(service)[1])}


def volume_at(service: dict[str, Any], path: str) -> str:
    """The named volume mounted at the directory holding `path`."""
    for kind, source, target in mounts(service):
        if kind == "volume" and (path == target or path.startswith(target.rstrip("/") + "/")):
            return source
    raise AssertionError(f"nothing is mounted at {path}")


def generator_script() -> str:
    """The shell script pg-password runs (`sh -c SCRIPT`)."""
    command = [str(a) for a in SERVICES["pg-password"]["command"]]
    assert command[:2] == ["sh", "-c"] and len(command) == 3, command
    return command[2]


def password_file() -> str:
    return environment(SERVICES["postgres"])["POSTGRES_PASSWORD_FILE"]


# ------------------------------------------------------------------ services


def test_cluster_has_postgres_three_brokers_spark_and_the_pipeline() -> None:
    assert {"postgres", "spark-master", "spark-worker", "pipeline"} <= set(SERVICES)
    assert sorted(brokers()) == ["broker-1", "broker-2", "broker-3"]
    assert CLUSTER.get("name") == "spool-cluster"  # its volumes apart from the single's


def test_every_service_builds_the_project_image_or_pins_an_image() -> None:
    single = load(SINGLE_FILE)["services"]
    for name, service in SERVICES.items():
        if "build" in service:
            assert service["build"] == single["broker"]["build"], name
            assert service["image"] == single["broker"]["image"], name
        else:
            assert ":" in service["image"] and not service["image"].endswith(":latest"), name
    assert SERVICES["postgres"]["image"] == "postgres:15"


def test_spark_master_and_worker_are_the_single_files() -> None:
    """The same Spark (version, commands) as docker-compose.yml, whose tests check the
    launcher classes and the pyspark version; the worker's executors write the audit
    where the driver names it."""
    single = load(SINGLE_FILE)["services"]
    assert SERVICES["spark-master"] == single["spark-master"]
    assert commands_of(SERVICES["spark-worker"]) == commands_of(single["spark-worker"])
    for name in ("spark-master", "spark-worker"):
        argv = commands_of(SERVICES[name])[0]
        constants = spark_class_bytes(SPARK_ARGUMENT_CLASSES[argv[1]])
        assert all(f.encode() in constants for f in argv[2:] if f.startswith("--"))
    assert SERVICES["spark-worker"]["healthcheck"]["disable"] is True


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_volumes_are_declared_and_dependencies_are_services(name: str) -> None:
    service = SERVICES[name]
    for kind, source, target in mounts(service):
        assert kind == "volume" and target.startswith("/"), f"{name}: {source}:{target}"
        assert source in (CLUSTER.get("volumes") or {}), f"{name}: {source} not declared"
    assert set(service.get("depends_on", [])) <= set(SERVICES)


# ------------------------------------------------------------------ postgres


def test_postgres_keeps_its_data_on_a_named_volume_and_is_checked_over_tcp() -> None:
    postgres = SERVICES["postgres"]
    assert volume_at(postgres, "/var/lib/postgresql/data") in CLUSTER["volumes"]
    test = postgres["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1] == "pg_isready", test
    flags = flag_values(test)
    # The entrypoint's first-start server (running the init scripts) listens on no TCP
    # port: a check over the Unix socket would pass before the real server is up.
    assert flags["--host"] == "127.0.0.1"
    env = environment(postgres)
    assert flags["--username"] == env["POSTGRES_USER"]
    assert flags["--dbname"] == env["POSTGRES_DB"]
    assert "ports" not in postgres, "only the brokers and the pipeline reach the database"


def test_the_password_is_generated_once_into_a_file_never_written_in_the_file() -> None:
    text = CLUSTER_FILE.read_text()
    assert "POSTGRES_PASSWORD:" not in text and "PGPASSWORD" not in text
    secret = password_file()
    generator = SERVICES["pg-password"]
    assert volume_at(generator, secret) == volume_at(SERVICES["postgres"], secret)
    deps = SERVICES["postgres"]["depends_on"]
    assert deps["pg-password"]["condition"] == "service_completed_successfully"
    assert generator["healthcheck"]["disable"] is True
    assert secret in generator_script()


def generate_password(directory: Path) -> Path:
    """Run pg-password's own script with its secrets directory moved to `directory`
    (`python3` the running interpreter); the password file it wrote."""
    if shutil.which("sh") is None:
        pytest.skip("no sh")
    secret = password_file()
    script = generator_script().replace(str(Path(secret).parent), str(directory))
    bindir = directory / "bin"
    bindir.mkdir(exist_ok=True)
    if not (bindir / "python3").exists():
        (bindir / "python3").symlink_to(Path(sys.executable))
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    result = subprocess.run(
        ["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""  # never printed
    return directory / Path(secret).name


def test_the_generator_writes_a_private_password_and_keeps_it(tmp_path: Path) -> None:
    """pg-password's own command run twice, as on two starts of the cluster."""
    path = generate_password(tmp_path)
    password = path.read_text()
    assert len(password.strip()) >= 24
    assert password.strip() == password.splitlines()[0]
    assert (path.stat().st_mode & 0o777) == 0o600
    assert generate_password(tmp_path).read_text() == password, "a later start keeps it"


# ------------------------------------------------------------------ the brokers


def test_every_broker_stores_in_the_postgres_service_without_a_password_in_its_url() -> None:
    postgres = environment(SERVICES["postgres"])
    for name, service in brokers().items():
        _, config = broker_config(service)
        url = urlsplit(str(config.get("storage")))
        assert url.scheme == "postgresql", name
        assert url.hostname == "postgres" and "postgres" in SERVICES, name
        assert (url.port or POSTGRES_PORT) == POSTGRES_PORT, name
        assert url.username == postgres["POSTGRES_USER"], name
        assert url.path.lstrip("/") == postgres["POSTGRES_DB"], name
        assert url.password is None, f"{name}: a password on the command line"
        # The password from the file postgres was initialised with, on the same volume.
        assert config.get("storage.password.file") == password_file(), name
        assert volume_at(service, password_file()) == volume_at(
            SERVICES["postgres"], password_file()
        )
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy", name
        assert "healthcheck" in SERVICES["postgres"]


def test_node_ids_and_data_dirs_are_distinct() -> None:
    ids, volumes = [], []
    for service in brokers().values():
        args, config = broker_config(service)
        ids.append(config.get("node.id"))
        volumes.append(volume_at(service, str(args.data_dir)))
    assert sorted(ids) == [1, 2, 3]
    assert len(set(volumes)) == 3, volumes


def test_each_broker_is_published_on_loopback_on_its_own_port_and_advertises_it() -> None:
    seen: set[str] = set()
    for name, service in brokers().items():
        by_name = listeners(service)
        external = by_name["EXTERNAL"]
        assert external.host == "0.0.0.0", "a container must listen beyond loopback"
        assert published_host_ips(service) == ["127.0.0.1"], name
        [(host_port, container_port)] = container_ports(service)
        assert container_port == external.port, f"{name}: publishes a port nothing serves"
        assert (external.advertised_host, external.advertised_port) == (
            "localhost",
            int(str(host_port)),
        ), f"{name}: clients on the host are told another address than the published one"
        seen.add(str(host_port))
    assert seen == {"9092", "9093", "9094"}


def test_each_broker_advertises_its_service_name_to_the_other_brokers() -> None:
    """The inter-broker listener (PLAINTEXT here, on the compose network only) is told
    to the others under the broker's service name, which resolves on that network."""
    from broker.listeners import inter_broker_listener, listeners_from_config

    for name, service in brokers().items():
        config = broker_config(service)[1]
        inter = inter_broker_listener(config, listeners_from_config(config), True)
        internal = listeners(service)[inter]
        assert internal.security_protocol == "PLAINTEXT"
        assert (internal.advertised_host, internal.advertised_port) == (name, internal.port)
        assert internal.port != listeners(service)["EXTERNAL"].port


def test_the_images_health_check_probes_every_brokers_external_listener() -> None:
    probe = healthcheck_command()[-1]
    host, _, port = probe.rpartition(":")
    for name, service in brokers().items():
        assert "healthcheck" not in service, f"{name}: the image's check applies"
        external = listeners(service)["EXTERNAL"]
        assert (host, int(port)) == ("127.0.0.1", external.port), name
        assert service.get("stop_signal") == "SIGTERM"


# ------------------------------------------------------------------ the pipeline


def test_pipeline_compacts_then_audits_the_brokers_database() -> None:
    pipeline = SERVICES["pipeline"]
    steps = commands_of(pipeline)
    assert [argv[:2] for argv in steps] == [["spool", "compact"], ["spool", "audit"]]
    urls = {str(broker_config(s)[1].get("storage")) for s in brokers().values()}
    assert len(urls) == 1, urls
    for argv in steps:
        args = parse_spool(argv)
        assert args.storage == next(iter(urls)), shlex.join(argv)
        assert args.data_dir is None
        assert str(args.storage_password_file) == password_file()
        assert args.master == "spark://spark-master:7077"
    assert volume_at(pipeline, password_file()) == volume_at(SERVICES["postgres"], password_file())
    out = str(parse_spool(steps[1]).out)
    worker = SERVICES["spark-worker"]
    assert volume_at(pipeline, out) == volume_at(worker, out), "executors write the audit"
    for name in brokers():
        assert pipeline["depends_on"][name]["condition"] == "service_healthy"
    assert pipeline["profiles"] == ["pipeline"]
    assert pipeline["hostname"] == environment(pipeline)["SPARK_LOCAL_IP"] == "pipeline"


def test_the_image_has_the_jdbc_driver_the_jobs_look_for() -> None:
    from persister.spark.pg import DEBIAN_JAR

    installs = " ".join(i.args for i in parse_dockerfile().all("RUN"))
    assert "libpostgresql-jdbc-java" in installs
    assert DEBIAN_JAR == "/usr/share/java/postgresql.jar"  # where that package puts it
    makefile = MAKEFILE.read_text()
    assert "JDBC_PKG := libpostgresql-jdbc-java" in makefile
    assert f"JDBC_JAR := {DEBIAN_JAR}" in makefile


# ------------------------------------------------------------------ make


def make_dry_run(*args: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("no make")
    result = subprocess.run(
        ["make", "-n", "-C", str(REPO_ROOT), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if k not in ("STACK", "COMPOSE")},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_make_targets_run_the_cluster_by_default_and_the_single_broker_on_request() -> None:
    for target in ("compose-up", "compose-down", "pipeline", "pipeline-report"):
        assert f"docker compose -f {CLUSTER_FILE.name} " in make_dry_run(target), target
        single = make_dry_run(target, "STACK=single")
        assert f"docker compose -f {SINGLE_FILE.name} " in single, target
    assert "up -d --build --wait" in make_dry_run("compose-up")
    assert "--profile pipeline down" in make_dry_run("compose-down")
    assert "--profile pipeline run --rm pipeline" in make_dry_run("pipeline")
