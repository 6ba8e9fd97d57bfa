// Microphone capture: downsamples the AudioContext's input (at the global `sampleRate`) to the
// target rate and posts frames of little-endian PCM16 (an ArrayBuffer per frame) to the page.
//
// Resampling: a windowed-sinc low-pass below the target Nyquist frequency, then linear
// interpolation between filtered samples at a fractional step of sampleRate / targetRate.

const lowPass = (cutoff, taps) => {
  // cutoff in cycles per input sample (< 0.5); a Hamming-windowed sinc normalised to unit gain
  const h = new Float32Array(taps);
  const mid = (taps - 1) / 2;
  let sum = 0;
  for (let i = 0; i < taps; i++) {
    const x = i - mid;
    const sinc = x === 0 ? 2 * cutoff : Math.sin(2 * Math.PI * cutoff * x) / (Math.PI * x);
    h[i] = sinc * (0.54 - 0.46 * Math.cos((2 * Math.PI * i) / (taps - 1)));
    sum += h[i];
  }
  return h.map((v) => v / sum);
};

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { targetRate = 16000, frameMs = 20 } = options.processorOptions || {};
    this.step = sampleRate / targetRate; // input samples per output sample
    this.taps = this.step > 1 ? lowPass((0.45 * targetRate) / sampleRate, 2 * Math.ceil(this.step * 12) + 1)
                              : Float32Array.of(1);
    this.history = new Float32Array(this.taps.length); // ring of the latest input samples
    this.head = 0;
    this.prev = 0; // previous filtered sample
    this.t = 1; // position of the next output sample after `prev`, in input samples
    this.frameSamples = Math.round((targetRate * frameMs) / 1000);
    this.newFrame();
  }

  newFrame() {
    this.frame = new DataView(new ArrayBuffer(this.frameSamples * 2));
    this.filled = 0;
  }

  filter(x) {
    const { history, taps } = this;
    const n = taps.length;
    history[this.head] = x;
    let y = 0;
    for (let k = 0, i = this.head; k < n; k++, i = i === 0 ? n - 1 : i - 1) y += taps[k] * history[i];
    this.head = (this.head + 1) % n;
    return y;
  }

  emit(sample) {
    const s = Math.max(-1, Math.min(1, sample));
    this.frame.setInt16(this.filled * 2, s < 0 ? s * 0x8000 : s * 0x7fff, true);
    if (++this.filled === this.frameSamples) {
      const buffer = this.frame.buffer;
      this.port.postMessage(buffer, [buffer]);
      this.newFrame();
    }
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true; // no input connected yet
    for (let i = 0; i < channel.length; i++) {
      const cur = this.filter(channel[i]);
      while (this.t <= 1) {
        this.emit(this.prev + (cur - this.prev) * this.t);
        this.t += this.step;
      }
      this.t -= 1;
      this.prev = cur;
    }
    return true;
  }
}

registerProcessor("capture", CaptureProcessor);
