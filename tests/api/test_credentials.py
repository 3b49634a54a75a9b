"""rhymerl/api/credentials.py: the one way a URL is shown (every place a credential hides in one is
masked) and which environment literals are credentials."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rhymerl.api.credentials import (
    NOT_SHOWN,
    holds_credential,
    literal_credential,
    masked,
    masked_set_item,
    secret_env_name,
    url_credential,
)

SECRET = "s3cret-pw"


@pytest.mark.parametrize(("url", "shown"), [
    (f"redis://:{SECRET}@r:6379/0", "redis://:***@r:6379/0"),
    (f"redis://u:{SECRET}@r/0?ssl_cert_reqs=none", "redis://u:***@r/0?ssl_cert_reqs=none"),
    (f"redis://u:{SECRET}@[::1/0", "redis://u:***@[::1/0"),  # one urllib refuses
    (f"rediss://u:p@{SECRET}@r/0", "rediss://u:***@r/0"),  # an '@' in the password
    (f"redis://u:a/{SECRET}@r/0", "redis://u:***@r/0"),  # a '/' in the password
    (f"redis://u:a#{SECRET}@r/0", "redis://u:***@r/0"),  # a '#' in the password
    (f"redis:u:{SECRET}@r/0", NOT_SHOWN),
    (f"redis://{SECRET}@r:6379/0", "redis://***@r:6379/0"),  # a bare user-info may be a token
    (f"https://{SECRET}@github.com/org/repo", "https://***@github.com/org/repo"),
    (f"redis://r:6379/0?password={SECRET}", "redis://r:6379/0?password=***"),
    (f"redis://r/0?ssl_cert_reqs=none&Token={SECRET}", "redis://r/0?ssl_cert_reqs=none&Token=***"),
    (f"redis://r:6379/0#{SECRET}", "redis://r:6379/0#***"),
    (f"redis://r:6379/{SECRET}", "redis://r:6379/***"),
    (f"redis://r:6379/{SECRET}?db=1", "redis://r:6379/***?db=1"),
    (f"unix:///run/redis.sock?db=2&password={SECRET}", "unix:///run/redis.sock?db=2&password=***"),
    (f"s3://AKIAEXAMPLE:{SECRET}@bucket/models/qwen", "s3://AKIAEXAMPLE:***@bucket/models/qwen"),
    (f"https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA&X-Amz-Signature={SECRET}&versionId=3",
     "https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Signature=***&versionId=3"),
    (f"https://a.blob.core.windows.net/c/f?sv=2022&sig={SECRET}", "https://a.blob.core.windows.net/c/f?sv=2022&sig=***"),
    (f"https://api.example.com/v1?{SECRET}", "https://api.example.com/v1?***"),  # a bare item may be the key
    (f"redis:r/0?access_token={SECRET}", "redis:r/0?access_token=***"),
    ("redis://r:6379/0", "redis://r:6379/0"),
    ("hf://Qwen/Qwen2.5-7B@v1.0", "hf://Qwen/Qwen2.5-7B@v1.0"),
    ("s3://models/qwen/7b", "s3://models/qwen/7b"),
    ("/models/qwen", "/models/qwen"),
])
def test_a_url_is_shown_with_every_place_a_credential_hides_in_masked(url: str, shown: str) -> None:
    assert masked(url) == shown


_HOSTS = st.sampled_from(["r", "r:6379", "[::1]:6379", "redis.ns.svc", "bucket"])
_SAFE = st.text(alphabet="abcxyz019-_.", min_size=1, max_size=8)


@st.composite
def _carrying(draw: st.DrawFn) -> str:
    """A URL with SECRET in one place a credential may sit, and harmless text elsewhere."""
    scheme = draw(st.sampled_from(["redis", "rediss", "unix", "s3", "https", "hf"]))
    place = draw(st.sampled_from(["password", "token@", "query", "fragment", "path"]))
    if place == "path":
        scheme = draw(st.sampled_from(["redis", "rediss"]))
    user = {"password": f"{draw(_SAFE)}:{SECRET}{draw(st.sampled_from(['', '/x', '#x', '?x', '@x']))}@",
            "token@": f"{SECRET}@"}.get(place, draw(st.sampled_from(["", f"{draw(_SAFE)}@"])))
    name = draw(st.sampled_from(["password", "token", "sig", "X-Amz-Signature", "client_secret", "api-key",
                                 "AUTH", "sessionToken"]))
    query = f"?a={draw(_SAFE)}&{name}={SECRET}" if place == "query" else draw(st.sampled_from(["", "?db=1"]))
    path = f"/{SECRET}" if place == "path" else draw(st.sampled_from(["", "/0", "/models/x"]))
    fragment = f"#{SECRET}" if place == "fragment" else ""
    return f"{scheme}://{user}{draw(_HOSTS)}{path}{query}{fragment}"


@given(_carrying())
def test_a_credential_anywhere_a_url_carries_one_is_never_shown_and_masking_twice_changes_nothing(url: str) -> None:
    shown = masked(url)
    assert SECRET not in shown and masked(shown) == shown


@given(st.text(max_size=40))
def test_masking_any_text_is_idempotent(text: str) -> None:
    assert masked(masked(text)) == masked(text)


@pytest.mark.parametrize(("url", "user_ok", "where"), [
    (f"s3://k:{SECRET}@bucket/x", False, "a password in its user-info"),
    (f"hf://{SECRET}@org/name", False, "a token as its user-info"),
    (f"s3://bucket/x?X-Amz-Signature={SECRET}", False, "the query parameter 'X-Amz-Signature'"),
    ("redis://reader@r/0", True, None),
    ("redis://reader@r/0", False, "a token as its user-info"),
    ("s3://bucket/what?.jsonl", False, None),  # an S3 key may hold '?'
    ("hf://org/name@main", False, None),
])
def test_a_url_says_where_it_carries_a_credential(url: str, user_ok: bool, where: str | None) -> None:
    assert url_credential(url, user_ok) == where


@pytest.mark.parametrize("name", [
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN",
    "WANDB_API_KEY", "OPENAI_API_KEY", "AZURE_STORAGE_KEY", "AZURE_CLIENT_SECRET", "AZURE_STORAGE_CONNECTION_STRING",
    "GOOGLE_APPLICATION_CREDENTIALS", "DB_PASSWORD", "PGPASSWORD", "MYSQL_PWD", "GITHUB_TOKEN", "hf_token",
    "my.api-key", "SECRET_KEY_BASE", "MLFLOW_TRACKING_PASSWORD", "ANTHROPIC_APIKEY",
])
def test_a_variable_named_as_a_credential_is_one(name: str) -> None:
    assert secret_env_name(name)


@pytest.mark.parametrize("name", [
    "PYTHONPATH", "AWS_ENDPOINT_URL", "AWS_REGION", "HF_ENDPOINT", "HF_HOME", "TOKENIZERS_PARALLELISM",
    "HF_TOKEN_PATH", "DB_PASSWORD_FILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_SHARED_CREDENTIALS_FILE", "PWD",
    "AZURE_CLIENT_ID", "NCCL_DEBUG", "KEYRING_DIR", "MONKEY",
])
def test_a_variable_named_for_a_file_place_or_setting_is_not_a_credential(name: str) -> None:
    assert not secret_env_name(name)


@pytest.mark.parametrize(("name", "value", "refused"), [
    ("HF_TOKEN", f"hf_{SECRET}", True),
    ("HF_TOKEN", "", False),  # an empty literal hides nothing
    ("HF_TOKEN", "$(MY_HF_TOKEN)", False),  # Kubernetes expands it from another variable
    ("GOOGLE_APPLICATION_CREDENTIALS", "/var/secrets/google/key.json", False),  # a mounted Secret's file
    ("GOOGLE_APPLICATION_CREDENTIALS", '{"type": "service_account", "private_key": "x"}', True),
    ("DATABASE_URL", f"postgres://app:{SECRET}@db/app", True),
    ("HF_ENDPOINT", f"https://hub.example.com/?token={SECRET}", True),
    ("GIT_URL", "ssh://git@github.com/org/repo", False),  # a user name alone
    ("AWS_ENDPOINT_URL", "http://minio.storage:9000", False),
])
def test_a_literal_is_a_credential_by_its_name_or_by_a_url_carrying_one(name: str, value: str, refused: bool) -> None:
    why = literal_credential(name, value)
    assert (why is not None) == refused
    assert why is None or (SECRET not in why and name in why)


def test_a_set_item_is_shown_with_a_credential_in_its_value_hidden() -> None:
    env = [{"name": "HF_TOKEN", "value": SECRET}]
    assert holds_credential(env) and not holds_credential([{"name": "HF_HOME", "value": "/tmp/hf"}])
    assert masked_set_item(f"rollout.pod.env=[{{name: HF_TOKEN, value: {SECRET}}}]", env) == "rollout.pod.env=***"
    assert masked_set_item(f"history.redis_url=redis://r/0?password={SECRET}", f"redis://r/0?password={SECRET}") \
        == "history.redis_url=redis://r/0?password=***"
    assert masked_set_item(f"history.redis_url:redis://u:{SECRET}@r/0", None) == \
        "history.redis_url:redis://u:***@r/0"  # a typo: '=' written ':'
    assert masked_set_item("algorithm.epochs=0", 0) == "algorithm.epochs=0"
