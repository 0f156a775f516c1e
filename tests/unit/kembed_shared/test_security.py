"""Kafka security settings without a broker: validation, aiokafka options, secrets kept out
of output, and the local broker's secured-mode configuration."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pydantic import SecretStr, ValidationError

from kembed_cli.main import main
from kembed_shared.kafka.security import _missing_topic_rights, client_options, principal_of
from kembed_shared.observability.logging import redacted
from kembed_shared.ports import KafkaAccessError
from kembed_shared.settings import SECURITY_FIELDS, KafkaClientSettings, describe_errors
from producer_sdk import AuthenticationError, AuthorizationError, ClientConfig
from scripts.kafka_local import AclBinding, LocalKafka, TlsFiles, secured_server_properties
from scripts.kafka_local.acls import acl_bindings
from worker.settings import WorkerSettings

SECRET = "hunter2-not-for-logs"

_S = TypeVar("_S", bound=KafkaClientSettings)


def settings_of(model: type[_S], **values: Any) -> _S:
    """Settings from keyword values and the environment, as the CLI builds them."""
    return model(**values)


# A self-signed test certificate and its private key, encrypted with "key-secret".
CERT = """-----BEGIN CERTIFICATE-----
MIIBgzCCASmgAwIBAgIUYiBezZSuVrHmwClYPPCC8HZQa9cwCgYIKoZIzj0EAwIw
FjEUMBIGA1UEAwwLa2VtYmVkLXRlc3QwIBcNMjYxMTMwMTIwMDQ0WhgPMjEyNjEx
MDYxMjAwNDRaMBYxFDASBgNVBAMMC2tlbWJlZC10ZXN0MFkwEwYHKoZIzj0CAQYI
KoZIzj0DAQcDQgAEp8wbC1ot3felv/2Xj+OPp7H5QnR7ZFi4sYmpE3jpuKCORNr9
sCbQc3QtWaNNophIgzImYjpgwtxNq+DpE5CyM6NTMFEwHQYDVR0OBBYEFF9cCg8Y
EIr31a6CB8mduBLdDnQQMB8GA1UdIwQYMBaAFF9cCg8YEIr31a6CB8mduBLdDnQQ
MA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSAAwRQIgUKFyLcX7kUM7Ue6w
LCpWWUZXma4MXMX7ipzYRVlGqzUCIQCFsc0S9JlYhc/g8VN4sAmRABHGLnC8xyGo
5v88QHGOCw==
-----END CERTIFICATE-----
"""
ENCRYPTED_KEY = """-----BEGIN ENCRYPTED PRIVATE KEY-----
MIHsMFcGCSqGSIb3DQEFDTBKMCkGCSqGSIb3DQEFDDAcBAhaCiHnJmcCpQICCAAw
DAYIKoZIhvcNAgkFADAdBglghkgBZQMEASoEEPAPte1hmOGlXxPyMuA/ztsEgZDS
wBaqSkvt64bWzyAcq5Ko7CjL54lVGrG808fd1RDQaNczuhM8kizrZ7AFUBazUqAZ
mqCk4V9utNIfWQOuGLHwfFGq5F1Yi3Z7OZVZ07XsrouUBmCi0+HbJYLuKAlv7cr5
Ycnu0jKlOEIkahbK003b58GyVA5jWG46pS0JH1+bQIWdkBbugAT20N6rBVEQhjw=
-----END ENCRYPTED PRIVATE KEY-----
"""


@pytest.fixture
def pem(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "ca.pem").write_text(CERT)
    (tmp_path / "key.pem").write_text(ENCRYPTED_KEY)
    return {"ca": str(tmp_path / "ca.pem"), "key": str(tmp_path / "key.pem")}


def sasl(protocol: str = "SASL_SSL", **more: Any) -> dict[str, Any]:
    return {
        "security_protocol": protocol,
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": "svc",
        "sasl_password": SECRET,
        **more,
    }


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({}, id="plaintext"),
        pytest.param(sasl("SASL_PLAINTEXT"), id="sasl-plaintext"),
        pytest.param(sasl("SASL_SSL", sasl_mechanism="PLAIN"), id="sasl-ssl-plain"),
        pytest.param({"security_protocol": "SSL"}, id="ssl-system-trust"),
        pytest.param({"security_protocol": "SSL", "ssl_check_hostname": False}, id="no-hostname"),
    ],
)
def test_consistent_security_settings_are_accepted(
    clean_env: pytest.MonkeyPatch, settings: dict[str, Any]
) -> None:
    """Complete combinations validate, for the worker and for the SDK alike."""
    settings_of(WorkerSettings, **settings)
    ClientConfig("localhost:9092", **settings)


def test_tls_files_are_accepted(clean_env: pytest.MonkeyPatch, pem: dict[str, str]) -> None:
    """CA, client certificate, separate key and key password: valid with SSL and SASL_SSL."""
    files: dict[str, Any] = {
        "ssl_cafile": pem["ca"],
        "ssl_certfile": pem["ca"],
        "ssl_keyfile": pem["key"],
        "ssl_password": "key-secret",
    }
    settings_of(WorkerSettings, security_protocol="SSL", **files)
    settings_of(WorkerSettings, **sasl(), **files)
    ClientConfig("localhost:9092", security_protocol="SSL", **files)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        pytest.param(
            {"security_protocol": "SASL_SSL", "sasl_password": SECRET},
            "security_protocol SASL_SSL needs sasl_mechanism, sasl_username",
            id="sasl-incomplete",
        ),
        pytest.param(
            {"sasl_username": "svc", "sasl_password": SECRET},
            "sasl_username, sasl_password given, but security_protocol PLAINTEXT sends no SASL "
            "credentials",
            id="sasl-without-sasl-protocol",
        ),
        pytest.param(
            {"security_protocol": "SSL", "sasl_mechanism": "PLAIN"},
            "security_protocol SSL sends no SASL credentials: use SASL_SSL",
            id="ssl-with-sasl",
        ),
        pytest.param(
            sasl("SASL_PLAINTEXT", ssl_cafile="/etc/hosts"),
            "ssl_cafile given, but security_protocol SASL_PLAINTEXT does not use TLS: use SASL_SSL",
            id="tls-file-without-tls",
        ),
        pytest.param(
            {"security_protocol": "SSL", "ssl_password": SECRET},
            "ssl_password given without ssl_certfile",
            id="key-password-without-cert",
        ),
        pytest.param(
            {"security_protocol": "SSL", "ssl_cafile": "/no/such/ca.pem"},
            "ssl_cafile: no such file: /no/such/ca.pem",
            id="missing-file",
        ),
    ],
)
def test_contradictory_settings_fail_with_a_clear_message_and_no_secret(
    clean_env: pytest.MonkeyPatch, settings: dict[str, Any], message: str
) -> None:
    """Incomplete or contradictory combinations are refused at start-up with a sentence
    saying what to change, and the described error never repeats the password."""
    with pytest.raises(ValidationError) as failure:
        settings_of(WorkerSettings, **settings)

    described = describe_errors(failure.value)
    assert message in described
    assert SECRET not in described


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        pytest.param(
            {"security_protocol": "SASL_SSL", "sasl_username": "svc"},
            "needs sasl_mechanism, sasl_password",
            id="sasl-incomplete",
        ),
        pytest.param({"security_protocol": "TLS"}, "security_protocol must be one of", id="proto"),
        pytest.param(sasl(sasl_mechanism="GSSAPI"), "sasl_mechanism must be one of", id="mech"),
        pytest.param(
            {"ssl_cafile": "ca.pem"}, "does not use TLS: use SSL or SASL_SSL", id="tls-file"
        ),
    ],
)
def test_sdk_config_refuses_the_same_contradictions(settings: dict[str, Any], message: str) -> None:
    """ClientConfig checks the combinations too, with a ValueError that holds no secret."""
    with pytest.raises(ValueError, match="invalid security settings") as failure:
        ClientConfig("localhost:9092", **settings)

    assert message in str(failure.value)
    assert SECRET not in str(failure.value)


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({"security_protocol": "SSL", "sasl_mechanism": "PLAIN"}, id="ssl-with-sasl"),
        pytest.param(sasl("SASL_PLAINTEXT", ssl_cafile="/etc/hosts"), id="tls-file-without-tls"),
        pytest.param({"security_protocol": "SSL", "ssl_password": SECRET}, id="key-password"),
        pytest.param({"security_protocol": "SSL", "ssl_cafile": "/no/such/ca.pem"}, id="no-file"),
    ],
)
def test_sdk_and_worker_share_one_set_of_rules(
    clean_env: pytest.MonkeyPatch, settings: dict[str, Any]
) -> None:
    """The SDK's ClientConfig and the worker's settings refuse a combination with the same
    sentences: one set of rules checks both."""
    with pytest.raises(ValidationError) as worker_failure:
        settings_of(WorkerSettings, **settings)
    with pytest.raises(ValueError, match="invalid security settings") as sdk_failure:
        ClientConfig("localhost:9092", **settings)

    sdk_problems = str(sdk_failure.value).removeprefix("invalid security settings: ")
    assert sdk_problems in describe_errors(worker_failure.value)


def test_env_vars_configure_security(clean_env: pytest.MonkeyPatch) -> None:
    """Every security setting is a KEMBED_* variable; passwords become SecretStr."""
    clean_env.setenv("KEMBED_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    clean_env.setenv("KEMBED_SASL_MECHANISM", "SCRAM-SHA-256")
    clean_env.setenv("KEMBED_SASL_USERNAME", "svc")
    clean_env.setenv("KEMBED_SASL_PASSWORD", SECRET)

    settings = settings_of(KafkaClientSettings)

    assert settings.security_protocol == "SASL_PLAINTEXT"
    assert isinstance(settings.sasl_password, SecretStr)
    assert settings.sasl_password.get_secret_value() == SECRET
    assert SECRET not in repr(settings)
    assert set(SECURITY_FIELDS) <= set(KafkaClientSettings.model_fields)
    assert set(KafkaClientSettings.model_fields) <= set(WorkerSettings.model_fields)


# -- aiokafka options ----------------------------------------------------------------------------


def test_plaintext_gives_plaintext_options(clean_env: pytest.MonkeyPatch) -> None:
    """The default adds nothing but the protocol, so plain set-ups behave as before."""
    assert client_options(settings_of(WorkerSettings)) == {"security_protocol": "PLAINTEXT"}
    assert client_options(ClientConfig("localhost:9092")) == {"security_protocol": "PLAINTEXT"}


def test_sasl_options_carry_the_login(clean_env: pytest.MonkeyPatch) -> None:
    """SASL settings map to aiokafka's sasl_* arguments, the password revealed only there."""
    expected = {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "svc",
        "sasl_plain_password": SECRET,
    }

    assert client_options(settings_of(WorkerSettings, **sasl("SASL_PLAINTEXT"))) == expected
    assert client_options(ClientConfig("localhost:9092", **sasl("SASL_PLAINTEXT"))) == expected
    assert principal_of(expected) == "User:svc"


def test_tls_options_build_a_verifying_context(
    clean_env: pytest.MonkeyPatch, pem: dict[str, str]
) -> None:
    """SASL_SSL builds an SSLContext that verifies the broker (CA file, hostname check on)
    and carries the client certificate with its encrypted key."""
    settings = settings_of(
        WorkerSettings,
        **sasl(),
        ssl_cafile=pem["ca"],
        ssl_certfile=pem["ca"],
        ssl_keyfile=pem["key"],
        ssl_password="key-secret",
    )

    options = client_options(settings)
    context = options["ssl_context"]

    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname is True
    assert [cert["subject"] for cert in context.get_ca_certs()] == [
        ((("commonName", "kembed-test"),),)
    ]
    assert options["sasl_plain_password"] == SECRET


def test_hostname_check_can_be_turned_off(
    clean_env: pytest.MonkeyPatch, pem: dict[str, str]
) -> None:
    """ssl_check_hostname=false keeps verifying the certificate but not the name in it."""
    worker_context = client_options(
        settings_of(
            WorkerSettings, security_protocol="SSL", ssl_cafile=pem["ca"], ssl_check_hostname=False
        )
    )["ssl_context"]
    sdk_context = client_options(
        ClientConfig(
            "localhost:9092",
            security_protocol="SSL",
            ssl_cafile=pem["ca"],
            ssl_check_hostname=False,
        )
    )["ssl_context"]

    for context in (worker_context, sdk_context):
        assert context.check_hostname is False
        assert context.verify_mode == ssl.CERT_REQUIRED


def test_unloadable_key_is_a_clear_tls_error(
    clean_env: pytest.MonkeyPatch, pem: dict[str, str]
) -> None:
    """A wrong key password stops the worker with a "tls" KafkaAccessError that names the
    settings involved and not the password."""
    settings = settings_of(
        WorkerSettings,
        security_protocol="SSL",
        ssl_certfile=pem["ca"],
        ssl_keyfile=pem["key"],
        ssl_password=SECRET,
    )

    with pytest.raises(KafkaAccessError) as failure:
        client_options(settings)

    assert failure.value.kind == "tls"
    assert "ssl_keyfile" in failure.value.reason
    assert SECRET not in str(failure.value)


def test_sdk_options_let_ssl_errors_through(pem: dict[str, str]) -> None:
    """The SDK asks for ssl's own error when the TLS files cannot be loaded (as before the
    SDK shared the worker's options); the worker's KafkaAccessError is the default."""
    config = ClientConfig(
        "localhost:9092",
        security_protocol="SSL",
        ssl_certfile=pem["ca"],
        ssl_keyfile=pem["key"],
        ssl_password=SECRET,
    )

    with pytest.raises(ssl.SSLError):
        client_options(config, tls_error=None)
    with pytest.raises(KafkaAccessError, match="cannot load the TLS files"):
        client_options(config)


def test_sdk_login_errors_read_like_the_workers() -> None:
    """AuthenticationError.of turns the shared diagnosis (kind, reason) into the SDK's
    error with the worker's "<kind> failed: <reason>" wording."""
    reason = "Kafka at k:9092 rejected the login of User:svc with PLAIN: SaslAuthenticationFailed"

    error = AuthenticationError.of("authentication", reason)

    assert isinstance(error, AuthenticationError)
    assert str(error) == str(KafkaAccessError("authentication", reason))
    assert str(error).startswith("authentication failed: Kafka at k:9092")


# -- topic rights from the broker's authorized operations ----------------------------------------


class _FakeClient:
    """Answers the authorized-operations metadata request with fixed topic entries."""

    def __init__(self, topics: list[tuple[int, str, bool, list[Any], int]]) -> None:
        self._topics = topics

    def get_random_node(self) -> int:
        return 1

    async def send(self, node: int, request: Any) -> Any:
        class Response:
            topics = self._topics

        return Response()


async def test_missing_rights_are_read_from_authorized_operations() -> None:
    """Bits of the authorized-operations field are Kafka's ACL operation codes (READ 3,
    WRITE 4); an unauthorized topic lacks everything; an unknown topic is not reported."""
    read, write, describe = 1 << 3, 1 << 4, 1 << 8
    client = _FakeClient(
        [
            (0, "requests", False, [], read | describe),
            (0, "results", False, [], read | describe),
            (29, "dlq", False, [], -(2**31)),
            (3, "missing", False, [], -(2**31)),
            (0, "fine", False, [], write | describe),
        ]
    )
    needs = {
        "requests": {"read"},
        "results": {"write"},
        "dlq": {"write"},
        "missing": {"read"},
        "fine": {"write"},
    }

    missing = await _missing_topic_rights(client, needs)

    assert missing == ["WRITE on topic 'results'", "WRITE on topic 'dlq'"]


# -- secrets stay out of output ------------------------------------------------------------------


def test_startup_log_settings_mask_secrets(
    clean_env: pytest.MonkeyPatch, pem: dict[str, str]
) -> None:
    """The settings the worker logs at start-up show *** for both passwords, and keep
    non-secret values (user name, file paths) readable."""
    settings = settings_of(
        WorkerSettings,
        **sasl(),
        ssl_certfile=pem["ca"],
        ssl_keyfile=pem["key"],
        ssl_password="key-secret",
    )

    logged = redacted(settings.model_dump())

    assert logged["sasl_password"] == "***"
    assert logged["ssl_password"] == "***"
    assert logged["sasl_username"] == "svc"
    assert logged["ssl_keyfile"] == pem["key"]
    assert SECRET not in str(logged)
    assert "key-secret" not in str(logged)


def test_sdk_config_keeps_passwords_secret() -> None:
    """A password given to the SDK as a plain string is held as a SecretStr, so printing
    the config (or a client's) never shows it."""
    config = ClientConfig("localhost:9092", **sasl())

    assert isinstance(config.sasl_password, SecretStr)
    assert SECRET not in repr(config)
    assert SECRET not in str(config)


def test_authorization_error_names_principal_topic_and_operation() -> None:
    """The SDK's authorization error says who lacks which right on which topic."""
    error = AuthorizationError("User:bob", "write", "embed.requests")

    assert str(error).startswith("authorization failed: User:bob is not authorized for WRITE")
    assert "topic 'embed.requests'" in str(error)
    assert (error.principal, error.operation, error.topic) == (
        "User:bob",
        "write",
        "embed.requests",
    )


def test_cli_security_flags_reach_the_settings(started: list[WorkerSettings]) -> None:
    """`kembed worker` takes the security flags: choices, a bool given as true/false, and a
    password that becomes a SecretStr."""
    argv = [
        "worker",
        *("--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "SCRAM-SHA-256"),
        *("--sasl-username", "svc", "--sasl-password", SECRET, "--ssl-check-hostname", "false"),
    ]

    assert main(argv) == 0
    settings = started[0]
    assert settings.sasl_mechanism == "SCRAM-SHA-256"
    assert settings.sasl_password == SecretStr(SECRET)
    assert settings.ssl_check_hostname is False


def test_cli_invalid_security_settings_exit_2_without_the_password(
    started: list[WorkerSettings],
    clean_env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Invalid combinations stop `kembed worker` and `kembed embed` with status 2 and a
    message that says what is missing, never echoing the password (from a flag or env)."""
    clean_env.setenv("KEMBED_SASL_PASSWORD", SECRET)

    assert main(["worker", "--security-protocol", "SASL_SSL"]) == 2
    worker_err = capsys.readouterr().err
    assert (
        main(["embed", "text", "--security-protocol", "SSL", "--ssl-password", "x" + SECRET]) == 2
    )
    embed_err = capsys.readouterr().err

    assert started == []
    assert "kembed worker: invalid settings" in worker_err
    assert "needs sasl_mechanism, sasl_username" in worker_err
    assert "kembed embed: invalid settings" in embed_err
    assert "sasl_password given, but security_protocol SSL" in embed_err
    assert SECRET not in worker_err + embed_err


def test_help_shows_secret_flags_but_never_their_values(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both commands list the security flags with their env vars; a password set in the
    environment does not appear in the help, and the bool flag shows true/false."""
    clean_env.setenv("KEMBED_SASL_PASSWORD", SECRET)
    texts = []
    for command in ("worker", "embed"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        texts.append(" ".join(capsys.readouterr().out.split()))

    for text in texts:
        for name in SECURITY_FIELDS:
            assert f"--{name.replace('_', '-')}" in text
            assert f"KEMBED_{name.upper()}" in text
        assert "--ssl-check-hostname {true,false}" in text
        assert SECRET not in text


# -- the local broker's secured mode -------------------------------------------------------------


def test_secured_broker_config_uses_scram_acls_and_one_super_user() -> None:
    """Secured mode: SASL_PLAINTEXT clients with both SCRAM mechanisms, the StandardAuthorizer
    denying what no ACL allows, admin the only super user."""
    config = secured_server_properties(9092, 9093, "admin-pw")

    assert config["listeners"] == ("SASL_PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093")
    assert config["sasl.enabled.mechanisms"] == "SCRAM-SHA-256,SCRAM-SHA-512"
    assert config["authorizer.class.name"].endswith("StandardAuthorizer")
    assert config["allow.everyone.if.no.acl.found"] == "false"
    assert config["super.users"] == "User:admin"
    assert not any("ssl" in key for key in config)


def test_secured_broker_config_adds_a_sasl_ssl_listener(tmp_path: Path) -> None:
    """With TLS files a second client listener speaks SASL_SSL with the broker's keystore,
    while the broker keeps talking to itself over SASL_PLAINTEXT."""
    files = TlsFiles(tmp_path / "ca.pem", tmp_path / "broker.p12", "store-pw")

    config = secured_server_properties(9092, 9093, "admin-pw", files, 9094)

    assert config["listeners"] == (
        "SASL_PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9094,CONTROLLER://127.0.0.1:9093"
    )
    assert config["advertised.listeners"] == (
        "SASL_PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9094"
    )
    assert config["inter.broker.listener.name"] == "SASL_PLAINTEXT"
    assert config["listener.name.sasl_ssl.ssl.keystore.location"] == str(files.keystore)
    assert "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config" in config


def test_local_kafka_checks_its_users(tmp_path: Path) -> None:
    """scram_users must include admin and use plain characters; client_config gives the
    aiokafka login of a user, and nothing for a plaintext broker."""
    with pytest.raises(ValueError, match="must include the super user 'admin'"):
        LocalKafka(tmp_path, scram_users={"alice": "pw"})
    with pytest.raises(ValueError, match="may only use"):
        LocalKafka(tmp_path, scram_users={"admin": "pw", "alice": 'p"w'})
    with pytest.raises(ValueError, match="tls=True needs scram_users"):
        LocalKafka(tmp_path, tls=True)

    secured = LocalKafka(tmp_path, scram_users={"admin": "a-pw", "alice": "b-pw"})

    assert LocalKafka(tmp_path).client_config() == {}
    assert secured.client_config("alice", "SCRAM-SHA-512") == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "sasl_plain_password": "b-pw",
    }


def test_acl_binding_checks_its_names() -> None:
    """Unknown operations or principals without a type are refused before any request."""
    with pytest.raises(ValueError, match="not one of"):
        AclBinding("User:alice", "topic", "t", "publish")
    with pytest.raises(ValueError, match="User:name"):
        AclBinding("alice", "topic", "t", "read")
    assert AclBinding("User:alice", "group", "g", "read").wire()[:3] == (3, "g", 3)


def test_acl_bindings_name_one_resource_and_known_operations() -> None:
    """grant()/revoke() arguments: one binding per operation, lower-cased, for a User
    principal; exactly one of topic= and group=; unknown operations and keywords refused."""
    bindings = acl_bindings("grant", "alice", ["Read", "write"], {"topic": "t", "prefixed": True})

    assert bindings == [
        AclBinding("User:alice", "topic", "t", "read", "prefixed"),
        AclBinding("User:alice", "topic", "t", "write", "prefixed"),
    ]
    assert acl_bindings("revoke", "User:bob", ["read"], {"group": "g"}) == [
        AclBinding("User:bob", "group", "g", "read")
    ]
    with pytest.raises(ValueError, match=r"grant\(\) takes exactly one of topic= or group="):
        acl_bindings("grant", "alice", ["read"], {"topic": "t", "group": "g"})
    with pytest.raises(ValueError, match="operations must be some of"):
        acl_bindings("grant", "alice", ["publish"], {"topic": "t"})
    with pytest.raises(TypeError, match="unexpected keyword arguments"):
        acl_bindings("grant", "alice", ["read"], {"topic": "t", "prefix": True})  # type: ignore[typeddict-unknown-key]
