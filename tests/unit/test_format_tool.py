"""`spool format --add-scram` (kafka-storage.sh format): Kafka's ScramParser forms and
messages, the credential written to the metadata log of a data directory that no
broker holds, and Kafka's already-formatted rule."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from broker.cli import main
from broker.tools.storage import FormatError, parse_add_scram
from coordinator.scram import credential_from_password, credential_from_salted, salted_password
from persister.dirlock import DataDirLock


def test_name_and_password_with_kafkas_defaults() -> None:
    user, mech, cred = parse_add_scram("SCRAM-SHA-256=[name=alice,password=alice-secret]")
    assert (user, mech, cred.iterations) == ("alice", "SCRAM-SHA-256", 4096)
    assert cred == credential_from_password("SCRAM-SHA-256", "alice-secret", cred.salt, 4096)


def test_salt_and_salted_password_in_base64() -> None:
    salt = b"0123456789abcdef"
    salted = salted_password("SCRAM-SHA-512", "pw", salt, 8192)
    text = (
        f'SCRAM-SHA-512=[name=bob,iterations=8192,salt="{base64.b64encode(salt).decode()}",'
        f'saltedpassword="{base64.b64encode(salted).decode()}"]'
    )
    _, _, cred = parse_add_scram(text)
    assert cred == credential_from_salted("SCRAM-SHA-512", salt, salted, 8192)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("SCRAM-SHA-256", "Failed to find equals sign"),
        ("SCRAM-SHA-1=[name=a,password=pw-secret]", "mechanism SCRAM-SHA-1 is not supported"),
        ("SCRAM-SHA-256=name=a,password=pw-secret]", "start with ["),
        ("SCRAM-SHA-256=[name=a,password=pw-secret", "end with ]"),
        ("SCRAM-SHA-256=[password=pw-secret]", "You must supply 'name'"),
        ("SCRAM-SHA-256=[name=a]", "one of 'password' or 'saltedpassword'"),
        ("SCRAM-SHA-256=[name=a,saltedpassword=AAAA]", "'salt' with 'saltedpassword'"),
        ("SCRAM-SHA-256=[name=a,password=pw-secret,colour=red]", "Unknown SCRAM configurations"),
        ("SCRAM-SHA-256=[name=a,iterations=4095,password=pw-secret]", "must be >= 4096"),
        ("SCRAM-SHA-512=[name=a,iterations=16385,password=pw-secret]", "must be <= 16384"),
        ("SCRAM-SHA-256=[name=a,iterations=many,password=pw-secret]", "iterations count"),
        ("SCRAM-SHA-256=[name=a,salt=!!,password=pw-secret]", "Failed to decode given salt"),
        ('SCRAM-SHA-512=[name=a,salt="N3E=",saltedpassword="YCE="]', "at least 12 bytes"),
    ],
)
def test_kafkas_messages_without_the_password(text: str, message: str) -> None:
    with pytest.raises(FormatError) as exc:
        parse_add_scram(text)
    assert message in str(exc.value)
    assert "pw-secret" not in str(exc.value)


def read_meta(data: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((data / "meta").glob("*.log")))


def test_format_writes_the_credentials_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    argv = ["format", "--data-dir", str(data), "-S", "SCRAM-SHA-512=[name=alice,password=s3cr3t]"]
    assert main([*argv, "-t", "MkU3OEVBNTcwNTJENDM2Qk"]) == 0
    out = capsys.readouterr()
    assert "cluster id MkU3OEVBNTcwNTJENDM2Qk" in out.out
    assert "alice (SCRAM-SHA-512)" in out.out and "s3cr3t" not in out.out + out.err
    log = read_meta(data)
    assert b'"scram_credential"' in log and b"s3cr3t" not in log
    # Kafka's rule for a formatted directory.
    assert main(argv) == 1
    assert "is already formatted. Use --ignore-formatted" in capsys.readouterr().err
    assert main([*argv, "--ignore-formatted"]) == 0
    assert "already formatted" in capsys.readouterr().out
    assert read_meta(data) == log


def test_format_refuses_a_directory_a_broker_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    lock = DataDirLock(data)
    lock.acquire()
    try:
        argv = ["format", "--data-dir", str(data), "-S", "SCRAM-SHA-256=[name=a,password=x]"]
        assert main(argv) == 1
        assert "Failed to acquire lock" in capsys.readouterr().err
    finally:
        lock.release()
