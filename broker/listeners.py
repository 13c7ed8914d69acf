"""Kafka's listeners: where the broker listens, what it advertises, and with what security.

`listeners` is a comma-separated list of `NAME://host:port` (several at once, each with
its own name and port), `advertised.listeners` what clients of each listener are told
(Metadata, FindCoordinator and DescribeCluster answer the endpoint of the listener a
request came in on, as Kafka does), and `listener.security.protocol.map` the security
protocol of each name. They are checked as Kafka's KafkaConfig checks them; any problem
is a KafkaError(INVALID_CONFIG) at startup naming the listener and the key.

SSL listeners take Kafka's `ssl.*` keys (SslConfigs), broker-wide or per listener as
`listener.name.<lower-cased name>.ssl.*`, with PEM key and trust stores (KIP-651):
`ssl.keystore.location` (a PEM file holding the chain and the private key), or
`ssl.keystore.certificate.chain` and `ssl.keystore.key` as PEM text; the trust store
from `ssl.truststore.location` or `ssl.truststore.certificates`. SASL_SSL listeners take
the same keys.

SASL listeners (SASL_PLAINTEXT, SASL_SSL) take `sasl.enabled.mechanisms` (per listener
as `listener.name.<name>.sasl.enabled.mechanisms`) and, for each enabled mechanism, the
JAAS entry `listener.name.<name>.<mechanism>.sasl.jaas.config`, as Kafka's brokers do;
PLAIN users may come instead from a JAAS file named by `java.security.auth.login.config`
(Kafka's JVM property of that name).
spool has PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512: GSSAPI (Kafka's default) and
OAUTHBEARER are refused at startup. SCRAM users are in the cluster metadata (created
with `spool users` or `spool format --add-scram`), so the SCRAM JAAS entry
(ScramLoginModule) is optional and has no options the broker reads.
`connections.max.reauth.ms` (KIP-368) is per listener too.

Brokers sharing a storage database reach each other on the inter-broker listener
(`inter_broker_client`): `inter.broker.listener.name`, else the listener named after
`security.inter.broker.protocol`, of any security protocol. This broker's client to the
others takes that listener's own keys, as Kafka's inter-broker channel builder does: its
trust store, its key store when `ssl.client.auth` asks for a certificate,
`ssl.endpoint.identification.algorithm`, and on SASL `sasl.mechanism.inter.broker.protocol`
with the username and password of the listener's JAAS entry for it.
"""

from __future__ import annotations

import ipaddress
import os
import re
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field

from broker import sasl
from broker.config import BrokerConfig
from broker.security import PLAINTEXT, SASL_PLAINTEXT, SASL_SSL, SECURITY_PROTOCOLS, SSL
from protocol.client import ClientSecurity, SecurityConfigError
from protocol.errors import ErrorCode, KafkaError

# Kafka's EndPoint URI: NAME://host:port, IPv6 hosts in brackets.
_ENDPOINT = re.compile(r"^(.*)://\[?([0-9a-zA-Z\-%._:]*)\]?:(-?[0-9]+)$")
_WILDCARDS = ("", "0.0.0.0", "::")
_TLS_VERSIONS = {
    "TLSv1.2": ssl.TLSVersion.TLSv1_2,
    "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}


def _invalid(message: str) -> KafkaError:
    return KafkaError(ErrorCode.invalid_config, message)


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """One `NAME://host:port` of listeners or advertised.listeners."""

    name: str
    host: str
    port: int


def parse_endpoints(text: str | None, key: str) -> list[EndpointSpec]:
    """The entries of `listeners` or `advertised.listeners`; names upper-cased as
    Kafka's ListenerName normalises them."""
    out = []
    for entry in (e.strip() for e in (text or "").split(",")):
        if not entry:
            continue
        match = _ENDPOINT.match(entry)
        if match is None:
            raise _invalid(
                f"Invalid {key} entry {entry!r}: expected NAME://host:port, e.g. "
                "PLAINTEXT://127.0.0.1:9092 (IPv6 hosts in brackets)"
            )
        name, host, port = match.group(1).upper(), match.group(2), int(match.group(3))
        if not name:
            raise _invalid(f"Invalid {key} entry {entry!r}: the listener name is empty")
        if not 0 <= port <= 65535:
            raise _invalid(f"Invalid {key} entry {entry!r}: port must be 0-65535")
        out.append(EndpointSpec(name, host, port))
    return out


def parse_protocol_map(text: str | None) -> dict[str, str]:
    """`listener.security.protocol.map`: NAME:PROTOCOL,... -> {NAME: PROTOCOL}."""
    out: dict[str, str] = {}
    for entry in (e.strip() for e in (text or "").split(",")):
        if not entry:
            continue
        name, sep, protocol = entry.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not name:
            raise _invalid(
                f"Invalid listener.security.protocol.map entry {entry!r}: expected "
                "NAME:PROTOCOL, e.g. EXTERNAL:SSL"
            )
        if protocol not in SECURITY_PROTOCOLS:
            raise _invalid(
                f"Invalid listener.security.protocol.map entry {entry!r}: the security "
                f"protocol must be one of {', '.join(SECURITY_PROTOCOLS)}"
            )
        if name in out:
            raise _invalid(f"listener.security.protocol.map names listener {name} twice")
        out[name] = protocol
    return out


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """The ssl.* keys of one listener."""

    listener: str
    keystore_location: str | None = None
    keystore_chain: str | None = None
    # A private key and its password: never in a repr (a listener may be logged).
    keystore_key: str | None = field(default=None, repr=False)
    key_password: str | None = field(default=None, repr=False)
    truststore_location: str | None = None
    truststore_certificates: str | None = None
    client_auth: str = "none"
    enabled_protocols: tuple[str, ...] = ("TLSv1.2", "TLSv1.3")

    @classmethod
    def from_config(cls, config: BrokerConfig, listener: str) -> TlsSettings:
        def get(key: str) -> str | None:
            value = config.for_listener(listener, key)
            return None if value is None or value == "" else str(value)

        prefix = f"listener.name.{listener.lower()}."
        has_truststore = (
            get("ssl.truststore.location") is not None
            or get("ssl.truststore.certificates") is not None
        )
        for store, used in (("keystore", True), ("truststore", has_truststore)):
            kind = (get(f"ssl.{store}.type") or "JKS").upper()
            if used and kind != "PEM":
                raise _invalid(
                    f"Listener {listener}: ssl.{store}.type is {kind}; spool reads PEM "
                    f"stores only: set ssl.{store}.type=PEM (or {prefix}ssl.{store}.type)"
                )
            if get(f"ssl.{store}.password") is not None:
                # Kafka's DefaultSslEngineFactory refuses a store password with PEM.
                raise _invalid(
                    f"Listener {listener}: ssl.{store}.password cannot be used with PEM "
                    "stores (an encrypted private key takes ssl.key.password)"
                )
        location, chain, key = (
            get("ssl.keystore.location"),
            get("ssl.keystore.certificate.chain"),
            get("ssl.keystore.key"),
        )
        if location is not None and (chain is not None or key is not None):
            raise _invalid(
                f"Listener {listener}: set ssl.keystore.location or "
                "ssl.keystore.certificate.chain with ssl.keystore.key, not both"
            )
        if location is None and (chain is None or key is None):
            raise _invalid(
                f"Listener {listener} is SSL but has no key store: set "
                "ssl.keystore.location (a PEM file with the certificate chain and the "
                "private key) or ssl.keystore.certificate.chain and ssl.keystore.key "
                f"(broker-wide or as {prefix}ssl.*)"
            )
        trust_location, trust_certs = (
            get("ssl.truststore.location"),
            get("ssl.truststore.certificates"),
        )
        if trust_location is not None and trust_certs is not None:
            raise _invalid(
                f"Listener {listener}: set ssl.truststore.location or "
                "ssl.truststore.certificates, not both"
            )
        rules = get("ssl.principal.mapping.rules") or "DEFAULT"
        if rules.strip() != "DEFAULT":
            raise _invalid(
                f"Listener {listener}: ssl.principal.mapping.rules={rules!r} is not supported "
                "yet; spool has DEFAULT only (the certificate's subject DN)"
            )
        protocols = tuple(
            p.strip() for p in (get("ssl.enabled.protocols") or "").split(",") if p.strip()
        )
        unknown = [p for p in protocols if p not in _TLS_VERSIONS]
        if unknown or not protocols:
            raise _invalid(
                f"Listener {listener}: ssl.enabled.protocols {protocols!r} must name some of "
                f"{', '.join(_TLS_VERSIONS)}"
            )
        return cls(
            listener=listener,
            keystore_location=location,
            keystore_chain=chain,
            keystore_key=key,
            key_password=get("ssl.key.password"),
            truststore_location=trust_location,
            truststore_certificates=trust_certs,
            client_auth=get("ssl.client.auth") or "none",
            enabled_protocols=protocols,
        )

    def context(self) -> ssl.SSLContext:
        """A server-side SSLContext; KafkaError(INVALID_CONFIG) when a file or PEM text
        cannot be loaded."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        versions = sorted(_TLS_VERSIONS[p] for p in self.enabled_protocols)
        ctx.minimum_version, ctx.maximum_version = versions[0], versions[-1]
        try:
            if self.keystore_location is not None:
                ctx.load_cert_chain(self.keystore_location, password=self.key_password)
            else:
                assert self.keystore_chain is not None and self.keystore_key is not None
                _load_inline_chain(ctx, self.keystore_chain, self.keystore_key, self.key_password)
        except (OSError, ValueError) as exc:
            raise _invalid(
                f"Listener {self.listener}: cannot load the key store "
                f"({self.keystore_location or 'ssl.keystore.certificate.chain/key'}): {exc}"
            ) from None
        try:
            if self.truststore_location is not None:
                ctx.load_verify_locations(cafile=self.truststore_location)
            elif self.truststore_certificates is not None:
                ctx.load_verify_locations(cadata=self.truststore_certificates)
            elif self.client_auth != "none":
                ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        except (OSError, ValueError) as exc:
            raise _invalid(
                f"Listener {self.listener}: cannot load the trust store "
                f"({self.truststore_location or 'ssl.truststore.certificates'}): {exc}"
            ) from None
        ctx.verify_mode = {
            "none": ssl.CERT_NONE,
            "requested": ssl.CERT_OPTIONAL,
            "required": ssl.CERT_REQUIRED,
        }[self.client_auth]
        return ctx


def _load_inline_chain(ctx: ssl.SSLContext, chain: str, key: str, password: str | None) -> None:
    """Python's ssl loads a chain and key from files only: write them to a private
    temporary directory, load, and remove them."""
    with tempfile.TemporaryDirectory(prefix="spool-tls-") as tmp:
        cert_path, key_path = os.path.join(tmp, "chain.pem"), os.path.join(tmp, "key.pem")
        for path, text in ((cert_path, chain), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
        ctx.load_cert_chain(cert_path, key_path, password=password)


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    """One listener: its name, security protocol, bind address and advertised address.

    `advertised_port` 0 means the port the listener is bound to (listeners with port 0
    take a free one).
    """

    name: str
    security_protocol: str
    host: str
    port: int
    advertised_host: str
    advertised_port: int
    tls: TlsSettings | None = None
    sasl: sasl.SaslSettings | None = None

    @property
    def is_tls(self) -> bool:
        return self.security_protocol in (SSL, SASL_SSL)

    @property
    def advertises_loopback_for_every_interface(self) -> bool:
        """Bound to every interface with no advertised address given: spool advertises
        127.0.0.1 (where Kafka refuses 0.0.0.0), which only this host can use."""
        return self.host in _WILDCARDS and self.advertised_host == _default_advertised("", 0)[0]

    @classmethod
    def plaintext(cls, host: str, port: int) -> ListenerConfig:
        """A single PLAINTEXT listener (what `--listen` without other keys means)."""
        return cls(PLAINTEXT, PLAINTEXT, host, port, *_default_advertised(host, port))


def _default_advertised(host: str, port: int) -> tuple[str, int]:
    return ("127.0.0.1" if host in _WILDCARDS else host), port


def _ip_family(host: str) -> int | None:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).version
    except ValueError:
        return None


def _check_ports(specs: Sequence[EndpointSpec]) -> None:
    """Kafka: each listener has its own port (port 0 excepted), unless two share it on
    an IPv4 and an IPv6 address."""
    by_port: dict[int, list[EndpointSpec]] = {}
    for spec in specs:
        if spec.port != 0:
            by_port.setdefault(spec.port, []).append(spec)
    for port, same in by_port.items():
        if len(same) == 1:
            continue
        families = sorted(str(_ip_family(s.host)) for s in same)
        if len(same) == 2 and families == ["4", "6"]:
            continue
        names = ", ".join(s.name for s in same)
        raise _invalid(
            f"listeners: each listener must have a different port, but {names} all use "
            f"port {port} (only an IPv4 and an IPv6 address may share one)"
        )


def listeners_from_config(config: BrokerConfig) -> list[ListenerConfig]:
    """The listeners `config` asks for, checked as Kafka checks them."""
    specs = parse_endpoints(config.get("listeners"), "listeners")
    if not specs:
        raise _invalid("listeners is empty: give at least one NAME://host:port")
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise _invalid(
                f"listeners: each listener must have a different name, but {spec.name} "
                f"appears more than once in {config.get('listeners')!r}"
            )
        seen.add(spec.name)
    _check_ports(specs)
    protocol_map = parse_protocol_map(config.get("listener.security.protocol.map"))
    advertised_text = config.get("advertised.listeners")
    advertised: dict[str, EndpointSpec] = {}
    for spec in parse_endpoints(advertised_text, "advertised.listeners"):
        if spec.name in advertised:
            raise _invalid(
                f"advertised.listeners: each listener must have a different name, but "
                f"{spec.name} appears more than once"
            )
        if spec.name not in seen:
            raise _invalid(
                f"advertised.listeners names listener {spec.name}, which is not in listeners "
                f"({', '.join(s.name for s in specs)}): advertised listener names must be "
                "equal to or a subset of the ones defined in listeners"
            )
        if spec.host in ("0.0.0.0", "::"):
            raise _invalid(
                f"advertised.listeners: listener {spec.name} cannot advertise the "
                f"non-routable meta-address {spec.host}; use an address clients can reach"
            )
        advertised[spec.name] = spec
    out = []
    for spec in specs:
        protocol = protocol_map.get(spec.name)
        if protocol is None:
            raise _invalid(
                f"No security protocol defined for listener {spec.name}: add it to "
                "listener.security.protocol.map (e.g. "
                f"{spec.name}:PLAINTEXT or {spec.name}:SSL)"
            )
        if spec.name in advertised:
            adv = advertised[spec.name]
            ad_host, ad_port = adv.host or _default_advertised(spec.host, 0)[0], adv.port
        else:
            ad_host, ad_port = _default_advertised(spec.host, spec.port)
        tls = TlsSettings.from_config(config, spec.name) if protocol in (SSL, SASL_SSL) else None
        sasl_settings = (
            sasl_from_config(config, spec.name) if protocol in (SASL_PLAINTEXT, SASL_SSL) else None
        )
        out.append(
            ListenerConfig(
                spec.name, protocol, spec.host, spec.port, ad_host, ad_port, tls, sasl_settings
            )
        )
    return out


def sasl_from_config(config: BrokerConfig, listener: str) -> sasl.SaslSettings:
    """A SASL listener's mechanisms and PLAIN users, checked as Kafka checks them at
    startup; never quoting a JAAS value (it holds passwords)."""
    prefix = f"listener.name.{listener.lower()}."
    reauth = int(config.for_listener(listener, "connections.max.reauth.ms") or 0)
    text = config.for_listener(listener, "sasl.enabled.mechanisms") or ""
    mechanisms = tuple(m.strip() for m in str(text).split(",") if m.strip())
    if not mechanisms:
        raise _invalid(
            f"Listener {listener} is {SASL_PLAINTEXT}/{SASL_SSL} but sasl.enabled.mechanisms "
            "is empty: set sasl.enabled.mechanisms=PLAIN"
        )
    for mechanism in mechanisms:
        if mechanism in sasl.NOT_YET_SUPPORTED:
            raise _invalid(
                f"Listener {listener}: SASL mechanism {mechanism} in sasl.enabled.mechanisms "
                f"is not supported by spool; spool has "
                f"{', '.join(sasl.SUPPORTED)}: set sasl.enabled.mechanisms=PLAIN "
                f"(Kafka's default is GSSAPI)"
            )
        if mechanism not in sasl.SUPPORTED:
            raise _invalid(
                f"Listener {listener}: unknown SASL mechanism {mechanism!r} in "
                f"sasl.enabled.mechanisms; spool has {', '.join(sasl.SUPPORTED)}"
            )
    users: dict[str, str] = {}
    if sasl.PLAIN in mechanisms:
        jaas = config.for_listener(listener, "plain.sasl.jaas.config")
        jaas_file = config.get("java.security.auth.login.config")
        if not jaas and jaas_file:
            users = _plain_users_from_file(listener, str(jaas_file))
        else:
            users = _plain_users_from_entry(config, listener, jaas)
    for mechanism in mechanisms:
        if mechanism not in sasl.SCRAM:
            continue
        key = f"{prefix}{mechanism.lower()}.sasl.jaas.config"
        jaas = config.for_listener(listener, f"{mechanism.lower()}.sasl.jaas.config")
        if not jaas:
            continue  # optional: the credentials are in the cluster metadata
        try:
            entry = sasl.parse_jaas(str(jaas))
        except sasl.JaasError as exc:
            raise _invalid(f"Listener {listener}: cannot parse {key}: {exc}") from None
        if entry.login_module != sasl.SCRAM_LOGIN_MODULE:
            raise _invalid(
                f"Listener {listener}: {key} names login module {entry.login_module}; "
                f"{mechanism} takes {sasl.SCRAM_LOGIN_MODULE}"
            )
    by_mechanism: dict[str, int] = {}
    for mechanism in mechanisms:
        value = config.for_listener(listener, f"{mechanism.lower()}.connections.max.reauth.ms")
        if value is not None:
            by_mechanism[mechanism] = int(value)
    return sasl.SaslSettings(
        listener, mechanisms, users, reauth_ms=reauth, reauth_ms_by_mechanism=by_mechanism
    )


def _plain_users_from_entry(config: BrokerConfig, listener: str, jaas: object) -> dict[str, str]:
    """PLAIN users from listener.name.<listener>.plain.sasl.jaas.config."""
    key = f"listener.name.{listener.lower()}.plain.sasl.jaas.config"
    if not jaas:
        bare = (
            " (sasl.jaas.config without the listener prefix is a client key)"
            if (config.get("sasl.jaas.config"))
            else ""
        )
        raise _invalid(
            f"Listener {listener} enables SASL mechanism PLAIN but has no JAAS entry: set "
            f"{key}='{sasl.PLAIN_LOGIN_MODULE} required user_<name>=\"<password>\";' "
            f"(or name a JAAS file in java.security.auth.login.config){bare}"
        )
    try:
        entry = sasl.parse_jaas(str(jaas))
    except sasl.JaasError as exc:
        raise _invalid(f"Listener {listener}: cannot parse {key}: {exc}") from None
    if entry.login_module != sasl.PLAIN_LOGIN_MODULE:
        raise _invalid(
            f"Listener {listener}: {key} names login module {entry.login_module}; PLAIN "
            f"takes {sasl.PLAIN_LOGIN_MODULE}"
        )
    users = sasl.plain_users(entry)
    if not users:
        raise _invalid(
            f'Listener {listener}: {key} declares no users: add user_<name>="<password>" options'
        )
    return users


def _plain_users_from_file(listener: str, path: str) -> dict[str, str]:
    """PLAIN users from a JAAS file's `<listener>.KafkaServer` section, else its
    `KafkaServer` one, as Kafka's JaasContext.loadServerContext reads the JVM's JAAS
    file when the listener has no sasl.jaas.config."""
    key = "java.security.auth.login.config"
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise _invalid(f"Listener {listener}: cannot read {key} {path}: {exc.strerror}") from None
    try:
        sections = sasl.parse_jaas_file(text)
    except sasl.JaasError as exc:
        raise _invalid(f"Listener {listener}: cannot parse {key} {path}: {exc}") from None
    listener_section = f"{listener.lower()}.KafkaServer"
    entries = sections.get(listener_section, sections.get("KafkaServer"))
    if entries is None:
        raise _invalid(
            f"Could not find a 'KafkaServer' or '{listener_section}' entry in the JAAS "
            f"configuration. System property '{key}' is {path}"
        )
    users: dict[str, str] = {}
    for entry in entries:
        if entry.login_module == sasl.PLAIN_LOGIN_MODULE:
            users.update(sasl.plain_users(entry))
    if not users:
        raise _invalid(
            f"Listener {listener}: the JAAS file {path} ({key}) declares no PLAIN users: "
            f'add user_<name>="<password>" options to a {sasl.PLAIN_LOGIN_MODULE} entry'
        )
    return users


def endpoint_text(host: str, port: int, name: str = PLAINTEXT) -> str:
    """`NAME://host:port`, IPv6 hosts in brackets (for --listen / --advertise)."""
    shown = f"[{host}]" if ":" in host else host
    return f"{name}://{shown}:{port}"


# Kafka's login modules for the mechanisms the inter-broker client may use.
_LOGIN_MODULES = {
    sasl.PLAIN: sasl.PLAIN_LOGIN_MODULE,
    **dict.fromkeys(sasl.SCRAM, sasl.SCRAM_LOGIN_MODULE),
}
_ENDPOINT_IDENTIFICATION = {"https": "https", "": "none", "none": "none"}


@dataclass(frozen=True, slots=True)
class InterBrokerClient:
    """How this broker reaches the others: the listener (`inter.broker.listener.name`,
    else the one named after `security.inter.broker.protocol`), its security protocol,
    the client settings built from that listener's own keys (None: PLAINTEXT), and the
    principal the other brokers see it as (for the hints of an authorization failure;
    its repr holds no secret: ClientSecurity hides them)."""

    listener: str
    protocol: str = PLAINTEXT
    security: ClientSecurity | None = None
    principal: str = "User:ANONYMOUS"

    def check(self) -> None:
        """KafkaError(INVALID_CONFIG) when the client settings cannot work (a trust or
        key store that does not load), checked at start as the listener's are."""
        if self.security is None:
            return
        try:
            self.security.validate()
        except SecurityConfigError as exc:
            raise _invalid(
                f"Inter-broker listener {self.listener}: this broker's client to the other "
                f"brokers cannot use the listener's settings: {exc}"
            ) from None


def inter_broker_client(
    config: BrokerConfig, listeners: list[ListenerConfig], clustered: bool
) -> InterBrokerClient:
    """The inter-broker listener and this broker's client settings for it, checked as
    Kafka's KafkaConfig checks them; a broker that cannot join a cluster (`clustered`
    false: its storage is not PostgreSQL) needs none, and only the two keys naming the
    listener are checked."""
    named = config.get("inter.broker.listener.name")
    if named and "security.inter.broker.protocol" in config.static:
        raise _invalid(
            "Only one of inter.broker.listener.name and security.inter.broker.protocol "
            "should be set: inter.broker.listener.name names the listener itself, "
            "security.inter.broker.protocol picks the listener named after a protocol"
        )
    name = str(named or config.get("security.inter.broker.protocol")).upper()
    if not clustered:
        return InterBrokerClient(name)
    found = next((lc for lc in listeners if lc.name == name), None)
    if found is None:
        if named:
            why = f"inter.broker.listener.name {name}"
        else:
            default = "" if "security.inter.broker.protocol" in config.static else ", the default"
            why = (
                f"The inter-broker listener {name} (named after "
                f"security.inter.broker.protocol={name}{default})"
            )
        raise _invalid(
            f"{why} is not one of the listeners "
            f"({', '.join(lc.name for lc in listeners)}): brokers sharing a storage "
            "database reach each other on it; set inter.broker.listener.name to the name "
            "of one of them (a PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL listener)"
        )
    protocol = found.security_protocol
    if protocol == PLAINTEXT:
        return InterBrokerClient(name)
    fields: dict[str, object] = {}
    principal = "User:ANONYMOUS"
    if found.tls is not None:
        fields.update(_tls_client_fields(config, found.tls))
        if found.tls.client_auth != "none":
            principal = f"User:<the subject DN of listener {name}'s key store certificate>"
    if found.sasl is not None:
        mechanism, username, password = _sasl_client_credentials(config, found.sasl)
        fields.update(mechanism=mechanism, username=username, password=password)
        principal = f"User:{username}"
    security = ClientSecurity(protocol=protocol, **fields)  # type: ignore[arg-type]
    return InterBrokerClient(name, protocol, security, principal)


def _tls_client_fields(config: BrokerConfig, tls: TlsSettings) -> dict[str, object]:
    """ClientSecurity's TLS fields from an SSL / SASL_SSL listener's keys, as Kafka's
    inter-broker client uses them: the listener's trust store to check the other
    broker's certificate, its key store presented when the listener asks clients for a
    certificate (ssl.client.auth requested or required), and
    ssl.endpoint.identification.algorithm (Kafka's default https; empty: no check)."""
    listener = tls.listener
    algorithm = config.for_listener(listener, "ssl.endpoint.identification.algorithm")
    checked = _ENDPOINT_IDENTIFICATION.get(str(algorithm or "").strip().lower())
    if checked is None:
        raise _invalid(
            f"Listener {listener} (the inter-broker listener): "
            f"ssl.endpoint.identification.algorithm {algorithm!r} is not supported: set it "
            "to https (the default: the other broker's certificate must name the host it "
            "is reached at) or to an empty value (no host name check)"
        )
    fields: dict[str, object] = {
        "ssl_ca_location": tls.truststore_location,
        "ssl_ca_pem": tls.truststore_certificates,
        "ssl_endpoint_identification": checked,
    }
    if tls.client_auth != "none":
        fields.update(
            ssl_certificate_location=tls.keystore_location,
            ssl_certificate_pem=tls.keystore_chain if tls.keystore_location is None else None,
            ssl_key_pem=tls.keystore_key if tls.keystore_location is None else None,
            ssl_key_password=tls.key_password,
        )
    return fields


def _sasl_client_credentials(
    config: BrokerConfig, settings: sasl.SaslSettings
) -> tuple[str, str, str]:
    """(mechanism, username, password) this broker logs in to the others with, as
    Kafka's brokers: sasl.mechanism.inter.broker.protocol, one of the listener's enabled
    mechanisms, and the username and password options of the listener's JAAS entry for
    it (listener.name.<listener>.<mechanism>.sasl.jaas.config, else the JAAS file's
    <listener>.KafkaServer / KafkaServer section). Messages never quote a password."""
    listener = settings.listener
    key_name = "sasl.mechanism.inter.broker.protocol"
    mechanism = str(config.get(key_name) or "").strip()
    default = "" if key_name in config.static else " (the default)"
    enabled = ", ".join(settings.mechanisms)
    if mechanism not in sasl.SUPPORTED:
        kind = "not supported by spool" if mechanism in sasl.NOT_YET_SUPPORTED else "unknown"
        raise _invalid(
            f"The inter-broker listener {listener} is SASL, but {key_name} is "
            f"{mechanism!r}{default}, which is {kind}: set {key_name} to one of the "
            f"listener's sasl.enabled.mechanisms ({enabled}); spool has "
            f"{', '.join(sasl.SUPPORTED)}"
        )
    if mechanism not in settings.mechanisms:
        raise _invalid(
            f"{key_name} must be included in sasl.enabled.mechanisms when SASL is used for "
            f"inter-broker communication: {mechanism} is not enabled on the inter-broker "
            f"listener {listener} ({enabled}); enable it there or pick one of those"
        )
    module = _LOGIN_MODULES[mechanism]
    key = f"listener.name.{listener.lower()}.{mechanism.lower()}.sasl.jaas.config"
    entry = _inter_broker_jaas_entry(config, listener, mechanism, key)
    example = f'{key}=\'{module} required username="<broker user>" password="<password>"'
    example += ' user_<broker user>="<password>";\'' if mechanism == sasl.PLAIN else ";'"
    if entry is None:
        bare = (
            "; a bare sasl.jaas.config is not read by brokers (Kafka ignores it too)"
            if config.get("sasl.jaas.config")
            else ""
        )
        raise _invalid(
            f"The inter-broker listener {listener} uses SASL mechanism {mechanism} "
            f"({key_name}), but no JAAS entry gives this broker's own credentials: brokers "
            "log in to each other with the username and password options of the listener's "
            f"entry for the mechanism; set {example} (or put them in the JAAS file's "
            f"KafkaServer section){bare}"
        )
    if entry.login_module != module:
        raise _invalid(
            f"The inter-broker listener {listener}: its {mechanism} JAAS entry names login "
            f"module {entry.login_module}; {mechanism} takes {module}"
        )
    username, password = entry.options.get("username"), entry.options.get("password")
    if not username or password is None:
        raise _invalid(
            f"The inter-broker listener {listener} uses SASL mechanism {mechanism}, but its "
            "JAAS entry has no username and password options: brokers log in to each other "
            f"with them; set {example}"
        )
    if mechanism == sasl.PLAIN and settings.plain_users.get(username) != password:
        raise _invalid(
            f"The inter-broker listener {listener} logs in to the other brokers as "
            f"{username!r} (the username option of its PLAIN JAAS entry), but the listener's "
            f"PLAIN users have no {username!r} with that password, so the other brokers "
            f'would refuse it: declare user_{username}="<the same password>" in that entry'
        )
    return mechanism, username, password


def _inter_broker_jaas_entry(
    config: BrokerConfig, listener: str, mechanism: str, key: str
) -> sasl.JaasEntry | None:
    """The listener's JAAS entry for `mechanism` (Kafka's JaasContext.loadServerContext):
    `key`, else the JAAS file's <listener>.KafkaServer (or KafkaServer) section's entry
    of the mechanism's login module; None when there is none."""
    jaas = config.for_listener(listener, f"{mechanism.lower()}.sasl.jaas.config")
    if jaas:
        try:
            return sasl.parse_jaas(str(jaas))
        except sasl.JaasError as exc:
            raise _invalid(f"Listener {listener}: cannot parse {key}: {exc}") from None
    path = config.get("java.security.auth.login.config")
    if not path:
        return None
    try:
        with open(str(path), encoding="utf-8") as fh:
            sections = sasl.parse_jaas_file(fh.read())
    except OSError as exc:
        raise _invalid(
            f"Listener {listener}: cannot read java.security.auth.login.config {path}: "
            f"{exc.strerror}"
        ) from None
    except sasl.JaasError as exc:
        raise _invalid(
            f"Listener {listener}: cannot parse java.security.auth.login.config {path}: {exc}"
        ) from None
    entries = sections.get(f"{listener.lower()}.KafkaServer", sections.get("KafkaServer", []))
    module = _LOGIN_MODULES[mechanism]
    return next((e for e in entries if e.login_module == module), None)


def inter_broker_listener(
    config: BrokerConfig, listeners: list[ListenerConfig], clustered: bool
) -> str:
    """The name of the listener other brokers are reached on (`inter_broker_client`)."""
    return inter_broker_client(config, listeners, clustered).listener
