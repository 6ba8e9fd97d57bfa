// The page's WebRTC call (docs/webrtc.md): the microphone as a track (the browser's echo
// cancellation, noise suppression and Opus, with its jitter buffer and loss concealment), the
// reply on the server's track played by an <audio> element, and the native protocol's events on
// the "events" data channel. POST /webrtc/calls?token=... takes the offer and answers it.
"use strict";

const RTC_GATHER_MS = 2000; // the longest the offer waits for this side's ICE candidates

function iceGathered(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      if (pc.iceGatheringState === "complete") {
        pc.removeEventListener("icegatheringstatechange", done);
        resolve();
      }
    };
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, RTC_GATHER_MS); // host candidates come at once; a slow STUN server is not waited for
  });
}

// A tap on the reply's audio as the page plays it: how much of it had sound (for tests and the
// status line), by an AnalyserNode on the remote track.
function tapLevel(ctx, stream, onLoud) {
  const source = ctx.createMediaStreamSource(stream);
  const analyser = ctx.createAnalyser();
  analyser.fftSize = 1024;
  source.connect(analyser);
  const samples = new Float32Array(analyser.fftSize);
  let last = performance.now();
  const timer = setInterval(() => {
    const now = performance.now();
    analyser.getFloatTimeDomainData(samples);
    let peak = 0;
    for (const s of samples) peak = Math.max(peak, Math.abs(s));
    if (peak > 0.01) onLoud(now - last);
    last = now;
  }, 20);
  return () => {
    clearInterval(timer);
    source.disconnect();
  };
}

// Starts a call; resolves once the server answered (the channel opens a moment later), or throws
// with `status` set to the HTTP status when the server refused the offer.
async function startWebRTC({ token, stream, ctx, audio, onOpen, onEvent, onClose, onLoud }) {
  const pc = new RTCPeerConnection();
  for (const track of stream.getAudioTracks()) pc.addTrack(track, stream);
  const channel = pc.createDataChannel("events");
  let untap = null;
  pc.ontrack = (event) => {
    const remote = event.streams[0] || new MediaStream([event.track]);
    audio.srcObject = remote;
    audio.play().catch(() => {}); // autoplay: the click that started the call allows it
    untap = tapLevel(ctx, remote, onLoud);
  };
  let closed = false;
  const close = () => {
    if (closed) return;
    closed = true;
    if (untap) untap();
    audio.srcObject = null;
    pc.close();
    onClose();
  };
  let answered = false;
  const send = (message) => channel.readyState === "open" && channel.send(JSON.stringify(message));
  const opened = () => channel.readyState === "open" && answered && onOpen(send);
  channel.onopen = opened;
  channel.onmessage = ({ data }) => onEvent(JSON.parse(data));
  channel.onclose = close;
  pc.onconnectionstatechange = () => {
    if (pc.connectionState === "failed" || pc.connectionState === "closed") close();
  };
  await pc.setLocalDescription(await pc.createOffer());
  await iceGathered(pc);
  const reply = await fetch(`/webrtc/calls?token=${encodeURIComponent(token)}`, {
    method: "POST", headers: { "content-type": "application/sdp" }, body: pc.localDescription.sdp,
  });
  if (!reply.ok) {
    pc.close();
    let message = `HTTP ${reply.status}`;
    try {
      message = (await reply.json()).message || message;
    } catch (err) { /* not JSON */ }
    const error = new Error(message);
    error.status = reply.status;
    throw error;
  }
  await pc.setRemoteDescription({ type: "answer", sdp: await reply.text() });
  answered = true;
  opened(); // if the channel opened already
  return { send, close };
}
