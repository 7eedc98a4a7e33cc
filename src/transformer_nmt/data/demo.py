"""Self-made English->German corpus of numbers, dates and quantities.

The project needs a default translation task that works offline, carries no
third-party text and is small enough to train on a laptop CPU in minutes, yet
is not solvable by copying the source. Every sentence here is built from the
templates and word lists in this module:

* cardinals 0..9999 ("three hundred twenty-four" ->
  "dreihundertvierundzwanzig")
  need units-before-tens reordering and compounding into a single word;
* dates ("on the third of March" / "on March 3" -> "am dritten März") need
  ordinals with the dative "-en" ending and only use days valid for the month;
* quantities ("twenty-four red apples" -> "vierundzwanzig rote Äpfel") need
  German plurals, adjective endings by case and, for "one", by gender;
* the sentence frames add verb-second inversion, the perfect-tense bracket
  ("Wir haben ... gekauft.") and separable verbs ("Er kam mit ... an.").

Each English sentence has exactly one German translation, so a small model can
reach a near-perfect BLEU score on held-out pairs.

Conventions: English numbers use no "and" and hyphenate 21..99; German uses
"einhundert" / "eintausend" and "einhunderteins" for 101. Noun phrases never
use quantities ending in 01 other than 1 itself, because German there wavers
between "hunderteins Äpfel" and "hundertundein Apfel". Years in dates are
written as digits.
"""

from __future__ import annotations

import os
import pathlib
import random
from functools import lru_cache
from typing import Callable, NamedTuple

from transformer_nmt.files import atomic_output

MAX_NUMBER = 9999

_EN_ONES = (
  "zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
  "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen",
  "sixteen", "seventeen", "eighteen", "nineteen",
)
_EN_TENS = (
  "", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy",
  "eighty", "ninety",
)
_DE_ONES = (
  "null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht",
  "neun", "zehn", "elf", "zwölf", "dreizehn", "vierzehn", "fünfzehn",
  "sechzehn", "siebzehn", "achtzehn", "neunzehn",
)
_DE_TENS = (
  "", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig",
  "achtzig", "neunzig",
)
_EN_IRREGULAR_ORDINALS = {
  1: "first", 2: "second", 3: "third", 5: "fifth", 8: "eighth",
  9: "ninth", 12: "twelfth",
}
# German ordinal stems that are not simply the cardinal ("acht" + "ten" would
# double the t).
_DE_IRREGULAR_ORDINAL_STEMS = {1: "ers", 3: "drit", 7: "sieb", 8: "ach"}

_MONTHS = (
  ("January", "Januar", 31), ("February", "Februar", 29),
  ("March", "März", 31), ("April", "April", 30), ("May", "Mai", 31),
  ("June", "Juni", 30), ("July", "Juli", 31), ("August", "August", 31),
  ("September", "September", 30), ("October", "Oktober", 31),
  ("November", "November", 30), ("December", "Dezember", 31),
)
_YEARS = range(1900, 2100)
_YEAR_PROBABILITY = 0.3


class _Noun(NamedTuple):
  en_sg: str
  en_pl: str
  de_sg: str
  de_pl: str
  gender: str  # "m", "f" or "n"


class _Adjective(NamedTuple):
  en: str
  de: str  # uninflected stem; endings are added by case


class _Subject(NamedTuple):
  en: str
  de: str
  person: str  # "1sg", "3sg" or "pl"


class _Verb(NamedTuple):
  en_base: str
  en_3sg: str
  en_past: str
  en_participle: str
  de_1sg: str
  de_3sg: str
  de_pl: str
  de_past_sg: str
  de_past_pl: str
  de_participle: str


class _WithVerb(NamedTuple):
  en_past: str
  de_past_sg: str
  de_past_pl: str
  de_particle: str  # separable prefix that moves to the end, or ""


_NOUNS = (
  _Noun("apple", "apples", "Apfel", "Äpfel", "m"),
  _Noun("house", "houses", "Haus", "Häuser", "n"),
  _Noun("cat", "cats", "Katze", "Katzen", "f"),
  _Noun("dog", "dogs", "Hund", "Hunde", "m"),
  _Noun("book", "books", "Buch", "Bücher", "n"),
  _Noun("table", "tables", "Tisch", "Tische", "m"),
  _Noun("chair", "chairs", "Stuhl", "Stühle", "m"),
  _Noun("flower", "flowers", "Blume", "Blumen", "f"),
  _Noun("bird", "birds", "Vogel", "Vögel", "m"),
  _Noun("tree", "trees", "Baum", "Bäume", "m"),
  _Noun("car", "cars", "Auto", "Autos", "n"),
  _Noun("bottle", "bottles", "Flasche", "Flaschen", "f"),
  _Noun("ball", "balls", "Ball", "Bälle", "m"),
  _Noun("horse", "horses", "Pferd", "Pferde", "n"),
  _Noun("cup", "cups", "Tasse", "Tassen", "f"),
  _Noun("shoe", "shoes", "Schuh", "Schuhe", "m"),
  _Noun("key", "keys", "Schlüssel", "Schlüssel", "m"),
  _Noun("window", "windows", "Fenster", "Fenster", "n"),
  _Noun("lamp", "lamps", "Lampe", "Lampen", "f"),
  _Noun("egg", "eggs", "Ei", "Eier", "n"),
  _Noun("boat", "boats", "Boot", "Boote", "n"),
  _Noun("stone", "stones", "Stein", "Steine", "m"),
  _Noun("door", "doors", "Tür", "Türen", "f"),
  _Noun("clock", "clocks", "Uhr", "Uhren", "f"),
)
# Stems chosen so that every ending attaches without spelling changes
# (no "teuer" -> "teure", "dunkel" -> "dunkle").
_ADJECTIVES = (
  _Adjective("red", "rot"), _Adjective("small", "klein"),
  _Adjective("big", "groß"), _Adjective("old", "alt"),
  _Adjective("new", "neu"), _Adjective("green", "grün"),
  _Adjective("blue", "blau"), _Adjective("beautiful", "schön"),
  _Adjective("heavy", "schwer"), _Adjective("white", "weiß"),
  _Adjective("black", "schwarz"), _Adjective("yellow", "gelb"),
)
_ADJECTIVE_PROBABILITY = 0.7
_SUBJECTS = (
  _Subject("I", "ich", "1sg"), _Subject("we", "wir", "pl"),
  _Subject("they", "sie", "pl"), _Subject("he", "er", "3sg"),
  _Subject("she", "sie", "3sg"),
  _Subject("my sister", "meine Schwester", "3sg"),
  _Subject("my father", "mein Vater", "3sg"),
  _Subject("the children", "die Kinder", "pl"),
)
_VERBS = (
  _Verb("see", "sees", "saw", "seen",
     "sehe", "sieht", "sehen", "sah", "sahen", "gesehen"),
  _Verb("buy", "buys", "bought", "bought",
     "kaufe", "kauft", "kaufen", "kaufte", "kauften", "gekauft"),
  _Verb("sell", "sells", "sold", "sold", "verkaufe", "verkauft",
     "verkaufen", "verkaufte", "verkauften", "verkauft"),
  _Verb("find", "finds", "found", "found",
     "finde", "findet", "finden", "fand", "fanden", "gefunden"),
  _Verb("paint", "paints", "painted", "painted",
     "male", "malt", "malen", "malte", "malten", "gemalt"),
  _Verb("order", "orders", "ordered", "ordered", "bestelle", "bestellt",
     "bestellen", "bestellte", "bestellten", "bestellt"),
  _Verb("count", "counts", "counted", "counted",
     "zähle", "zählt", "zählen", "zählte", "zählten", "gezählt"),
)
_WITH_VERBS = (
  _WithVerb("came", "kam", "kamen", ""),
  _WithVerb("arrived", "kam", "kamen", "an"),
  _WithVerb("played", "spielte", "spielten", ""),
  _WithVerb("traveled", "reiste", "reisten", ""),
)
_LOCATIONS = (
  ("in the garden", "im Garten"), ("in the kitchen", "in der Küche"),
  ("in the room", "im Zimmer"), ("in the shop", "im Laden"),
  ("in the village", "im Dorf"), ("at the station", "am Bahnhof"),
)
_EVENTS = (
  ("my birthday", "mein Geburtstag"), ("the meeting", "das Treffen"),
  ("the party", "die Party"), ("the concert", "das Konzert"),
  ("the exam", "die Prüfung"), ("the wedding", "die Hochzeit"),
)
_NUMBER_FRAMES = (
  ("The number is {}.", "Die Zahl ist {}."),
  ("The answer is {}.", "Die Antwort ist {}."),
  ("The room number is {}.", "Die Zimmernummer ist {}."),
  ("I counted to {}.", "Ich zählte bis {}."),
)
_DEFINITE_NOMINATIVE = {"m": "der", "f": "die", "n": "das"}
# Indefinite article and adjective ending after it, by (case, gender).
_ONE_FORMS = {
  ("acc", "m"): ("einen", "en"), ("acc", "f"): ("eine", "e"),
  ("acc", "n"): ("ein", "es"), ("dat", "m"): ("einem", "en"),
  ("dat", "f"): ("einer", "en"), ("dat", "n"): ("einem", "en"),
}
# Strong plural adjective endings (no article before the number).
_PLURAL_ENDINGS = {"acc": "e", "dat": "en"}


def _check_number(n: int) -> None:
  if isinstance(n, bool) or not isinstance(n, int):
    raise TypeError(f"expected an int, got {type(n).__name__}")
  if not 0 <= n <= MAX_NUMBER:
    raise ValueError(f"number must be in 0..{MAX_NUMBER}, got {n}")


def _english_below_100(n: int) -> str:
  if n < 20:
    return _EN_ONES[n]
  tens, units = divmod(n, 10)
  return _EN_TENS[tens] + (f"-{_EN_ONES[units]}" if units else "")


@lru_cache(maxsize=None)
def number_to_english(n: int) -> str:
  """Writes a cardinal number as English words.

  Uses no "and" and hyphenates 21..99, e.g. 324 -> "three hundred
  twenty-four", 1001 -> "one thousand one".

  Args:
    n: Integer in 0..9999.

  Returns:
    The number in lower-case English words.

  Raises:
    TypeError: If ``n`` is not an int.
    ValueError: If ``n`` is outside 0..9999.
  """
  _check_number(n)
  if n == 0:
    return "zero"
  thousands, rest = divmod(n, 1000)
  hundreds, below_100 = divmod(rest, 100)
  parts = []
  if thousands:
    parts.append(f"{_EN_ONES[thousands]} thousand")
  if hundreds:
    parts.append(f"{_EN_ONES[hundreds]} hundred")
  if below_100:
    parts.append(_english_below_100(below_100))
  return " ".join(parts)


def _german_below_100(n: int) -> str:
  if n < 20:
    return _DE_ONES[n]
  tens, units = divmod(n, 10)
  if not units:
    return _DE_TENS[tens]
  # Inside a compound 1 loses its "s": "einundzwanzig", not "einsundzwanzig".
  unit_word = "ein" if units == 1 else _DE_ONES[units]
  return f"{unit_word}und{_DE_TENS[tens]}"


@lru_cache(maxsize=None)
def number_to_german(n: int) -> str:
  """Writes a cardinal number as one German word (standalone form).

  Uses "einhundert" / "eintausend" for 100 / 1000 and "eins" at the end,
  e.g. 324 -> "dreihundertvierundzwanzig", 101 -> "einhunderteins".

  Args:
    n: Integer in 0..9999.

  Returns:
    The number as a single lower-case German word.

  Raises:
    TypeError: If ``n`` is not an int.
    ValueError: If ``n`` is outside 0..9999.
  """
  _check_number(n)
  if n == 0:
    return "null"
  thousands, rest = divmod(n, 1000)
  hundreds, below_100 = divmod(rest, 100)
  word = ""
  if thousands:
    word += ("ein" if thousands == 1 else _DE_ONES[thousands]) + "tausend"
  if hundreds:
    word += ("ein" if hundreds == 1 else _DE_ONES[hundreds]) + "hundert"
  if below_100:
    word += _german_below_100(below_100)
  return word


def _english_ordinal(day: int) -> str:
  if day in _EN_IRREGULAR_ORDINALS:
    return _EN_IRREGULAR_ORDINALS[day]
  if day < 20:
    return _EN_ONES[day] + "th"
  tens, units = divmod(day, 10)
  if not units:
    return _EN_TENS[tens][:-1] + "ieth"  # "twenty" -> "twentieth"
  return f"{_EN_TENS[tens]}-{_english_ordinal(units)}"


def _german_ordinal_dative(day: int) -> str:
  """Ordinal as used after "am": "ersten", "dritten", "zwanzigsten"."""
  if day < 20:
    return _DE_IRREGULAR_ORDINAL_STEMS.get(day, _DE_ONES[day]) + "ten"
  return _german_below_100(day) + "sten"


def _is_leap(year: int) -> bool:
  return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def _days_in_month(month: int, year: int | None) -> int:
  days = _MONTHS[month][2]
  # Without a year 29 February is allowed; with one it must be a leap year.
  if month == 1 and year is not None and not _is_leap(year):
    return 28
  return days


def _capitalize(text: str) -> str:
  # str.capitalize() would lower-case the rest ("I", German nouns).
  return text[:1].upper() + text[1:]


def _sample_date(rng: random.Random) -> tuple[str, str]:
  """Returns ("on the third of March", "am dritten März"), maybe + year."""
  month = rng.randrange(12)
  year = rng.choice(_YEARS) if rng.random() < _YEAR_PROBABILITY else None
  day = rng.randint(1, _days_in_month(month, year))
  month_en, month_de, _ = _MONTHS[month]
  if rng.random() < 0.5:
    en = f"on the {_english_ordinal(day)} of {month_en}"
    en += f" {year}" if year is not None else ""
  else:
    en = f"on {month_en} {day}"
    en += f", {year}" if year is not None else ""
  de = f"am {_german_ordinal_dative(day)} {month_de}"
  de += f" {year}" if year is not None else ""
  return en, de


def _quantity_allowed(q: int) -> bool:
  # 101, 201, ... would need "hundertundein Apfel"-style agreement.
  return q == 1 or (2 <= q <= MAX_NUMBER and q % 100 != 1)


def _sample_quantity(rng: random.Random) -> int:
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
    if _quantity_allowed(q):
      return q


def _sample_standalone_number(rng: random.Random) -> int:
  # Small numbers are over-weighted so that they are seen often enough.
  r = rng.random()
  if r < 0.3:
    return rng.randint(0, 99)
  if r < 0.5:
    return rng.randint(100, 999)
  return rng.randint(1000, MAX_NUMBER)


def _noun_phrase(q: int, adj: _Adjective | None, noun: _Noun,
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


def _sample_adjective(rng: random.Random) -> _Adjective | None:
  return rng.choice(_ADJECTIVES) if rng.random() < _ADJECTIVE_PROBABILITY \
    else None


def _sample_noun_phrase(rng: random.Random, case: str) -> tuple[str, str]:
  q = _sample_quantity(rng)
  adj = _sample_adjective(rng)
  return _noun_phrase(q, adj, rng.choice(_NOUNS), case)


def _english_present(verb: _Verb, person: str) -> str:
  return verb.en_3sg if person == "3sg" else verb.en_base


def _german_present(verb: _Verb, person: str) -> str:
  return {"1sg": verb.de_1sg, "3sg": verb.de_3sg, "pl": verb.de_pl}[person]


def _german_past(singular: str, plural: str, person: str) -> str:
  return plural if person == "pl" else singular


def _template_number(rng: random.Random) -> tuple[str, str]:
  n = _sample_standalone_number(rng)
  en_frame, de_frame = rng.choice(_NUMBER_FRAMES)
  return en_frame.format(number_to_english(n)), \
    de_frame.format(number_to_german(n))


def _template_event_date(rng: random.Random) -> tuple[str, str]:
  event_en, event_de = rng.choice(_EVENTS)
  past = rng.random() < 0.5
  date_en, date_de = _sample_date(rng)
  en = f"{event_en} {'was' if past else 'is'} {date_en}."
  de = f"{event_de} {'war' if past else 'ist'} {date_de}."
  return _capitalize(en), _capitalize(de)


def _template_present(rng: random.Random) -> tuple[str, str]:
  subj, verb = rng.choice(_SUBJECTS), rng.choice(_VERBS)
  np_en, np_de = _sample_noun_phrase(rng, "acc")
  en = f"{subj.en} {_english_present(verb, subj.person)} {np_en}."
  de = f"{subj.de} {_german_present(verb, subj.person)} {np_de}."
  return _capitalize(en), _capitalize(de)


def _template_there_is(rng: random.Random) -> tuple[str, str]:
  # "es gibt" takes the accusative and the location moves to the front.
  loc_en, loc_de = rng.choice(_LOCATIONS)
  np_en, np_de = _sample_noun_phrase(rng, "acc")
  be = "is" if np_en.startswith("one ") else "are"
  return (f"There {be} {np_en} {loc_en}.",
      _capitalize(f"{loc_de} gibt es {np_de}."))


def _template_past_dated(rng: random.Random) -> tuple[str, str]:
  subj, verb = rng.choice(_SUBJECTS), rng.choice(_VERBS)
  np_en, np_de = _sample_noun_phrase(rng, "acc")
  date_en, date_de = _sample_date(rng)
  verb_de = _german_past(verb.de_past_sg, verb.de_past_pl, subj.person)
  if rng.random() < 0.5:
    # Fronted date: German is verb-second, so subject and verb swap.
    en = f"{_capitalize(date_en)}, {subj.en} {verb.en_past} {np_en}."
    de = f"{_capitalize(date_de)} {verb_de} {subj.de} {np_de}."
    return en, de
  # Time before the object in the German middle field.
  en = f"{subj.en} {verb.en_past} {np_en} {date_en}."
  de = f"{subj.de} {verb_de} {date_de} {np_de}."
  return _capitalize(en), _capitalize(de)


def _template_perfect(rng: random.Random) -> tuple[str, str]:
  # The participle goes to the end of the German clause.
  subj, verb = rng.choice(_SUBJECTS), rng.choice(_VERBS)
  np_en, np_de = _sample_noun_phrase(rng, "acc")
  have_en = "has" if subj.person == "3sg" else "have"
  have_de = {"1sg": "habe", "3sg": "hat", "pl": "haben"}[subj.person]
  en = f"{subj.en} {have_en} {verb.en_participle} {np_en}."
  de = f"{subj.de} {have_de} {np_de} {verb.de_participle}."
  return _capitalize(en), _capitalize(de)


def _template_with(rng: random.Random) -> tuple[str, str]:
  # "mit" takes the dative; separable particles go to the end.
  subj, verb = rng.choice(_SUBJECTS), rng.choice(_WITH_VERBS)
  np_en, np_de = _sample_noun_phrase(rng, "dat")
  verb_de = _german_past(verb.de_past_sg, verb.de_past_pl, subj.person)
  particle = f" {verb.de_particle}" if verb.de_particle else ""
  en = f"{subj.en} {verb.en_past} with {np_en}."
  de = f"{subj.de} {verb_de} mit {np_de}{particle}."
  return _capitalize(en), _capitalize(de)


def _template_price(rng: random.Random) -> tuple[str, str]:
  noun, adj = rng.choice(_NOUNS), _sample_adjective(rng)
  q = _sample_quantity(rng)
  past = rng.random() < 0.5
  en_adj = f"{adj.en} " if adj else ""
  de_adj = f"{adj.de}e " if adj else ""  # weak ending after der/die/das
  en_price = "one euro" if q == 1 else f"{number_to_english(q)} euros"
  # "Euro" stays singular after numbers; "einen" because "kosten" takes
  # the accusative.
  de_price = "einen Euro" if q == 1 else f"{number_to_german(q)} Euro"
  article = _DEFINITE_NOMINATIVE[noun.gender]
  en = f"The {en_adj}{noun.en_sg} {'cost' if past else 'costs'} {en_price}."
  de = (f"{_capitalize(article)} {de_adj}{noun.de_sg} "
     f"{'kostete' if past else 'kostet'} {de_price}.")
  return en, de


def _count_dates() -> int:
  with_year = sum(_days_in_month(m, y) for y in _YEARS for m in range(12))
  without_year = sum(_days_in_month(m, None) for m in range(12))
  return 2 * (with_year + without_year)  # two English date formats


def _template_capacities() -> dict[str, int]:
  quantities = sum(
    1 for q in range(1, MAX_NUMBER + 1) if _quantity_allowed(q))
  noun_heads = len(_NOUNS) * (len(_ADJECTIVES) + 1)
  phrases = quantities * noun_heads
  dates = _count_dates()
  subj_verb = len(_SUBJECTS) * len(_VERBS)
  return {
    "number": len(_NUMBER_FRAMES) * (MAX_NUMBER + 1),
    "event_date": len(_EVENTS) * 2 * dates,
    "present": subj_verb * phrases,
    "there_is": len(_LOCATIONS) * phrases,
    "past_dated": 2 * subj_verb * phrases * dates,
    "perfect": subj_verb * phrases,
    "with": len(_SUBJECTS) * len(_WITH_VERBS) * phrases,
    "price": 2 * noun_heads * quantities,
  }


def _capacity() -> int:
  """Number of distinct English sentences all templates can produce."""
  return sum(_template_capacities().values())


# Weights keep the standalone numbers (the hardest part) frequent while no
# single frame dominates.
_Sampler = Callable[[random.Random], tuple[str, str]]
_TEMPLATES: dict[str, tuple[float, _Sampler]] = {
  "number": (3.0, _template_number),
  "event_date": (2.0, _template_event_date),
  "present": (1.5, _template_present),
  "there_is": (1.0, _template_there_is),
  "past_dated": (2.0, _template_past_dated),
  "perfect": (1.5, _template_perfect),
  "with": (1.5, _template_with),
  "price": (1.5, _template_price),
}


def generate_pairs(num_pairs: int, seed: int) -> list[tuple[str, str]]:
  """Generates distinct (English, German) sentence pairs.

  Generation is sequential, so the result for ``num_pairs=n`` is a prefix of
  the result for any larger ``num_pairs`` with the same seed.

  Args:
    num_pairs: How many pairs to return (>= 0).
    seed: Seed for a private ``random.Random``; equal seeds give equal
      output.

  Returns:
    List of ``(english, german)`` tuples with no repeated English sentence.

  Raises:
    ValueError: If ``num_pairs`` is negative or larger than the number of
      distinct sentences the templates can produce.
  """
  if num_pairs < 0:
    raise ValueError(f"num_pairs must be >= 0, got {num_pairs}")
  capacity = _capacity()
  if num_pairs > capacity:
    raise ValueError(
      f"requested {num_pairs} pairs but the demo templates can only "
      f"produce {capacity} distinct English sentences")
  rng = random.Random(seed)
  weights = [w for w, _ in _TEMPLATES.values()]
  samplers = [s for _, s in _TEMPLATES.values()]
  seen: set[str] = set()
  pairs: list[tuple[str, str]] = []
  while len(pairs) < num_pairs:
    english, german = rng.choices(samplers, weights)[0](rng)
    if english not in seen:
      seen.add(english)
      pairs.append((english, german))
  return pairs


def _write_lines_atomically(path: pathlib.Path, lines: list[str]) -> None:
  # A crash must never leave a half-written file under the final name.
  with atomic_output(path) as f:
    f.writelines(line + "\n" for line in lines)


def _write_split(out_dir: pathlib.Path, split: str,
        pairs: list[tuple[str, str]]
        ) -> tuple[pathlib.Path, pathlib.Path]:
  en_path, de_path = out_dir / f"{split}.en", out_dir / f"{split}.de"
  _write_lines_atomically(en_path, [en for en, _ in pairs])
  _write_lines_atomically(de_path, [de for _, de in pairs])
  return en_path, de_path


def write_demo_corpus(
  directory: str | os.PathLike,
  num_train: int,
  num_valid: int,
  num_test: int,
  seed: int = 0,
) -> dict[str, tuple[pathlib.Path, pathlib.Path]]:
  """Writes train/valid/test splits of the demo corpus as parallel files.

  Writes ``{split}.en`` and ``{split}.de`` (UTF-8, one sentence per line)
  into ``directory``, creating it if needed. The splits share no English
  sentence. Test and valid pairs are drawn first so that they stay the same
  when only ``num_train`` changes.

  Args:
    directory: Output directory.
    num_train: Number of training pairs.
    num_valid: Number of validation pairs.
    num_test: Number of test pairs.
    seed: Seed for the generator.

  Returns:
    ``{"train": (en_path, de_path), "valid": (...), "test": (...)}``.

  Raises:
    ValueError: If a size is negative or the total exceeds the number of
      distinct sentences the templates can produce.
  """
  sizes = {"test": num_test, "valid": num_valid, "train": num_train}
  for split, size in sizes.items():
    if size < 0:
      raise ValueError(f"num_{split} must be >= 0, got {size}")
  pairs = generate_pairs(sum(sizes.values()), seed)
  out_dir = pathlib.Path(directory)
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = {}
  start = 0
  for split, size in sizes.items():
    paths[split] = _write_split(out_dir, split, pairs[start:start + size])
    start += size
  return {split: paths[split] for split in ("train", "valid", "test")}
