// One call (/qa/calls/{id}), from GET /api/calls/{id}: its summary, the recording with a marker per
// turn, the waterfall of stage latencies per turn, the turns' figures (stages, speculative decoding)
// and the transcript with the words the caller did not hear struck through.
import {
  apiUrl, badge, el, formatDuration, formatMs, formatPercent, formatTime, getJSON, isPreemptive, mean,
  splitReply, STAGES, stageSegments,
} from "./common.js";

const callId = decodeURIComponent(location.pathname.replace(/^.*\/qa\/calls\//, "").replace(/\/$/, ""));
const page = {state: "loading", callId, call: null, turns: [], segments: [], waterfall: null};
window.qaPage = page;

// Badges for what happened in a turn besides its status.
function turnBadges(turn) {
  return [
    turn.barge_in ? badge("barge-in", "barge-in") : null,
    turn.dtmf ? badge(`DTMF ${turn.dtmf}`, "dtmf") : null,
    turn.error ? badge("error", "failed", turn.error) : null,
    turn.deadline_missed ? badge("deadline missed", "warn") : null,
    turn.underruns ? badge(`${turn.underruns} underrun${turn.underruns > 1 ? "s" : ""}`, "warn") : null,
    isPreemptive(turn) ? badge("preemptive", "info", "the reply started at a pause, before the end of speech") : null,
  ].filter(Boolean);
}

function renderSummary(call) {
  document.title = `Call ${call.id} · voice-agent QA`;
  document.getElementById("crumb").textContent = call.id;
  document.getElementById("call-id").textContent = call.id;
  document.getElementById("call-status").replaceChildren(badge(call.status, call.status));
  const items = [
    ["started", formatTime(call.started_at)], ["ended", formatTime(call.ended_at)],
    ["duration", formatDuration(call.duration_s)], ["transport", call.transport], ["caller", call.caller ?? "–"],
    ["end reason", call.end_reason ?? "–"], ["turns", call.turns], ["interruptions", call.interruptions],
    ["errors", call.errors], ["median v2v", `${formatMs(call.v2v_median_ms)} ms`],
    ["worst v2v", `${formatMs(call.v2v_max_ms)} ms`],
    ["settings", el("details", {}, el("summary", {class: "mono"}, call.fingerprint || "–"),
                     el("pre", {}, JSON.stringify(call.settings, null, 2)))],
  ];
  document.getElementById("summary").replaceChildren(
    ...items.map(([name, value]) => el("div", {"data-field": name}, el("dt", {}, name), el("dd", {}, value))));
}

// The player, and a marker at each turn's offset that seeks it there.
function renderRecording(call, turns) {
  if (!call.has_recording) return;
  document.getElementById("recording").hidden = false;
  const player = document.getElementById("player");
  const timeline = document.getElementById("timeline");
  const playhead = document.getElementById("playhead");
  player.src = apiUrl(`calls/${encodeURIComponent(call.id)}/recording`);
  const markers = turns.map((turn) => {
    const marker = el("button", {type: "button", class: `marker ${turn.status}`, "data-offset": turn.offset_s,
                                 title: `turn ${turn.turn_id} at ${formatDuration(turn.offset_s)}`}, turn.turn_id);
    marker.addEventListener("click", () => seek(turn.offset_s));
    return marker;
  });
  timeline.append(...markers);
  const place = () => {
    const length = Number.isFinite(player.duration) && player.duration > 0 ? player.duration : call.duration_s;
    for (const marker of markers) {
      const at = length ? Math.min(100, (Number(marker.dataset.offset) / length) * 100) : 0;
      marker.style.left = `${at}%`;
    }
    playhead.style.left = length ? `${Math.min(100, (player.currentTime / length) * 100)}%` : "0";
  };
  place();
  player.addEventListener("loadedmetadata", place);
  player.addEventListener("timeupdate", place);
  timeline.addEventListener("click", (event) => {
    if (event.target !== timeline) return;
    const length = Number.isFinite(player.duration) ? player.duration : call.duration_s;
    const box = timeline.getBoundingClientRect();
    if (length) seek(((event.clientX - box.left) / box.width) * length);
  });
}

function seek(seconds) {
  const player = document.getElementById("player");
  player.currentTime = seconds;
}

// One horizontal stacked bar per turn, a segment per stage (Chart.js); under a turn that made tool
// calls, a bar per call, from its dispatch to its result (ms from the caller's end of speech).
function renderWaterfall(turns, segments) {
  const box = document.getElementById("waterfall-box");
  const rows = [];
  turns.forEach((turn, i) => {
    rows.push({label: `turn ${turn.turn_id}`, turn, segment: segments[i]});
    for (const call of turn.tool_calls || []) rows.push({label: `  ↳ ${call.name}`, turn, call});
  });
  box.style.height = `${90 + 34 * Math.max(1, rows.length)}px`;
  const labels = rows.map((row) => row.label);
  const datasets = STAGES.map((stage) => ({
    label: stage.label, key: stage.key, backgroundColor: stage.color, borderWidth: 0, barPercentage: 0.8,
    data: rows.map((row) => (row.segment ? row.segment[stage.key] : null)),
  }));
  if (rows.some((row) => row.call)) {
    // an invisible segment up to the dispatch, then the call itself
    datasets.push(
      {label: "", key: "tool_wait", backgroundColor: "rgba(0,0,0,0)", borderWidth: 0, barPercentage: 0.8,
       data: rows.map((row) => (row.call ? Math.max(0, row.call.dispatched_ms ?? 0) : null))},
      {label: "tool call", key: "tool_call", backgroundColor: "#7f8c8d", borderWidth: 0, barPercentage: 0.8,
       data: rows.map((row) => (row.call ? row.call.duration_ms : null))},
    );
  }
  page.waterfall = new Chart(document.getElementById("waterfall"), {
    type: "bar",
    data: {labels, datasets},
    options: {
      indexAxis: "y", animation: false, responsive: true, maintainAspectRatio: false,
      scales: {
        x: {stacked: true, beginAtZero: true, title: {display: true, text: "ms from the caller's end of speech"}},
        y: {stacked: true},
      },
      plugins: {
        legend: {position: "top", labels: {boxWidth: 12, filter: (item) => item.text !== ""}},
        tooltip: {
          filter: (item) => item.dataset.key !== "tool_wait",
          callbacks: {
            label: (item) => `${item.dataset.label}: ${formatMs(item.raw)} ms`,
            footer: (items) => {
              const row = rows[items[0].dataIndex];
              if (row.call) {
                const heard = row.call.filler_heard === null ? "" : row.call.filler_heard ? "; filler heard"
                  : "; filler not heard";
                return `${row.call.name}(${row.call.arguments}) → ${row.call.error || row.call.output}` +
                  ` (${row.call.runs_on}${heard})`;
              }
              return row.turn.voice_to_voice_ms === null ? "voice-to-voice unknown"
                : `voice-to-voice: ${formatMs(row.turn.voice_to_voice_ms)} ms`;
            },
          },
        },
      },
    },
  });
}

const SPEC_HEADS = ["v2v", "accept", "K", "accepted / position", "tok/s"];

function sparkline(spec) {
  const counts = spec?.accepted_per_position || [];
  if (!counts.length) return "–";
  const top = Math.max(spec.drafts || 0, ...counts) || 1;
  const title = counts.map((n, i) => `position ${i + 1}: ${n}`).join(", ") + ` (of ${spec.drafts} drafts)`;
  return el("span", {class: "spark", title, "aria-label": title, "data-counts": JSON.stringify(counts)},
    counts.map((n) => el("span", {style: `height:${Math.max(1, Math.round((n / top) * 100))}%`})));
}

function renderTurnsTable(turns, segments) {
  const table = document.getElementById("turns");
  table.tHead.rows[0].replaceChildren(
    el("th", {}, "turn"), el("th", {}, "status"),
    ...STAGES.map((stage) => el("th", {class: "num"}, el("span", {class: "swatch", style: `background:${stage.color}`}),
                                stage.label)),
    ...SPEC_HEADS.map((head) => el("th", {class: "num"}, head)));
  table.tBodies[0].replaceChildren(...turns.map((turn, i) => {
    const spec = turn.spec;
    const k = mean(spec?.k_chosen);
    return el("tr", {"data-turn-id": turn.turn_id, "data-stage-ms": JSON.stringify(segments[i])},
      el("td", {}, turn.turn_id),
      el("td", {}, el("span", {class: "badges"}, badge(turn.status, turn.status), turnBadges(turn))),
      ...STAGES.map((stage) => el("td", {class: "num", "data-stage": stage.key}, formatMs(segments[i][stage.key]))),
      el("td", {class: "num"}, formatMs(turn.voice_to_voice_ms)),
      el("td", {class: "num", "data-field": "acceptance"}, formatPercent(spec?.acceptance_rate)),
      el("td", {class: "num", "data-field": "k", title: spec?.k_chosen ? `K chosen: ${spec.k_chosen.join(", ")}` : null},
         k === null ? "–" : k.toFixed(1)),
      el("td", {class: "num"}, sparkline(spec)),
      el("td", {class: "num"}, spec?.tokens_per_second != null ? spec.tokens_per_second.toFixed(1) : "–"));
  }));
}

// The time beside each turn seeks the recording there, when there is one.
function renderTranscript(turns, recorded) {
  document.getElementById("transcript").replaceChildren(...turns.map((turn) => {
    const reply = splitReply(turn);
    const at = recorded ? el("button", {type: "button", class: "link", title: "play from here"},
                             formatDuration(turn.offset_s)) : formatDuration(turn.offset_s);
    if (recorded) at.addEventListener("click", () => seek(turn.offset_s));
    return el("article", {class: `turn ${turn.status}`, "data-turn-id": turn.turn_id},
      el("header", {class: "badges"}, `turn ${turn.turn_id} · `, at,
        turn.status !== "completed" ? badge(turn.status, turn.status) : null, turnBadges(turn)),
      el("p", {class: "user"}, turn.user_text || el("span", {class: "muted"}, "(no transcript)")),
      el("p", {class: "bot"},
        reply.heard ? el("span", {class: "heard"}, reply.heard) : null,
        reply.sentUnheard ? el("s", {class: "unheard sent", title: "sent, not heard"}, reply.sentUnheard) : null,
        reply.unsent ? el("s", {class: "unheard unsent", title: "generated, never sent"}, reply.unsent) : null,
        !reply.heard && !reply.sentUnheard && !reply.unsent ? el("span", {class: "muted"}, "(no reply)") : null),
      turn.error ? el("p", {class: "error-text"}, turn.error) : null);
  }));
}

async function load() {
  document.getElementById("call-id").textContent = callId;
  try {
    const body = await getJSON(apiUrl(`calls/${encodeURIComponent(callId)}`));
    page.call = body.call;
    page.turns = body.turns;
    page.segments = body.turns.map(stageSegments);
    document.getElementById("call").hidden = false;
    renderSummary(body.call);
    renderRecording(body.call, body.turns);
    renderWaterfall(body.turns, page.segments);
    renderTurnsTable(body.turns, page.segments);
    renderTranscript(body.turns, body.call.has_recording);
    document.body.dataset.state = page.state = "ready";
  } catch (error) {
    const box = document.getElementById("error");
    box.hidden = false;
    box.textContent = error.status === 404 ? `No call with id ${callId}.` : `Could not load the call: ${error.message}`;
    document.body.dataset.state = page.state = "error";
  }
}

load();
