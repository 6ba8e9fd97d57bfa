"""Echo cancellation: the bot's reply, played by the caller's loudspeaker and heard again by their microphone (a
speakerphone, a laptop without headphones, a desk phone on a line with no echo control), taken out of the
caller's audio before the VAD and the recognizer hear it, so that the bot does not take its own voice for the
caller's and interrupt itself (issue 36, item 4).

The server knows what it played and when: the player places every chunk of a reply at the time it starts playing
for the caller, as a call's recording does. `PlayedTrack` keeps the last seconds of that, at 16 kHz on the
session's clock. `MicTimeline` places the caller's audio on the same clock: a frame's last sample arrived at
`frame.at`, and the least delayed frame so far tells when sample 0 was heard (a late frame is late, not early).
`EchoCanceller` is speexdsp's echo canceller (a multidelay adaptive filter with two paths, which does not diverge
while the caller talks over the bot) and its preprocessor's residual echo suppression, through ctypes on the
Debian library (libspeexdsp1). Its filter spans `tail_ms`: the whole delay from the server's playhead to the echo
in the caller's audio (the network both ways, the client's playback buffer, the room) must lie within it.

`cancel_echo` runs it on the session's input line, before vad_stage; `bench/echo_turns.py` measures it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import AsyncIterator, Callable

import numpy as np

from models.protocols import Audio
from pipeline.audio import StreamResampler, float_to_pcm16
from pipeline.config import EchoConfig
from pipeline.events import AudioFrame

log = logging.getLogger(__name__)

RATE = 16000
FRAME = 160  # 10 ms: the canceller's frame
# A found echo still shows where the correlation within 4 ms of its delay stands this many standard deviations
# high (DelayEstimator.strength). Offline replays of cancel_echo on espeak-ng speech through tests/speakerphone.py's
# room (delays 10-990 ms, rooms of 0.3 and 0.6 s, 16 and 8 kHz lines, frames jittered by up to 50 ms): a real echo
# gave 45-117 alone, 17 and up under noise as loud as it, 9-66 under a caller 10-15 dB louder talking over it;
# once it had gone, 1.3-4.3 over the room's noise or the caller's speech.
STILL_THERE = 8.0
# A window where the caller's audio is more than this louder than the found echo would be (at its measured echo
# return) tells nothing of it: under a caller 20 dB louder (an 8 kHz line, 700 ms, a 0.6 s room) a real echo's
# correlation stayed under STILL_THERE for 13 windows in a row (3.25 s). Counting the rest, a real echo was never
# unseen for more than 3 windows in a row (0.75 s; EchoConfig.drop_after_s is 2 s).
BURIED_DB = 10.0
_ECHO_SET_SAMPLING_RATE = 24
_PREPROCESS_SET_DENOISE = 0
_PREPROCESS_SET_NOISE_SUPPRESS = 18
_PREPROCESS_SET_ECHO_SUPPRESS = 20
_PREPROCESS_SET_ECHO_SUPPRESS_ACTIVE = 22
_PREPROCESS_SET_ECHO_STATE = 24


@functools.cache
def speexdsp() -> ctypes.CDLL:
    name = ctypes.util.find_library("speexdsp")
    if name is None:
        raise RuntimeError("echo cancellation and noise suppression need libspeexdsp (Debian package libspeexdsp1, "
                           "which scripts/setup.sh installs); or turn them off: session.echo.enabled false, "
                           "session.noise.enabled false")
    lib = ctypes.CDLL(name)
    lib.speex_echo_state_init.restype = ctypes.c_void_p
    lib.speex_echo_state_init.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.speex_echo_state_destroy.argtypes = [ctypes.c_void_p]
    lib.speex_echo_cancellation.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.speex_echo_ctl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.speex_preprocess_state_init.restype = ctypes.c_void_p
    lib.speex_preprocess_state_init.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.speex_preprocess_state_destroy.argtypes = [ctypes.c_void_p]
    lib.speex_preprocess_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.speex_preprocess_ctl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    return lib


def available() -> bool:
    """Whether libspeexdsp can be loaded here."""
    try:
        speexdsp()
    except (RuntimeError, OSError):
        return False
    return True


def _pcm16(samples: Audio) -> np.ndarray:
    return np.frombuffer(float_to_pcm16(samples), dtype="<i2")


class EchoCanceller:
    """speexdsp's echo canceller and residual echo suppression on 16 kHz audio: `process(mic, played)` takes the
    microphone's samples and what the loudspeaker played over the same samples (as long, already aligned to
    within the filter's tail) and gives back the microphone without the echo, as long as what went in, less
    the part of a 10 ms frame not yet whole (it comes out with the next call)."""

    def __init__(self, tail_ms: int = 500, suppress_db: int = -40, suppress_active_db: int = -15) -> None:
        self._lib = speexdsp()
        self._echo = self._lib.speex_echo_state_init(FRAME, RATE * tail_ms // 1000)
        self._pre = self._lib.speex_preprocess_state_init(FRAME, RATE)
        if not self._echo or not self._pre:
            raise RuntimeError("speexdsp could not make an echo canceller")
        self._ctl(self._lib.speex_echo_ctl, self._echo, _ECHO_SET_SAMPLING_RATE, RATE)
        # the preprocessor's gains on (its residual echo suppression is one of them), its noise attenuation at
        # 0 dB: the caller's audio otherwise passes as it is (noise is not the echo canceller's to remove)
        self._ctl(self._lib.speex_preprocess_ctl, self._pre, _PREPROCESS_SET_DENOISE, 1)
        self._ctl(self._lib.speex_preprocess_ctl, self._pre, _PREPROCESS_SET_NOISE_SUPPRESS, 0)
        self._ctl(self._lib.speex_preprocess_ctl, self._pre, _PREPROCESS_SET_ECHO_SUPPRESS, suppress_db)
        self._ctl(self._lib.speex_preprocess_ctl, self._pre, _PREPROCESS_SET_ECHO_SUPPRESS_ACTIVE, suppress_active_db)
        self._lib.speex_preprocess_ctl(self._pre, _PREPROCESS_SET_ECHO_STATE, ctypes.c_void_p(self._echo))
        self._mic = np.zeros(0, dtype=np.float32)
        self._played = np.zeros(0, dtype=np.float32)
        self._out = np.zeros(FRAME, dtype=np.int16)

    @staticmethod
    def _ctl(fn: Callable[..., int], state: int, request: int, value: int) -> None:
        arg = ctypes.c_int(value)
        fn(state, request, ctypes.byref(arg))

    def process(self, mic: Audio, played: Audio) -> Audio:
        if len(mic) != len(played):
            raise ValueError(f"mic and played audio differ in length ({len(mic)} and {len(played)} samples)")
        self._mic = np.concatenate([self._mic, mic.astype(np.float32, copy=False)])
        self._played = np.concatenate([self._played, played.astype(np.float32, copy=False)])
        whole = len(self._mic) // FRAME * FRAME
        if not whole:
            return np.zeros(0, dtype=np.float32)
        mic16, played16 = _pcm16(self._mic[:whole]), _pcm16(self._played[:whole])
        out = np.empty(whole, dtype=np.int16)
        for i in range(0, whole, FRAME):
            self._lib.speex_echo_cancellation(self._echo, mic16[i:].ctypes.data, played16[i:].ctypes.data,
                                              self._out.ctypes.data)
            self._lib.speex_preprocess_run(self._pre, self._out.ctypes.data)
            out[i:i + FRAME] = self._out
        self._mic, self._played = self._mic[whole:], self._played[whole:]
        return out.astype(np.float32) / 32768.0

    def pending(self) -> Audio:
        """The microphone's samples given but not yet processed (less than a 10 ms frame)."""
        return self._mic

    def __del__(self) -> None:
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        if getattr(self, "_pre", None):
            lib.speex_preprocess_state_destroy(self._pre)
            self._pre = None
        if getattr(self, "_echo", None):
            lib.speex_echo_state_destroy(self._echo)
            self._echo = None


class PlayedTrack:
    """What the caller's loudspeaker plays, at 16 kHz on the session's clock, the last `keep_s` seconds of it: an
    AudioTap (pipeline/session/parts.py) the player writes each reply chunk to, placed where it starts playing.
    Chunks within `tolerance_s` of the previous one's end follow it exactly (the playhead's rounding leaves no
    clicks); `bot_stopped(at)` silences what was placed after `at` (the caller never heard it)."""

    def __init__(self, keep_s: float = 4.0, tolerance_s: float = 0.05) -> None:
        self._size = int(keep_s * RATE)
        self._buf = np.zeros(self._size, dtype=np.float32)
        self._tolerance = int(tolerance_s * RATE)
        self.origin: float | None = None  # the clock time of sample 0
        self._end = 0  # one past the last sample placed
        self._cursor: int | None = None  # where the next contiguous chunk goes
        self._rate = 0
        self._resampler: StreamResampler | None = None
        self.echo_ms: float | None = None  # the delay at which cancel_echo found this audio in the caller's

    def index(self, at: float) -> int:
        """The sample at clock time `at` (the track's origin is set by its first chunk, or here)."""
        if self.origin is None:
            self.origin = at
        return round((at - self.origin) * RATE)

    def bot(self, samples: Audio, rate: int, at: float) -> None:
        start = self.index(at)
        if self._cursor is None or abs(start - self._cursor) > self._tolerance or rate != self._rate:
            self._resampler, self._rate = StreamResampler(rate, RATE), rate  # a new stretch
        else:
            start = self._cursor
        assert self._resampler is not None
        audio = self._resampler(samples.astype(np.float32, copy=False))[-self._size:]
        self._write(start, audio)
        self._cursor = start + len(audio)

    def bot_stopped(self, at: float) -> None:
        cut = max(self.index(at), self._end - self._size)
        if cut < self._end:
            self._buf[np.arange(cut, self._end) % self._size] = 0.0
        self._cursor = None

    def _write(self, start: int, audio: Audio) -> None:
        if start > self._end:  # a gap: silence between
            gap = np.arange(max(self._end, start - self._size), start)
            self._buf[gap % self._size] = 0.0
        self._buf[np.arange(start, start + len(audio)) % self._size] = audio
        self._end = max(self._end, start + len(audio))

    def read(self, start: int, count: int) -> Audio:
        """Samples [start, start + count): zeros where nothing was placed (or it is older than keep_s)."""
        where = np.arange(start, start + count)
        valid = (where >= max(0, self._end - self._size)) & (where < self._end)
        out = np.zeros(count, dtype=np.float32)
        out[valid] = self._buf[where[valid] % self._size]
        return out


class MicTimeline:
    """Places the caller's audio on the session's clock. A frame's last sample arrived at `at`; the frame least
    delayed by the network so far tells when sample 0 was heard (`anchor`), and sample k was heard k / RATE
    after it. Audio that arrives more than `restart_s` later than that says (the client stopped sending for a
    while) starts the timeline again."""

    def __init__(self, restart_s: float = 1.0) -> None:
        self.anchor: float | None = None
        self.count = 0  # samples placed since the anchor's sample 0
        self.restart_s = restart_s

    def place(self, samples: int, at: float) -> float:
        """The clock time the first of these `samples` samples (the last of which arrived at `at`) was heard."""
        self.count += samples
        zero = at - self.count / RATE  # where sample 0 would be, going by this frame
        if self.anchor is None or zero > self.anchor + self.restart_s:
            self.anchor, self.count = at - samples / RATE, samples
        elif zero < self.anchor:
            self.anchor = zero
        return self.anchor + (self.count - samples) / RATE


class DelayEstimator:
    """How far behind the played audio its echo lies in the caller's audio, in samples: the peak of their
    cross-correlation with the phase transform (GCC-PHAT) over the last `window_s` of the caller's audio, searched
    over delays up to `max_delay_ms`, every `every_s` while the bot is heard. A peak counts where it stands
    `min_peak` standard deviations above the correlation and `min_lead` times above its highest point more than
    3 ms away (an echo gives 60-100 and 10-25 alone, 20-60 and 3-12 under a caller 10 dB louder; another voice
    at most 23 and 2.6: tests/pipeline/test_echo.py), and an estimate once two peaks in a row agree within 4 ms.
    A peak within `edge_ms` of either end of the searched delays does not count: beyond them the correlation may
    rise higher, and no echo comes back within 3 ms of the playhead. A 300 Hz tone arriving in jittered bursts
    against a 200 Hz reply gave such peaks, 85-94 high, at 0 and at 1000 ms (bench/echo_false_find.py: false
    finds in 13 of 180 runs, none with the edges left out)."""

    def __init__(self, max_delay_ms: int = 1000, window_s: float = 1.0, every_s: float = 0.25,
                 min_dbfs: float = -55.0, min_peak: float = 30.0, min_lead: float = 3.0, edge_ms: int = 3) -> None:
        self.lags = RATE * max_delay_ms // 1000
        self.window = int(window_s * RATE)
        self.every = int(every_s * RATE)
        self.min_power = 10 ** (min_dbfs / 10)
        self.min_peak, self.min_lead = min_peak, min_lead
        self._mic = np.zeros(self.window, dtype=np.float32)
        self._heard = 0  # samples heard, up to a window's worth
        self._since = 0  # samples heard since the last estimate
        self._last: int | None = None
        self._corr: np.ndarray | None = None  # the last window's correlation over its spread; None if quiet
        self._n = 1 << int(np.ceil(np.log2(2 * self.window + self.lags)))
        self._near = RATE * 3 // 1000
        self._edge = RATE * edge_ms // 1000

    def hear(self, mic: Audio) -> None:
        mic = mic[-self.window:]
        self._mic = np.concatenate([self._mic[len(mic):], mic])
        self._heard = min(self.window, self._heard + len(mic))
        self._since += len(mic)

    def due(self) -> bool:
        return self._since >= self.every

    def echo_return(self, played: Audio, delay: int) -> float:
        """The caller's audio over the window against what was played `delay` before it, in power: how loud the
        echo comes back (the window was found to hold the bot)."""
        lagged = played[self.lags - delay:self.lags - delay + self.window]
        return float(np.mean(self._mic ** 2) / max(float(np.mean(lagged ** 2)), 1e-12))

    def estimate(self, played: Audio) -> int | None:
        """`played`: what was played over the window and `lags` samples before it (window + lags samples, the
        window's last sample last). The delay, once it is sure of one; else None."""
        self._since = 0
        quiet = np.mean(played[-self.window:] ** 2) < self.min_power or np.mean(self._mic ** 2) < self.min_power / 100
        if quiet or self._heard < self.window // 2:  # half a window of the caller: enough, and sooner
            self._last = self._corr = None
            return None
        spectrum = np.conj(np.fft.rfft(self._mic, self._n)) * np.fft.rfft(played, self._n)
        corr = np.fft.irfft(spectrum / (np.abs(spectrum) + 1e-12), self._n)[:self.lags + 1]
        corr = corr / max(float(np.std(corr)), 1e-12)
        self._corr = corr
        peak = int(np.argmax(corr))
        elsewhere = np.concatenate([corr[:max(0, peak - self._near)], corr[peak + self._near + 1:]])
        sure = (corr[peak] >= self.min_peak and self._edge <= peak <= self.lags - self._edge
                and (not len(elsewhere) or corr[peak] >= self.min_lead * float(np.max(elsewhere))))
        delay = self.lags - peak
        agreed = sure and self._last is not None and abs(delay - self._last) <= RATE * 4 // 1000
        self._last = delay if sure else None
        return delay if agreed else None

    def strength(self, played: Audio, delay: int, erl: float) -> float | None:
        """How clearly the last window (`played` as `estimate` had it) holds the echo found `delay` behind at echo
        return `erl`: the correlation at its highest within 4 ms of that delay, in standard deviations of the
        correlation. None where the window cannot tell: it was not searched (quiet, or too little heard), what
        was played `delay` before it is quiet (a reply whose echo has not yet come back), or the caller's audio
        is more than `BURIED_DB` louder than the echo would be (talking over it: the echo correlates weaker)."""
        lagged = float(np.mean(played[self.lags - delay:self.lags - delay + self.window] ** 2))
        buried = np.mean(self._mic ** 2) > 10 ** (BURIED_DB / 10) * erl * lagged
        if self._corr is None or lagged < self.min_power or buried:
            return None
        peak, near = self.lags - delay, RATE * 4 // 1000
        return float(np.max(self._corr[max(0, peak - near):max(0, peak + near + 1)], initial=0.0))


class EchoGate:
    """What the canceller has not yet learned, held down: a frame of the caller's audio no louder than the echo
    of what was just played would make it (the played audio's loudest 10 ms over the echo's delay and the room's
    `reach_ms` before it, times the line's echo return `erl`, plus `margin_db`) is the bot's, and its cleaned
    audio is attenuated by `floor_db`; louder, it is the caller talking over the bot (double talk), and passes,
    as everything does for `hold_ms` after. Where nothing louder than `quiet_dbfs` was played, nothing is held.
    The echo return is measured where the echo was found: the gate works from then on, before the adaptive
    filter has converged (seconds of the bot's speech), and after it (what it leaves, Silero can still call
    speech). A caller not `margin_db` louder than the bot's echo is not heard over it."""

    def __init__(self, erl: float, margin_db: float = 10.0, floor_db: float = -40.0, reach_ms: int = 400,
                 hold_ms: int = 200, quiet_dbfs: float = -60.0) -> None:
        self.erl = erl
        self.margin = 10 ** (margin_db / 10)
        self.floor = np.float32(10 ** (floor_db / 20))
        self.reach = RATE * reach_ms // 1000
        self.hold = RATE * hold_ms // 1000
        self.quiet = 10 ** (quiet_dbfs / 10)
        self._open_for = 0  # samples the gate stays open

    def echo_power(self, played: Audio) -> float:
        """The loudest 10 ms of `played` (the reach before the frame's echo, and the frame's), in power."""
        whole = len(played) // FRAME * FRAME
        if not whole:
            return 0.0
        return float(np.max(np.mean(played[:whole].reshape(-1, FRAME) ** 2, axis=1)))

    def apply(self, mic: Audio, played: Audio, clean: Audio) -> Audio:
        """`mic`: the frame as heard; `played`: what was played over the echo's reach for it; `clean`: the
        canceller's output for it."""
        echo = self.echo_power(played)
        if echo < self.quiet:
            return clean
        power = float(np.mean(mic ** 2)) if len(mic) else 0.0
        if power > self.margin * self.erl * echo:
            self._open_for = self.hold
            return clean
        if self._open_for > 0:
            self._open_for -= len(mic)
            return clean
        return clean * self.floor


async def cancel_echo(frames: AsyncIterator[AudioFrame], track: PlayedTrack, config: EchoConfig,
                      estimator: DelayEstimator | None = None) -> AsyncIterator[AudioFrame]:
    """The caller's frames without the bot's echo. They pass untouched until the delay estimator (`estimator`, a
    bench's; by default one over `max_delay_ms`) finds the bot in them (a line with no echo, the usual one, is
    never touched); from then on the canceller, its filter spanning `tail_ms`, is fed the played audio that much
    later less `margin_ms`, and the echo gate holds down what the canceller has not yet learned. An estimate that
    moves by a little (the network's and the client's jitter) is left to the filter; one that leaves the filter's
    first half (a client whose buffer grew) places the filter again, with a fresh canceller.

    A found echo is dropped (the canceller and the gate with it: the caller's audio passes untouched again) once
    the search has gone `drop_after_s` of the caller's audio, over which the bot was played where its echo would
    be heard, without the correlation standing `STILL_THERE` standard deviations high within 4 ms of the delay
    found: a caller who took the phone off speakerphone, or a find that was never the bot. A window that cannot tell
    (quiet, or the caller `BURIED_DB` louder than the echo would be) counts neither way; the search goes on and
    finds the echo again should it come back. An echo that goes with the bot playing on is dropped 2.4 s later
    over the room's noise or a caller as loud as the echo was (tests/pipeline/test_echo.py)."""
    canceller: EchoCanceller | None = None
    gate: EchoGate | None = None
    timeline = MicTimeline()
    estimator = estimator if estimator is not None else DelayEstimator(config.max_delay_ms)
    shift = 0  # the played audio is read this many samples before the caller's (once the canceller is made)
    delay = 0
    unseen = 0  # samples of the caller's audio searched since the found echo last showed
    erl = 1.0  # the found echo's return, measured where the canceller was made
    margin, span = RATE * config.margin_ms // 1000, RATE * config.tail_ms // 2000
    async for frame in frames:
        heard = timeline.place(len(frame.samples), frame.at)
        if track.origin is None:  # the bot has not played yet
            yield frame
            continue
        at = track.index(heard)
        n = len(frame.samples)
        estimator.hear(frame.samples)
        held: Audio | None = None  # what a dropped canceller had not yet processed
        if estimator.due():
            played = track.read(at + n - estimator.window - estimator.lags, estimator.window + estimator.lags)
            found = estimator.estimate(played)
            if found is not None:
                track.echo_ms, delay, unseen = 1000 * found / RATE, found, 0
                low = shift + margin // 2 if shift else 0  # (a filter placed at 0 covers the echo from 0)
                if canceller is None or not low <= found <= shift + span:
                    log.info("the bot's echo is in the caller's audio, %.0f ms behind the playhead (found %.1f s "
                             "after the bot first played): cancelling it", track.echo_ms, at / RATE)
                    shift, erl = max(0, found - margin), estimator.echo_return(played, found)
                    canceller = EchoCanceller(config.tail_ms, config.suppress_db, config.suppress_active_db)
                if gate is None and config.gate_margin_db > 0:
                    gate = EchoGate(erl, config.gate_margin_db)
            elif canceller is not None and config.drop_after_s > 0:
                strength = estimator.strength(played, delay, erl)
                if strength is not None and strength >= STILL_THERE:
                    unseen = 0
                    # the return measured at the find may hold the caller's voice too: the quietest seen since
                    # tells better when the caller is loud enough to bury the echo
                    erl = min(erl, estimator.echo_return(played, delay))
                elif strength is not None:
                    unseen += estimator.every
                if unseen >= config.drop_after_s * RATE:
                    log.info("the bot's echo %.0f ms behind the playhead is no longer in the caller's audio (not "
                             "seen over %.1f s of the bot playing, %.1f s after the bot first played): no longer "
                             "cancelling it", track.echo_ms, unseen / RATE, at / RATE)
                    held = canceller.pending()
                    canceller = gate = track.echo_ms = None
                    unseen = 0
        if canceller is None:
            if held is not None and len(held):
                yield AudioFrame(np.concatenate([held, frame.samples]), frame.at)
            else:
                yield frame
            continue
        clean = canceller.process(frame.samples, track.read(at - shift, n))
        if gate is not None:
            reach = gate.reach
            clean = gate.apply(frame.samples, track.read(at - delay - reach, n + reach), clean)
        if len(clean):
            yield AudioFrame(clean, frame.at)
