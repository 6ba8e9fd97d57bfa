"""Access (docs/security.md): keys on /v1, /api, /qa, /ws and /metrics; the one-use session token
for browsers; the login cookie for the QA pages; origins; the loopback default. The app runs with
fake engines (named as fakes); WebSocket cases go through a real server and a real client."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from app.cli import main as cli_main
from app.security import access as access_module
from app.security.access import Access, AllowedHosts, Keys, check_exposure, load_keys, origin_allowed
from app.security.tokens import Tokens, UsedTokens
from app.settings import ServerConfig
from core.clock import FakeClock
from core.errors import ConfigError
from tests.app.live import fake_app, live

KEY = "k-0123456789abcdef-secret"
OTHER = "k-second-key-of-two"
START = json.dumps({"type": "session.start", "audio": {"sample_rate": 16000}})
BEARER = {"authorization": f"Bearer {KEY}"}


async def client_for(**server: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=fake_app(**server)), base_url="http://127.0.0.1")


@pytest.fixture
async def keyed() -> AsyncIterator[httpx.AsyncClient]:
    async with await client_for(api_keys=[KEY, OTHER]) as client:
        yield client


GUARDED = [("GET", "/v1/models"), ("GET", "/api/calls"), ("GET", "/qa"), ("GET", "/qa/calls/abc"),
           ("GET", "/metrics"), ("POST", "/api/session-token")]
# what each guarded path answers once the key is right, here (no call store: its API is 503; the pages load)
LET_IN = {"/v1/models": 200, "/api/calls": 503, "/qa": 200, "/qa/calls/abc": 200, "/metrics": 200,
          "/api/session-token": 200}


@pytest.mark.parametrize(("method", "path"), GUARDED)
async def test_a_missing_or_wrong_key_gets_401_saying_what_to_send(
        keyed: httpx.AsyncClient, method: str, path: str) -> None:
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": f"Basic {KEY}"}):
        reply = await keyed.request(method, path, headers=headers)
        assert reply.status_code == 401, (path, headers)
        assert reply.headers["www-authenticate"].startswith("Bearer")
        assert "Authorization: Bearer <key>" in reply.json()["error"]["message"]


@pytest.mark.parametrize(("method", "path"), GUARDED)
async def test_either_key_is_let_in(keyed: httpx.AsyncClient, method: str, path: str) -> None:
    for key in (KEY, OTHER):
        reply = await keyed.request(method, path, headers={"authorization": f"Bearer {key}"})
        assert reply.status_code == LET_IN[path], (path, reply.status_code, reply.text[:200])


async def test_healthz_and_the_page_stay_open(keyed: httpx.AsyncClient) -> None:
    assert (await keyed.get("/healthz")).status_code in (200, 503)  # open; 503 until the lifespan ran
    assert (await keyed.get("/")).status_code == 200
    assert (await keyed.get("/api/auth")).json() == {"keys_required": True, "authorized": False}
    assert (await keyed.get("/api/auth", headers=BEARER)).json() == {"keys_required": True, "authorized": True}


async def test_without_keys_everything_is_open() -> None:
    async with await client_for() as client:
        assert (await client.get("/v1/models")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
        assert (await client.get("/api/auth")).json() == {"keys_required": False, "authorized": True}


def test_keys_come_from_the_list_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# the operators' keys\nfile-key-1\n\n  file-key-2  # the dashboard's\n")
    server = ServerConfig(api_keys=["listed-key"], api_keys_file=str(path))
    assert load_keys(server) == ["listed-key", "file-key-1", "file-key-2"]
    with pytest.raises(ConfigError, match="api_keys_file"):
        load_keys(ServerConfig(api_keys_file=str(tmp_path / "missing")))


async def test_a_key_from_the_file_is_let_in(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("from-file\n")
    async with await client_for(api_keys_file=str(path)) as client:
        assert (await client.get("/v1/models")).status_code == 401
        assert (await client.get("/v1/models", headers={"authorization": "Bearer from-file"})).status_code == 200


def test_keys_are_compared_as_digests_of_one_length_against_every_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """hmac.compare_digest on the raw strings returns at once when the lengths differ: timing
    would tell a key's length. Digests are 32 bytes whatever was sent."""
    compared: list[tuple[bytes, bytes]] = []
    real = access_module.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(access_module.hmac, "compare_digest", spy)
    keys = Keys(["first", "second-and-longer", "third"])
    assert keys.check("first")
    assert len(compared) == 3  # the match on the first key does not end the loop early
    for guess in ("", "x", "fourth", "y" * 5000):
        assert not keys.check(guess)
    assert len(compared) == 15
    assert {(len(a), len(b)) for a, b in compared} == {(32, 32)}
    assert keys.identify("second-and-longer") != keys.identify("first")
    assert "second" not in (keys.identify("second-and-longer") or "")  # names the key by a hash, not the key


async def test_a_key_is_never_logged(keyed: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    await keyed.get("/v1/models", headers=BEARER)
    await keyed.get("/v1/models", headers={"authorization": f"Bearer {KEY}x"})
    await keyed.post("/api/login", json={"key": KEY})
    check_exposure(ServerConfig(host="0.0.0.0", allow_unauthenticated=True))
    check_exposure(ServerConfig(host="0.0.0.0", api_keys=[KEY]))
    assert KEY not in caplog.text
    assert KEY not in repr(ServerConfig(api_keys=[KEY]))


async def test_a_session_token_is_used_once_and_expires() -> None:
    clock = FakeClock()
    access = Access(ServerConfig(api_keys=[KEY]), clock)
    tokens = access.session_tokens
    token = tokens.issue("key:abc")
    assert await tokens.take(token) == "key:abc"  # the client it was issued to
    assert await tokens.take(token) is None  # once only
    late = tokens.issue()
    clock.advance(60.5)
    assert await tokens.take(late) is None  # expired after 60 s
    assert await tokens.take("never-issued") is None


async def test_the_used_tokens_are_bounded_and_never_let_a_token_be_used_twice() -> None:
    clock = FakeClock()
    used = UsedTokens(clock, max_count=3)
    tokens = Tokens(60, clock, b"a-secret-of-sixteen+", "session token", used)
    issued = [tokens.issue() for _ in range(4)]
    assert [await tokens.take(t) for t in issued[:3]] == ["", "", ""] and len(used) == 3
    assert await tokens.take(issued[3]) is None  # three live ones are struck off: no room, so no use (never a reuse)
    assert all([await tokens.take(t) is None for t in issued[:3]])
    clock.advance(61)
    fresh = tokens.issue("key:abc")
    assert await tokens.take(fresh) == "key:abc" and len(used) == 1  # expired ones are dropped as room is needed


async def test_a_token_from_one_replica_opens_a_call_on_another_that_shares_the_secret() -> None:
    clock = FakeClock()
    shared = ServerConfig(api_keys=[KEY], token_secret="one-secret-for-every-replica")
    first, second = Access(shared, clock), Access(shared, clock)
    other = Access(ServerConfig(api_keys=[KEY], token_secret="another-deployments-secret"), clock)
    token = first.session_tokens.issue("key:abc")
    assert await other.session_tokens.take(token) is None  # another secret
    assert await second.logins.owner(token) is None  # a session token is no login cookie
    tampered = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    assert await second.session_tokens.take(tampered) is None
    assert await second.session_tokens.take(token) == "key:abc"
    assert await first.session_tokens.take(token) == "key:abc"  # one use per process without server.redis_url
    cookie = first.logins.issue("key:abc")
    assert await second.cookie_owner(cookie) == "key:abc"
    await second.logins.drop(cookie)  # logged out there
    assert await second.cookie_owner(cookie) is None
    secret = first.mint_client_secret("key:abc", 30, {"type": "realtime", "instructions": "Be brief."})
    minted = {"type": "realtime", "instructions": "Be brief."}
    assert await second.client_secrets.redeem(secret, "ek_") == ("key:abc", minted)


async def test_a_token_secret_that_is_short_or_an_empty_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least 16"):
        Access(ServerConfig(token_secret="short"), FakeClock())
    empty = tmp_path / "secret"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        Access(ServerConfig(token_secret_file=str(empty)), FakeClock())
    empty.write_text("a-secret-from-a-file-of-sixteen\n")
    token = Access(ServerConfig(token_secret_file=str(empty)), FakeClock()).session_tokens.issue("x")
    reader = Access(ServerConfig(token_secret="a-secret-from-a-file-of-sixteen"), FakeClock())
    assert await reader.session_tokens.take(token) == "x"


async def test_the_session_token_route_needs_a_key(keyed: httpx.AsyncClient) -> None:
    assert (await keyed.post("/api/session-token")).status_code == 401
    reply = await keyed.post("/api/session-token", headers=BEARER)
    assert reply.status_code == 200
    body = reply.json()
    assert body["expires_in"] == 60 and len(body["token"]) >= 32


async def test_login_sets_a_cookie_that_opens_qa_and_api_only(keyed: httpx.AsyncClient) -> None:
    assert (await keyed.post("/api/login", json={"key": "wrong"})).status_code == 401
    assert "voice_agent_login" not in keyed.cookies
    reply = await keyed.post("/api/login", json={"key": KEY})
    assert reply.status_code == 200
    cookie = reply.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and KEY.lower() not in cookie
    assert (await keyed.get("/qa")).status_code == 200
    assert (await keyed.get("/api/calls")).status_code == 503  # in: no call store here
    assert (await keyed.post("/api/session-token")).status_code == 200
    assert (await keyed.get("/v1/models")).status_code == 401  # /v1 and /metrics take a key only
    assert (await keyed.get("/metrics")).status_code == 401
    await keyed.post("/api/logout")
    keyed.cookies.clear()
    assert (await keyed.get("/api/calls")).status_code == 401


async def test_the_qa_page_without_a_key_is_a_login_form(keyed: httpx.AsyncClient) -> None:
    reply = await keyed.get("/qa", headers={"accept": "text/html,application/xhtml+xml"})
    assert reply.status_code == 401
    assert "/api/login" in reply.text and 'type="password"' in reply.text


def test_the_server_binds_loopback_by_default_and_refuses_to_expose_itself_without_keys(
        caplog: pytest.LogCaptureFixture) -> None:
    assert ServerConfig().host == "127.0.0.1"
    check_exposure(ServerConfig())
    check_exposure(ServerConfig(host="::1"))
    for host in ("0.0.0.0", "192.168.1.5", "::", "voice.example.com"):
        with pytest.raises(ConfigError, match=r"without API keys.*server\.api_keys"):
            check_exposure(ServerConfig(host=host))
    check_exposure(ServerConfig(host="0.0.0.0", api_keys=[KEY]))
    assert not caplog.records
    caplog.set_level(logging.WARNING)
    check_exposure(ServerConfig(host="0.0.0.0", allow_unauthenticated=True))
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "no API keys" in caplog.text


def test_the_cli_refuses_0_0_0_0_without_keys(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("VOICE_AGENT_SERVER__API_KEYS", "VOICE_AGENT_SERVER__API_KEYS_FILE",
                 "VOICE_AGENT_SERVER__ALLOW_UNAUTHENTICATED", "VOICE_AGENT_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["serve", "--host", "0.0.0.0"])
    assert exit_info.value.code == 2
    assert "refusing to serve 0.0.0.0 without API keys" in capsys.readouterr().err


# -- /ws, through a real server and client ---------------------------------------------------------

async def _close_of(ws: Any) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(ws.recv(), 5)
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code, closed.value.rcvd.reason


async def _started(ws: Any) -> None:
    await ws.send(START)
    event = json.loads(await asyncio.wait_for(ws.recv(), 5))
    assert event["type"] == "session.started"


async def test_ws_needs_a_key_or_a_one_use_token() -> None:
    with live(fake_app(api_keys=[KEY])) as address:
        async with connect(f"ws://{address}/ws") as ws:
            code, reason = await _close_of(ws)
        assert code == 1008 and "Authorization: Bearer" in reason and "session-token" in reason
        async with connect(f"ws://{address}/ws", additional_headers=BEARER) as ws:
            await _started(ws)
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            token = (await http.post("/api/session-token", headers=BEARER)).json()["token"]
        async with connect(f"ws://{address}/ws?token={token}") as ws:
            await _started(ws)
        async with connect(f"ws://{address}/ws?token={token}") as ws:  # used already
            assert (await _close_of(ws))[0] == 1008


async def test_ws_refuses_a_foreign_browser_origin_with_403() -> None:
    with live(fake_app(allowed_origins=["https://app.example.com"])) as address:
        with pytest.raises(InvalidStatus) as refused:
            async with connect(f"ws://{address}/ws", origin=websockets.Origin("https://evil.example")):
                pass
        assert refused.value.response.status_code == 403
        assert b"allowed_origins" in refused.value.response.body
        for origin in (f"http://{address}", "https://app.example.com"):  # its own page, and a listed one
            async with connect(f"ws://{address}/ws", origin=websockets.Origin(origin)) as ws:
                await _started(ws)
        async with connect(f"ws://{address}/ws") as ws:  # no Origin: not a browser
            await _started(ws)


# -- DNS rebinding: a page whose own name points at 127.0.0.1 ---------------------------------------

REBOUND = [("GET", "/api/calls"), ("GET", "/qa"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
           ("GET", "/metrics"), ("GET", "/"), ("GET", "/api/auth"), ("POST", "/api/session-token"),
           ("GET", "/docs")]


@pytest.mark.parametrize(("method", "path"), REBOUND)
async def test_a_request_for_a_host_the_server_does_not_answer_to_is_refused(method: str, path: str) -> None:
    async with await client_for() as client:
        reply = await client.request(method, path, headers={"host": "attacker.example:8000"})
        assert reply.status_code == 400, path
        error = reply.json()["error"]
        assert error["code"] == "host_not_allowed" and "server.allowed_hosts" in error["message"]
        for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "app.localhost"):
            assert not _host_refused(await client.request(method, path, headers={"host": host})), (path, host)
        assert not _host_refused(await client.get("/healthz", headers={"host": "10.1.2.3:8000"}))  # probes


def _host_refused(reply: httpx.Response) -> bool:
    return reply.status_code == 400 and reply.json().get("error", {}).get("code") == "host_not_allowed"


async def test_allowed_hosts_add_names_and_suffixes() -> None:
    async with await client_for(allowed_hosts=["voice.example.com", ".example.org"]) as client:
        for host, status in (("voice.example.com", 200), ("VOICE.example.com.:443", 200), ("example.org", 200),
                             ("a.b.example.org", 200), ("example.com", 400), ("evilexample.org", 400)):
            assert (await client.get("/v1/models", headers={"host": host})).status_code == status, host
    async with await client_for(allowed_hosts=["*"]) as anything:
        assert (await anything.get("/v1/models", headers={"host": "attacker.example"})).status_code == 200


async def test_ws_refuses_a_rebinding_host_and_origin_before_the_upgrade() -> None:
    with live(fake_app()) as address:
        port = int(address.rsplit(":", 1)[1])
        rebound = f"ws://attacker.example:{port}/ws"
        for origin in (None, websockets.Origin(f"http://attacker.example:{port}")):  # Origin = Host: its own page
            with pytest.raises(InvalidStatus) as refused:
                async with connect(rebound, host="127.0.0.1", port=port, origin=origin):
                    pass
            assert refused.value.response.status_code == 403
            assert b"server.allowed_hosts" in refused.value.response.body
        async with connect(f"ws://localhost:{port}/ws", host="127.0.0.1", port=port,
                           origin=websockets.Origin(f"http://localhost:{port}")) as ws:
            await _started(ws)


def test_origin_equal_to_host_is_the_page_s_own_only_for_an_allowed_host() -> None:
    hosts = AllowedHosts(["localhost", "127.0.0.1"])
    assert origin_allowed("http://127.0.0.1:8000", "127.0.0.1:8000", [], hosts)
    assert not origin_allowed("http://attacker.example:8000", "attacker.example:8000", [], hosts)
    assert not origin_allowed("http://127.0.0.1:8000", "127.0.0.1:9000", [], hosts)
    assert origin_allowed("https://app.example.com", "127.0.0.1", ["https://app.example.com"], hosts)
    assert origin_allowed(None, "anything", [], hosts)  # not a browser


# -- key guessing, per-key counts, paths, cookies ---------------------------------------------------

@pytest.mark.parametrize("path", ["/api/calls", "/qa", "/v1/models", "/metrics"])
async def test_wrong_keys_are_limited_on_every_authenticated_route(path: str) -> None:
    async with await client_for(api_keys=[KEY], max_auth_failures_per_minute=3) as client:
        for n in range(3):
            assert (await client.get(path, headers={"authorization": f"Bearer guess-{n}"})).status_code == 401
        blocked = await client.get(path, headers=BEARER)  # even the right key waits out the minute
        assert blocked.status_code == 429 and int(blocked.headers["retry-after"]) >= 1
        assert blocked.json()["error"]["code"] == "too_many_failures"
        assert (await client.post("/api/login", json={"key": KEY})).status_code == 429
        assert (await client.get("/healthz")).status_code != 429  # open routes are not held back


async def test_wrong_logins_count_as_wrong_keys() -> None:
    async with await client_for(api_keys=[KEY], max_auth_failures_per_minute=2) as client:
        for _ in range(2):
            assert (await client.post("/api/login", json={"key": "guess"})).status_code == 401
        assert (await client.get("/v1/models", headers=BEARER)).status_code == 429


async def test_ws_wrong_keys_are_limited_too() -> None:
    with live(fake_app(api_keys=[KEY], max_auth_failures_per_minute=2)) as address:
        for _ in range(2):
            async with connect(f"ws://{address}/ws", additional_headers={"authorization": "Bearer guess"}) as ws:
                assert (await _close_of(ws))[0] == 1008
        async with connect(f"ws://{address}/ws", additional_headers=BEARER) as ws:
            code, reason = await _close_of(ws)
        assert code == 1013 and "server.max_auth_failures_per_minute" in reason


async def test_calls_with_a_key_count_per_key_not_per_address() -> None:
    """A gateway's callers share its address and its key: the per-address cap is for keyless access."""
    with live(fake_app(api_keys=[KEY, OTHER], max_calls_per_client=1, max_calls_per_key=2)) as address:
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            token = (await http.post("/api/session-token", headers=BEARER)).json()["token"]
        async with connect(f"ws://{address}/ws", additional_headers=BEARER) as first, \
                connect(f"ws://{address}/ws?token={token}") as second:  # minted with KEY: counts as KEY
            await _started(first)
            await _started(second)
            async with connect(f"ws://{address}/ws", additional_headers=BEARER) as third:
                code, reason = await _close_of(third)
            assert code == 1013 and "server.max_calls_per_key" in reason
            async with connect(f"ws://{address}/ws", additional_headers={"authorization": f"Bearer {OTHER}"}) as ws:
                await _started(ws)  # another key has its own count


async def test_the_guard_matches_the_path_starlette_routes_on() -> None:
    """Served under a root path (a proxy's prefix, or mounted in another app), /voice/api/calls is
    the route /api/calls, and needs its key."""
    transport = httpx.ASGITransport(app=fake_app(api_keys=[KEY]), root_path="/voice")
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        assert (await client.get("/voice/api/calls")).status_code == 401
        assert (await client.get("/voice/v1/models")).status_code == 401
        assert (await client.get("/voice/v1/models", headers=BEARER)).status_code == 200


async def test_the_login_cookie_is_secure_when_the_request_came_over_tls() -> None:
    async with await client_for(api_keys=[KEY], trusted_proxies=["127.0.0.1"]) as client:
        plain = await client.post("/api/login", json={"key": KEY})
        assert "secure" not in plain.headers["set-cookie"].lower()
        behind_tls = await client.post("/api/login", json={"key": KEY}, headers={"x-forwarded-proto": "https"})
        assert "secure" in behind_tls.headers["set-cookie"].lower()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_metrics_port_serves_metrics_without_a_key() -> None:
    port = _free_port()
    with live(fake_app(api_keys=[KEY], metrics_port=port)) as address:
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"http://{address}/metrics")).status_code == 401
            reply = await http.get(f"http://127.0.0.1:{port}/metrics")
            assert reply.status_code == 200 and "voice_agent" in reply.text
            # prometheus_client's server answers every path with the metrics: never with the API
            other = await http.get(f"http://127.0.0.1:{port}/v1/models")
            assert "voice_agent" in other.text and '"object"' not in other.text


def test_keys_come_from_the_environment_as_a_json_list(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.settings import Settings

    monkeypatch.setenv("VOICE_AGENT_SERVER__API_KEYS", json.dumps([KEY, OTHER]))
    assert load_keys(Settings().server) == [KEY, OTHER]
    monkeypatch.setenv("VOICE_AGENT_SERVER__API_KEYS", "")  # compose's ${VOICE_AGENT_API_KEYS:-}
    assert load_keys(Settings().server) == []


async def test_the_phone_routes_keep_their_own_checks_and_take_no_key(keyed: httpx.AsyncClient) -> None:
    reply = await keyed.post("/twilio/voice", data={"CallSid": "CA1"})
    assert reply.status_code == 403  # Twilio's signature check (no auth token here), not the key
    assert "www-authenticate" not in reply.headers


# -- /api/auth is no oracle -------------------------------------------------------------------------

async def test_wrong_keys_on_api_auth_are_counted_limited_and_logged_without_the_key(
        caplog: pytest.LogCaptureFixture) -> None:
    """/api/auth says whether a key is good: each wrong one counts as on any authenticated route,
    past the limit it answers 429 (and so does every route that takes a key), and each is logged
    with the client's address, never with the key."""
    app = fake_app(api_keys=[KEY], max_auth_failures_per_minute=3)
    transport = httpx.ASGITransport(app=app, client=("198.51.100.23", 40123))
    caplog.set_level(logging.WARNING, logger="app.security.access")
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        assert (await client.get("/api/auth")).json() == {"keys_required": True, "authorized": False}  # not counted
        for n in range(3):
            reply = await client.get("/api/auth", headers={"authorization": f"Bearer guess-{n}-{KEY[:8]}"})
            assert reply.json() == {"keys_required": True, "authorized": False}
        blocked = await client.get("/api/auth", headers=BEARER)  # even the right key waits out the minute
        assert blocked.status_code == 429 and int(blocked.headers["retry-after"]) >= 1
        assert blocked.json()["error"]["code"] == "too_many_failures"
        assert (await client.get("/v1/models", headers=BEARER)).status_code == 429  # one count for every route
        assert (await client.get("/healthz")).status_code != 429
    lines = [r.getMessage() for r in caplog.records if r.name == "app.security.access"]
    assert len(lines) == 3 and all("198.51.100.23" in line and "/api/auth" in line for line in lines), lines
    assert "refused for" in lines[-1]  # the failure that used up the minute says so
    assert not any("guess-" in r.getMessage() or KEY in r.getMessage() for r in caplog.records)


async def test_a_path_cannot_forge_a_line_in_the_wrong_key_warning(caplog: pytest.LogCaptureFixture) -> None:
    """The path is the client's, percent-decoded: a newline in it stays quoted in the one line."""
    app = fake_app(api_keys=[KEY])
    transport = httpx.ASGITransport(app=app, client=("198.51.100.24", 40123))
    caplog.set_level(logging.WARNING, logger="app.security.access")
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        await client.get("/v1/models%0AINFO%20forged", headers={"authorization": "Bearer wrong"})
    [line] = [r.getMessage() for r in caplog.records if r.name == "app.security.access"]
    assert "forged" in line and len(line.splitlines()) == 1, line


async def test_a_wrong_login_cookie_on_api_auth_counts_too() -> None:
    async with await client_for(api_keys=[KEY], max_auth_failures_per_minute=2) as client:
        for _ in range(2):
            client.cookies.set(access_module.LOGIN_COOKIE, "not-a-login")
            assert (await client.get("/api/auth")).json()["authorized"] is False
        client.cookies.clear()
        assert (await client.get("/api/auth", headers=BEARER)).status_code == 429


async def test_api_auth_counts_nothing_without_keys() -> None:
    async with await client_for(max_auth_failures_per_minute=1) as client:
        for _ in range(3):
            reply = await client.get("/api/auth", headers={"authorization": "Bearer anything"})
            assert reply.json() == {"keys_required": False, "authorized": True}


async def test_every_wrong_key_is_logged_with_the_address_not_the_key(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="app.security.access")
    async with await client_for(api_keys=[KEY]) as client:
        await client.get("/v1/models", headers={"authorization": "Bearer wrong-key-1234"})
        await client.post("/api/login", json={"key": "wrong-key-5678"})
    lines = [r.getMessage() for r in caplog.records if r.name == "app.security.access"]
    assert len(lines) == 2 and "/v1/models" in lines[0] and "/api/login" in lines[1], lines
    assert all("127.0.0.1" in line for line in lines)
    assert not any("wrong-key" in r.getMessage() for r in caplog.records)
