"""Who is on the other end of a connection: Kafka's principal and security context.

Each connection gets a `SecurityContext` when it is accepted (and, on an SSL listener,
once its TLS handshake is done): the listener it came in on, that listener's security
protocol and the authenticated `KafkaPrincipal`. Requests carry it (server.RequestContext)
so that authorization (KIP-11's ACLs) and SASL can build on it.

The principal follows Kafka's DefaultKafkaPrincipalBuilder: a TLS client that presented
a certificate is `User:<its subject DN>` in RFC 2253 form (X500Principal.getName(), as
`ssl.principal.mapping.rules=DEFAULT` leaves it, e.g. `User:CN=alice,OU=eng,O=Acme`);
any other connection is `User:ANONYMOUS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Kafka's SecurityProtocol names.
PLAINTEXT = "PLAINTEXT"
SSL = "SSL"
SASL_PLAINTEXT = "SASL_PLAINTEXT"
SASL_SSL = "SASL_SSL"
SECURITY_PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)


@dataclass(frozen=True, slots=True)
class KafkaPrincipal:
    """Kafka's KafkaPrincipal: a type ("User") and a name; `str()` is `User:name`."""

    principal_type: str
    name: str

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"


ANONYMOUS = KafkaPrincipal("User", "ANONYMOUS")


@dataclass(frozen=True, slots=True)
class SecurityContext:
    """What the broker knows of a connection's security: listener, protocol, principal.

    `tls_version` and `cipher` are set on SSL listeners (for logs and later checks).
    """

    listener: str
    security_protocol: str
    principal: KafkaPrincipal = ANONYMOUS
    tls_version: str | None = None
    cipher: str | None = None


PLAINTEXT_CONTEXT = SecurityContext(PLAINTEXT, PLAINTEXT)

# RFC 2253's keywords for the attributes Java names in X500Principal.getName(); Python's
# ssl module reports OpenSSL's long names.
_RFC2253_KEYWORDS = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
# Other attributes Java writes as their dotted OID (values as text here, not Java's
# `#<hex of the DER value>`).
_OIDS = {
    "emailAddress": "1.2.840.113549.1.9.1",
    "serialNumber": "2.5.4.5",
    "title": "2.5.4.12",
    "surname": "2.5.4.4",
    "givenName": "2.5.4.42",
    "initials": "2.5.4.43",
    "generationQualifier": "2.5.4.44",
    "dnQualifier": "2.5.4.46",
    "pseudonym": "2.5.4.65",
    "postalCode": "2.5.4.17",
    "businessCategory": "2.5.4.15",
}


def _escape(value: str) -> str:
    """An attribute value escaped as RFC 2253 section 2.4 says."""
    out = []
    for i, ch in enumerate(value):
        if ch in ',+"\\<>;' or (i == 0 and ch in "# ") or (i == len(value) - 1 and ch == " "):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def subject_dn(subject: Any) -> str:
    """A certificate subject, as `ssl.SSLSocket.getpeercert()["subject"]` gives it (the
    RDNs in certificate order), in RFC 2253 form: last RDN first, `,` between RDNs and
    `+` within one."""
    rdns = []
    for rdn in reversed(tuple(subject)):
        parts = []
        for attr, value in rdn:
            keyword = _RFC2253_KEYWORDS.get(attr) or _OIDS.get(attr) or str(attr)
            parts.append(f"{keyword}={_escape(str(value))}")
        rdns.append("+".join(parts))
    return ",".join(rdns)


def principal_of_peer_cert(peercert: Mapping[str, Any] | None) -> KafkaPrincipal:
    """The principal of a TLS peer: its subject DN if it presented a (verified)
    certificate, else ANONYMOUS (Kafka's DefaultKafkaPrincipalBuilder)."""
    if not peercert or not peercert.get("subject"):
        return ANONYMOUS
    return KafkaPrincipal("User", subject_dn(peercert["subject"]))
