"""Settings from environment variables (VOICE_AGENT_..., nested with __) and an optional TOML or
JSON file (VOICE_AGENT_CONFIG or `--config`). Each backend is handed only its own section.

    VOICE_AGENT_LLM__MODEL=qwen2.5-coder-1.5b-instruct-q4_k_m VOICE_AGENT_ENDPOINTING__END_SILENCE_MS=400 \\
        voice-agent serve
"""

from __future__ import annotations

import base64
import json
import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from app.store.config import OtelConfig, StorageConfig
from core.errors import ConfigError
from models.config import AsrConfig, LlmConfig, TtsConfig, TurnConfig, VadConfig
from models.protocols import SamplingParams
from pipeline.config import AgentConfig, AsrStageConfig, ChunkerConfig, EndpointingConfig, SessionConfig, ToolsConfig
from pipeline.facts import load_facts, with_facts


class ServerConfig(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    max_sessions: int = Field(8, ge=1, description="concurrent calls; more are refused with server_busy")
    max_frame_bytes: int = Field(32000, ge=320, description="largest binary audio frame (1 s of 16 kHz PCM16)")
    max_text_bytes: int = Field(16384, ge=256, description="largest text message")
    max_session_s: float = Field(1800.0, gt=0, description="a call is ended after this long")
    max_audio_backlog_ms: int = Field(5000, ge=100, description="audio queued ahead of the pipeline; more is dropped")
    max_protocol_errors: int = Field(50, ge=1, description="a session is closed after this many bad messages")
    send_timeout_s: float = Field(10.0, gt=0, description="a caller that reads nothing this long is dropped")
    max_api_requests: int = Field(
        4, ge=1, description="concurrent generations through /v1/chat/completions; more get 429 with Retry-After")
    drain_timeout_s: float = Field(
        10.0, ge=0, description="on SIGTERM, how long calls in progress may go on finishing their replies before "
        "the server says goodbye and exits (docs/reliability.md)")
    # Access (docs/security.md)
    api_keys: list[SecretStr] = Field(
        default_factory=list, description="keys accepted as `Authorization: Bearer <key>` on /v1, /api, /qa, /ws and "
        "/metrics (env: a JSON list); none (and no api_keys_file) leaves them open, on a loopback address only")
    api_keys_file: str = Field("", description="a file of more keys, one a line; # starts a comment")
    allow_unauthenticated: bool = Field(
        False, description="true lets the server bind a non-loopback address without keys (a warning at start-up)")
    allowed_hosts: list[str] = Field(
        default_factory=list, description="host names this server answers to besides the loopback names, the address "
        "it binds and twilio.public_url's host (voice.example.com; .example.com for it and its subdomains; * for any); "
        "a request naming another Host is refused (400, or 403 before a WebSocket upgrade): DNS rebinding")
    allowed_origins: list[str] = Field(
        default_factory=list, description="browser origins (https://app.example.com) that may open /ws; the page's "
        "own origin (Origin host = Host, when that host is allowed) and clients that send no Origin are also allowed")
    trusted_proxies: list[str] = Field(
        default_factory=list, description="addresses or networks (10.0.0.0/8) of proxies whose X-Forwarded-For "
        "names the client; from anyone else the header is ignored")
    redis_url: str = Field(
        "", description="Redis or Valkey (redis://host:6379/0) that replicas share: per-client rate limits and the "
        "one-use tokens already used (empty: each process keeps its own)")
    shared_state_failure: Literal["open", "closed"] = Field(
        "open", description="what the limits do while server.redis_url cannot be reached: open: let rate-limited "
        "requests through and count each replica's calls alone (the limits grow with the replicas; the service stays "
        "up); closed: refuse new calls, rate-limited requests and key checks with a try-later answer (503, or close "
        "1013) and report the replica not ready (/readyz 503) until Redis answers. One-use tokens are refused either "
        "way")
    token_secret: SecretStr = Field(
        SecretStr(""), description="the secret session tokens, login cookies, ephemeral keys and stream nonces are "
        "signed with; the same on every replica, so one replica's token works on all (at least 16 characters; "
        "empty: each process makes its own)")
    token_secret_file: str = Field("", description="a file whose first line is server.token_secret")
    login_ttl_s: float = Field(
        3600.0, gt=0, description="how long the cookie from POST /api/login (the QA dashboard's key) lasts")
    metrics_port: int = Field(
        0, ge=0, le=65535, description="also serve /metrics without a key on this port (0: off), for a private "
        "network; the main port's /metrics needs a key when keys are set")
    metrics_host: str = Field("127.0.0.1", description="the address the metrics_port binds")
    # Limits per client address (docs/security.md)
    max_connections_per_minute: int = Field(
        30, ge=1, description="new /ws connections per client (key, or address without one) a minute; more are "
        "closed with 1013")
    admission_wait_s: float = Field(
        2.0, ge=0, le=30, description="a new call that finds every call slot (server.max_sessions) or its client's "
        "places (max_calls_per_client, max_calls_per_key) taken waits up to this long for one to be released before "
        "it is refused: a caller who hangs up and dials again at once is let in (0: refuse at once)")
    max_calls_per_client: int = Field(
        4, ge=1, description="/ws calls in progress per client address (without a key); more are closed with 1013")
    max_calls_per_key: int = Field(
        4, ge=0, description="/ws calls in progress per API key (a gateway's many callers share one key); more are "
        "closed with 1013. Below server.max_sessions, so one leaked key cannot take every call slot: raise it (with "
        "max_sessions) for a gateway that carries most of the calls; 0: no cap but server.max_sessions")
    max_auth_failures_per_minute: int = Field(
        10, ge=1, description="wrong keys, tokens or login cookies per client address a minute, on every route; "
        "more get 429 (or close 1013) until the minute has passed")
    max_api_requests_per_minute: int = Field(
        120, ge=1, description="/v1 requests (and /api/login attempts) per client (key, or address without one) a "
        "minute; more get 429")
    max_body_bytes: int = Field(
        1_048_576, ge=1024, description="largest HTTP request body; larger get 413")
    body_timeout_s: float = Field(
        30.0, gt=0, description="an HTTP request body must arrive whole within this; slower senders get 408")
    start_timeout_s: float = Field(
        10.0, gt=0, description="a WebSocket (/ws, phone media) that has not started its call (session.start, the "
        "provider's `start`) this long after opening is closed (1008)")
    idle_timeout_s: float = Field(
        60.0, gt=0, description="a WebSocket (/ws, phone media) that sends nothing this long is closed (1001) as dead")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_caller_content: Literal["redacted", "debug", "info"] = Field(
        "redacted", description="what the log shows of what callers say and key in (transcripts, keypad digits, "
        "tool arguments and answers, and the replies that repeat them): redacted: only how much ('caller: [9 words]', "
        "'keys [4 keys]'); debug: that, and a DEBUG line with the content after each; info: the content in every "
        "line (local testing only). Phone numbers are masked whatever this says")

    @field_validator("api_keys", "allowed_hosts", "allowed_origins", "trusted_proxies", mode="before")
    @classmethod
    def _empty_list(cls, value: Any) -> Any:
        """An empty variable (compose's `${VOICE_AGENT_API_KEYS:-}`) is an empty list."""
        return [] if isinstance(value, str) and not value.strip() else value


def public_url(setting: str, value: str) -> str:
    """A public base URL: http(s), no query or fragment, no trailing slash."""
    if value and not value.startswith(("https://", "http://")):
        raise ValueError(f"{setting} must start with https:// (or http://), got {value!r}")
    if "?" in value or "#" in value:
        raise ValueError(f"{setting} takes no query or fragment")
    return value.rstrip("/")


class TwilioConfig(BaseModel):
    """Twilio Media Streams (docs/phone.md). Every request Twilio makes is signed with the auth token."""

    auth_token: SecretStr = Field(SecretStr(""), description="the account's auth token: the key of X-Twilio-Signature")
    public_url: str = Field(
        "", description="the URL Twilio calls, e.g. https://voice.example.com (behind a proxy or a tunnel the request "
        "does not show it, and signatures cover it); the media stream is its wss:// form")
    check_signatures: bool = Field(
        True, description="false accepts unsigned requests: for local testing only (a warning at start-up)")
    stream_nonce_ttl_s: float = Field(
        60.0, gt=0, description="the TwiML answer carries a one-use nonce for its stream's `start`; Twilio must open "
        "the stream within this long (a captured stream cannot be replayed)")
    shared_keys: dict[str, SecretStr] = Field(
        default_factory=dict, description="SharedKey id -> secret, for webhooks whose X-Twilio-Webhooks-Signature-"
        "Settings names a key (HMAC-SHA256); a request naming no known key is checked with the auth token")
    account_sid: str = Field("", max_length=64, description="the account (AC...) that places calls out through "
                             "Twilio's REST API, with the auth token")
    caller_id: str = Field("", max_length=64, description="the number calls out come from (a Twilio number of the "
                           "account, E.164)")
    api_url: str = Field("https://api.twilio.com", description="Twilio's REST API (another address for a test double "
                         "or a regional edge)")

    @field_validator("public_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return public_url("twilio.public_url", value)

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, value: str) -> str:
        return public_url("twilio.api_url", value) or cls.model_fields["api_url"].default


class TelnyxConfig(BaseModel):
    """Telnyx media streaming (docs/phone.md). Telnyx does not sign the media socket: each stream URL
    (`?token=...`), or the stream's streaming auth token, carries a one-use token that expires, minted
    with the operator's secret (POST /api/phone/telnyx-stream, or app.security.phone_tokens.mint_token)."""

    stream_token: SecretStr = Field(
        SecretStr(""), description="the secret that signs the one-use, time-bound tokens every /telnyx/media "
        "connection must carry")
    public_url: str = Field(
        "", description="the URL Telnyx reaches this server at, e.g. https://voice.example.com: the stream URLs "
        "minted here name it, and its host is one this server answers to")
    token_ttl_s: float = Field(60.0, gt=0, description="how long a minted stream token may wait for its connection")
    allow_static_token: bool = Field(
        False, description="also accept the secret itself as the token: replayable by whoever saw one stream URL "
        "(a warning at start-up)")
    check_token: bool = Field(
        True, description="false accepts connections without the token: for local testing only (a warning at "
        "start-up)")
    api_key: SecretStr = Field(SecretStr(""), description="the API key that places calls out through Telnyx's Call "
                               "Control API")
    connection_id: str = Field("", max_length=128, description="the Call Control application calls out are placed "
                               "from")
    caller_id: str = Field("", max_length=64, description="the number calls out come from (E.164)")
    api_url: str = Field("https://api.telnyx.com", description="Telnyx's REST API (another address for a test "
                         "double)")
    public_key: str = Field(
        "", max_length=64, description="the account's Ed25519 public key (base64, from the Mission Control Portal): "
        "the webhooks of calls placed out (POST /telnyx/events) must be signed with it; empty: those calls ask for no "
        "webhooks here")
    check_signatures: bool = Field(
        True, description="false takes unsigned webhooks at /telnyx/events: for local testing only (a warning at "
        "start-up)")
    webhook_tolerance_s: float = Field(
        300.0, gt=0, le=3600, description="how far a webhook's signed telnyx-timestamp may lie from this server's "
        "clock: an older one is a replay and is refused")

    @field_validator("public_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return public_url("telnyx.public_url", value)

    @field_validator("public_key")
    @classmethod
    def _ed25519_key(cls, value: str) -> str:
        value = value.strip()
        try:
            raw = base64.b64decode(value, validate=True)
        except ValueError:
            raw = b""
        if value and len(raw) != 32:
            raise ValueError("telnyx.public_key must be the account's Ed25519 public key in base64 (32 bytes), as "
                             "the Mission Control Portal shows it")
        return value

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, value: str) -> str:
        return public_url("telnyx.api_url", value) or cls.model_fields["api_url"].default


class PhoneConfig(BaseModel):
    """What the phone transports (Twilio, Telnyx) share. The inter-digit timeout of DTMF is
    session.dtmf_timeout_ms."""

    mark_interval_ms: int = Field(
        200, ge=20, le=5000, description="a mark after every this much reply audio (and at its end): the marks the "
        "provider echoes once played tell what the caller heard")
    max_frame_bytes: int = Field(65536, ge=1024, description="largest text frame from the provider")
    max_connections_per_minute: int = Field(
        600, ge=1, description="new media sockets per provider address a minute (a provider's few addresses carry "
        "every caller); more are closed with 1013")
    max_media_payload_bytes: int = Field(
        16000, ge=160, description="largest decoded audio payload of one media frame (2 s of 8 kHz mu-law)")
    api_timeout_s: float = Field(
        10.0, gt=0, le=60, description="how long a call placed out waits for the provider's REST API to answer")
    transfer_calls: bool = Field(
        False, description="offer transfer_call on Twilio and Telnyx calls (with their API credentials set): the "
        "provider dials tools.transfer_targets, so each must be a number in E.164 or a SIP URI the provider's cloud "
        "reaches (an extension of the SIP trunk is not)")
    answer_grace_s: float = Field(
        20.0, gt=0, le=300, description="a call placed out whose media stream has not started this long after its "
        "ring timeout is given up (not answered, or the provider could not reach the stream URL)")


class RealtimeConfig(BaseModel):
    """The OpenAI Realtime API at /v1/realtime (docs/realtime.md)."""

    max_event_bytes: int = Field(
        1_048_576, ge=4096, description="largest client event (an input_audio_buffer.append of 1 MiB holds about "
        "16 s of 24 kHz PCM16 in base64)")
    idle_note: str = Field(
        "(The caller has said nothing for {seconds} seconds.)", min_length=1, max_length=500,
        description="what the model reads as the caller's turn when turn_detection's idle_timeout_ms runs out "
        "({seconds}: the timeout)")


class IceServer(BaseModel):
    """A STUN or TURN server the WebRTC peer connections use (a deployment behind NAT)."""

    urls: list[str] = Field(min_length=1, description="stun:host:port, turn:host:port?transport=udp, ...")
    username: str | None = None
    credential: str | None = None


class WebRTCConfig(BaseModel):
    """WebRTC calls: POST /v1/realtime/calls (docs/webrtc.md)."""

    ice_servers: list[IceServer] = Field(
        default_factory=list, description="STUN/TURN servers for ICE; none: host candidates only (the server's own "
        "addresses, right where callers reach it directly)")
    ice_gathering_timeout_s: float = Field(
        5.0, gt=0, le=60, description="the longest the answer waits for the server's ICE candidates")
    max_offer_bytes: int = Field(
        65_536, ge=1024, le=1_048_576, description="largest SDP offer taken")
    reorder_ms: int = Field(
        200, ge=0, le=1000, description="the caller's packets are decoded in sequence order: a packet in its place "
        "goes on at once, and a missing one is waited for until packets this far past it have come (then its place "
        "is filled: webrtc.conceal_loss). With 5 % loss and 40 ms jitter, 60 ms dropped so many packets as late "
        "that the recognizer's word error rate was 0.46; 200 ms: docs/benchmarks.md")
    conceal_loss: bool = Field(
        True, description="the place of a caller's packet given up for lost is filled with their last pitch period, "
        "held for 20 ms, then faded out over 40 ms (pipeline/conceal.py), not with silence: docs/benchmarks.md, "
        "'Lost and reordered packets'")
    connect_timeout_s: float = Field(
        15.0, gt=0, le=300, description="a call whose peer connection and data channel are not up this long after "
        "its answer is ended and its slot freed")


class SipTrunk(BaseModel):
    """The SIP trunk (or PBX) that calls out go through."""

    address: str = Field("", description="host:port of the trunk's SIP server (UDP); empty: no calls out over SIP")
    username: str = Field("", description="the trunk account's user, for digest authentication of calls out")
    password: SecretStr = Field(SecretStr(""), description="the trunk account's password")
    caller_id: str = Field("voice-agent", description="the From user of calls out (the number the callee sees)")


class SipConfig(BaseModel):
    """SIP calls in from a trunk or a PBX, and out through it (docs/sip.md)."""

    enabled: bool = Field(False, description="listen for SIP INVITEs on sip.host:sip.port (UDP)")
    host: str = Field("0.0.0.0", description="the address SIP and RTP listen on")
    port: int = Field(5060, ge=1, le=65535, description="the SIP port (UDP)")
    public_address: str = Field(
        "", description="the address put in Contact and SDP for peers to reach; empty: sip.host, or this host's "
        "address when sip.host is 0.0.0.0")
    trusted_addresses: list[str] = Field(
        default_factory=list, description="trunks let in by source address without digest authentication "
        "(addresses or CIDR ranges, e.g. 10.0.0.0/8)")
    username: str = Field("", description="calls in from other addresses must authenticate (digest) as this user; "
                          "empty: they are refused (403)")
    password: SecretStr = Field(SecretStr(""), description="the password of sip.username")
    realm: str = Field("voice-agent", description="the digest realm of the challenge")
    rtp_port_min: int = Field(0, ge=0, le=65535, description="the RTP port range (even ports); 0: any free port")
    rtp_port_max: int = Field(0, ge=0, le=65535, description="the top of the RTP port range")
    reorder_ms: int = Field(
        60, ge=0, le=1000, description="a caller's RTP packet this late takes its place still; later, its place "
        "is silence (a trunk rarely reorders; 60 ms is three packets)")
    conceal_loss: bool = Field(
        True, description="the place of a caller's packet given up for lost is filled with their last pitch period, "
        "held for 20 ms, then faded out over 40 ms (pipeline/conceal.py), not with silence: docs/benchmarks.md, "
        "'Lost and reordered packets'")
    rtp_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="a call whose caller sends no RTP this long is ended (BYE)")
    trunk: SipTrunk = SipTrunk()


class MachineDetection(BaseModel):
    """How a call placed out tells a person from an answering machine (tuned on espeak-ng's voices;
    bench/answering_machine.py reports held-out voices)."""

    human_max_speech_s: float = Field(1.9, gt=0, description="a greeting no longer than this, then a pause, is a "
                                      "person's")
    pause_s: float = Field(0.5, gt=0, description="the pause after a person's short greeting")
    machine_speech_s: float = Field(2.5, gt=0, description="a greeting with this much speech (its pauses aside) is "
                                    "a machine's")
    wait_s: float = Field(1.6, gt=0, description="a greeting of any length below machine_speech_s, then this long "
                          "without a beep or a word: a person waiting for an answer")
    silence_s: float = Field(3.0, gt=0, description="nobody speaking this long: a person who answered silently")
    beep_min_s: float = Field(0.15, gt=0, description="the shortest steady tone taken for a beep")
    speech_threshold: float = Field(0.5, gt=0, lt=1, description="the VAD probability counted as speech")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VOICE_AGENT_", env_nested_delimiter="__", extra="ignore")

    server: ServerConfig = ServerConfig()
    vad: VadConfig = VadConfig()
    endpointing: EndpointingConfig = EndpointingConfig()
    turn: TurnConfig = TurnConfig()
    asr: AsrConfig = AsrConfig()
    asr_stage: AsrStageConfig = AsrStageConfig()
    llm: LlmConfig = LlmConfig()
    chunker: ChunkerConfig = ChunkerConfig()
    tts: TtsConfig = TtsConfig()
    session: SessionConfig = SessionConfig()
    agent: AgentConfig = AgentConfig()
    tools: ToolsConfig = ToolsConfig()
    twilio: TwilioConfig = TwilioConfig()
    telnyx: TelnyxConfig = TelnyxConfig()
    phone: PhoneConfig = PhoneConfig()
    realtime: RealtimeConfig = RealtimeConfig()
    webrtc: WebRTCConfig = WebRTCConfig()
    sip: SipConfig = SipConfig()
    machine_detection: MachineDetection = MachineDetection()
    storage: StorageConfig = StorageConfig()
    otel: OtelConfig = OtelConfig()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _FileSource(settings_cls)

    def with_facts(self) -> Settings:
        """These settings with the operator's facts (agent) joined to the default prompts; an unreadable
        or oversized facts file is a ConfigError."""
        facts = load_facts(self.agent)
        if not facts:
            return self
        session = self.session.model_copy(update={"system_prompt": with_facts(self.session.system_prompt, facts),
                                                  "tools_prompt": with_facts(self.session.tools_prompt, facts)})
        return self.model_copy(update={"session": session})

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.llm.temperature, top_p=self.llm.top_p, top_k=self.llm.top_k,
            max_tokens=self.llm.max_tokens,
        )


class _FileSource(PydanticBaseSettingsSource):
    """Values from the file named by VOICE_AGENT_CONFIG (TOML or JSON); lowest priority."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = os.environ.get("VOICE_AGENT_CONFIG")
        return load_file(Path(path)) if path else {}


def load_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the settings file {path}: {exc}") from exc
    try:
        data: dict[str, Any] = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"the settings file {path} is not valid {path.suffix.lstrip('.') or 'TOML'}: {exc}") from exc
    return data
