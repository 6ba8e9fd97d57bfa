"""POST /v1/chat/completions on the embedded engine: OpenAI format, streaming and not, with the
speculative decoding choice per request and its stats in the final chunk."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.e2e.conftest import Server

pytestmark = pytest.mark.slow
ORDER = "Repeat exactly after me: two large pepperoni pizzas, one garlic bread and a bottle of cola."


def post(server: Server, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=120)


def test_non_streaming_completion_with_ngram_speculation(server: Server) -> None:
    # "auto" may rightly choose not to draft when the costs measured at start-up say it does not pay
    # (a busy machine's are), so drafting itself is checked with a fixed K, and "auto" with its stats
    auto = post(server, {"messages": [{"role": "user", "content": ORDER}], "temperature": 0, "max_tokens": 40,
                         "speculative": {"method": "ngram", "num_speculative_tokens": "auto"}})
    assert auto.status_code == 200, auto.text
    chosen = auto.json()["usage"]["speculative_decoding"]
    assert chosen["method"] == "ngram" and chosen["accepted_tokens"] <= chosen["draft_tokens"], chosen
    reply = post(server, {"messages": [{"role": "user", "content": ORDER}], "temperature": 0, "max_tokens": 40,
                          "speculative": {"method": "ngram", "num_speculative_tokens": 4}})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["object"] == "chat.completion"
    text = body["choices"][0]["message"]["content"]
    assert "pepperoni" in text.lower()
    spec = body["usage"]["speculative_decoding"]
    assert spec["method"] == "ngram" and spec["drafts"] > 0 and spec["accepted_tokens"] > 0
    assert body["usage"]["completion_tokens"] == spec["completion_tokens"] > 0
    assert spec["mean_acceptance_length"] == pytest.approx(1 + spec["accepted_tokens"] / spec["drafts"], abs=1e-3)

    plain = post(server, {"messages": [{"role": "user", "content": ORDER}], "temperature": 0, "max_tokens": 40,
                          "speculative": {"method": "off"}}).json()
    assert plain["usage"]["speculative_decoding"]["drafts"] == 0


def test_streaming_completion_ends_with_stats_and_done(server: Server) -> None:
    body = {"messages": [{"role": "system", "content": "Answer in one short sentence."},
                         {"role": "user", "content": "What is the capital of France?"}],
            "stream": True, "temperature": 0, "speculative": {"method": "ngram", "num_speculative_tokens": 4}}
    chunks, done = [], False
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=120) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunks.append(json.loads(line[6:]))
    assert done
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert "paris" in text.lower()
    final = chunks[-1]
    assert final["choices"][0]["finish_reason"] == "stop"
    assert final["usage"]["speculative_decoding"]["method"] == "ngram"
    assert all(k <= 4 for k in final["usage"]["speculative_decoding"]["k_chosen"])


def test_a_stop_string_ends_the_generation_with_its_real_usage(server: Server) -> None:
    """The reply is cut at the stop string, the generation ends there, and usage reports what was
    generated up to it (tokens and speculative statistics), not zeros."""
    body = {"messages": [{"role": "user", "content": ORDER}], "temperature": 0, "max_tokens": 60,
            "stop": ["garlic"], "speculative": {"method": "ngram", "num_speculative_tokens": 4}}
    reply = post(server, body)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    text = data["choices"][0]["message"]["content"]
    assert data["choices"][0]["finish_reason"] == "stop"
    assert "garlic" not in text and "pepperoni" in text.lower()
    usage = data["usage"]
    spec = usage["speculative_decoding"]
    assert 0 < usage["completion_tokens"] < 60 and usage["prompt_tokens"] > 0
    assert spec["completion_tokens"] == usage["completion_tokens"] and spec["method"] == "ngram"
    assert spec["drafts"] > 0 and spec["finish_reason"] == "stop"


@pytest.mark.parametrize(("body", "status", "code"), [
    ({"messages": []}, 400, "invalid_request"),
    ({"messages": [{"role": "user", "content": "hi"}], "model": "gpt-9"}, 404, "model_not_found"),
    ({"messages": [{"role": "user", "content": "hi"}], "speculative": {"method": "draft_model"}}, 400,
     "speculation_unavailable"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "unsupported_n"),
])
def test_bad_requests_get_openai_style_errors(server: Server, body: dict, status: int, code: str) -> None:
    reply = post(server, body)
    assert reply.status_code == status
    assert reply.json()["error"]["code"] == code


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_over_the_context_gets_a_400(server: Server, stream: bool) -> None:
    long = " ".join(f"word{i}" for i in range(5000))  # well over llm.max_context_tokens (4096)
    reply = post(server, {"messages": [{"role": "user", "content": long}], "max_tokens": 8, "stream": stream})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "context_length_exceeded" and "llm.max_context_tokens" in error["message"]


def test_generations_beyond_max_api_requests_get_429_and_slots_come_back(server: Server) -> None:
    body = {"messages": [{"role": "user", "content": "Write the numbers from 1 to 500, separated by commas."}],
            "max_tokens": 400, "temperature": 0, "stream": True, "speculative": {"method": "off"}}
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        streams, readers = [], []
        try:
            for _ in range(4):  # server.max_api_requests, by default
                response = client.send(client.build_request("POST", "/v1/chat/completions", json=body), stream=True)
                assert response.status_code == 200
                streams.append(response)
                readers.append(response.iter_lines())  # kept: a dropped reader closes its response
                next(readers[-1])  # generating
            refused = client.post("/v1/chat/completions", json={**body, "stream": False, "max_tokens": 4})
            assert refused.status_code == 429, refused.text
            assert refused.headers["Retry-After"] == "1"
            assert refused.json()["error"]["code"] == "too_many_requests"
        finally:
            for response in streams:
                response.close()  # the client goes away mid-stream
    deadline = time.monotonic() + 20
    while True:  # the aborted generations give their slots back
        again = post(server, {**body, "stream": False, "max_tokens": 4})
        if again.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert again.status_code == 200, again.text


BOOKING_TOOL = {"type": "function", "function": {
    "name": "book_table", "description": "Book a table at the restaurant.",
    "parameters": {"type": "object", "properties": {"party_size": {"type": "integer"}, "time": {"type": "string"}},
                   "required": ["party_size", "time"]}}}
STATUS_TOOL = {"type": "function", "function": {
    "name": "order_status", "description": "Look up an order by its number.",
    "parameters": {"type": "object", "properties": {"order_number": {"type": "string"}},
                   "required": ["order_number"]}}}


def test_tool_calls_through_the_official_openai_sdk(server: Server) -> None:
    """Another framework using this server as its LLM with tools: the official SDK's own parsing
    of the calls, streamed and not, and the follow-up with the tool's result."""
    from openai import OpenAI

    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=120)
    model = client.models.list().data[0].id
    messages: list[dict] = [{"role": "user", "content": "Where is my order 4512?"}]
    done = client.chat.completions.create(model=model, messages=messages,  # type: ignore[arg-type]
                                          tools=[BOOKING_TOOL, STATUS_TOOL], temperature=0)  # type: ignore[list-item]
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "order_status"  # type: ignore[union-attr]
    assert "4512" in json.loads(call.function.arguments)["order_number"].replace(" ", "")  # type: ignore[union-attr]

    stream = client.chat.completions.create(model=model, messages=messages, stream=True,  # type: ignore[arg-type]
                                            tools=[BOOKING_TOOL, STATUS_TOOL], temperature=0,  # type: ignore[list-item]
                                            tool_choice={"type": "function", "function": {"name": "order_status"}})
    pieces, finish = {}, None
    for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            piece = pieces.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            piece["id"] += delta.id or ""
            piece["name"] += delta.function.name or "" if delta.function else ""
            piece["arguments"] += delta.function.arguments or "" if delta.function else ""
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert finish == "tool_calls" and [p["name"] for p in pieces.values()] == ["order_status"]
    json.loads(pieces[0]["arguments"])

    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"status": "shipped Monday"})}]
    follow = client.chat.completions.create(model=model, messages=messages,  # type: ignore[arg-type]
                                            tools=[BOOKING_TOOL, STATUS_TOOL], temperature=0,  # type: ignore[list-item]
                                            tool_choice="none", max_tokens=40)
    # tool_choice "none": words, however weak the model (whether the 0.5B uses the result is in
    # tests/models/test_tool_calls_llama.py, on the 1.5B)
    # (a weak model's words may run to max_tokens: "length" is words too)
    assert follow.choices[0].finish_reason in ("stop", "length") and not follow.choices[0].message.tool_calls
    assert (follow.choices[0].message.content or "").strip()


@pytest.mark.parametrize("body, message", [
    ({"tools": [{"type": "function", "function": {"name": "x y"}}]}, "name must be"),
    ({"tools": [BOOKING_TOOL], "tool_choice": {"type": "function", "function": {"name": "fly"}}}, "not among"),
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/defs/a"}}}}}]}, "not supported"),
    ({"messages": [{"role": "tool", "content": "{}"}]}, "tool_call_id"),
])
def test_bad_tools_get_a_400_that_says_what_is_wrong(server: Server, body: dict, message: str) -> None:
    reply = post(server, {"messages": [{"role": "user", "content": "Hi"}], **body})
    assert reply.status_code == 400 and message in reply.json()["error"]["message"], reply.text
