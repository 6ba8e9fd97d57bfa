// The browser client of the native protocol (docs/websocket.md): over WebRTC by default
// (static/webrtc.js: the microphone and the reply as tracks, events on a data channel), else, or
// with ?transport=ws, over /ws: microphone in through an AudioWorklet, reply audio out through a
// gapless AudioContext queue that barge-in flushes. A live transcript and latency table either way.
// `window.voiceAgent` mirrors the state for tests.
"use strict";

const INPUT_RATE = 16000;
const FRAME_MS = 20;
const MARKS = ["speech_end", "asr_final", "llm_first_token", "first_phrase", "tts_first_audio", "first_audio_sent"];

const $ = (id) => document.getElementById(id);
const ui = { start: $("start"), stop: $("stop"), status: $("status"), transcript: $("transcript"),
             latency: $("latency").tBodies[0], errors: $("errors") };

const voiceAgent = (window.voiceAgent = {
  state: "idle", events: [], audioBytesReceived: 0, audioChunksPlayed: 0, playbackFlushes: 0, playedReports: 0,
  transport: null, audioHeardMs: 0, fallback: null,
});
const WANTS_WEBRTC = new URLSearchParams(location.search).get("transport") !== "ws";

let ws = null;
let rtc = null; // the WebRTC call once answered: { send, close }
let rtcCaller = null; // the WebRTC call being made or made (its events count)
setInterval(() => playback.report(), 250); // playback progress, from the audio clock
let ctx = null; // one AudioContext for capture and playback
let mic = null; // { stream, source, node }
let outputRate = 24000;
let sessionStarted = false;

function setState(state) {
  voiceAgent.state = state;
  ui.status.textContent = state;
  ui.status.dataset.state = state;
  const active = state === "connecting" || state === "listening";
  ui.start.disabled = active;
  ui.stop.disabled = !active;
}

function showError(code, message) {
  const p = document.createElement("p");
  p.textContent = `${code}: ${message}`;
  ui.errors.append(p);
}

// -- playback --------------------------------------------------------------------------------------

const playback = {
  sources: new Set(), // scheduled or playing AudioBufferSourceNodes
  head: 0, // AudioContext time at which the next chunk starts
  replyTurn: null, // turn of the latest response.text.delta: the audio that arrives belongs to it
  flushedTurn: null, // a turn interrupted by barge-in: its late audio is dropped
  segments: [], // [AudioContext start time, duration] of each chunk of the reply turn's audio
  segmentsTurn: null,
  reported: -1, // the last played_ms sent to the server

  enqueue(arrayBuffer) {
    if (!ctx || (this.replyTurn !== null && this.replyTurn === this.flushedTurn)) return;
    const view = new DataView(arrayBuffer);
    const n = arrayBuffer.byteLength >> 1;
    if (n === 0) return;
    const buffer = ctx.createBuffer(1, n, outputRate);
    const samples = buffer.getChannelData(0);
    for (let i = 0; i < n; i++) samples[i] = view.getInt16(2 * i, true) / 32768;
    const source = ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(ctx.destination);
    // after a gap (or at the start of a reply), start a little ahead so the queue can build up
    if (this.head < ctx.currentTime) this.head = ctx.currentTime + 0.05;
    source.start(this.head);
    if (this.segmentsTurn !== this.replyTurn) {
      this.segments = [];
      this.segmentsTurn = this.replyTurn;
      this.reported = -1;
    }
    this.segments.push([this.head, buffer.duration]);
    this.head += buffer.duration;
    this.sources.add(source);
    source.onended = () => {
      if (this.sources.delete(source)) voiceAgent.audioChunksPlayed++; // not if it was flushed
    };
  },

  playedMs() {
    // how much of the reply turn's audio has played, by the audio clock (gaps do not count)
    if (!ctx) return 0;
    const now = ctx.currentTime;
    let played = 0;
    for (const [start, duration] of this.segments) played += Math.min(Math.max(now - start, 0), duration);
    return Math.round(played * 1000);
  },

  report() {
    // tell the server what the caller has heard (output_audio.played), so that on barge-in the
    // conversation keeps exactly the words that were played
    // (over WebRTC the server knows: what was heard is what went out on its track)
    if (rtc || !ws || ws.readyState !== WebSocket.OPEN || !sessionStarted || this.segmentsTurn === null) return;
    const played = this.playedMs();
    if (played === this.reported) return;
    this.reported = played;
    ws.send(JSON.stringify({ type: "output_audio.played", turn_id: this.segmentsTurn, played_ms: played }));
    voiceAgent.playedReports++;
  },

  flush() {
    // stops everything scheduled at once; true if anything was playing or queued
    const sources = [...this.sources];
    this.sources.clear();
    for (const source of sources) source.stop();
    this.head = 0;
    return sources.length > 0;
  },
};

// -- transcript and latency ------------------------------------------------------------------------

const lines = new Map(); // turn_id -> { user, bot } paragraphs

function line(turnId, who) {
  const turn = lines.get(turnId) || {};
  lines.set(turnId, turn);
  if (!turn[who]) {
    turn[who] = document.createElement("p");
    turn[who].className = who;
    turn[who].dataset.turn = turnId;
    if (who === "user" && turn.bot) ui.transcript.insertBefore(turn.user, turn.bot);
    else ui.transcript.append(turn[who]);
  }
  return turn[who];
}

function scrollTranscript() {
  ui.transcript.scrollTop = ui.transcript.scrollHeight;
}

function userText(turnId, text, final) {
  const p = line(turnId, "user");
  p.textContent = text;
  p.classList.toggle("partial", !final);
  p.classList.toggle("final", final);
  if (final && !text.trim()) {
    p.remove();
    delete lines.get(turnId).user;
  }
  scrollTranscript();
}

function botText(turnId, text) {
  line(turnId, "bot").textContent += text;
  scrollTranscript();
}

function latencyRow(done) {
  const ms = done.latency_ms || {};
  const tps = done.llm && done.llm.tokens_per_second;
  // a preemptive reply started at the pause: its marks before "speech end" are negative
  const status = done.preemptive ? `${done.status} (preemptive)` : done.status;
  const cells = [done.turn_id, status, ...MARKS.map((m) => (ms[m] != null ? Math.round(ms[m]) : "–")),
                 tps != null ? tps.toFixed(1) : "–"];
  const tr = ui.latency.insertRow();
  for (const value of cells) tr.insertCell().textContent = value;
}

// -- server events ---------------------------------------------------------------------------------

function onEvent(event) {
  voiceAgent.events.push(event);
  switch (event.type) {
    case "session.started":
      outputRate = event.output_audio.sample_rate;
      sessionStarted = true;
      if (mic) setState("listening");
      break;
    case "speech.started":
      // the caller makes a sound: the server holds the reply's audio until it knows whether this
      // interrupts (sustained speech, a word) or not (a cough, "mm-hmm"); tell it how far we got
      playback.report();
      break;
    case "transcript.partial":
      userText(event.turn_id, event.text, false);
      break;
    case "transcript.final":
      userText(event.turn_id, event.text, true);
      if (event.text.trim()) playback.replyTurn = event.turn_id; // the server starts a reply
      break;
    case "response.text.delta":
      playback.replyTurn = event.turn_id;
      botText(event.turn_id, event.text);
      break;
    case "response.done":
      if (event.status === "interrupted" && event.turn_id === playback.replyTurn) {
        // barge-in: stop what is still playing, and drop the turn's late audio
        playback.report();
        if (playback.flush()) voiceAgent.playbackFlushes++;
        playback.flushedTurn = playback.replyTurn;
      }
      latencyRow(event);
      if (event.status !== "completed") lines.get(event.turn_id)?.bot?.classList.add(event.status);
      break;
    case "error":
      showError(event.code, event.message);
      break;
  }
}

// -- microphone ------------------------------------------------------------------------------------

async function startMic() {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
  });
  await ctx.audioWorklet.addModule("static/capture-worklet.js");
  const source = ctx.createMediaStreamSource(stream);
  const node = new AudioWorkletNode(ctx, "capture", {
    processorOptions: { targetRate: INPUT_RATE, frameMs: FRAME_MS },
  });
  node.port.onmessage = ({ data }) => {
    if (sessionStarted && ws && ws.readyState === WebSocket.OPEN) ws.send(data);
  };
  source.connect(node);
  node.connect(ctx.destination); // the node outputs silence; being connected keeps it running
  mic = { stream, source, node };
}

function stopMic() {
  if (!mic) return;
  mic.stream.getTracks().forEach((track) => track.stop());
  if (mic.node) {
    mic.source.disconnect();
    mic.node.port.onmessage = null;
    mic.node.disconnect();
  }
  mic = null;
}

// -- start / stop ----------------------------------------------------------------------------------

// A one-use token for /ws (browsers cannot put a key in a WebSocket's headers; docs/security.md).
// When the server needs a key (401), the page asks for one and keeps it for this tab only.
const KEY_ITEM = "voice-agent-key";

async function sessionToken() {
  for (;;) {
    const key = sessionStorage.getItem(KEY_ITEM);
    const reply = await fetch("/api/session-token", {
      method: "POST", headers: key ? { authorization: `Bearer ${key}` } : {},
    });
    if (reply.ok) return (await reply.json()).token;
    if (reply.status !== 401) throw new Error(`no session token: HTTP ${reply.status}`);
    const entered = window.prompt(key ? "That API key was refused. API key:" : "This server needs an API key:");
    if (!entered) throw new Error("this server needs an API key");
    sessionStorage.setItem(KEY_ITEM, entered.trim());
  }
}

async function start() {
  setState("connecting");
  sessionStarted = false;
  ctx = ctx || new AudioContext(); // created in the click, so it may play
  await ctx.resume();

  let token;
  try {
    token = await sessionToken();
  } catch (err) {
    showError("unauthorized", err.message);
    setState("closed");
    return;
  }
  if (WANTS_WEBRTC && window.RTCPeerConnection) {
    try {
      await startRtc(token);
      return;
    } catch (err) {
      if (err.status === 401 || err.status === 403 || err.status === 429 || err.status === 503) {
        showError("refused", err.message); // the WebSocket would be refused the same way
        setState("closed");
        return;
      }
      voiceAgent.fallback = `${err.name}: ${err.message}`; // no WebRTC here: the WebSocket instead
      console.warn("WebRTC call failed; using the WebSocket:", err);
      try {
        token = await sessionToken(); // the first one was used
      } catch (tokenErr) {
        showError("unauthorized", tokenErr.message);
        setState("closed");
        return;
      }
    }
  }
  voiceAgent.transport = "ws";
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const sock = (ws = new WebSocket(`${scheme}//${location.host}/ws?token=${encodeURIComponent(token)}`));
  sock.binaryType = "arraybuffer";
  sock.onopen = () => sock.send(JSON.stringify({
    type: "session.start", audio: { sample_rate: INPUT_RATE, encoding: "pcm16" },
  }));
  sock.onmessage = ({ data }) => {
    if (sock !== ws) return; // a previous call's socket
    if (typeof data === "string") {
      onEvent(JSON.parse(data));
    } else {
      voiceAgent.audioBytesReceived += data.byteLength;
      playback.enqueue(data);
    }
  };
  sock.onclose = (e) => {
    if (sock !== ws) return;
    stopMic();
    sessionStarted = false;
    if (e.code !== 1000) showError("closed", `the connection closed (${e.code}${e.reason ? ": " + e.reason : ""})`);
    setState("closed");
  };

  try {
    await startMic();
  } catch (err) {
    showError("microphone", `${err.name}: ${err.message}`);
    sock.close();
    return;
  }
  if (sock === ws && sessionStarted) setState("listening");
}

async function startRtc(token) {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
  });
  const me = {}; // this call: its events count while it is the page's call
  rtcCaller = me;
  try {
    const call = await startWebRTC({
      token, stream, ctx, audio: $("reply-audio"),
      onOpen: (send) => send({ type: "session.start", audio: { sample_rate: INPUT_RATE, encoding: "pcm16" } }),
      onEvent: (event) => rtcCaller === me && onEvent(event),
      onLoud: (ms) => (voiceAgent.audioHeardMs += ms),
      onClose: () => {
        stream.getTracks().forEach((track) => track.stop());
        if (rtcCaller !== me) return;
        rtc = rtcCaller = null;
        mic = null;
        sessionStarted = false;
        setState("closed");
      },
    });
    if (rtcCaller === me) {
      rtc = call;
      voiceAgent.transport = "webrtc";
      mic = { stream, source: null, node: null };
      if (sessionStarted) setState("listening");
    }
  } catch (err) {
    stream.getTracks().forEach((track) => track.stop());
    if (rtcCaller === me) rtcCaller = null;
    throw err;
  }
}

function stop() {
  if (rtc) {
    const call = rtc;
    call.send({ type: "session.end" }); // the server closes the call; the connection's close ends it here
    setTimeout(() => call.close(), 1000);
    return;
  }
  stopMic();
  playback.flush();
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "session.end" }));
  else setState("closed");
}

ui.start.addEventListener("click", start);
ui.stop.addEventListener("click", stop);
