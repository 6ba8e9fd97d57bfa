"""Calls for bench/recall.py: what a caller tells the agent and later asks back.

A repeat-back is one turn: the caller gives a number, a name or a spelled code and asks to hear it
back. A five-turn call gives it in turn 1, talks about other things in turns 2 to 4 (some of them
with other numbers in them, to confuse) and asks for it in turn 5. Each item is written as speech
recognition writes it (digits apart, run together, or as words; letters apart).

"tune" items are the ones prompts were compared on; "held" ones were written beside them and are only
run for the report.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    kind: str  # number | name | code
    value: str  # what must be said back: digits and letters (any spacing), or a name
    given: str  # the caller's words that give it (turn 1 of a call, or with the question in a repeat-back)


TUNE_ITEMS = [
    Item("number", "4521", "My order number is 4 5 2 1."),
    Item("name", "Priya", "Hi, my name is Priya."),
    Item("code", "AB42", "The booking code is A B 4 2."),
    Item("number", "90317", "My ticket number is 90317."),
]
HELD_ITEMS = [
    Item("number", "7309", "My account number is 7 3 0 9."),
    Item("number", "66120", "The reference is six six one two zero."),
    Item("number", "5550198", "My phone number is 5 5 5 0 1 9 8."),
    Item("number", "31884", "My claim number is 31884."),
    Item("number", "2046", "The parcel number is 2 0 4 6."),
    Item("number", "81", "I'm in room 81."),
    Item("name", "Tomasz", "This is Tomasz calling."),
    Item("name", "Okonkwo", "My last name is Okonkwo."),
    Item("name", "Maple", "I live on Maple Street."),
    Item("name", "Ingrid", "My daughter's name is Ingrid."),
    Item("code", "QX7", "The promo code is Q X 7."),
    Item("code", "K9L2", "My postcode starts K 9 L 2."),
    Item("code", "ZR55", "The confirmation code is Z R 5 5."),
    Item("code", "B12C", "The seat is B 1 2 C."),
    Item("number", "4400", "The invoice number is 4 4 0 0."),
    Item("name", "Delgado", "I'm calling for Mr. Delgado."),
    Item("code", "TW3", "The flight gate is T W 3."),
    Item("number", "19", "My locker is number 19."),
    Item("name", "Siobhan", "My colleague is called Siobhan."),
    Item("number", "700231", "The order is 7 0 0 2 3 1."),
]

REPEAT_ASK = {"number": "Can you repeat it back to me?", "name": "Can you say it back to me?",
              "code": "Can you read it back to me?"}
RECALL_ASK = {"number": "Before I go, what was the number I gave you at the start?",
              "name": "By the way, what was the name I told you at the start?",
              "code": "And what was the code I gave you earlier?"}

# turns 2 to 4 of a call: other requests, some with other numbers in them
MIDDLE = [
    ("How many days are there in a week?", "What is the capital of Italy?", "Thanks, that's helpful."),
    ("What's a good way to stay warm in winter?", "What is twelve plus nine?", "Okay, great."),
    ("Tell me a fun fact about octopuses.", "I was born in 1987, how old is that?", "Interesting."),
    ("What is the largest ocean?", "My train leaves at 6 15.", "Alright, thanks."),
    ("Can you recommend a good book?", "What do bees make?", "Nice, thank you."),
]
