"""Settings sections of the pipeline (composed into app.settings.Settings)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

# Calls without tools. A prompt that said the agent can check and do nothing (bench/tool_calls.py
# --no-tools: the 0.5B invented 15 of 30 tune answers with it, 26 with this one) failed three
# end-to-end tests on 8 kHz calls (a phone call's "What is the capital of France?" was answered about
# the United States); they pass with this one, so it stays until that is understood. A prompt with
# examples of good replies (bench/honesty.py's "examples": invented 6 of 40 held-out answers on the 0.5B,
# against 37 with this one) failed the same tests: Whisper heard "What is the capital and friends?" at
# 8 kHz, and the 0.5B recited its examples ("The capital of Spain is Madrid. My ticket number is ...").
DEFAULT_SYSTEM_PROMPT = (
    "You are a friendly, helpful voice assistant on a phone call. Your replies are spoken aloud, so "
    "answer in one to three short, natural sentences. Never use lists, markdown, code, or emoji. "
    "When the caller asks for something, confirm it back in their own words."
)


# For calls with tools: the previous default system prompt kept Qwen2.5-Coder-1.5B from calling them
# ("never use code", "confirm it back": it said "Sure, I can book a table for two at seven tonight"
# and booked nothing). This one was tuned on the tune half of bench/tool_calls.py's spoken set: without its example
# sentence the 1.5B stated prices ("The chicken curry costs $15") and told callers to "call the
# order_status function"; with it, it says it cannot check.
DEFAULT_TOOLS_PROMPT = (
    "You are a friendly voice assistant on a phone call. Your replies are spoken aloud: one to three short, "
    "natural sentences, without lists, markdown or emoji. Use a tool when the caller asks for something a tool "
    "can check or do. You know nothing about this business or the caller beyond what a tool tells you: never "
    "state prices, menus, stock, parking, opening hours, bookings, orders, accounts, weather or anything else you "
    "did not get from a tool, and never say you did something a tool did not do. If no tool can check or do it, "
    "say so plainly, for example: 'Sorry, I can't check that here.' Never mention tools or functions to the caller."
)


NOISE_SUPPRESSOR = r"^(off|speex-([1-9]|[1-5][0-9]|60))$"


class SoundAlone(BaseModel):
    """The decision on the end-of-turn model's answer alone, chosen like the fused one ("audio, tuned")."""

    audio_weight: float = Field(0.25, gt=0, description="weight of the end-of-turn model's log-odds")
    bias: float = Field(-2.0, description="added to the log-odds")
    sure_probability: float = Field(0.8, gt=0, lt=1, description="at or above this the turn ends at once")
    doubt_probability: float = Field(
        0.05, gt=0, lt=1, description="at or below this the caller gets the whole max_patience_ms")


class NoiseFloorConfig(BaseModel):
    """pipeline/noise_floor.py: where the line's background fools the VAD (other people talking), a window not
    louder than the background is silence, whatever the VAD says; the caller is the voice near the microphone."""
    enabled: bool = Field(True, description="gate the VAD on the noise floor (off: the VAD alone decides)")
    start_margin_db: float = Field(6.0, ge=0, le=40, description="outside a turn or in a pause, a window must be "
                                   "this far above the floor to count as speech")
    stop_margin_db: float = Field(3.0, ge=0, le=40, description="while the caller talks, a window this close to "
                                  "the floor counts as silence")
    fooled_probability: float = Field(
        0.5, gt=0, le=1, description="the gate acts only while the VAD's median probability over the quietest "
        "windows (those within stop_margin_db of the floor) reaches this: the background sounds like speech. Steady "
        "noise, which Silero already ignores, is left to it")
    window_s: float = Field(6.0, gt=0, le=60, description="the floor is a low percentile of the levels of this much "
                            "of the line heard while the caller was not talking")
    first_s: float = Field(1.0, ge=0, le=60, description="the gate acts once this much of the line was heard outside "
                           "the caller's turns (a caller who talks as the line opens is never their own floor)")
    first_turn_s: float = Field(
        4.0, gt=0, le=60, description="where this much of the line was heard as the caller talking before first_s of "
        "it was heard outside their turns, the talk is taken for the line's background (other people talking) and "
        "learned from: a call that opens in a café does not keep its first turn going until endpointing.max_turn_s. "
        "A caller who talks this long without a pause as the line opens may be cut off (bench/noise_turns.py)")
    percentile: float = Field(20.0, ge=0, le=50, description="which percentile of those levels is the floor")
    smooth_ms: int = Field(96, ge=0, le=1000, description="the level is smoothed over this long (0: not smoothed)")
    quiet_dbfs: float = Field(-70.0, le=0, description="a window quieter than this is left to the VAD (a quiet "
                              "line: no background to tell the caller from)")


class CallerLevelConfig(BaseModel):
    """pipeline/caller_level.py: one voice behind the caller (a television) is quieter than the caller; a window far
    below the caller's own level in their recent turns is not the caller."""
    enabled: bool = Field(False, description="gate the VAD on the caller's level (off: the VAD and the noise floor "
                          "decide). Off by default: a caller who speaks again start_margin_db quieter is lost "
                          "(bench/noise_turns.py)")
    start_margin_db: float = Field(7.0, ge=0, le=60, description="outside a turn or in a pause, a window this far "
                                   "below the caller's level does not count as speech: a caller who speaks again this "
                                   "much quieter than in their loudest recent turn is not heard until they speak up "
                                   "or memory_s passes")
    stop_margin_db: float = Field(10.0, ge=0, le=60, description="while the caller talks, a window this far below "
                                  "their level counts as silence, where a quieter voice was heard (background_ms, "
                                  "background_share)")
    background_ms: int = Field(320, ge=32, le=10000, description="a quieter voice is heard where the gate kept this "
                               "much of what the VAD called speech from starting a turn in the last recent_s")
    recent_s: float = Field(20.0, gt=0, le=600, description="how far back a quieter voice counts as heard")
    background_share: float = Field(0.3, gt=0, le=1, description="a quieter voice is heard too where this share of "
                                    "the current turn's speech windows is more than stop_margin_db below the turn's "
                                    "own level")
    memory_s: float = Field(60.0, gt=0, le=3600, description="a turn's level is forgotten this long after it "
                            "ended: a caller who moved away from the microphone is not deaf to the bot for longer")
    resume_ms: int = Field(160, ge=32, le=2000, description="where a quieter voice was heard, a pause resumes after "
                           "this much speech loud enough to be the caller (a single loud window of that voice does "
                           "not resume it)")
    percentile: float = Field(90.0, ge=50, le=100, description="a turn's level: this percentile of the smoothed "
                              "levels of its speech windows")
    turns: int = Field(3, ge=1, le=20, description="the caller's level is the loudest of their last this many turns "
                       "(and the current one)")
    min_speech_ms: int = Field(400, ge=32, le=5000, description="a turn's level counts once it has had this much "
                               "speech")


class EndpointingConfig(BaseModel):
    threshold: float = Field(0.5, gt=0, lt=1, description="speech probability that counts as speech")
    neg_threshold: float | None = Field(None, description="below this counts as silence (default threshold - 0.15)")
    min_speech_ms: int = Field(160, ge=0, description="speech must last this long to start a turn (or barge in)")
    end_silence_ms: int = Field(
        480, ge=64, description="silence that ends the caller's turn when no end-of-turn model is used (turn.engine "
        "= \"off\", or the model failed)")
    prefix_padding_ms: int = Field(300, ge=0, description="audio before the detected start given to ASR")
    noise_floor: NoiseFloorConfig = Field(default_factory=NoiseFloorConfig)
    caller_level: CallerLevelConfig = Field(default_factory=CallerLevelConfig)
    max_turn_s: float = Field(30.0, gt=1, description="a turn longer than this is ended")
    early_final_ms: int = Field(
        150, ge=0, description="a pause: after this much silence the end-of-turn evidence is gathered (the "
        "end-of-turn model is asked, the final transcript starts, and from it the LLM's end-of-sentence "
        "probability) and the turn may end (0: none of it; the turn ends after end_silence_ms). 64 ms was tried "
        "(issue 31): the words came ~100 ms sooner but the learned decision's held-out median moved by ~15 ms, "
        "and Whisper, given less silence after the last word, heard an 8 kHz \"My name is Alice.\" as "
        "\"Natalie\" every time")
    # The decision at a pause (pipeline/turn_policy.py): the evidence fused in log-odds, and the silence
    # waited shrinking as the fused probability grows. Chosen with bench/turn_detection.py on hibari's and
    # espeak-ng's voices, each family judged apart (docs/bench/turn_detection.txt): the words alone came
    # out best on every family, the sound (Smart Turn) adding cut-offs on one family for speed on another.
    decision: Literal["learned", "rule"] = Field(
        "learned", description="learned: the probability that the caller has finished comes from the model in "
        "decision_file (trained on the tuned voices' pauses by bench/turn_detection.py --train, with its own "
        "patience curve and max_patience_ms: the settings below from audio_weight to max_patience_ms are then "
        "unused); rule: the hand-set fusion below")
    decision_file: str = Field(
        "", description="the learned decision's file (empty: the one shipped, pipeline/turn_decision.json); a "
        "missing or malformed file stops the server at start-up")
    text_signal: bool = Field(
        True, description="use the words: the LLM's probability that the caller's sentence ends with the words "
        "transcribed at the pause (the embedded engine; with llm.engine=openai, `without_words` decides)")
    audio_weight: float = Field(0.0, ge=0, description="weight of the end-of-turn model's log-odds (0: not asked)")
    text_weight: float = Field(0.5, ge=0, description="weight of the words' log-probability")
    text_neutral: float = Field(
        -3.0, le=0, description="the words' (natural) log-probability that counts as no evidence either way")
    bias: float = Field(-1.0, description="added to the fused log-odds")
    sure_probability: float = Field(
        0.95, gt=0, lt=1, description="a fused probability at or above this ends the turn at once")
    doubt_probability: float = Field(
        0.05, gt=0, lt=1, description="at or below this the caller gets the whole max_patience_ms; in between, "
        "in proportion")
    max_patience_ms: int = Field(
        1500, ge=64, description="the longest pause waited out before the turn ends (the evidence said unfinished, "
        "or none came)")
    without_words: SoundAlone = Field(
        default_factory=lambda: SoundAlone(), description="the decision where the words are not weighed "
        "(text_signal false, or an LLM that gives no probabilities: llm.engine=openai)")

    @model_validator(mode="after")
    def _marks_in_order(self) -> EndpointingConfig:
        for name, rule in (("endpointing", self), ("endpointing.without_words", self.without_words)):
            if rule.doubt_probability > rule.sure_probability:
                raise ValueError(f"{name}.doubt_probability must not be above {name}.sure_probability")
        return self


class AsrStageConfig(BaseModel):
    partials: bool = Field(True, description="interim transcripts while the caller speaks over the bot (shown, not "
                           "trusted to decide a barge-in: Whisper misreads a word cut off mid-way)")
    partials_while_idle: bool = Field(
        False, description="interim transcripts also while the bot is silent: a live transcript, but a Whisper pass "
        "still running when the caller pauses delays the final one (on 2 cores, voice-to-voice p50 +120 ms, "
        "p95 +290 ms)")
    partial_interval_ms: int = Field(700, ge=100, description="new speech between interim transcripts")
    first_partial_ms: int = Field(
        300, ge=100, description="speech before a turn's first interim transcript")
    interim_beam_size: int = Field(
        1, ge=1, le=10, description="beam for interim transcripts (greedy: 14 % faster than beam 5 with "
        "whisper-tiny.en on machine A); the final one, made at the pause, uses asr.beam_size, since greedy search "
        "misheard an 8 kHz question that beam 5 got right")
    spoken_digits: bool = Field(
        True, description="runs of three or more dictated digits become numerals (\"four five one two\" -> "
        "\"4512\") in the transcripts, so the model copies a code a tool needs instead of converting words "
        "(pipeline/numerals.py)")
    max_queued_events: int = Field(
        256, ge=8, description="speech and transcript events waiting for the session; beyond it the VAD waits, "
        "and the socket's audio backlog limit (server.max_audio_backlog_ms) drops the caller's newest audio")


class ChunkerConfig(BaseModel):
    first_min_words: int = Field(2, ge=1, description="the first phrase may end at a clause after this many words")
    first_max_words: int = Field(
        4, ge=1, description="the first phrase ends after this many words even without a clause mark, so the "
        "first audio does not wait for a long first sentence (max_words applies to it too)")
    min_words: int = Field(6, ge=1, description="later phrases end at a clause after this many words")
    max_words: int = Field(24, ge=4, description="a phrase is cut at a word boundary beyond this")


class TrimConfig(BaseModel):
    """Trimming the synthesizer's silence around each phrase (pipeline/trim.py), for every engine.
    Measured at 16 kHz: hibari leaves 235-330 ms before a phrase's sound and 245-455 ms after it,
    at -85 dBFS or below (mostly digital zero); espeak-ng 0-45 ms of zeros before, 300 ms after a
    sentence, 150 ms after a comma. Soft onsets ("th", "f", "h") rise from -80 dBFS over tens of ms,
    so the level sits at -60: 25 dB above hibari's padding, and with onset_ms the loudest 5 ms
    dropped before a phrase's first sound was -61 dBFS (mostly -70 to -83)."""

    enabled: bool = Field(True, description="false: each phrase's audio is sent as the synthesizer made it")
    silence_db: float = Field(
        -60.0, le=0, description="a 5 ms frame whose RMS level is below this (dB relative to full scale) is silence")
    onset_ms: int = Field(
        10, ge=0, description="audio kept before a phrase's first sound, so a soft onset or plosive is not clipped")
    sentence_pause_ms: int = Field(
        250, ge=0, description="the silence after a phrase that ends a sentence (. ? !) is cut to this: the "
        "synthesizer's own silence, never lengthened, at most max_inner_silence_ms")
    clause_pause_ms: int = Field(
        120, ge=0, description="the same after a phrase that ends a clause (, ; : and dashes)")
    cut_pause_ms: int = Field(
        0, ge=0, description="the same after a phrase cut without a mark (mid-sentence: chunker.first_max_words, "
        "chunker.max_words), where the words run on")
    max_inner_silence_ms: int = Field(
        400, ge=0, description="a silence inside a phrase is kept as it is up to this long and cut to it beyond (it "
        "is held back until the sound resumes): above the pauses measured inside a sentence (hibari up to 265 ms, "
        "espeak-ng 225 ms) and espeak-ng's 300-340 ms between sentences, below hibari's 630-800 ms between two "
        "sentences of one phrase (its padding twice)")


class ReplyBudgetConfig(BaseModel):
    """How much a spoken reply says before it stops at a sentence's end and offers the rest
    (pipeline/reply_budget.py). Text-only replies and /v1 chat completions are not limited by it."""

    enabled: bool = Field(True, description="false: a reply runs until the model stops or llm.max_tokens")
    max_sentences: int = Field(3, ge=1, description="the reply stops after this many sentences when more would follow")
    max_seconds: float = Field(
        15.0, gt=0, description="or at the first sentence end after about this much speech (its words at "
        "words_per_second), whichever comes first")
    words_per_second: float = Field(2.5, gt=0, description="the speaking rate the speech's length is reckoned at")
    offer: str = Field("Shall I go on?", max_length=200,
                       description="said after a reply the budget stopped (empty: nothing); it stays in the history")


class HonestyConfig(BaseModel):
    """The honesty gate (pipeline/honesty.py): a voice reply to a request the agent cannot check or carry
    out begins by saying so."""

    enabled: bool = Field(True, description="false: the reply is whatever the model writes")
    threshold: float = Field(0.5, ge=0, le=1, description="the judging model's chance that the request needs a "
                             "look-up or an action, at or above which the reply begins with `opening`; chosen for "
                             "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (llm.tools_model, which judges when it is loaded; "
                             "else llm.model) on bench/honesty.py's tune requests")
    opening: str = Field("Sorry, I'm not able to", min_length=1, max_length=100,
                         description="what such a reply begins with; the model goes on from it")


class AgentConfig(BaseModel):
    """What the operator tells the agent about the business (pipeline/facts.py)."""

    facts: str = Field("", description="facts the agent may state (hours, address, services, prices, policies), "
                       "joined to the server's default prompts; anything else about the business it says it cannot "
                       "check")
    facts_file: str = Field("", description="a UTF-8 text file of such facts, read at start (after agent.facts)")
    max_facts_chars: int = Field(6000, ge=0, description="the facts go into every call's prompt; longer is a "
                                 "start-up error")


class EchoConfig(BaseModel):
    """pipeline/echo.py: the bot's reply, heard again by the caller's microphone (a speakerphone), is cancelled from
    the caller's audio before the VAD and the recognizer, against what the server knows it played and when."""
    enabled: bool = Field(True, description="cancel the bot's echo from the caller's audio once it is found there "
                          "(needs libspeexdsp); a line without echo passes untouched")
    tail_ms: int = Field(250, ge=20, le=2000, description="the adaptive filter's span from the echo's delay (found "
                         "by cross-correlation): the room's reverberation, and the delay's jitter")
    max_delay_ms: int = Field(1000, ge=20, le=4000, description="the longest echo delay searched for, from the "
                              "server's playhead: the network both ways, the client's playback buffer, the room")
    margin_ms: int = Field(40, ge=0, le=500, description="the filter starts this long before the delay found (a "
                           "delay found later within half the filter's span leaves it where it is)")
    gate_margin_db: float = Field(
        10.0, ge=0, le=40, description="on a line with echo, a frame of the caller's audio not this much louder than "
        "the echo of what was just played would be (at the line's measured echo return) is held down (-40 dB) "
        "before the VAD: what the adaptive filter has not yet learned in a call's first seconds. A caller this much "
        "quieter than the bot's echo is not heard over it; 0: no gate")
    drop_after_s: float = Field(
        2.0, ge=0, le=60, description="a found echo is dropped (the caller's audio passes untouched again) once the "
        "delay search has gone this long over the bot's playing without seeing it at its delay: a caller who took "
        "the phone off speakerphone, or a find that was never the bot; 0: a found echo is kept for the call")
    suppress_db: int = Field(-40, ge=-90, le=0, description="residual echo suppression while only the bot talks")
    suppress_active_db: int = Field(-15, ge=-90, le=0, description="residual echo suppression while the caller "
                                    "talks over the bot")
    own_words: bool = Field(True, description="words recognized over the bot that are mostly its own reply's "
                            "(an echo not yet cancelled: the filter learns the room in the first seconds) are not an "
                            "interruption; also with enabled false")


class NoiseConfig(BaseModel):
    """pipeline/denoise.py: steady noise taken out of the caller's audio for the recognizer (the VAD hears it as it
    came), per line: `off` or `speex-N` (speexdsp's suppressor, at most N dB of attenuation). The defaults are the
    recognizer's word error rate in noise (bench/noise_asr.py): it helped on the phone line, not on a wideband one."""
    enabled: bool = Field(True, description="suppress noise in the caller's audio; false: every line as it comes")
    wideband: str = Field("off", pattern=NOISE_SUPPRESSOR, description="the suppressor for a wideband line (a "
                          "browser, an app: 16 kHz and up)")
    narrowband: str = Field("speex-25", pattern=NOISE_SUPPRESSOR, description="the suppressor for a phone line "
                            "(8 kHz)")
    min_floor_dbfs: float = Field(-50.0, ge=-100, le=0, description="a line whose background (the 10th percentile "
                                  "of its 10 ms levels over the last 4 s) is quieter than this passes as it came, "
                                  "10 ms late; the suppressor turns on at this level and off 6 dB under it. -100: "
                                  "always on")

    def for_line(self, input_rate: int) -> str:
        """The suppressor for a line whose caller's audio comes at `input_rate`."""
        if not self.enabled:
            return "off"
        return self.narrowband if input_rate <= 8000 else self.wideband


class SessionConfig(BaseModel):
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    tools_prompt: str = Field(DEFAULT_TOOLS_PROMPT, description="the system prompt of a call that has tools at its "
                                                               "start (unless the client gives instructions)")
    max_instructions_chars: int = Field(4000, ge=0)
    max_history_messages: int = Field(24, ge=2, description="older turns are dropped from the prompt")
    history_drop_block: int = Field(
        12, ge=1, description="older messages are dropped this many at a time, so the prompt's start (and the "
        "LLM's cache of it) stays the same for that many messages; 1 slides the window every turn")
    output_chunk_ms: int = Field(40, ge=10, le=500, description="reply audio per binary frame")
    output_lead_ms: int = Field(300, ge=0, description="how far reply audio may run ahead of real time")
    echo: EchoConfig = Field(default_factory=lambda: EchoConfig(), description="echo cancellation (pipeline/echo.py)")
    noise: NoiseConfig = Field(default_factory=lambda: NoiseConfig(), description="noise suppression "
                               "(pipeline/denoise.py)")
    tts_trim: TrimConfig = Field(
        default_factory=lambda: TrimConfig(), description="the synthesizer's silence before and after each phrase "
        "is cut: the reply starts with sound, and phrases are apart by a pause chosen from their last mark")
    honesty: HonestyConfig = Field(
        default_factory=lambda: HonestyConfig(), description="a voice reply to a request the agent cannot check or "
        "carry out begins by saying so (pipeline/honesty.py)")
    reply_budget: ReplyBudgetConfig = Field(
        default_factory=lambda: ReplyBudgetConfig(), description="a spoken reply stops at a sentence's end once it "
        "has said enough, and offers the rest")
    take_back_ms: int = Field(
        600, ge=0, description="a reply the caller talks over (speech that interrupts it: words, or sustained "
        "speech; not a key) within this long of its first audio is taken back: the turn had been ended too soon, "
        "so the reply leaves the history and what the caller said before and after it is answered as one turn (0: "
        "an interruption always keeps what was heard). On the held-out cut turns the decision ended too soon, 10 "
        "of 27 callers went on after the reply's first audio, 7 of them within 0.15 s of it (docs/benchmarks.md)")
    apology: str = "Sorry, I'm having trouble answering right now. Could you say that again?"
    barge_in_max_hold_ms: int = Field(
        1500, ge=0, description="while the bot talks, a caller's sound pauses its audio; at the caller's first pause "
        "(endpointing.early_final_ms) or the end of the sound, a word that is not a backchannel interrupts it, a cough "
        "or a backchannel lets it go on, and speech that lasts this long interrupts it in any case (the caller's "
        "pauses, while their words are recognized, are not counted)")
    backchannels: list[str] = Field(
        default_factory=lambda: ["mm-hmm", "mhm", "hmm", "mm", "uh-huh", "yeah", "yes", "yep", "okay", "ok", "right",
                                 "sure", "i see", "got it", "uh", "um"],
        description="short replies that, said while the bot talks, do not interrupt it")
    speculation_relax_s: float = Field(
        4.0, ge=0, description="once this much reply audio waits to be played, the LLM drafts nothing "
        "(K capped at 0): it is far enough ahead of the caller's ears, and other calls get the CPU")
    preemptive: bool = Field(
        True, description="start the reply at a pause, on the transcript made there, before the turn is known to "
        "be over; its audio is held until the turn ends, and it is dropped if the caller goes on")
    max_playout_s: float = Field(
        20.0, gt=0, description="reply audio synthesized but not yet sent; beyond it the LLM and the TTS wait for "
        "playback, so a long reply holds a bounded amount of memory and leaves the CPU to other calls")
    refill_ms: int = Field(
        500, ge=0, description="while a reply plays, its next tokens are due this long before its audio runs out: "
        "the time the next phrase takes to write and synthesize, so a call about to run dry goes before one that "
        "is not (llm.schedule edf)")
    dtmf_timeout_ms: int = Field(
        1500, ge=100, le=30000, description="keypad digits (phone DTMF) are collected until none comes for this long; "
        "then they reach the conversation as the caller's turn (\"The caller pressed 4 2 # on the phone keypad.\")")
    max_dtmf_digits: int = Field(32, ge=1, le=256, description="digits in one keypad turn; more are dropped")
    first_audio_budget_ms: int = Field(
        250, ge=0, description="a reply's first audio is due this long after the caller's end of speech: the LLM "
        "serves calls by when their audio is due (llm.schedule edf), and a later first audio counts as a deadline "
        "miss")


class ToolsConfig(BaseModel):
    """Tool calls during calls (pipeline/tools.py): the server's own tools and how a turn runs them."""

    file: str = Field(
        "", description="a JSON or YAML file of HTTP tools the server runs itself (phone calls have no client that "
        "can run code): each with name, description, url, method, headers (\"${ENV_VAR}\" takes a secret from the "
        "environment), timeout_s and the JSON Schema of its arguments (docs/tools.md)")
    end_call: bool = Field(False, description="offer the built-in end_call tool on every call (a call may also ask "
                                              "for it in session.start)")
    transfer_targets: dict[str, str] = Field(
        default_factory=dict, description="where the built-in transfer_call tool may send a call: a name the model "
        "chooses (\"front desk\") -> a SIP URI or a number (through sip.trunk). Offered on calls whose line can "
        "transfer (SIP); empty: no transfer_call tool. The model cannot reach any other destination")
    warm_transfers: list[str] = Field(
        default_factory=list, description="the transfer targets (by name) a SIP call is handed to warm: the agent "
        "first calls the person, tells them who is calling and why (the model's summary), and joins the two calls "
        "only if they answer; otherwise the model is told, and the call goes on. The others are cold (a REFER)")
    transfer_ring_timeout_s: float = Field(
        25.0, gt=0, le=120, description="how long the person of a warm transfer may take to answer")
    warm_transfer_message: str = Field(
        "Hello, this is the virtual assistant with a caller for you. {summary} I am putting them through now.",
        max_length=500, description="what the person of a warm transfer hears when they answer, before the calls "
        "are joined; {summary} is the model's summary of who is calling and why")
    tool_choice: str = Field("auto", description="auto, none or required, for the server's tools")
    max_steps: int = Field(3, ge=1, le=10, description="rounds of tool calls in one turn; then the model answers in "
                                                      "words")
    call_threshold: float = Field(
        0.37, ge=0.0, le=1.0, description="a reply calls a tool only where the model's probability of a call "
        "(against all its words together, at temperature 1) is at least this: decided, never sampled. Chosen on "
        "the tune half of bench/tool_calls.py's set for Qwen2.5-Coder-1.5B: requests no tool can serve got at "
        "most 0.34, tool requests mostly 0.40 and up")
    greedy_arguments: bool = Field(
        True, description="a call's arguments are the model's most likely ones at any temperature (the spoken words "
        "keep llm.temperature): the same request makes the same call")
    filler_after_ms: int = Field(600, ge=0, description="a tool slower than this gets one short spoken filler, once "
                                                       "per turn")
    filler: str = "One moment, let me check."
    acknowledgement: str = Field(
        "One moment.", description="said as soon as a reply to the caller's words begins a tool call without a word "
        "of its own, while the call is still being written (the caller hears it at a plain turn's latency, not the "
        "silence of the call and the tool); such a turn gets no filler. Empty: silent until the answer or the filler")
    timeout_s: float = Field(10.0, gt=0, le=120, description="a tool that takes longer fails with a timeout, which the "
                                                            "model is told")
    max_result_chars: int = Field(4000, ge=100, description="a tool's result is cut to this many characters for the "
                                                           "model")
    max_tools: int = Field(32, ge=1, le=128, description="tools declared in one call, at most")
    goodbye_grace_ms: int = Field(
        2000, ge=0, description="after end_call, the call ends once the goodbye is reported played; without "
        "reports, this long after it surely has")

    @model_validator(mode="after")
    def _warm_targets_exist(self) -> ToolsConfig:
        unknown = [name for name in self.warm_transfers if name not in self.transfer_targets]
        if unknown:
            raise ValueError(f"tools.warm_transfers names {', '.join(map(repr, unknown))}, not in "
                             f"tools.transfer_targets ({', '.join(map(repr, self.transfer_targets)) or 'none'})")
        return self
