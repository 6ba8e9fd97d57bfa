"""The call QA dashboard in headless Chromium, against the real app and store on a temporary SQLite
file: the calls list renders the seeded calls and sorts them, the filters reach the API, a call's
page draws a waterfall whose bars (read back from the Chart.js object) are the API's stage figures,
the transcript strikes through what the caller did not hear, the recording's turn markers seek the
player, and every resource comes from the service itself. Screenshots of the list and of a call go
to test-artifacts/qa/.

The calls are written through the store's own interface (CallStore.call_started, turn_ended,
call_ended) before the app starts; the app runs in a thread under uvicorn with fake backends: no
model is loaded.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import json
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn

from app.main import create_app
from app.settings import Settings
from app.store import CallRecord, CallStore, StorageConfig, TurnRecord
from pipeline.session import Backends
from tests.e2e.chromium import console, start_chromium
from tests.pipeline.fakes import FakeLLM, FakeRecognizer, FakeSynthesizer, FakeVad

pytestmark = [pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "qa"
STAGE_KEYS = ("endpointing", "asr", "first_token", "first_phrase", "tts", "first_audio")
NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)
RECORDING_S = 22.0
MONO_T0 = 100.0  # the recorder's clock at the demo call's start


def marks(*values: float) -> dict[str, float]:
    names = ("speech_end", "asr_final", "llm_first_token", "first_phrase", "tts_first_audio", "first_audio_sent")
    return dict(zip(names, values, strict=False))


def spec(k: list[int], per_position: list[int]) -> dict[str, Any]:
    """A turn's speculative statistics: a draft of k_chosen[i] tokens per step."""
    drafts, draft_tokens, accepted = len(k), sum(k), sum(per_position)
    return {"method": "draft_model", "drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted,
            "accepted_per_position": per_position, "k_chosen": k, "tokens_per_second": 41.5,
            "acceptance_rate": round(accepted / draft_tokens, 4), "completion_tokens": accepted + drafts,
            "time_to_first_token_ms": 80.0}


@dataclass
class SeedCall:
    id: str
    transport: str
    minutes_ago: float
    turns: list[TurnRecord]
    error: str | None = None
    recorded: bool = False

    @property
    def started(self) -> dt.datetime:
        return NOW - dt.timedelta(minutes=self.minutes_ago)


def turn(turn_id: int, offset_s: float, latency: dict[str, float], v2v: float | None, *, status: str = "completed",
         user: str = "", generated: str = "", sent: str | None = None, heard: str | None = None,
         stats: dict[str, Any] | None = None, **extra: Any) -> TurnRecord:
    sent = generated if sent is None else sent
    return TurnRecord(turn_id=turn_id, at=NOW, offset_s=offset_s, status=status, user_text=user,
                      generated_text=generated, sent_text=sent, heard_text=sent if heard is None else heard,
                      latency_ms=latency, voice_to_voice_ms=v2v, spec=stats, **extra)


DEMO_REPLY = "Sure. For what time? And under which name should I put it?"
DEMO = SeedCall("qa-demo", "ws", 20, recorded=True, turns=[
    turn(1, 2.1, marks(0, 92.4, 171.0, 233.8, 301.5, 305.2), 512.7, user="Hello, I'd like to book a table.",
         generated="Happy to help. How many people?", stats=spec([4, 4, 3, 3, 2], [4, 3, 2, 2]), dtmf="1#"),
    # a reply started at a pause: ASR and the first token came before the end-of-speech decision
    turn(2, 7.4, marks(0, -40.0, -12.5, 35.0, 88.0, 90.5), 301.0, user="For two, please.",
         generated="A table for two.", stats=spec([4, 4], [2, 2, 1, 1])),
    turn(3, 12.9, marks(0, 101.0, 190.0, 260.0, 330.0, 334.0), 560.0, status="interrupted", barge_in=True,
         user="Can you book it for tonight?", generated=DEMO_REPLY, sent="Sure. For what time?",
         heard="Sure. For what", stats=spec([4, 4, 4], [3, 2, 1, 0])),
    turn(4, 17.0, marks(0, 85.0, 160.0, 220.0, 290.0, 292.0), 480.0, user="Eight o'clock, under Smith.",
         generated="Done: eight o'clock for two, under Smith.", stats=spec([3, 3], [2, 2, 1])),
])
SEED = [
    DEMO,
    SeedCall("qa-slow", "twilio", 60, turns=[
        turn(1, 3.0, marks(0, 180.0, 420.0, 610.0, 700.0, 706.0), 900.0, user="hi", generated="Hello there."),
        turn(2, 9.0, marks(0, 200.0, 800.0, 1100.0, 1190.0, 1195.0), 1400.0, user="and?", generated="Well.",
             deadline_missed=True, underruns=2)]),
    SeedCall("qa-failed", "telnyx", 90, error="llm_unavailable: the LLM server refused the connection", turns=[
        turn(1, 2.5, marks(0, 95.0), None, status="failed", user="Are you there?",
             error="llm_unavailable: the LLM server refused the connection")]),
    SeedCall("qa-fast", "ws", 120, turns=[
        turn(n, 2.0 + 5 * n, marks(0, 60.0, 110.0, 150.0, 190.0, 192.0 + n), 250.0 + 10 * n, user=f"q{n}",
             generated=f"a{n}", stats=spec([5, 5], [2, 2, 2, 2, 1])) for n in (1, 2, 3)]),
    SeedCall("qa-phone", "twilio", 150, turns=[
        turn(1, 2.0, marks(0, 90.0, 170.0, 230.0, 300.0, 303.0), 610.0, user="one", generated="First answer."),
        turn(2, 8.0, marks(0, 95.0, 175.0, 240.0, 310.0, 312.0), 655.5, status="interrupted", barge_in=True,
             user="two", generated="Second answer is long.", sent="Second answer", heard="Second")]),
]




def background(k: int) -> SeedCall:
    """One of a few ordinary calls over the last three hours, for the overview's lines."""
    turns = []
    for n in range(1, 2 + k % 3):
        asr = 60.0 + (k * 37 + n * 11) % 70
        token = asr + 50.0 + (k * 13 + n * 7) % 90
        phrase = token + 40.0 + (k * 17) % 50
        audio = phrase + 55.0 + (k * 23 + n) % 40
        turns.append(turn(n, 4.0 * n, marks(0, asr, token, phrase, audio, audio + 2.5), audio + 190.0 + (k * 29) % 80,
                          status="interrupted" if (k, n) == (4, 2) else "completed", user=f"question {n}",
                          generated=f"answer {n}", stats=spec([4, 4, 3], [3, 1 + (k + n) % 3, (k * n) % 3, k % 2])))
    return SeedCall(f"bg-{k:02d}", ("ws", "twilio", "telnyx")[k % 3], 27 + 10 * k, turns)


NAMED = SEED  # the calls the tests look at one by one
# a turn that made a tool call: the reply's first audio is the answer from its result
TOOLS = SeedCall("qa-tools", "ws", 33, turns=[
    turn(1, 2.0, {**marks(0, 90.0, 900.0, 960.0, 1020.0, 1024.0), "tool_dispatched": 310.0, "tools_done": 610.0,
                  "answer_first_audio_sent": 1024.0}, 1230.0, user="Where is my order 4512?",
         generated="It shipped on Monday.",
         tool_calls=[{"call_id": "call_1", "name": "order_status", "arguments": '{"order_number": "4512"}',
                      "runs_on": "server", "output": '{"status": "shipped Monday"}', "error": None,
                      "dispatched_ms": 310.0, "finished_ms": 610.0, "duration_ms": 300.0, "filler_heard": None}])])
SEED = sorted([*NAMED, TOOLS, *(background(k) for k in range(15))], key=lambda c: c.minutes_ago)  # newest first


def expected_segments(turn: TurnRecord) -> dict[str, float | None]:
    """The waterfall's bars as docs/qa.md defines them: endpointing = voice-to-voice minus the first
    audio sent; each stage from the previous mark to its own, negative marks drawn at 0."""
    latency = turn.latency_ms
    sent = latency.get("first_audio_sent")
    endpointing = None if turn.voice_to_voice_ms is None or sent is None else turn.voice_to_voice_ms - max(0.0, sent)
    out: dict[str, float | None] = {"endpointing": endpointing}
    at = 0.0
    for key, mark in zip(STAGE_KEYS[1:], ("asr_final", "llm_first_token", "first_phrase", "tts_first_audio",
                                           "first_audio_sent"), strict=True):
        if mark not in latency:
            out[key] = None
            continue
        end = max(at, latency[mark])
        out[key] = end - at
        at = end
    return out


def test_expected_segments_of_the_seed() -> None:
    """The figures the browser test holds the page to, written out for two turns."""
    assert expected_segments(DEMO.turns[0]) == pytest.approx(
        {"endpointing": 207.5, "asr": 92.4, "first_token": 78.6, "first_phrase": 62.8, "tts": 67.7,
         "first_audio": 3.7})
    assert expected_segments(DEMO.turns[1]) == pytest.approx(
        {"endpointing": 210.5, "asr": 0.0, "first_token": 0.0, "first_phrase": 35.0, "tts": 53.0,
         "first_audio": 2.5})
    failed = expected_segments(NAMED[2].turns[0])
    assert failed == {"endpointing": None, "asr": 95.0, "first_token": None, "first_phrase": None, "tts": None,
                      "first_audio": None}


async def seed(config: StorageConfig) -> None:
    store = CallStore(config)
    await store.open()
    rng = np.random.default_rng(7)
    for call in SEED:
        store.call_started(CallRecord(call.id, call.transport, call.started, fingerprint="5eed5eed5eed5eed",
                                      settings={"llm": {"model": "qwen2.5-0.5b-instruct"}},
                                      caller="+15550100" if call.transport != "ws" else "127.0.0.1"))
        recorder = store.recorder(call.id, started_at=MONO_T0) if call.recorded else None
        if recorder is not None:
            second = 16000
            for s in range(int(RECORDING_S)):
                recorder.caller((rng.standard_normal(second) * 0.02).astype(np.float32), second,
                                at=MONO_T0 + s + 1)  # a caller frame's time is when it has arrived: its end
            for t in call.turns:
                tone = 0.2 * np.sin(np.arange(second) * 2 * np.pi * 220 / second).astype(np.float32)
                recorder.bot(tone, second, at=MONO_T0 + t.offset_s + 0.5)
        for t in call.turns:
            store.turn_ended(call.id, dataclasses.replace(t, at=call.started + dt.timedelta(seconds=t.offset_s)))
        ended = call.started + dt.timedelta(seconds=RECORDING_S if call.recorded else 12 * len(call.turns))
        store.call_ended(call.id, ended, "error" if call.error else "hangup", error=call.error, recorder=recorder)
    await store.flush()
    await store.close()


@dataclass
class App:
    base_url: str
    api: httpx.Client


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    data = tmp_path_factory.mktemp("qa-store")
    config = StorageConfig(url=f"sqlite:///{data / 'calls.db'}", data_dir=str(data), recordings=True,
                           retention_days=0)
    asyncio.run(seed(config))
    backends = Backends(FakeVad(), FakeRecognizer([]), FakeSynthesizer(), FakeLLM([]))
    server = uvicorn.Server(uvicorn.Config(create_app(Settings(storage=config), backends=backends),
                                           host="127.0.0.1", port=_free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, name="qa-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the app did not start"
        time.sleep(0.05)
    base_url = f"http://127.0.0.1:{server.config.port}"
    with httpx.Client(base_url=base_url, timeout=10) as api:
        yield App(base_url, api)
    server.should_exit = True
    thread.join(15)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    driver = start_chromium(tmp_path_factory.mktemp("chromium") / "profile", "--window-size=1280,900",
                            "--force-device-scale-factor=1", "--lang=en-US")
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(browser: Any, predicate: Callable[[], Any], what: str, timeout: float = 15) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s\nbrowser console:\n{console(browser)}"
        time.sleep(0.1)


def open_page(browser: Any, url: str) -> None:
    browser.get(url)
    state = wait_for(browser, lambda: browser.execute_script(
        "const s = document.body.dataset.state; return s === 'loading' ? null : s;"), f"{url} loaded")
    assert state == "ready", f"{url}: {state}: " + browser.execute_script(
        "return document.getElementById('error').textContent") + "\n" + console(browser)


def screenshot(browser: Any, name: str) -> Path:
    """The whole page as test-artifacts/qa/<name>.png (Chromium's own capture beyond the viewport);
    small enough to go into docs/qa-screenshots/ (docs/qa.md)."""
    size = browser.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    shot = browser.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 4000), "scale": 1}})
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    assert path.stat().st_size < 300_000, f"{path}: {path.stat().st_size} bytes, too large for docs/"
    return path


def rows(browser: Any) -> list[dict[str, Any]]:
    return list(browser.execute_script("""
        return [...document.querySelectorAll('#calls tbody tr')].map((tr) => ({
          id: tr.dataset.callId, cells: [...tr.cells].map((td) => td.textContent.trim()),
          href: tr.querySelector('a').getAttribute('href')}));"""))


def column(browser: Any, key: str) -> int:
    keys = browser.execute_script("return [...document.querySelectorAll('#calls th')].map((th) => th.dataset.key)")
    return int(keys.index(key))


def test_the_list_renders_the_seeded_calls(app: App, browser: Any) -> None:
    api = app.api.get("/api/calls").json()
    assert api["total"] == len(SEED)
    open_page(browser, app.base_url + "/qa")
    shown = rows(browser)
    assert [r["id"] for r in shown] == [c["id"] for c in api["calls"]] == [c.id for c in SEED]  # newest first
    assert browser.find_element("id", "count").text == f"({len(SEED)})"

    demo = next(r for r in shown if r["id"] == DEMO.id)
    median = statistics.median(t.voice_to_voice_ms for t in DEMO.turns if t.voice_to_voice_ms is not None)
    assert demo["cells"][column(browser, "v2v_median_ms")] == str(round(median))  # 496
    assert demo["cells"][column(browser, "v2v_max_ms")] == "560"
    assert demo["cells"][column(browser, "turns")] == "4"
    assert demo["cells"][column(browser, "interruptions")] == "1"
    assert demo["cells"][column(browser, "duration_s")] == "0:22"
    assert demo["cells"][column(browser, "status")] == "interrupted"
    failed = next(r for r in shown if r["id"] == "qa-failed")
    assert failed["cells"][column(browser, "v2v_max_ms")] == "–"
    assert failed["cells"][column(browser, "status")] == "failed"
    assert demo["href"] == f"{app.base_url}/qa/calls/{DEMO.id}"

    # the last three hours (the seeded ones), for the screenshot
    since = (NOW - dt.timedelta(hours=3)).isoformat().replace("+00:00", "Z")
    open_page(browser, f"{app.base_url}/qa?since={since}")
    assert len(rows(browser)) == len(SEED)
    screenshot(browser, "calls-list")


def test_sorting_by_a_column_reorders_the_calls(app: App, browser: Any) -> None:
    open_page(browser, app.base_url + "/qa")
    calls = {c["id"]: c for c in app.api.get("/api/calls").json()["calls"]}
    worst = {k: c["v2v_max_ms"] for k, c in calls.items()}
    rising = sorted((k for k in worst if worst[k] is not None), key=lambda k: worst[k])
    missing = [k for k in worst if worst[k] is None]

    header = browser.find_element("css selector", "#calls th[data-key='v2v_max_ms'] button")
    header.click()
    assert [r["id"] for r in rows(browser)] == rising + missing  # calls without a figure go last
    browser.find_element("css selector", "#calls th[data-key='v2v_max_ms'] button").click()
    assert [r["id"] for r in rows(browser)] == rising[::-1] + missing
    sort = browser.find_element("css selector", "#calls th[data-key='v2v_max_ms']").get_attribute("aria-sort")
    assert sort == "descending"
    assert "sort=v2v_max_ms" in browser.current_url and "dir=desc" in browser.current_url

    browser.find_element("css selector", "#calls th[data-key='transport'] button").click()
    transports = [r["cells"][column(browser, "transport")] for r in rows(browser)]
    assert transports == sorted(transports) and transports != [calls[c.id]["transport"] for c in SEED]


def test_filters_and_export_links_carry_the_query(app: App, browser: Any) -> None:
    open_page(browser, app.base_url + "/qa")
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("name", "transport")).select_by_value("twilio")
    browser.find_element("name", "min_v2v_ms").send_keys("1000")
    browser.find_element("css selector", "#filters button[type='submit']").click()
    wait_for(browser, lambda: "transport=twilio" in browser.current_url, "the filters in the URL")
    wait_for(browser, lambda: browser.execute_script("return document.body.dataset.state") == "ready", "reloaded")
    assert [r["id"] for r in rows(browser)] == ["qa-slow"]
    export = browser.find_element("id", "export-csv").get_attribute("href")
    assert "format=csv" in export and "transport=twilio" in export and "min_v2v_ms=1000" in export
    response = app.api.get(export.removeprefix(app.base_url))
    assert response.status_code == 200 and {row.split(",")[0] for row in response.text.splitlines()[1:]} == {"qa-slow"}

    # a Grafana data link: the calls within 5 minutes of a moment
    at_ms = int((DEMO.started + dt.timedelta(minutes=2)).timestamp() * 1000)
    open_page(browser, f"{app.base_url}/qa?around={at_ms}")
    assert [r["id"] for r in rows(browser)] == [DEMO.id]
    assert "around=" not in browser.current_url and "since=" in browser.current_url


def test_paging_through_the_calls(app: App, browser: Any) -> None:
    open_page(browser, app.base_url + "/qa?limit=8")
    ids = [c.id for c in SEED]
    pages = []
    for _ in range(3):
        wait_for(browser, lambda: browser.execute_script("return document.body.dataset.state") == "ready", "a page")
        pages.append(([r["id"] for r in rows(browser)], browser.find_element("id", "page").text))
        if browser.find_element("id", "next").is_enabled():
            browser.find_element("id", "next").click()
    assert pages == [(ids[:8], f"1–8 of {len(ids)}"), (ids[8:16], f"9–16 of {len(ids)}"),
                     (ids[16:], f"17–{len(ids)} of {len(ids)}")]
    assert not browser.find_element("id", "next").is_enabled()
    browser.find_element("id", "prev").click()
    wait_for(browser, lambda: [r["id"] for r in rows(browser)] == ids[8:16], "the page before")
    assert "offset=8" in browser.current_url and "limit=8" in browser.current_url


def test_the_overview_charts_draw_the_apis_buckets(app: App, browser: Any) -> None:
    open_page(browser, app.base_url + "/qa")
    charts = browser.execute_script("""
        const read = (id) => Chart.getChart(document.getElementById(id)).data;
        const data = {v2v: read('chart-v2v'), marks: read('chart-stages'), acceptance: read('chart-acceptance')};
        const strip = (d) => ({labels: d.labels, datasets: d.datasets.map((s) => ({label: s.label, data: s.data}))});
        return {v2v: strip(data.v2v), marks: strip(data.marks), acceptance: strip(data.acceptance),
                window: window.qaPage.overview};""")
    window = charts["window"]
    api = app.api.get("/api/overview", params={"since": window["since"], "until": window["until"],
                                                "bucket_s": window["bucket_s"]}).json()
    buckets = api["buckets"]
    assert sum(b["turns"] for b in buckets) == sum(len(c.turns) for c in SEED)
    assert {s["label"]: s["data"] for s in charts["v2v"]["datasets"]} == {
        name: [b[f"v2v_{name}"] for b in buckets] for name in ("p50", "p95", "p99")}
    marks_drawn = {s["label"]: s["data"] for s in charts["marks"]["datasets"]}
    assert marks_drawn["first audio sent"] == [b["stages_p50"].get("first_audio_sent") for b in buckets]
    assert marks_drawn["ASR final"] == [b["stages_p50"].get("asr_final") for b in buckets]
    turns, rate = charts["acceptance"]["datasets"]
    assert turns["data"] == [b["turns"] for b in buckets]
    assert rate["data"] == [None if b["acceptance_rate"] is None
                            else pytest.approx(b["acceptance_rate"] * 100) for b in buckets]
    assert any(v is not None for v in rate["data"])


def read_waterfall(browser: Any) -> dict[str, Any]:
    return dict(browser.execute_script("""
        const chart = Chart.getChart(document.getElementById('waterfall'));
        return {labels: chart.data.labels,
                datasets: chart.data.datasets.map((d) => ({key: d.key, label: d.label, data: d.data})),
                stacked: chart.options.scales.x.stacked && chart.options.scales.y.stacked,
                indexAxis: chart.options.indexAxis,
                rows: [...document.querySelectorAll('#turns tbody tr')].map(
                  (tr) => JSON.parse(tr.dataset.stageMs))};"""))


def test_a_tool_call_is_a_bar_of_its_own_under_its_turn(app: App, browser: Any) -> None:
    body = app.api.get(f"/api/calls/{TOOLS.id}").json()
    assert body["turns"][0]["tool_calls"][0]["name"] == "order_status"
    open_page(browser, f"{app.base_url}/qa/calls/{TOOLS.id}")
    drawn = read_waterfall(browser)
    assert drawn["labels"] == ["turn 1", "  ↳ order_status"]
    by_key = {d["key"]: d["data"] for d in drawn["datasets"]}
    assert by_key["tool_wait"] == [None, 310.0] and by_key["tool_call"] == [None, 300.0]
    assert all(by_key[key][1] is None for key in STAGE_KEYS)  # the call's row has only the call
    assert by_key["first_audio"][0] is not None  # the turn's row is as before


@pytest.mark.parametrize("call", NAMED, ids=lambda c: c.id)
def test_a_calls_waterfall_draws_the_apis_numbers(app: App, browser: Any, call: SeedCall) -> None:
    body = app.api.get(f"/api/calls/{call.id}").json()
    open_page(browser, f"{app.base_url}/qa/calls/{call.id}")
    drawn = read_waterfall(browser)
    assert drawn["indexAxis"] == "y" and drawn["stacked"]
    assert drawn["labels"] == [f"turn {t['turn_id']}" for t in body["turns"]]
    assert [d["key"] for d in drawn["datasets"]] == list(STAGE_KEYS)
    for i, turn_json in enumerate(body["turns"]):
        api_turn = TurnRecord(turn_id=turn_json["turn_id"], at=NOW, offset_s=turn_json["offset_s"],
                              status=turn_json["status"], latency_ms=turn_json["latency_ms"],
                              voice_to_voice_ms=turn_json["voice_to_voice_ms"])
        want = expected_segments(api_turn)
        got = {d["key"]: d["data"][i] for d in drawn["datasets"]}
        for key in STAGE_KEYS:
            if want[key] is None:
                assert got[key] is None, (call.id, i, key, got)
            else:
                assert got[key] == pytest.approx(want[key], abs=1.0), (call.id, i, key, got, want)
        assert drawn["rows"][i] == got  # the table's figures are the bars'
        drawn_total = sum(v for v in got.values() if v is not None)
        if turn_json["voice_to_voice_ms"] is not None:
            assert drawn_total == pytest.approx(turn_json["voice_to_voice_ms"], abs=1.0)  # the bar ends at v2v


def test_a_calls_page_marks_unheard_words_and_shows_its_figures(app: App, browser: Any) -> None:
    open_page(browser, f"{app.base_url}/qa/calls/{DEMO.id}")
    transcript = browser.execute_script("""
        return [...document.querySelectorAll('#transcript article')].map((a) => ({
          id: Number(a.dataset.turnId), user: a.querySelector('.user').textContent,
          heard: a.querySelector('.bot .heard')?.textContent ?? '',
          sentUnheard: a.querySelector('.bot s.unheard.sent')?.textContent ?? null,
          unsent: a.querySelector('.bot s.unheard.unsent')?.textContent ?? null,
          badges: [...a.querySelectorAll('.badge')].map((b) => b.textContent)}));""")
    barged = next(t for t in transcript if t["id"] == 3)
    assert barged["heard"] == "Sure. For what"
    assert barged["sentUnheard"] == " time?"
    assert barged["unsent"] == " And under which name should I put it?"
    assert {"interrupted", "barge-in"} <= set(barged["badges"])
    first = next(t for t in transcript if t["id"] == 1)
    assert first["heard"] == DEMO.turns[0].generated_text and first["sentUnheard"] is None and first["unsent"] is None
    assert "DTMF 1#" in first["badges"]
    assert "preemptive" in next(t for t in transcript if t["id"] == 2)["badges"]
    assert [t["user"] for t in transcript] == [t.user_text for t in DEMO.turns]

    figures = browser.execute_script("""
        return [...document.querySelectorAll('#turns tbody tr')].map((tr) => ({
          acceptance: tr.querySelector('[data-field=acceptance]').textContent,
          k: tr.querySelector('[data-field=k]').textContent,
          counts: JSON.parse(tr.querySelector('.spark')?.dataset.counts ?? 'null')}));""")
    assert figures[0] == {"acceptance": "69%", "k": "3.2", "counts": [4, 3, 2, 2]}  # 11 of 16 drafted tokens
    assert [f["acceptance"] for f in figures] == ["69%", "75%", "50%", "83%"]
    assert [f["k"] for f in figures] == ["3.2", "4.0", "4.0", "3.0"]

    # the recording: a marker per turn at its offset; a click seeks the player there
    assert browser.find_element("id", "recording").is_displayed()
    wait_for(browser, lambda: browser.execute_script("return document.getElementById('player').readyState >= 1"),
             "the recording's metadata")
    duration = browser.execute_script("return document.getElementById('player').duration")
    assert duration == pytest.approx(RECORDING_S, abs=0.1)
    markers = browser.find_elements("css selector", "#timeline .marker")
    assert [m.text for m in markers] == ["1", "2", "3", "4"]
    lefts = [float(m.value_of_css_property("left").removesuffix("px")) for m in markers]
    width = browser.execute_script("return document.getElementById('timeline').getBoundingClientRect().width")
    for left, t in zip(lefts, DEMO.turns, strict=True):
        assert left == pytest.approx(t.offset_s / duration * width, abs=2)
    markers[2].click()
    wait_for(browser, lambda: abs(browser.execute_script("return document.getElementById('player').currentTime")
                                  - DEMO.turns[2].offset_s) < 0.05, "the player seeked to turn 3")
    browser.execute_script("window.scrollTo(0, 0)")
    screenshot(browser, "call-page")


def test_a_call_without_a_recording_hides_the_player_and_an_unknown_call_says_so(app: App, browser: Any) -> None:
    open_page(browser, f"{app.base_url}/qa/calls/qa-failed")
    assert not browser.find_element("id", "recording").is_displayed()
    error_turn = browser.find_element("css selector", "#transcript article[data-turn-id='1'] .error-text").text
    assert error_turn.startswith("llm_unavailable")

    browser.get(f"{app.base_url}/qa/calls/no-such-call")
    wait_for(browser, lambda: browser.execute_script("return document.body.dataset.state") == "error", "an error")
    assert browser.find_element("id", "error").text == "No call with id no-such-call."


def test_every_resource_comes_from_the_service(app: App, browser: Any) -> None:
    for path in ("/qa", f"/qa/calls/{DEMO.id}"):
        browser.get_log("browser")  # read (and so drop) what earlier pages logged
        open_page(browser, app.base_url + path)
        loaded = browser.execute_script("return performance.getEntriesByType('resource').map((e) => e.name)")
        assert loaded and all(url.startswith(app.base_url + "/") for url in loaded), loaded
        assert any(url.endswith("/static/vendor/chart.umd.js") for url in loaded)
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, json.dumps(errors, indent=1)

