"""TLS for the secured broker's SASL_SSL listener: a local CA and a broker certificate for
127.0.0.1, made with the JDK's keytool (the broker needs a JDK anyway, so no openssl)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from scripts.kafka_local.layout import HOST
from scripts.kafka_local.process import java


@dataclass(frozen=True)
class TlsFiles:
    """A local CA (PEM, for clients' ``ssl_cafile``) and the broker's PKCS12 keystore."""

    ca_file: Path
    keystore: Path
    password: str


def _keytool() -> str:
    sibling = Path(java()).resolve().parent / "keytool"
    if sibling.exists():
        return str(sibling)
    found = shutil.which("keytool")
    if found is None:
        raise RuntimeError("keytool (part of the JDK) is needed for a TLS listener")
    return found


def make_tls_files(directory: Path) -> TlsFiles:
    """A CA and a broker certificate it signed for 127.0.0.1 (an IP SAN, so clients can
    check the host name), made with the JDK's keytool once per ``directory``."""
    ca_file, keystore = directory / "ca.pem", directory / "broker.p12"
    secret = directory / "keystore-password"
    if ca_file.exists() and keystore.exists() and secret.exists():
        return TlsFiles(ca_file, keystore, secret.read_text().strip())
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, mode=0o700)
    password = secrets.token_hex(16)
    env = {**os.environ, "KEMBED_KEYSTORE_PASSWORD": password}
    store = ["-storetype", "PKCS12", "-storepass:env", "KEMBED_KEYSTORE_PASSWORD"]
    key = ["-keyalg", "EC", "-groupname", "secp256r1", "-validity", "3650"]
    ca, broker = str(directory / "ca.p12"), str(keystore)
    csr, signed, chain = (
        str(directory / name) for name in ("broker.csr", "broker.crt", "chain.pem")
    )
    steps = [
        ["-genkeypair", "-alias", "ca", "-dname", "CN=kembed-local-ca", "-ext", "bc:c", *key,
         "-keystore", ca, *store],
        ["-exportcert", "-alias", "ca", "-rfc", "-file", str(ca_file), "-keystore", ca, *store],
        ["-genkeypair", "-alias", "broker", "-dname", f"CN={HOST}", *key, "-keystore", broker,
         *store],
        ["-certreq", "-alias", "broker", "-file", csr, "-keystore", broker, *store],
        ["-gencert", "-alias", "ca", "-infile", csr, "-rfc", "-outfile", signed,
         "-ext", f"SAN=ip:{HOST}", "-ext", "EKU=serverAuth", "-validity", "3650",
         "-keystore", ca, *store],
    ]  # fmt: skip
    for step in steps:
        _run_keytool(step, env)
    Path(chain).write_text(ca_file.read_text() + Path(signed).read_text())
    _run_keytool(
        ["-importcert", "-noprompt", "-alias", "broker", "-file", chain, "-keystore", broker,
         *store],
        env,
    )  # fmt: skip
    secret.write_text(password)
    secret.chmod(0o600)
    return TlsFiles(ca_file, keystore, password)


def _run_keytool(args: list[str], env: Mapping[str, str]) -> None:
    result = subprocess.run(
        [_keytool(), *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        raise RuntimeError(f"keytool {args[0]} failed:\n{output}")
