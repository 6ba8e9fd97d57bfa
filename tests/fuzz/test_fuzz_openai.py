"""Fuzzing the /v1 bodies through the real app (ASGI, fake engines, named as fakes): random and
mutated JSON, wrong types, huge numbers, bytes that are not UTF-8. Every bad body gets a 4xx with a
JSON error and a code, never a 500; a well-formed request sent after each one is answered right."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.main import create_app
from app.runtime import Runtime
from tests.app.fake_server import REPLY
from tests.fuzz.harness import CASES, Loop, fake_runtime, fuzz_settings
from tests.fuzz.strategies import text_frames

TEMPLATES: list[dict[str, Any]] = [
    {"model": "", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "temperature": 0.5,
     "top_p": 0.9, "stop": ["\n"], "stream": False, "n": 1},
    {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}], "stream": True,
     "speculative": {"method": "off", "num_speculative_tokens": 3}},
]
GOOD = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 64}
bodies = st.one_of(text_frames(TEMPLATES).map(str.encode), st.binary(max_size=300))


@pytest.fixture(scope="module")
def client() -> Iterator[tuple[Loop, httpx.AsyncClient, Runtime]]:
    loop = Loop()
    runtime = fake_runtime()
    app = create_app(runtime.settings, backends=runtime.backends)
    app.state.runtime.ready.set()  # the lifespan is not run here: the fake engines need no loading
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")
    yield loop, client, app.state.runtime
    loop.run(client.aclose())
    loop.close()


def check_good(loop: Loop, client: httpx.AsyncClient) -> None:
    response = loop.run(client.post("/v1/chat/completions", json=GOOD))
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == REPLY


@given(bodies)
@fuzz_settings(1000)
def test_every_bad_body_gets_a_4xx_json_error(client: tuple[Loop, httpx.AsyncClient, Runtime], body: bytes) -> None:
    CASES["v1 body"] += 1
    loop, http, runtime = client
    response = loop.run(http.post("/v1/chat/completions", content=body,
                                  headers={"content-type": "application/json"}))
    assert response.status_code < 500, (response.status_code, response.text, body)
    if response.status_code >= 400:
        error = json.loads(response.text)["error"]
        assert isinstance(error["code"], str) and error["code"] and error["message"], error
    assert runtime.api_requests == 0  # every generation let go of its slot
    if CASES["v1 body"] % 50 == 0:
        check_good(loop, http)


def test_a_well_formed_request_is_answered_after_the_fuzzing(client: tuple[Loop, httpx.AsyncClient, Runtime]) -> None:
    loop, http, _ = client
    check_good(loop, http)
