import pytest

from app.transports.native.messages import OutputAudioPlayed, SessionEnd, SessionStart, event_json, parse_client_text
from core.errors import ProtocolError
from models.protocols import GenerationStats
from pipeline.events import ResponseDone, SpeechStarted


def code_of(text: str) -> str:
    with pytest.raises(ProtocolError) as info:
        parse_client_text(text)
    return info.value.code


def test_session_start_is_parsed() -> None:
    msg = parse_client_text('{"type":"session.start","audio":{"sample_rate":48000,"encoding":"pcm16"},'
                            '"instructions":"Be brief."}')
    assert isinstance(msg, SessionStart)
    assert msg.audio.sample_rate == 48000 and msg.instructions == "Be brief."
    assert isinstance(parse_client_text('{"type":"session.end"}'), SessionEnd)


@pytest.mark.parametrize(("text", "code"), [
    ("{not json", "invalid_json"),
    ("[1, 2]", "invalid_message"),
    ('{"kind": "x"}', "invalid_message"),
    ('{"type": "dance"}', "unknown_type"),
    ('{"type": "session.start"}', "invalid_message"),
    ('{"type": "session.start", "audio": {"sample_rate": 44100}}', "unsupported_sample_rate"),
    ('{"type": "session.start", "audio": {"sample_rate": 16000, "encoding": "opus"}}', "invalid_message"),
    ('{"type": "session.start", "audio": {"sample_rate": 16000}, "output_audio": {"sample_rate": 11}}',
     "unsupported_sample_rate"),
    ('{"type": "session.start", "audio": {"sample_rate": 16000}, "surprise": 1}', "invalid_message"),
])
def test_bad_messages_get_specific_codes(text: str, code: str) -> None:
    assert code_of(text) == code


def test_error_messages_say_what_to_do() -> None:
    with pytest.raises(ProtocolError) as info:
        parse_client_text('{"type": "session.start", "audio": {"sample_rate": 44100}}')
    assert "8000" in str(info.value) and "48000" in str(info.value)


def test_events_to_wire() -> None:
    assert event_json(SpeechStarted(3, 1.0, 512.4)) == {"type": "speech.started", "turn_id": 3, "audio_start_ms": 512}
    stats = GenerationStats(completion_tokens=5, duration_ms=500.0)
    done = event_json(ResponseDone(3, "Hi.", "completed", {"speech_end": 0.0}, 800.0, stats))
    assert done["type"] == "response.done" and done["status"] == "completed"
    assert done["llm"]["tokens_per_second"] == 10.0


def test_playback_reports_are_parsed_and_checked() -> None:
    msg = parse_client_text('{"type":"output_audio.played","turn_id":3,"played_ms":1840}')
    assert isinstance(msg, OutputAudioPlayed) and msg.turn_id == 3 and msg.played_ms == 1840
    assert code_of('{"type":"output_audio.played","turn_id":3,"played_ms":-5}') == "invalid_message"
    assert code_of('{"type":"output_audio.played","played_ms":5}') == "invalid_message"


def test_response_done_carries_deadline_misses_and_underruns() -> None:
    done = event_json(ResponseDone(4, "Hi.", "completed", {}, 900.0, None, deadline_missed=True, underruns=2,
                                   underrun_ms=640.5))
    assert (done["deadline_missed"], done["underruns"], done["underrun_ms"]) == (True, 2, 640.5)
    assert event_json(ResponseDone(5, "Hi.", "completed", {}))["underruns"] == 0
