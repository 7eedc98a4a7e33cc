"""Numbers and dates of the demo corpus (data/demo.py): cardinals 0..9999 as English and
German words, English ordinals and German dative ordinals, and dates valid for their month.

Conventions: English numbers use no "and" and hyphenate 21..99; German uses "einhundert" /
"eintausend" and "einhunderteins" for 101. Years in dates are written as digits.
"""

from __future__ import annotations

import random
from functools import lru_cache

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


def sample_date(rng: random.Random) -> tuple[str, str]:
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


def count_dates() -> int:
  """Number of distinct (English, German) dates sample_date can produce."""
  with_year = sum(_days_in_month(m, y) for y in _YEARS for m in range(12))
  without_year = sum(_days_in_month(m, None) for m in range(12))
  return 2 * (with_year + without_year)  # two English date formats
