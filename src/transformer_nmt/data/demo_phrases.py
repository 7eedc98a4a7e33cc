"""Noun phrases of the demo corpus (data/demo.py): a quantity, maybe an adjective and a
noun, with German plurals, adjective endings by case and, for "one", by gender.

Quantities never end in 01 other than 1 itself, because German there wavers between
"hunderteins Äpfel" and "hundertundein Apfel".
"""

from __future__ import annotations

import random
from typing import NamedTuple

from transformer_nmt.data.demo_numbers import MAX_NUMBER, number_to_english, number_to_german


class Noun(NamedTuple):
  en_sg: str
  en_pl: str
  de_sg: str
  de_pl: str
  gender: str  # "m", "f" or "n"


class Adjective(NamedTuple):
  en: str
  de: str  # uninflected stem; endings are added by case


NOUNS = (
  Noun("apple", "apples", "Apfel", "Äpfel", "m"),
  Noun("house", "houses", "Haus", "Häuser", "n"),
  Noun("cat", "cats", "Katze", "Katzen", "f"),
  Noun("dog", "dogs", "Hund", "Hunde", "m"),
  Noun("book", "books", "Buch", "Bücher", "n"),
  Noun("table", "tables", "Tisch", "Tische", "m"),
  Noun("chair", "chairs", "Stuhl", "Stühle", "m"),
  Noun("flower", "flowers", "Blume", "Blumen", "f"),
  Noun("bird", "birds", "Vogel", "Vögel", "m"),
  Noun("tree", "trees", "Baum", "Bäume", "m"),
  Noun("car", "cars", "Auto", "Autos", "n"),
  Noun("bottle", "bottles", "Flasche", "Flaschen", "f"),
  Noun("ball", "balls", "Ball", "Bälle", "m"),
  Noun("horse", "horses", "Pferd", "Pferde", "n"),
  Noun("cup", "cups", "Tasse", "Tassen", "f"),
  Noun("shoe", "shoes", "Schuh", "Schuhe", "m"),
  Noun("key", "keys", "Schlüssel", "Schlüssel", "m"),
  Noun("window", "windows", "Fenster", "Fenster", "n"),
  Noun("lamp", "lamps", "Lampe", "Lampen", "f"),
  Noun("egg", "eggs", "Ei", "Eier", "n"),
  Noun("boat", "boats", "Boot", "Boote", "n"),
  Noun("stone", "stones", "Stein", "Steine", "m"),
  Noun("door", "doors", "Tür", "Türen", "f"),
  Noun("clock", "clocks", "Uhr", "Uhren", "f"),
)
# Stems chosen so that every ending attaches without spelling changes
# (no "teuer" -> "teure", "dunkel" -> "dunkle").
ADJECTIVES = (
  Adjective("red", "rot"), Adjective("small", "klein"),
  Adjective("big", "groß"), Adjective("old", "alt"),
  Adjective("new", "neu"), Adjective("green", "grün"),
  Adjective("blue", "blau"), Adjective("beautiful", "schön"),
  Adjective("heavy", "schwer"), Adjective("white", "weiß"),
  Adjective("black", "schwarz"), Adjective("yellow", "gelb"),
)
_ADJECTIVE_PROBABILITY = 0.7
# Indefinite article and adjective ending after it, by (case, gender).
_ONE_FORMS = {
  ("acc", "m"): ("einen", "en"), ("acc", "f"): ("eine", "e"),
  ("acc", "n"): ("ein", "es"), ("dat", "m"): ("einem", "en"),
  ("dat", "f"): ("einer", "en"), ("dat", "n"): ("einem", "en"),
}
# Strong plural adjective endings (no article before the number).
_PLURAL_ENDINGS = {"acc": "e", "dat": "en"}


def quantity_allowed(q: int) -> bool:
  # 101, 201, ... would need "hundertundein Apfel"-style agreement.
  return q == 1 or (2 <= q <= MAX_NUMBER and q % 100 != 1)


def sample_quantity(rng: random.Random) -> int:
  # Mostly short numbers keep sentences short; long ones are also covered
  # by the standalone-number template.
  while True:
    r = rng.random()
    if r < 0.1:
      return 1
    if r < 0.55:
      q = rng.randint(2, 99)
    elif r < 0.8:
      q = rng.randint(100, 999)
    else:
      q = rng.randint(1000, MAX_NUMBER)
    if quantity_allowed(q):
      return q


def noun_phrase(q: int, adj: Adjective | None, noun: Noun,
        case: str) -> tuple[str, str]:
  """English and German noun phrase, German in ``case`` ("acc"/"dat")."""
  en_noun = noun.en_sg if q == 1 else noun.en_pl
  en_adj = f"{adj.en} " if adj else ""
  en = f"{number_to_english(q)} {en_adj}{en_noun}"
  if q == 1:
    article, ending = _ONE_FORMS[(case, noun.gender)]
    de_adj = f"{adj.de}{ending} " if adj else ""
    return en, f"{article} {de_adj}{noun.de_sg}"
  de_noun = noun.de_pl
  if case == "dat" and not de_noun.endswith(("n", "s")):
    de_noun += "n"  # dative plural: "Äpfeln", "Häusern"; not "Autos"
  de_adj = f"{adj.de}{_PLURAL_ENDINGS[case]} " if adj else ""
  return en, f"{number_to_german(q)} {de_adj}{de_noun}"


def sample_adjective(rng: random.Random) -> Adjective | None:
  return rng.choice(ADJECTIVES) if rng.random() < _ADJECTIVE_PROBABILITY \
    else None


def sample_noun_phrase(rng: random.Random, case: str) -> tuple[str, str]:
  q = sample_quantity(rng)
  adj = sample_adjective(rng)
  return noun_phrase(q, adj, rng.choice(NOUNS), case)
