"""The labelled set of bench/turn_detection.py: spoken requests in many voices (bench/voices.py), each
either complete or with a pause inside where the caller means to go on, and the caller's true end.

Kinds, per voice:
- complete: a whole request (a question, a statement, a list, a number read out, a thank-you), then
  2.5 s of silence. A voice may pause at a comma: a turn ended there is a false cut-off too;
- midcut: the request's AUDIO cut right after a word that cannot end a sentence (a function word:
  an article, a preposition, a possessive, an auxiliary, "to", ...), between 25 % and 80 % of its
  words, a pause, then the rest ("Can you book me a table for | two people at eight tonight?").
  The word's end is found by aligning (DTW over log-mel frames) the voice saying the words up to it
  alone onto the whole (whisper-tiny's word ends run ~100 ms late), and the cut is the quietest
  20 ms near there; a cut inside a sound tries the next such word;
- midnumber: a number read out, cut between two of its digits ("my order number is four seven |
  two nine");
- hesitation: "I'd like to book, um" + pause + "a table for two.", the parts said apart.
Human recordings (whisper's sentences of real readings) give complete and midcut samples, cut at
whisper's word end (they cannot say the words alone). Pauses are 0.6, 0.9 or 1.2 s, in rotation.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field

import numpy as np

from bench.voices import RATE, HumanUtterance, Renderer, Voice, on_phone, whisper

PAUSES_S = (0.6, 0.9, 1.2)
LEAD_S, TAIL_S = 0.5, 2.5
CUT_SPAN = (0.25, 0.8)  # a mid-phrase cut follows a word between these shares of the words
REFINE_MS = 60  # ... at the quietest 20 ms frame within this of the word's end
MAX_CUT_DB = -20.0  # a clean cut: its frame this far below the speech's RMS (not inside a sound) ...
CUT_OFF_WHISPER_MS = (-250, 150)  # ... and this near whisper's end of the word (whisper-tiny's ends run late)

_FUNCTION_WORDS = {
    "articles": "a an the",
    "prepositions": "to for in on at of from with by about into onto near after before under between through "
                    "during without than over across towards",
    "possessives": "my your our their its",
    "conjunctions": "and or but because if whether when while unless although",
    "auxiliaries": "is are was were be been being am do does did can could will would should shall may might must "
                   "i'd i'm i'll you'd we'd what's where's how's there's it's let's",
    "verbs that want an object, determiners": "like want need wanted needed trying gonna wanna some any every each",
}
FUNCTION_WORDS = frozenset(w for words in _FUNCTION_WORDS.values() for w in words.split())
NOT_AFTER = {"in": {"log", "logged", "check", "checked", "sign", "signed", "come", "get", "got", "plug", "fill"},
             "on": {"turn", "turned", "put", "log", "logged", "come", "hold", "go"},
             "over": {"come", "go", "hand", "move"},
             "like": {"be", "is", "was", "it's", "look", "looks", "feel", "feels"}}
DIGITS = frozenset(["zero", "oh", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"])

REQUESTS = [  # questions
    "Can you book me a table for two people at eight tonight?",
    "What is the weather going to be like in Paris tomorrow?",
    "How long should I bake a chicken breast at two hundred degrees?",
    "Is there a pharmacy near the station that is open after ten at night?",
    "Can you recommend a vegetarian recipe that takes less than thirty minutes?",
    "Will it snow in the mountains near Denver this weekend?",
    "How do I set up automatic payments for my electricity bill?",
    "What time does the last train to Boston leave tonight?",
    "Why was I charged twice for the same purchase last week?",
    "What's a good substitute for buttermilk in pancakes?",
    "How many tablespoons are in a quarter of a cup?",
    "Can you check whether my package from the bookstore has been delivered yet?",
    "Okay, what's the difference between the basic and the premium membership?",
    # statements and requests
    "I forgot my password, and now I can't get into my account.",
    "I'd like to move my dentist appointment from Tuesday to Thursday morning.",
    "Please cancel my order for the blue running shoes.",
    "Book me a taxi to the airport for six in the morning.",
    "Actually, I want to upgrade my phone plan to unlimited data.",
    "Find me an Italian restaurant with outdoor seating for Saturday night.",
    "Remind me to water the plants every Sunday at nine.",
    "If it rains tomorrow, move my tennis lesson to the indoor court.",
    "Sorry, I meant the flight to Lisbon on Thursday, not the one on Friday.",
    "My flight from Chicago was delayed by more than three hours.",
    # lists
    "Could you add milk, eggs, and a loaf of bread to my shopping list?",
    "I need a hammer, some nails, two brushes and a can of white paint.",
    "I'd like a large pizza with mushrooms, olives and extra cheese.",
    # dates, e-mail and street addresses (issue 31: more sentence shapes)
    "Can I get an appointment on the fifteenth of March at half past two?",
    "I was born on the fourth of May, nineteen eighty five.",
    "My email address is anna dot lee at example dot com.",
    "Please send the parcel to forty two Maple Street in Springfield.",
    "The delivery should go to apartment five on Park Avenue.",
    # continuations with "and", fillers
    "I need to pay my rent and then send some money to my sister.",
    "We are checking out on Sunday and we would like a late checkout.",
    "So, um, I think I need to reset my router again.",
    "Well, could you tell me how much it costs to ship a box to Canada?",
    # short answers (complete only: too short to cut)
    "Yes, that's right.",
    "No, thank you.",
    # thank-yous and closings
    "Thanks, that is all for today.",
    "Thank you so much for your help with the booking.",
    "No, that's everything, goodbye.",
]
NUMBERS = [  # complete as read out; a midnumber sample cuts between two digits
    "My order number is four seven two nine one.",
    "The code on the back of my card is eight one six.",
    "You can call me back on five five five, two three nine, four four one zero.",
    "My account number is three three eight, one nine zero, two.",
    "The postcode is nine four one zero seven.",
]
HESITATIONS = [
    ("I'd like to book, um", "a table for two."),
    ("My account number is, uh", "four five six."),
    ("Can you tell me, um", "what the weather will be like tomorrow?"),
    ("I was wondering if, uh", "you could move my appointment to Friday."),
    ("What's the best way to, um", "cook salmon in the oven?"),
    ("I need to change the, uh", "delivery address on my last order."),
    ("Could you remind me to, um", "call my mother at six?"),
    ("My flight lands at noon, so", "can you book me a taxi for one o'clock?"),
    ("How long does it take to, um", "boil an egg?"),
    ("I'm looking for a flight to, uh", "Lisbon next Thursday morning."),
    ("Is it going to, um", "rain in Seattle this weekend?"),
    ("Can I pay with, uh", "a gift card?"),
    ("The heating in my flat is broken, so", "I need a plumber today."),
    ("What time does the, uh", "pharmacy on Main Street close?"),
    ("Please send the invoice to, um", "the accounts team."),
    ("I think I left my, uh", "umbrella on the train."),
]
KINDS = ("complete", "midcut", "midnumber", "hesitation")


@dataclass
class Sample:
    id: str
    voice: str
    family: str
    kind: str  # one of KINDS
    text: str  # with " | " where the pause goes
    pause_s: float  # 0 for complete samples
    true_end_ms: float  # where the caller's last word ends
    pause_ms: tuple[float, float] | None  # the pause that is not an end
    note: str
    audio: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class Word:
    text: str  # as whisper wrote it, with its punctuation
    start: int  # samples, in the trimmed speech
    end: int

    @property
    def bare(self) -> str:
        return re.sub(r"[^a-z']", "", self.text.lower().replace("’", "'"))

    @property
    def ends_clause(self) -> bool:
        return bool(re.search(r"[,.;:!?]\W*$", self.text.strip()))


class Speaker:
    """A Renderer, and whisper's word timings of what it renders (cached beside the audio)."""

    def __init__(self, renderer: Renderer) -> None:
        self.renderer = renderer

    def say(self, voice: Voice, text: str) -> np.ndarray:
        return self.renderer.say(voice, text)

    def words(self, voice: Voice, text: str, audio: np.ndarray, offset: int) -> list[Word]:
        path = self.renderer.path(voice, text).with_suffix(".words.json")
        if path.is_file():
            timed = json.loads(path.read_text())
        else:
            segments, _ = whisper().transcribe(audio, language="en", word_timestamps=True, beam_size=5)
            timed = [[w.word, round(w.start, 3), round(w.end, 3)] for s in segments for w in (s.words or [])]
            path.write_text(json.dumps(timed))
        return [Word(t, int(s * RATE) - offset, int(e * RATE) - offset) for t, s, e in timed]


def speech_span(audio: np.ndarray) -> tuple[int, int]:
    """First and one-past-last sample above -40 dB of the 0.5 peak."""
    loud = np.flatnonzero(np.abs(audio) > 0.005)
    return (int(loud[0]), int(loud[-1]) + 1) if len(loud) else (0, 0)


def quietest(audio: np.ndarray, lo: int, hi: int) -> int:
    """The middle of the quietest 20 ms frame (5 ms steps) whose middle lies in [lo, hi]."""
    frame = RATE // 50
    starts = list(range(max(0, lo - frame // 2), max(0, min(hi - frame // 2, len(audio) - frame)) + 1, frame // 4))
    energies = [float(np.mean(audio[s:s + frame] ** 2)) for s in starts]
    return starts[int(np.argmin(energies))] + frame // 2


def level_db(speech: np.ndarray, at: int) -> float:
    """The level of the 20 ms around sample `at`, in dB against the speech's RMS."""
    frame = speech[max(0, at - RATE // 100):at + RATE // 100]
    return round(10 * float(np.log10((np.mean(frame ** 2) + 1e-12) / (np.mean(speech ** 2) + 1e-12))), 1)


def is_function_word(words: list[Word], i: int) -> bool:
    before = words[i - 1].bare if i else ""
    return words[i].bare in FUNCTION_WORDS and before not in NOT_AFTER.get(words[i].bare, set())


def phrase_cuts(words: list[Word], text: str, number: bool = False) -> list[tuple[int, int]]:
    """The words a cut may follow, as (index in `words`, index in the text's words): function words (or, with
    `number`, a digit followed by another) between 25 % and 80 % of the words, not followed by punctuation,
    where whisper heard this word and the next one as written."""
    n = len(words)
    written = [re.sub(r"[^a-z']", "", w.lower().replace("’", "'")) for w in text.split()]
    blocks = difflib.SequenceMatcher(None, [w.bare for w in words], written, autojunk=False).get_matching_blocks()
    heard = {i: b.b + i - b.a for b in blocks for i in range(b.a, b.a + b.size - 1)}  # i and i + 1 as written
    if number:
        return sorted((i, j) for i, j in heard.items() if words[i].bare in DIGITS and words[i + 1].bare in DIGITS
                      and not words[i].ends_clause)
    return sorted((i, j) for i, j in heard.items() if CUT_SPAN[0] <= (i + 1) / n <= CUT_SPAN[1]
                  and not words[i].ends_clause and is_function_word(words, i))


def log_mel(audio: np.ndarray) -> np.ndarray:
    """40 log-mel bands per 10 ms (25 ms windows), mean-normalized: features to align two renderings."""
    win, hop, n_fft = 400, 160, 512
    frames = np.lib.stride_tricks.sliding_window_view(np.pad(audio, (0, win)), win)[::hop] * np.hanning(win)
    power = np.abs(np.fft.rfft(frames, n_fft)) ** 2
    mel = 2595 * np.log10(1 + np.linspace(0, RATE / 2, n_fft // 2 + 1) / 700)
    edges = np.linspace(mel[0], mel[-1], 42)
    bank = np.clip(np.minimum((mel[None] - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None]),
                              (edges[2:, None] - mel[None]) / (edges[2:, None] - edges[1:-1, None])), 0, None)
    feats = np.log(power @ bank.T + 1e-8)
    return feats - feats.mean(axis=0)


def prefix_end(prefix: np.ndarray, whole: np.ndarray) -> int:
    """Where the speech of `prefix` (the same voice saying the first words alone) ends in `whole`: the free end
    of a dynamic time warping of the prefix onto the start of the whole (steps (1,1), (1,2), (2,1))."""
    a, b = log_mel(prefix), log_mel(whole)
    a /= np.linalg.norm(a, axis=1, keepdims=True) + 1e-8
    b /= np.linalg.norm(b, axis=1, keepdims=True) + 1e-8
    cost = 1 - a @ b.T
    n, m = cost.shape
    total = np.full((n, m), np.inf)
    total[0, 0] = cost[0, 0]
    for i in range(1, n):
        best = np.full(m, np.inf)
        best[1:] = total[i - 1, :-1]
        best[2:] = np.minimum(best[2:], total[i - 1, :-2])
        if i >= 2:
            best[1:] = np.minimum(best[1:], total[i - 2, :-1])
        total[i] = cost[i] + best
    steps = n + np.arange(m)
    return int(np.argmin(total[-1] / steps)) * 160 + 200


class SetBuilder:
    def __init__(self, speaker: Speaker, limit: int | None = None) -> None:
        self.speaker = speaker
        self.limit = limit
        self.samples: list[Sample] = []
        self.skipped: list[str] = []
        self._lead = np.zeros(int(LEAD_S * RATE), np.float32)
        self._tail = np.zeros(int(TAIL_S * RATE), np.float32)

    def add(self, voice: str, family: str, kind: str, n: int, text: str, pause_s: float, parts: list[np.ndarray],
            pause_at: int | None, note: str = "") -> None:
        audio = np.concatenate([self._lead, *parts, self._tail])
        end = len(self._lead) + sum(len(p) for p in parts)
        pause = None
        if pause_at is not None:
            start = len(self._lead) + pause_at
            pause = (1000 * start / RATE, 1000 * (start + pause_s * RATE) / RATE)
        noise = np.random.default_rng(len(self.samples)).standard_normal(len(audio)).astype(np.float32) * 3e-4
        self.samples.append(Sample(f"{voice}/{kind}/{n}", voice, family, kind, text, pause_s, 1000 * end / RATE,
                                   pause, note, audio + noise))

    def paused(self, voice: Voice | str, family: str, kind: str, n: int, speech: np.ndarray, cut: int, text: str,
               note: str, pause_s: float) -> None:
        gap = np.zeros(int(pause_s * RATE), np.float32)
        name = voice.name if isinstance(voice, Voice) else voice
        self.add(name, family, kind, n, text, pause_s, [speech[:cut], gap, speech[cut:]], cut, note)

    def voice(self, voice: Voice, v: int) -> None:
        """Every kind of sample in `voice` (the v-th voice: it sets the rotation of pauses and cuts)."""
        family = voice.family + ("-phone" if voice.phone else "")
        for i, text in enumerate([*REQUESTS, *NUMBERS][:self.limit]):
            a, b = speech_span(whole := self.speaker.say(voice, text))
            speech = whole[a:b]
            self.add(voice.name, family, "complete", i, text, 0.0, [speech], None)
            pause_s = PAUSES_S[(i + v) % len(PAUSES_S)]
            number = text in NUMBERS
            words = self.speaker.words(voice, text, whole, a)
            self._cut(voice, family, "midnumber" if number else "midcut", i, text, speech, words, pause_s, number)
        for i, (first, rest) in enumerate(HESITATIONS[:self.limit]):
            one, two = self.speaker.say(voice, first), self.speaker.say(voice, rest)
            one, two = one[slice(*speech_span(one))], two[slice(*speech_span(two))]
            pause_s = PAUSES_S[(i + v + 1) % len(PAUSES_S)]
            gap = np.zeros(int(pause_s * RATE), np.float32)
            self.add(voice.name, family, "hesitation", i, f"{first} | {rest}", pause_s, [one, gap, two], len(one))

    def _cut(self, voice: Voice, family: str, kind: str, i: int, text: str, speech: np.ndarray, words: list[Word],
             pause_s: float, number: bool) -> None:
        refine = int(REFINE_MS * RATE / 1000)
        choices = phrase_cuts(words, text, number)
        for c in range(len(choices)):  # in rotation, the first that makes a clean cut
            k, j = choices[(i + c) % len(choices)]
            said = " ".join(text.split()[:j + 1])
            prefix = self.speaker.say(voice, said)
            end = prefix_end(prefix[slice(*speech_span(prefix))], speech)
            cut = quietest(speech, end - refine, end + refine)
            level, off_ms = level_db(speech, cut), 1000 * (cut - words[k].end) / RATE
            if level <= MAX_CUT_DB and CUT_OFF_WHISPER_MS[0] <= off_ms <= CUT_OFF_WHISPER_MS[1]:
                note = f"after '{words[k].bare}', cut {off_ms:+.0f} ms from whisper's word end, {level:g} dB"
                self.paused(voice, family, kind, i, speech, cut, f"{said} | {' '.join(text.split()[j + 1:])}",
                            note, pause_s)
                return
        self.skipped.append(f"{voice.name}/{kind}/{i}: no clean cut among {len(choices)} in "
                            f"{' '.join(w.text.strip() for w in words)!r}")

    def human(self, name: str, utterances: list[HumanUtterance], v: int) -> None:
        """A recording's sentences, complete, and cut after a function word at whisper's word end."""
        for i, u in enumerate(utterances):
            a, b = speech_span(u.audio)
            speech = u.audio[a:b]
            self.add(f"human-{name}", "human", "complete", i, u.text, 0.0, [speech], None)
            words = [Word(t, s - a, e - a) for t, s, e in u.words]
            cuts = phrase_cuts(words, u.text)
            pause_s = PAUSES_S[(i + v) % len(PAUSES_S)]
            for c in range(len(cuts)):
                k, _ = cuts[(i + c) % len(cuts)]
                cut = quietest(speech, words[k].end - 2 * int(REFINE_MS * RATE / 1000), words[k].end)
                if level_db(speech, cut) <= MAX_CUT_DB:
                    said = " ".join(w.text.strip() for w in words[:k + 1])
                    rest = " ".join(w.text.strip() for w in words[k + 1:])
                    self.paused(f"human-{name}", "human", "midcut", i, speech, cut, f"{said} | {rest}",
                                f"after '{words[k].bare}', at whisper's word end", pause_s)
                    break
            else:
                self.skipped.append(f"human-{name}/midcut/{i}: no clean cut among {len(cuts)}")


def build_set(voices: list[Voice], human: dict[str, list[HumanUtterance]], renderer: Renderer,
              limit: int | None = None) -> tuple[list[Sample], list[str]]:
    builder = SetBuilder(Speaker(renderer), limit)
    for v, voice in enumerate(voices):
        builder.voice(voice, v)
    for v, (name, utterances) in enumerate(sorted(human.items())):
        builder.human(name, utterances[:limit], v)
    return builder.samples, builder.skipped



# The voices of bench/turn_detection.py: the settings are chosen on TUNED's families and reported on
# HELD_OUT's, families the choice never saw (another engine, recorded people, a phone line).
TUNED = ["hibari-heart", "hibari-heart-slow", "hibari-heart-high-fast", "hibari-heart-low",
         "espeak-en-us-160", "espeak-en-gb+m3-140", "espeak-en-gb-scotland+f3-170", "espeak-en-029+f2-145",
         # the same through a phone line: tuned without them, the decision cut off 6-15 % of the held-out
         # families' turns on the phone at 0.6 s pauses (0-2 % off it)
         "hibari-heart-phone", "hibari-heart-slow-phone", "hibari-heart-high-fast-phone", "hibari-heart-low-phone",
         "espeak-en-us-160-phone", "espeak-en-gb+m3-140-phone", "espeak-en-gb-scotland+f3-170-phone",
         "espeak-en-029+f2-145-phone"]
# four voices a family (a phone line is a family of its own), so that each has 150 complete and 150
# cut turns or more (issue 31, item 3)
HELD_OUT = ["flite-kal", "flite-awb", "flite-slt", "flite-rms",
            "flite-kal-phone", "flite-awb-phone", "flite-slt-phone", "flite-rms-phone",
            "piper-joe", "piper-joe-slow", "piper-joe-fast", "piper-joe-low",
            "piper-joe-phone", "piper-joe-slow-phone", "piper-joe-fast-phone", "piper-joe-low-phone"]
HUMAN_MIN_S = 0.8  # the recordings' sentences this long or longer (and up to 8 s)


def pick_voices(found: dict[str, list[Voice]], names: list[str]) -> list[Voice]:
    """The named voices among those found (a name ending in -phone: that voice on a phone line)."""
    by_name = {v.name: v for voices in found.values() for v in voices}
    picked = []
    for name in names:
        base = name.removesuffix("-phone")
        if base in by_name:
            picked.append(on_phone(by_name[base]) if name.endswith("-phone") else by_name[base])
    return picked
