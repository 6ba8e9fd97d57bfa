"""Four realistic tools a restaurant-and-shop phone line would declare, and requests to them.

Shared by bench/tool_decoding.py (the speed of writing a call) and the tool-call tests. Each request
carries the call a careful human operator would make (tool and exact arguments), or None where no
declared tool can help.
"""

from __future__ import annotations

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
