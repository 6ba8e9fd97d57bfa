// Shared by the call QA pages (/qa and /qa/calls/{id}): the API's address, fetching, formatting,
// the waterfall's stages and the split of a reply into what the caller heard and what they did not.

// The service's root, found from this file's own address (/static/qa/common.js), so the pages also
// work behind a proxy that serves the service under a path prefix.
export const ROOT = new URL("../../", import.meta.url);

export function apiUrl(path, params = {}) {
  const url = new URL("api/" + path, ROOT);
  for (const [name, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") url.searchParams.set(name, value);
  }
  return url;
}

export function callPageUrl(id) {
  return new URL("qa/calls/" + encodeURIComponent(id), ROOT);
}

// The JSON body, or an Error carrying the API's own message ({"error": {"code", "message"}}).
export async function getJSON(url) {
  const response = await fetch(url);
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (!response.ok) {
    const message = body?.error?.message || `${response.status} ${response.statusText}`;
    const error = new Error(message);
    error.status = response.status;
    throw error;
  }
  return body;
}

// A DOM element: el("td", {class: "num", title: "…"}, "text", child, …). Strings become text nodes.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const pad = (n, width = 2) => String(n).padStart(width, "0");

// An ISO time as the browser's local time, 2025-03-01 13:03:07.
export function formatTime(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

// A value for <input type="datetime-local"> (local time, to the second) from an ISO time.
export function toLocalInput(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return "";
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

// ISO-8601 UTC from what a datetime-local input (local time) or a URL (ISO, epoch seconds) holds.
export function toIso(value) {
  if (!value) return "";
  const d = /^\d+(\.\d+)?$/.test(value) ? new Date(Number(value) * 1000) : new Date(value);
  return Number.isNaN(d.getTime()) ? "" : d.toISOString();
}

export function formatMs(ms) {
  return ms === null || ms === undefined ? "–" : String(Math.round(ms));
}

// Seconds as m:ss (h:mm:ss from an hour), 132.4 -> 2:12.
export function formatDuration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  return h ? `${h}:${pad(m)}:${pad(s % 60)}` : `${m}:${pad(s % 60)}`;
}

export function formatPercent(rate) {
  return rate === null || rate === undefined ? "–" : `${Math.round(rate * 100)}%`;
}

export function badge(text, kind, title) {
  return el("span", {class: `badge ${kind || ""}`.trim(), title}, text);
}

// The waterfall's stages, in order: each from the previous mark to its own. Endpointing runs from the
// caller's true end of speech to speech_end (the end-of-speech decision), known where the turn's
// voice-to-voice figure is.
export const STAGES = [
  {key: "endpointing", label: "endpointing", mark: "speech_end", markLabel: "end of speech", color: "#9aa5b8"},
  {key: "asr", label: "ASR", mark: "asr_final", markLabel: "ASR final", color: "#2f6fed"},
  {key: "first_token", label: "first token", mark: "llm_first_token", markLabel: "LLM first token", color: "#8e44ad"},
  {key: "first_phrase", label: "first phrase", mark: "first_phrase", markLabel: "first phrase", color: "#d35400"},
  {key: "tts", label: "TTS", mark: "tts_first_audio", markLabel: "TTS first audio", color: "#16a085"},
  {key: "first_audio", label: "first audio sent", mark: "first_audio_sent", markLabel: "first audio sent",
   color: "#c0392b"},
];

// A turn's stage durations in ms ({endpointing, asr, …}; null where a mark is missing). Marks are ms
// after speech_end; a reply started early, at a pause, can have negative ones: they are drawn at 0,
// and a stage never runs backwards, so the bars add up to the first audio sent (plus endpointing:
// the voice-to-voice figure).
export function stageSegments(turn) {
  const marks = turn.latency_ms || {};
  const sent = marks.first_audio_sent;
  const v2v = turn.voice_to_voice_ms;
  const segments = {
    endpointing: v2v !== null && v2v !== undefined && sent !== undefined && sent !== null
      ? Math.max(0, v2v - Math.max(0, sent)) : null,
  };
  let at = 0;
  for (const stage of STAGES.slice(1)) {
    const mark = marks[stage.mark];
    if (mark === null || mark === undefined) {
      segments[stage.key] = null;
      continue;
    }
    const end = Math.max(at, mark);
    segments[stage.key] = end - at;
    at = end;
  }
  return segments;
}

export function isPreemptive(turn) {
  return Object.values(turn.latency_ms || {}).some((ms) => ms < 0);
}

function commonPrefix(a, b) {
  let n = 0;
  while (n < a.length && n < b.length && a[n] === b[n]) n += 1;
  return n;
}

// The reply in three parts: heard by the caller, sent but not heard (cut off by a barge-in), and
// generated but never sent. heard_text is a prefix of sent_text, itself a prefix of generated_text.
export function splitReply(turn) {
  const sent = turn.sent_text || "";
  const generated = turn.generated_text || sent;
  const heardEnd = commonPrefix(generated, turn.heard_text || "");
  const sentEnd = Math.max(heardEnd, commonPrefix(generated, sent));
  return {
    heard: generated.slice(0, heardEnd),
    sentUnheard: generated.slice(heardEnd, sentEnd),
    unsent: generated.slice(sentEnd),
  };
}

export function mean(values) {
  return values && values.length ? values.reduce((a, b) => a + b, 0) / values.length : null;
}
