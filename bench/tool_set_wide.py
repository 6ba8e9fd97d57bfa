"""A wider labelled spoken set for bench/tool_calls.py (`--requests wide`, issue 34): six tools (the four
of bench/tool_set.py's SPOKEN_TOOLS, a weather forecast and a booking looked up by name and a spelled
code), 60 requests to one tool, 6 that need two calls, and 30 that need none: 16 that no declared tool
covers (half of them ones a tool almost covers: a booking changed, the weather last week, an order
cancelled, a store that is not ours) and 14 small talk. Each tool request carries the calls a careful
operator would make, with the one right spelling of each argument.

Split in halves written at the same time: "tune" (what prompts, schemas and thresholds may be adjusted
on) and "held" (only run for the report). Voices: report on bench/turn_set.py's HELD_OUT families.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.tool_set import DAYS, SPOKEN_TOOLS, Call, _book, _cancel, _hours, _order

WIDE_TOOLS: list[dict[str, Any]] = [
    *SPOKEN_TOOLS,
    {"type": "function", "name": "get_weather",
     "description": "The weather forecast for a city, today, tomorrow or a day of this week.",
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string", "description": "the city's name"},
         "day": {"type": "string", "enum": DAYS}},
         "required": ["city", "day"]},
     "read_only": True},
    {"type": "function", "name": "find_booking",
     "description": "Look up a table booking by the caller's last name and its six-character confirmation code.",
     "parameters": {"type": "object", "properties": {
         "last_name": {"type": "string", "description": "the caller's last name, capitalized (Nguyen)"},
         "code": {"type": "string", "description": "the confirmation code's letters and digits, upper case, "
                                                   "without spaces", "pattern": "^[A-Z0-9]{6}$"}},
         "required": ["last_name", "code"]},
     "read_only": True},
]


@dataclass(frozen=True)
class Request:
    text: str
    calls: tuple[Call, ...]  # the calls a careful operator makes (none: no tool can or need serve it)
    split: str  # tune | held
    kind: str = "tool"  # tool | uncheckable (no declared tool covers it) | chat (needs no tool)


def _weather(city: str, day: str) -> Call:
    return ("get_weather", {"city": city, "day": day})


def _booking(name: str, code: str) -> Call:
    return ("find_booking", {"last_name": name, "code": code})


_TUNE: list[tuple[str, tuple[Call, ...]]] = [
    ("Could you book a table for two on Monday at a quarter past seven in the evening?",
     (_book(2, "Monday", "19:15"),)),
    ("A table for eleven people this Friday at eight in the evening, please.", (_book(11, "Friday", "20:00"),)),
    ("I'd like a table for four tomorrow at half past twelve, for lunch.", (_book(4, "tomorrow", "12:30"),)),
    ("Please reserve a table for nine people on Sunday at six in the evening.", (_book(9, "Sunday", "18:00"),)),
    ("Can we get a table for two today at seven forty five PM?", (_book(2, "today", "19:45"),)),
    ("What's the status of order 7 7 0 1?", (_order("7701"),)),
    ("Order number 4 0 9 3 8, is it out for delivery?", (_order("40938"),)),
    ("Can you see where my order 1 2 6 0 is?", (_order("1260"),)),
    ("I'm calling about order 8 5 5 1 9, has it shipped?", (_order("85519"),)),
    ("Track order number 3 0 0 4, please.", (_order("3004"),)),
    ("When does the pharmacy open on Monday?", (_hours("pharmacy", "Monday"),)),
    ("Is the main store open today?", (_hours("main store", "today"),)),
    ("What time does the bakery close on Friday?", (_hours("bakery", "Friday"),)),
    ("Will the pharmacy be open tomorrow?", (_hours("pharmacy", "tomorrow"),)),
    ("What are the main store's opening hours on Sunday?", (_hours("main store", "Sunday"),)),
    ("Please cancel my appointment on the second of March.", (_cancel("March", 2),)),
    ("I need to cancel the appointment on June twenty first.", (_cancel("June", 21),)),
    ("Cancel my appointment for October thirteenth, please.", (_cancel("October", 13),)),
    ("I can't come on the seventeenth of April, please cancel my appointment that day.", (_cancel("April", 17),)),
    ("Can you cancel my appointment on January thirty first?", (_cancel("January", 31),)),
    ("What's the weather in Paris tomorrow?", (_weather("Paris", "tomorrow"),)),
    ("Will it rain in London on Saturday?", (_weather("London", "Saturday"),)),
    ("How cold will it be in Chicago today?", (_weather("Chicago", "today"),)),
    ("What's the forecast for Madrid on Friday?", (_weather("Madrid", "Friday"),)),
    ("Is it going to be sunny in Tokyo tomorrow?", (_weather("Tokyo", "tomorrow"),)),
    ("Can you find my booking? The name is Smith and the code is K 4 7 B 2 Q.", (_booking("Smith", "K47B2Q"),)),
    ("I'm looking for my reservation under Garcia, confirmation code 9 X 3 L M 1.", (_booking("Garcia", "9X3LM1"),)),
    ("Check my booking please, last name Nguyen, N G U Y E N, code A A 5 2 7 T.", (_booking("Nguyen", "AA527T"),)),
    ("My booking code is R 2 D 4 Z 8 and my name is Patel.", (_booking("Patel", "R2D4Z8"),)),
    ("Is there a booking for Johnson, code 3 M 9 P 0 K?", (_booking("Johnson", "3M9P0K"),)),
    ("Is the bakery open on Saturday? And book me a table for two that day at noon.",
     (_hours("bakery", "Saturday"), _book(2, "Saturday", "12:00"))),
    ("Where is order 5 0 3 7, and what's the weather in Paris today?", (_order("5037"), _weather("Paris", "today"))),
    ("Please cancel my appointment on March ninth and tell me when the pharmacy opens tomorrow.",
     (_cancel("March", 9), _hours("pharmacy", "tomorrow"))),
]
_HELD: list[tuple[str, tuple[Call, ...]]] = [
    ("Book a table for three on Wednesday at a quarter to nine in the evening.", (_book(3, "Wednesday", "20:45"),)),
    ("We're a group of twelve, could you book us a table on Saturday at one PM?", (_book(12, "Saturday", "13:00"),)),
    ("Table for one tomorrow at eleven thirty in the morning, please.", (_book(1, "tomorrow", "11:30"),)),
    ("I want to book for six people on Thursday at eight fifteen PM.", (_book(6, "Thursday", "20:15"),)),
    ("Could you book two seats for today at ten past six in the evening?", (_book(2, "today", "18:10"),)),
    ("Where's order 6 2 7 1?", (_order("6271"),)),
    ("Has order 9 0 4 4 2 left the warehouse?", (_order("90442"),)),
    ("My order is number 5 1 8 0, can you check it?", (_order("5180"),)),
    ("Could you look up order 2 7 3 3 6 for me?", (_order("27336"),)),
    ("I'd like an update on order 4 4 0 8.", (_order("4408"),)),
    ("How early does the bakery open on Saturday?", (_hours("bakery", "Saturday"),)),
    ("Is the pharmacy open this Thursday?", (_hours("pharmacy", "Thursday"),)),
    ("Until what time is the main store open on Wednesday?", (_hours("main store", "Wednesday"),)),
    ("Is the bakery open tomorrow morning?", (_hours("bakery", "tomorrow"),)),
    ("What are the pharmacy's hours today?", (_hours("pharmacy", "today"),)),
    ("I'd like to cancel my appointment on May sixth.", (_cancel("May", 6),)),
    ("Please cancel the appointment I have on the twenty fifth of November.", (_cancel("November", 25),)),
    ("Cancel my August second appointment.", (_cancel("August", 2),)),
    ("I won't make it on September nineteenth, cancel my appointment please.", (_cancel("September", 19),)),
    ("Can you call off my appointment for December twelfth?", (_cancel("December", 12),)),
    ("What will the weather be like in Boston on Monday?", (_weather("Boston", "Monday"),)),
    ("Do I need an umbrella in Seattle today?", (_weather("Seattle", "today"),)),
    ("How warm will it be in Berlin on Sunday?", (_weather("Berlin", "Sunday"),)),
    ("Will it snow in Denver tomorrow?", (_weather("Denver", "tomorrow"),)),
    ("What's the forecast for Dublin this Wednesday?", (_weather("Dublin", "Wednesday"),)),
    ("Look up my reservation, the name is Brown, code T 6 1 V 9 J.", (_booking("Brown", "T61V9J"),)),
    ("I have a booking under Kowalski, K O W A L S K I, code 5 5 B 8 E 2.", (_booking("Kowalski", "55B8E2"),)),
    ("Can you check the booking for Lee, confirmation Q 7 7 H 3 N?", (_booking("Lee", "Q77H3N"),)),
    ("My name is Okafor and my booking code is 2 Z 6 F 4 W.", (_booking("Okafor", "2Z6F4W"),)),
    ("Please find the reservation for Martin with code P 9 K 1 1 S.", (_booking("Martin", "P9K11S"),)),
    ("Check order 8 1 2 6 and order 4 4 9 0 for me.", (_order("8126"), _order("4490"))),
    ("What's the weather in London tomorrow, and is the main store open tomorrow?",
     (_weather("London", "tomorrow"), _hours("main store", "tomorrow"))),
    ("Book a table for four on Friday at seven PM, and cancel my appointment on February fourteenth.",
     (_book(4, "Friday", "19:00"), _cancel("February", 14))),
]
_TUNE_NONE = [
    ("Can you change my booking to eight o'clock?", "uncheckable"),  # almost: bookings are made or looked up
    ("What was the weather in Paris last Tuesday?", "uncheckable"),  # almost: forecasts, not the past
    ("Can you cancel my order 4 5 1 2?", "uncheckable"),  # almost: orders are looked up, appointments cancelled
    ("When does the post office open tomorrow?", "uncheckable"),  # almost: only our three stores
    ("How much is a table for two?", "uncheckable"),
    ("Do you have a vegan menu?", "uncheckable"),
    ("Can you send me the receipt for my last order?", "uncheckable"),
    ("Is the pharmacy selling face masks?", "uncheckable"),
    ("Hi there, can you hear me?", "chat"),
    ("What's the capital of Italy?", "chat"),
    ("How many minutes are in an hour?", "chat"),
    ("Thanks a lot, have a nice day.", "chat"),
    ("Can you repeat that please?", "chat"),
    ("What's ten times three?", "chat"),
    ("Are you a real person?", "chat"),
]
_HELD_NONE = [
    ("Can you move my table to Saturday?", "uncheckable"),  # almost
    ("What will the weather be in Paris next month?", "uncheckable"),  # almost: this week only
    ("Can you refund order 3 3 1 0?", "uncheckable"),  # almost
    ("What time does the library close today?", "uncheckable"),  # almost
    ("Who was my waiter last night?", "uncheckable"),
    ("Do you have a table by the window?", "uncheckable"),
    ("How long is the wait for a table right now?", "uncheckable"),
    ("Can I pay with a gift card at the bakery?", "uncheckable"),
    ("Hello, is this the restaurant?", "chat"),
    ("What's the opposite of hot?", "chat"),
    ("How many legs does a spider have?", "chat"),
    ("Okay, thank you so much.", "chat"),
    ("Sorry, I didn't catch that.", "chat"),
    ("What is twelve divided by four?", "chat"),
    ("Who wrote Romeo and Juliet?", "chat"),
]
WIDE: list[Request] = (
    [Request(t, c, "tune") for t, c in _TUNE] + [Request(t, (), "tune", k) for t, k in _TUNE_NONE]
    + [Request(t, c, "held") for t, c in _HELD] + [Request(t, (), "held", k) for t, k in _HELD_NONE])
