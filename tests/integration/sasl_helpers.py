"""A broker with SASL listeners for the SASL tests (test_sasl_plain, test_cli_security):
PLAINTEXT on `port` (where the harness waits, and for the tests' admin helpers),
SASL_PLAINTEXT on `sasl_port` and SASL_SSL on `sasl_ssl_port` (the certificates of
tls_helpers), set with Kafka's `listeners` and per-listener JAAS keys."""

from __future__ import annotations

from pathlib import Path

from tests.integration.conftest import Broker, free_port
from tests.integration.tls_helpers import Certs

# PLAIN's users: admin and alice.
JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-secret" '
    'user_admin="admin-secret" user_alice="alice-secret";'
)
SCRAM_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


class SaslBroker(Broker):
    """PLAINTEXT on `port`, SASL_PLAINTEXT on `sasl_port`, SASL_SSL on `sasl_ssl_port`,
    with `mechanisms` enabled on both SASL listeners."""

    def __init__(self, root: Path, certs: Certs, mechanisms: tuple[str, ...] = ("PLAIN",)):
        settings = {
            "sasl.enabled.mechanisms": ",".join(mechanisms),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(certs.server),
        }
        for listener in ("sasl_plaintext", "sasl_ssl"):
            for mechanism in mechanisms:
                jaas = JAAS if mechanism == "PLAIN" else SCRAM_JAAS
                settings[f"listener.name.{listener}.{mechanism.lower()}.sasl.jaas.config"] = jaas
        super().__init__(root / "data", root / "broker.log", settings)
        self.sasl_port, self.sasl_ssl_port = free_port(), free_port()
        self.settings["listeners"] = (
            f"PLAINTEXT://127.0.0.1:{self.port},"
            f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_port},"
            f"SASL_SSL://127.0.0.1:{self.sasl_ssl_port}"
        )
