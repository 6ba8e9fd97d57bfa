from pipeline.turns import PhraseLedger, Turn


def test_latency_marks_are_ms_since_speech_end() -> None:
    turn = Turn(1)
    turn.mark("speech_end", 10.0)
    turn.mark("asr_final", 10.25)
    turn.mark("asr_final", 11.0)  # the first mark wins
    turn.mark("first_audio_sent", 10.9)
    turn.ended_at = 9.5
    assert turn.latency_ms() == {"speech_end": 0.0, "asr_final": 250.0, "first_audio_sent": 900.0}
    assert turn.voice_to_voice_ms() == 1400.0


def test_sent_text_keeps_whole_phrases_and_a_share_of_the_cut_one() -> None:
    ledger = PhraseLedger()
    ledger.add_phrase(0, "Of course,")
    ledger.add_phrase(1, "your table for four is booked at eight.")
    ledger.add_phrase(2, "Anything else?")
    ledger.add_audio(0, 1000)
    ledger.add_audio(1, 8000)
    ledger.add_sent(0, 1000)
    ledger.add_sent(1, 4000)  # half of phrase 1 went out
    assert ledger.sent_text() == "Of course, your table for four"
    assert ledger.full_text() == "Of course, your table for four is booked at eight. Anything else?"


def test_nothing_sent_means_no_text() -> None:
    ledger = PhraseLedger()
    ledger.add_phrase(0, "Hello.")
    ledger.add_audio(0, 100)
    assert ledger.sent_text() == ""
