"""Four realistic tools a restaurant-and-shop phone line would declare, and requests to them.

Shared by bench/tool_decoding.py (the speed of writing a call) and the tool-call tests. Each request
carries the call a careful human operator would make (tool and exact arguments), or None where no
declared tool can help.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "book_table",
     "description": "Book a table at the restaurant.",
     "parameters": {"type": "object", "properties": {
         "party_size": {"type": "integer", "description": "how many people"},
         "time": {"type": "string", "description": "24-hour time, HH:MM"},
         "day": {"type": "string", "description": "today, tomorrow, or a weekday"}},
         "required": ["party_size", "time", "day"]}},
    {"type": "function", "name": "order_status",
     "description": "Look up where an order is, by its order number.",
     "parameters": {"type": "object", "properties": {
         "order_number": {"type": "string", "description": "the digits of the order number"}},
         "required": ["order_number"]}},
    {"type": "function", "name": "opening_hours",
     "description": "The opening hours of one of our stores (the pharmacy, the bakery, the main store) on a day.",
     "parameters": {"type": "object", "properties": {
         "store": {"type": "string", "enum": ["pharmacy", "bakery", "main store"]},
         "day": {"type": "string", "description": "a weekday, today or tomorrow"}},
         "required": ["store", "day"]}},
    {"type": "function", "name": "cancel_appointment",
     "description": "Cancel the caller's appointment on a date.",
     "parameters": {"type": "object", "properties": {
         "date": {"type": "string", "description": "the date as the caller said it, e.g. March 3"}},
         "required": ["date"]}},
]

SYSTEM = ("You are a friendly voice assistant on a phone call for a restaurant and its shops. Your replies "
          "are spoken aloud: one or two short sentences. Use a tool when the caller asks for something a "
          "tool can check or do. Never state opening hours, bookings, order details, weather or anything "
          "else you did not get from a tool; if no tool can check it, say you cannot check that here.")

Call = tuple[str, dict[str, Any]]
# (request, expected call: (name, arguments) or None)
REQUESTS: list[tuple[str, Call | None]] = [
    ("Can you book a table for two at seven tonight?", ("book_table",
        {"party_size": 2, "time": "19:00", "day": "today"})),
    ("I need a table for four tomorrow at eight thirty.", ("book_table",
        {"party_size": 4, "time": "20:30", "day": "tomorrow"})),
    ("Where is my order 4 5 1 2?", ("order_status", {"order_number": "4512"})),
    ("Can you check on order number 88031 for me?", ("order_status", {"order_number": "88031"})),
    ("What time does the pharmacy close on Sunday?", ("opening_hours", {"store": "pharmacy", "day": "Sunday"})),
    ("Is the bakery open tomorrow?", ("opening_hours", {"store": "bakery", "day": "tomorrow"})),
    ("Please cancel my appointment on March third.", ("cancel_appointment", {"date": "March 3"})),
    ("I can't make it on the fifth of June, cancel that appointment please.", ("cancel_appointment",
        {"date": "June 5"})),
    ("Book us a table for six on Friday at one in the afternoon.", ("book_table",
        {"party_size": 6, "time": "13:00", "day": "Friday"})),
    ("Has order 30217 shipped yet?", ("order_status", {"order_number": "30217"})),
    ("When does the main store open on Saturday?", ("opening_hours", {"store": "main store", "day": "Saturday"})),
    ("Cancel my appointment for April twelfth.", ("cancel_appointment", {"date": "April 12"})),
]


# ------------------------------------------------------------------------------ the labelled spoken set
# bench/tool_calls.py: the same four tools, with the schemas a careful tool author writes for a voice agent
# (days and months as enums, a date as month and day, digits and times held to a pattern): whatever the caller's words,
# the arguments have one right spelling. "tune" requests are the ones prompts and schemas were adjusted on;
# "held" ones were written at the same time and only run for the report.
DAYS = ["today", "tomorrow", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
SPOKEN_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "book_table",
     "description": "Book a table at the restaurant.",
     "parameters": {"type": "object", "properties": {
         "party_size": {"type": "integer", "description": "how many people"},
         "day": {"type": "string", "enum": DAYS},
         "time": {"type": "string", "description": "24-hour time, HH:MM (seven in the evening is 19:00)",
                  "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"}},
         "required": ["party_size", "day", "time"]}},
    {"type": "function", "name": "order_status",
     "description": "Look up where an order is, by its order number.",
     "parameters": {"type": "object", "properties": {
         "order_number": {"type": "string", "description": "the order number's digits, without spaces",
                          "pattern": "^[0-9]+$"}},
         "required": ["order_number"]}},
    {"type": "function", "name": "opening_hours",
     "description": "The opening hours of one of our stores (the pharmacy, the bakery, the main store) on a day.",
     "parameters": {"type": "object", "properties": {
         "store": {"type": "string", "enum": ["pharmacy", "bakery", "main store"]},
         "day": {"type": "string", "enum": DAYS}},
         "required": ["store", "day"]}},
    {"type": "function", "name": "cancel_appointment",
     "description": "Cancel the caller's appointment on a date.",
     "parameters": {"type": "object", "properties": {
         "month": {"type": "string", "enum": MONTHS},
         "day": {"type": "integer", "description": "the day of the month"}},
         "required": ["month", "day"]}},
]


@dataclass(frozen=True)
class Spoken:
    text: str
    call: Call | None  # the call a careful operator makes, or None
    split: str  # tune | held
    kind: str = "tool"  # tool | uncheckable (no declared tool can check or do it) | chat (needs no tool)


def _book(n: int, day: str, time: str) -> Call:
    return ("book_table", {"party_size": n, "day": day, "time": time})


def _order(number: str) -> Call:
    return ("order_status", {"order_number": number})


def _hours(store: str, day: str) -> Call:
    return ("opening_hours", {"store": store, "day": day})


def _cancel(month: str, day: int) -> Call:
    return ("cancel_appointment", {"month": month, "day": day})


_TUNE_TOOL = [
    ("Can you book a table for two at seven tonight?", _book(2, "today", "19:00")),
    ("I need a table for four tomorrow at eight thirty in the evening.", _book(4, "tomorrow", "20:30")),
    ("Book us a table for six on Friday at one in the afternoon.", _book(6, "Friday", "13:00")),
    ("Could I get a table for three this evening at six?", _book(3, "today", "18:00")),
    ("Reserve a table for five people on Saturday at seven thirty in the evening.", _book(5, "Saturday", "19:30")),
    ("We would like to come in on Sunday at noon, a table for eight please.", _book(8, "Sunday", "12:00")),
    ("Where is my order 4 5 1 2?", _order("4512")),
    ("Can you check on order number 8 8 0 3 1 for me?", _order("88031")),
    ("Has order 3 0 2 1 7 shipped yet?", _order("30217")),
    ("I want to know the status of order 6 6 0 9.", _order("6609")),
    ("My order number is 7 2 4 1 5, when will it arrive?", _order("72415")),
    ("Could you track order 1 9 3 8 for me please?", _order("1938")),
    ("What time does the pharmacy close on Sunday?", _hours("pharmacy", "Sunday")),
    ("Is the bakery open tomorrow?", _hours("bakery", "tomorrow")),
    ("When does the main store open on Saturday?", _hours("main store", "Saturday")),
    ("Is the pharmacy open today?", _hours("pharmacy", "today")),
    ("What are the bakery's hours on Monday?", _hours("bakery", "Monday")),
    ("How late is the main store open on Thursday?", _hours("main store", "Thursday")),
    ("Please cancel my appointment on March third.", _cancel("March", 3)),
    ("I can't make it on the fifth of June, cancel that appointment please.", _cancel("June", 5)),
    ("Cancel my appointment for April twelfth.", _cancel("April", 12)),
    ("I need to cancel my appointment on the twentieth of May.", _cancel("May", 20)),
    ("Please call off my appointment on October first.", _cancel("October", 1)),
    ("Can you cancel the appointment I have on January fifteenth?", _cancel("January", 15)),
]
_HELD_TOOL = [
    ("A table for two tomorrow at nine in the evening, please.", _book(2, "tomorrow", "21:00")),
    ("Can I book for seven people on Wednesday at six thirty PM?", _book(7, "Wednesday", "18:30")),
    ("I'd like to reserve a table for one today at twelve thirty.", _book(1, "today", "12:30")),
    ("Please book a table for four on Tuesday at eight in the evening.", _book(4, "Tuesday", "20:00")),
    ("Could you put us down for a table of ten on Saturday at seven PM?", _book(10, "Saturday", "19:00")),
    ("Table for three on Thursday at one fifteen in the afternoon, please.", _book(3, "Thursday", "13:15")),
    ("What's happening with order 5 5 2 0?", _order("5520")),
    ("Can you tell me where order 4 1 7 7 3 is?", _order("41773")),
    ("I ordered something last week, the number is 2 0 8 6. Where is it?", _order("2086")),
    ("Check the status of my order, number 9 3 1 4 please.", _order("9314")),
    ("Has my order 6 1 2 2 8 been delivered?", _order("61228")),
    ("Is order 3 8 0 5 on its way?", _order("3805")),
    ("Until when is the bakery open today?", _hours("bakery", "today")),
    ("Is the pharmacy open on Wednesday?", _hours("pharmacy", "Wednesday")),
    ("What time does the main store open tomorrow?", _hours("main store", "tomorrow")),
    ("When does the bakery open on Sunday morning?", _hours("bakery", "Sunday")),
    ("Can you tell me the main store's hours for Friday?", _hours("main store", "Friday")),
    ("Is the pharmacy still open on Tuesday evening?", _hours("pharmacy", "Tuesday")),
    ("I have to cancel my appointment on September ninth.", _cancel("September", 9)),
    ("Cancel the appointment on February twenty second, please.", _cancel("February", 22)),
    ("Please cancel my appointment for the eleventh of August.", _cancel("August", 11)),
    ("I won't be able to come on July fourth, please cancel my appointment.", _cancel("July", 4)),
    ("Can you cancel my November thirtieth appointment?", _cancel("November", 30)),
    ("Drop my appointment on December eighth, please.", _cancel("December", 8)),
]
_TUNE_NONE = [
    ("Is it going to rain tomorrow morning?", "uncheckable"),
    ("Do you have parking spaces near the restaurant?", "uncheckable"),
    ("How much does the chicken curry cost?", "uncheckable"),
    ("Can you deliver a pizza to my house?", "uncheckable"),
    ("What's the balance on my account?", "uncheckable"),
    ("Is the doctor in today?", "uncheckable"),
    ("What is the capital of France?", "chat"),
    ("Thank you, that's very helpful.", "chat"),
    ("How many days are there in a week?", "chat"),
    ("Can you tell me a short joke?", "chat"),
    ("Hello, who am I speaking with?", "chat"),
    ("How do you spell restaurant?", "chat"),
]
_HELD_NONE = [
    ("What's the weather like this weekend?", "uncheckable"),
    ("Do you have gluten free bread at the bakery?", "uncheckable"),
    ("Can you move my appointment to next week?", "uncheckable"),
    ("How much is a taxi from the station?", "uncheckable"),
    ("Is the flu vaccine in stock at the pharmacy?", "uncheckable"),
    ("What's the wifi password at the restaurant?", "uncheckable"),
    ("What's two plus two?", "chat"),
    ("Good morning, how are you today?", "chat"),
    ("What is the largest planet in our solar system?", "chat"),
    ("Could you speak a little slower please?", "chat"),
    ("What does RSVP mean?", "chat"),
    ("Thanks, goodbye.", "chat"),
]
SPOKEN: list[Spoken] = (
    [Spoken(t, c, "tune") for t, c in _TUNE_TOOL] + [Spoken(t, None, "tune", k) for t, k in _TUNE_NONE]
    + [Spoken(t, c, "held") for t, c in _HELD_TOOL] + [Spoken(t, None, "held", k) for t, k in _HELD_NONE])
