"""Settings that do not parse: every command says so in one sentence, and never quotes a
secret (a bearer token is a key of its mapping, so pydantic's path to a bad role is the token).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from waystation.testing.settings import USER_ENV_PREFIXES
from waystation.testing.workers import REPO

TOKEN = "tok-7Hq2-never-print-me"
API_KEY = "sk-live-never-print-me"
DB_PASSWORD = "pg-pass-never-print-me"
WEBHOOK_SECRET = "whsec-never-print-me"
ENCRYPTION_KEY = "ZW5jcnlwdGlvbi1rZXktbmV2ZXItcHJpbnQtbWU="
MCP_PASSWORD = "mcp-pass-never-print-me"
SECRETS = [TOKEN, API_KEY, DB_PASSWORD, WEBHOOK_SECRET, ENCRYPTION_KEY, MCP_PASSWORD]

# Every secret setting is set, and three of them are wrong in a way that pydantic's own
# message would quote: a token's role, an encryption key that is not a string, an MCP server
# with both a command and a URL that holds a password.
MISCONFIGURED = {
    "WAYSTATION_API_TOKENS": json.dumps({TOKEN: {"role": "admin", "name": "ops"}}),
    "OPENAI_API_KEY": API_KEY,
    "WAYSTATION_DATABASE_URL": f"postgresql://agent:{DB_PASSWORD}@db.internal/waystation",
    "WAYSTATION_WEBHOOKS": json.dumps(
        [{"name": "ops", "url": "https://hooks.example.com/x", "secret": WEBHOOK_SECRET}]
    ),
    "WAYSTATION_ENCRYPTION_KEYS": json.dumps({"k1": {"key": ENCRYPTION_KEY}}),
    "WAYSTATION_MCP_SERVERS": json.dumps(
        {"git": {"command": "mcp-server-git", "url": f"https://u:{MCP_PASSWORD}@mcp.example"}}
    ),
}


async def run(argv: list[str], env: dict[str, str]) -> tuple[int | None, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(USER_ENV_PREFIXES)}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *argv,
        cwd=REPO,
        env={**base, "WAYSTATION_EMBEDDED_SERVER": "false", **env},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    return process.returncode, out.decode()


@pytest.mark.parametrize(
    "argv",
    [
        ["starter.py", "config"],
        ["starter.py", "api"],
        ["starter.py", "worker"],
        ["starter.py", "run", "say hi"],
        ["worker.py"],
    ],
    ids=["config", "api", "worker", "run", "worker.py"],
)
async def test_misconfigured_settings_are_one_sentence_that_quotes_no_secret(
    argv: list[str],
) -> None:
    code, said = await run(argv, MISCONFIGURED)
    assert code not in (0, None), said
    assert "Traceback" not in said and said.count("\n") == 1, said
    for secret in SECRETS:
        assert secret not in said, f"{secret!r} printed:\n{said}"
    # The sentence names each variable and what is wrong, so the fix is findable.
    assert "WAYSTATION_API_TOKENS at <a token>.role: Input should be 'reader' or 'approver'" in (
        said
    )
    assert "WAYSTATION_ENCRYPTION_KEYS at k1: Input should be a valid string" in said
    assert "WAYSTATION_MCP_SERVERS at git: " in said and "either command" in said


async def test_settings_that_are_not_json_say_which_variable_without_quoting_it() -> None:
    code, said = await run(["starter.py", "config"], {"WAYSTATION_API_TOKENS": f'{{"{TOKEN}": '})
    assert code == 2
    assert TOKEN not in said and "Traceback" not in said
    assert said.startswith("error: invalid settings: WAYSTATION_API_TOKENS is not valid JSON")


async def test_the_api_started_by_uvicorn_itself_quotes_no_secret_either() -> None:
    """`uvicorn waystation.servers.http_api:app` (docs/http-api.md) prints uvicorn's own
    traceback of
    the failed import: its last line is the sentence, and no secret is anywhere in it."""
    code, said = await run(["-m", "uvicorn", "waystation.servers.http_api:app"], MISCONFIGURED)
    assert code not in (0, None), said
    for secret in SECRETS:
        assert secret not in said, f"{secret!r} printed:\n{said}"
    assert "WAYSTATION_API_TOKENS at <a token>.role" in said.strip().splitlines()[-1]
