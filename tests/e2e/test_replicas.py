"""Several replicas on one machine, for real: Debian's HAProxy in front of three `voice-agent serve`
replicas (real models for speech; tests/haproxy_server.py, configured as docs/deployment.md
advises), one PostgreSQL (the call store), one Redis (limits, call counts, used tokens), one
SeaweedFS (recordings, S3), and one shared LLM server standing for vLLM: a fourth `voice-agent
serve` whose /v1 the replicas use with `llm.engine=openai`. Real sockets, real spoken audio.

Shown: a session token minted through the balancer opens a call on another replica; calls made on
every replica, and their recordings, are seen through any one; a key's limit on calls holds across
replicas; SIGTERM to a replica mid-reply lets its caller hear the reply and the goodbye while the
balancer takes it out (its /readyz) and new calls land on the others, its record complete; SIGKILL
loses only the calls on the killed replica, whose finished turns are kept; a restart of PostgreSQL
and Redis mid-call loses no finished turn and the call goes on talking. A test that stops a replica
or a shared server starts it again (same port) before it ends, so the tests hold in any order; each
uses a key of its own, so a killed replica's call lease (which lapses in 60 s) counts against no
other test."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.client import VoiceClient
from tests.e2e.conftest import Server, start_server, stop_server
from tests.haproxy_server import Balancer, haproxy
from tests.needs import missing
from tests.postgres_server import GIVEN_URL, PostgresServer, postgres_cluster
from tests.redis_server import RedisServer, redis_process
from tests.s3_server import s3_server
from tests.speech import speech_samples

pytestmark = pytest.mark.slow
NAMES = ("a", "b", "c")
KEYS = {test: f"replica-test-key-{test}-0123456789"
        for test in ("token", "seen", "limit", "sigterm", "sigterm-newcomers", "sigkill", "restart")}
BUCKET = "calls"
# how long a replica told to stop waits for its calls' replies: a limit, not a margin. The SIGTERM test's
# reply ran past 30 s in a fresh-clone run while benchmarks loaded the same 2 cores, and was cut
DRAIN_S = 120.0


@dataclass
class Replica:
    server: Server
    proc: subprocess.Popen[bytes]

    @property
    def port(self) -> int:
        return int(self.server.base_url.rsplit(":", 1)[1])


@dataclass
class Cluster:
    tmp: Path
    env: dict[str, str]
    balancer: Balancer
    replicas: dict[str, Replica]
    redis: RedisServer
    postgres: PostgresServer | None  # None: VOICE_AGENT_TEST_POSTGRES_URL's server, which the tests cannot restart

    def restart(self, name: str) -> None:
        """Start a stopped replica again on its port; returns once the balancer holds it UP."""
        old = self.replicas[name]
        assert old.proc.poll() is not None
        server, proc = start_server(self.tmp, self.env, port=old.port)
        self.replicas[name] = Replica(server, proc)
        self.balancer.wait_for(name, "UP", timeout=60)

    def api(self, name: str, key: str) -> httpx.AsyncClient:
        """The API of one replica, called directly."""
        return httpx.AsyncClient(base_url=self.replicas[name].server.base_url, timeout=10,
                                 headers={"Authorization": f"Bearer {key}"})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("replicas")
    with contextlib.ExitStack() as stack:
        postgres = None if GIVEN_URL else stack.enter_context(postgres_cluster())
        database = postgres.url if postgres is not None else GIVEN_URL
        redis = stack.enter_context(redis_process(tmp))
        (tmp / "s3").mkdir()
        endpoint = stack.enter_context(s3_server(tmp / "s3"))
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test",
                     aws_secret_access_key="test").create_bucket(Bucket=BUCKET)
        llm, llm_proc = start_server(tmp, {})  # the shared LLM server (vLLM's stand-in), embedded engine
        stack.callback(stop_server, llm_proc)
        env = {
            "VOICE_AGENT_LLM__ENGINE": "openai", "VOICE_AGENT_LLM__BASE_URL": llm.base_url + "/v1",
            "VOICE_AGENT_LLM__REMOTE_MODEL": "qwen2.5-coder-0.5b-instruct-q4_k_m",
            # the stand-in shares a few CPU cores with three replicas: a pause in its tokens longer than the
            # 1.5 s a GPU server is allowed is load here, not a stalled server
            "VOICE_AGENT_LLM__READ_TIMEOUT_S": "30",
            "VOICE_AGENT_STORAGE__URL": database, "VOICE_AGENT_STORAGE__RECORDINGS": "true",
            "VOICE_AGENT_STORAGE__RECORDINGS_URL": f"s3://{BUCKET}/recordings",
            "VOICE_AGENT_STORAGE__S3_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "VOICE_AGENT_SERVER__REDIS_URL": redis.url,
            "VOICE_AGENT_SERVER__TOKEN_SECRET": "replica-test-secret-0123456789",
            "VOICE_AGENT_SERVER__API_KEYS": json.dumps(list(KEYS.values())),
            "VOICE_AGENT_SERVER__TRUSTED_PROXIES": '["127.0.0.1"]',
            "VOICE_AGENT_SERVER__MAX_CALLS_PER_KEY": "2",
            "VOICE_AGENT_SERVER__MAX_CONNECTIONS_PER_MINUTE": "600",
            "VOICE_AGENT_SERVER__DRAIN_TIMEOUT_S": str(DRAIN_S),
        }
        with ThreadPoolExecutor(len(NAMES)) as pool:  # the replicas load their models side by side
            started = list(pool.map(lambda _: start_server(tmp, env), NAMES))
        replicas = {name: Replica(server, proc) for name, (server, proc) in zip(NAMES, started, strict=True)}
        try:
            balancer = stack.enter_context(haproxy(tmp, {name: r.port for name, r in replicas.items()}))
            yield Cluster(tmp, env, balancer, replicas, redis, postgres)
        finally:
            for replica in replicas.values():
                if replica.proc.poll() is None:
                    stop_server(replica.proc)


async def call_on(cluster: Cluster, name: str, key: str, **start: Any) -> VoiceClient:
    """A call through the balancer that lands on replica `name` (calls that land elsewhere are hung up)."""
    for _ in range(3 * len(NAMES)):
        client = VoiceClient(cluster.balancer.ws_url, headers={"Authorization": f"Bearer {key}"})
        started = await client.connect(**start)
        assert started["type"] == "session.started", started
        if client.response_headers.get("x-served-by") == name:
            return client
        await client.close()
    raise AssertionError(f"no call through the balancer landed on {name}: {cluster.balancer.states()}")


async def speak(client: VoiceClient, question: str, tmp: Path, done: int = 1) -> None:
    """Say `question` and wait for the `done`-th completed response."""
    await client.stream(speech_samples(question, tmp))
    trailing = asyncio.create_task(client.silence(30))
    try:
        await client.wait_for(lambda e: e["type"] == "response.done" and len(client.events("response.done")) >= done,
                              120)
    finally:
        trailing.cancel()


async def record(api: httpx.AsyncClient, call_id: str, turns: int, ended: bool, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        response = await api.get(f"/api/calls/{call_id}")
        if response.status_code == 200:
            body: dict = response.json()
            if len(body["turns"]) >= turns and (body["call"]["ended_at"] is not None) == ended:
                return body
        assert time.monotonic() < deadline, f"{api.base_url}: call {call_id}: {response.status_code} {response.text}"
        await asyncio.sleep(0.2)


async def test_a_token_minted_through_the_balancer_opens_a_call_on_another_replica(cluster: Cluster) -> None:
    key = KEYS["token"]
    landed: list[tuple[str, str]] = []
    async with httpx.AsyncClient(base_url=cluster.balancer.url, timeout=10) as http:
        for _ in range(4):
            minted = await http.post("/api/session-token", headers={"Authorization": f"Bearer {key}"})
            assert minted.status_code == 200, minted.text
            client = VoiceClient(f"{cluster.balancer.ws_url}?token={minted.json()['token']}")
            started = await client.connect()
            assert started["type"] == "session.started", started
            landed.append((minted.headers["x-served-by"], client.response_headers["x-served-by"]))
            await client.close()
            if landed[-1][0] != landed[-1][1]:
                break
    assert any(minter != user for minter, user in landed), landed


async def test_calls_and_recordings_from_every_replica_are_seen_through_any(cluster: Cluster, tmp_path: Path) -> None:
    key = KEYS["seen"]
    made: dict[str, str] = {}
    for name in NAMES:
        client = await call_on(cluster, name, key)
        await speak(client, "What is the capital of France?", tmp_path)
        await client.send_json({"type": "session.end"})
        await client.wait_closed(30)
        made[name] = client.session["session_id"]
    for name in NAMES:
        async with cluster.api(name, key) as api:
            listed = (await api.get("/api/calls", params={"limit": 200})).json()["calls"]
            assert set(made.values()) <= {c["id"] for c in listed}, (name, listed)
            for origin, call_id in made.items():
                body = await record(api, call_id, turns=1, ended=True)
                assert body["turns"][0]["user_text"], body
                if origin == name:
                    continue
                deadline = time.monotonic() + 30  # uploaded when the call ended, in the background
                while (wav := await api.get(f"/api/calls/{call_id}/recording")).status_code != 200:
                    assert time.monotonic() < deadline, (origin, name, wav.status_code, wav.text)
                    await asyncio.sleep(0.2)
                assert wav.content[:4] == b"RIFF" and len(wav.content) > 16000, (origin, name, len(wav.content))


async def test_a_keys_limit_on_calls_holds_across_replicas(cluster: Cluster) -> None:
    key = KEYS["limit"]  # server.max_calls_per_key is 2 on every replica
    first, second = await call_on(cluster, "a", key), await call_on(cluster, "b", key)
    try:
        refused: list[tuple[str, int | None, str]] = []
        for _ in range(3):  # each lands on some replica: every one refuses the third call
            third = VoiceClient(cluster.balancer.ws_url, headers={"Authorization": f"Bearer {key}"})
            await third.open()
            code = await third.wait_closed(10)
            refused.append((third.response_headers["x-served-by"], code, third._ws.close_reason))
        assert all(code == 1013 and "server.max_calls_per_key" in reason for _, code, reason in refused), refused
        assert len({name for name, _, _ in refused}) >= 2, refused  # not one replica's count
        await first.close()
        deadline = time.monotonic() + 20  # the hung-up call's slot is given back: a new one is let in
        while True:
            again = VoiceClient(cluster.balancer.ws_url, headers={"Authorization": f"Bearer {key}"})
            started = await again.connect()
            if started["type"] == "session.started":
                await again.close()
                break
            assert time.monotonic() < deadline, started
            await asyncio.sleep(0.2)
    finally:
        await first.close()
        await second.close()


async def test_sigterm_mid_reply_finishes_the_reply_moves_new_calls_and_keeps_the_record(
        cluster: Cluster, tmp_path: Path) -> None:
    key = KEYS["sigterm"]
    victim = "a"
    client = await call_on(cluster, victim, key, instructions="Answer in two short sentences.")
    try:
        await client.stream(speech_samples("Tell me about the history of the bicycle.", tmp_path))
        trailing = asyncio.create_task(client.silence(40))
        deadline = time.monotonic() + 120
        while not client.audio_between(0):  # the reply's first audio: the replica is mid-reply
            assert time.monotonic() < deadline and not client.closed, client.events()
            await asyncio.sleep(0.02)
        assert not client.events("response.done"), client.events()  # not yet over
        proc = cluster.replicas[victim].proc
        proc.send_signal(signal.SIGTERM)
        cluster.balancer.wait_for(victim, "DOWN", timeout=10)  # its /readyz failed: no new calls for it
        newcomer = await call_on(cluster, "b", key)  # lands on another
        landed = []
        newcomers = {"Authorization": f"Bearer {KEYS['sigterm-newcomers']}"}
        for _ in range(3):
            other = VoiceClient(cluster.balancer.ws_url, headers=newcomers)
            started = await other.connect()
            assert started["type"] == "session.started", started
            landed.append(other.response_headers["x-served-by"])
            await other.close()
        assert victim not in landed, landed
        await newcomer.close()
        close_code = await client.wait_closed(DRAIN_S + 10)
        trailing.cancel()
        exit_code = await asyncio.to_thread(proc.wait, 20)
        events = [e for e in client.events() if e["type"] in ("response.done", "error")]
        assert events[0]["type"] == "response.done" and events[0]["status"] == "completed", events
        assert events[-1]["type"] == "error" and events[-1]["code"] == "server_shutting_down", events
        assert close_code == 1001 and exit_code == 0, (close_code, exit_code)
        async with cluster.api("c", key) as api:
            body = await record(api, client.session["session_id"], turns=1, ended=True)
        assert body["call"]["end_reason"] == "server_shutdown", body["call"]
        assert body["turns"][0]["heard_text"] and body["turns"][0]["status"] == "completed", body["turns"][0]
    finally:
        await client.close()
        if cluster.replicas[victim].proc.poll() is None:
            cluster.replicas[victim].proc.kill()
        cluster.replicas[victim].proc.wait(20)
        cluster.restart(victim)


async def test_sigkill_loses_only_the_calls_on_that_replica_and_keeps_their_finished_turns(
        cluster: Cluster, tmp_path: Path) -> None:
    key = KEYS["sigkill"]
    victim, survivor = "b", "c"
    doomed = await call_on(cluster, victim, key)
    spared = await call_on(cluster, survivor, key)
    try:
        await speak(doomed, "What is the capital of France?", tmp_path)
        async with cluster.api(survivor, key) as api:
            await record(api, doomed.session["session_id"], turns=1, ended=False)  # the finished turn is stored
        cluster.replicas[victim].proc.kill()
        await doomed.wait_closed(10)  # its caller is cut off
        cluster.balancer.wait_for(victim, "DOWN", timeout=10)
        await speak(spared, "What is the capital of Italy?", tmp_path)  # the other replica's call goes on
        answered = spared.events("response.done")[-1]
        assert answered["status"] == "completed" and answered["text"], answered
        await spared.send_json({"type": "session.end"})
        await spared.wait_closed(30)
        async with cluster.api(survivor, key) as api:
            kept = await record(api, doomed.session["session_id"], turns=1, ended=False)
            whole = await record(api, spared.session["session_id"], turns=1, ended=True)
        assert kept["turns"][0]["generated_text"] and len(kept["turns"]) == 1, kept
        assert whole["call"]["end_reason"] != "server_shutdown", whole["call"]
    finally:
        await doomed.close()
        await spared.close()
        cluster.replicas[victim].proc.wait(20)
        cluster.restart(victim)


async def test_a_restart_of_postgresql_and_redis_mid_call_loses_no_turn_and_the_call_goes_on(
        cluster: Cluster, tmp_path: Path) -> None:
    key = KEYS["restart"]
    postgres = cluster.postgres
    if postgres is None:
        missing("restarting PostgreSQL needs the tests' own server, not VOICE_AGENT_TEST_POSTGRES_URL")
    client = await call_on(cluster, "c", key)
    try:
        await speak(client, "What is the capital of France?", tmp_path)
        await asyncio.to_thread(postgres.stop)  # a restart of both shared servers: down...
        await asyncio.to_thread(cluster.redis.stop)
        await speak(client, "What is the capital of Italy?", tmp_path, done=2)  # its turn waits to be stored
        await asyncio.to_thread(postgres.start)  # ...and up again, well within storage.write_retry_s
        await asyncio.to_thread(cluster.redis.start)
        await speak(client, "What is the capital of Spain?", tmp_path, done=3)
        newcomer = await call_on(cluster, "a", key)  # new calls are let in again
        await newcomer.close()
        await client.send_json({"type": "session.end"})
        await client.wait_closed(30)
        async with cluster.api("b", key) as api:
            body = await record(api, client.session["session_id"], turns=3, ended=True, timeout=90)
        assert len({t["turn_id"] for t in body["turns"]}) == 3, body["turns"]  # every finished turn, once
        assert all(t["user_text"] and t["generated_text"] for t in body["turns"]), body["turns"]
        assert body["call"]["turns"] == 3 and body["call"]["ended_at"] is not None, body["call"]
        answers = client.events("response.done")  # each question heard its answer: down or up, the call talked on
        assert [a["status"] for a in answers] == ["completed"] * 3 and all(a["text"] for a in answers), answers
    finally:
        await client.close()
        if not await asyncio.to_thread(postgres.running):  # the next test finds both running, whatever happened
            await asyncio.to_thread(postgres.start)
        if not cluster.redis.running:
            await asyncio.to_thread(cluster.redis.start)
