"""Self-made English->German corpus of numbers, dates and quantities.

The project needs a default translation task that works offline, carries no
third-party text and is small enough to train on a laptop CPU in minutes, yet
is not solvable by copying the source. Every sentence here is built from the
templates and word lists of this module and the two beside it:

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

The numbers and dates are demo_numbers.py's, the noun phrases demo_phrases.py's (each
states its conventions); the sentence frames and the corpus files are this module's.
"""

from __future__ import annotations

import os
import pathlib
import random
from typing import Callable, NamedTuple

from transformer_nmt.data.demo_numbers import (
  MAX_NUMBER,
  count_dates,
  number_to_english,
  number_to_german,
  sample_date,
)
from transformer_nmt.data.demo_phrases import (
  ADJECTIVES,
  NOUNS,
  quantity_allowed,
  sample_adjective,
  sample_noun_phrase,
  sample_quantity,
)
from transformer_nmt.files import atomic_output


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
def _capitalize(text: str) -> str:
  # str.capitalize() would lower-case the rest ("I", German nouns).
  return text[:1].upper() + text[1:]


def _sample_standalone_number(rng: random.Random) -> int:
  # Small numbers are over-weighted so that they are seen often enough.
  r = rng.random()
  if r < 0.3:
    return rng.randint(0, 99)
  if r < 0.5:
    return rng.randint(100, 999)
  return rng.randint(1000, MAX_NUMBER)


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
  date_en, date_de = sample_date(rng)
  en = f"{event_en} {'was' if past else 'is'} {date_en}."
  de = f"{event_de} {'war' if past else 'ist'} {date_de}."
  return _capitalize(en), _capitalize(de)


def _template_present(rng: random.Random) -> tuple[str, str]:
  subj, verb = rng.choice(_SUBJECTS), rng.choice(_VERBS)
  np_en, np_de = sample_noun_phrase(rng, "acc")
  en = f"{subj.en} {_english_present(verb, subj.person)} {np_en}."
  de = f"{subj.de} {_german_present(verb, subj.person)} {np_de}."
  return _capitalize(en), _capitalize(de)


def _template_there_is(rng: random.Random) -> tuple[str, str]:
  # "es gibt" takes the accusative and the location moves to the front.
  loc_en, loc_de = rng.choice(_LOCATIONS)
  np_en, np_de = sample_noun_phrase(rng, "acc")
  be = "is" if np_en.startswith("one ") else "are"
  return (f"There {be} {np_en} {loc_en}.",
      _capitalize(f"{loc_de} gibt es {np_de}."))


def _template_past_dated(rng: random.Random) -> tuple[str, str]:
  subj, verb = rng.choice(_SUBJECTS), rng.choice(_VERBS)
  np_en, np_de = sample_noun_phrase(rng, "acc")
  date_en, date_de = sample_date(rng)
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
  np_en, np_de = sample_noun_phrase(rng, "acc")
  have_en = "has" if subj.person == "3sg" else "have"
  have_de = {"1sg": "habe", "3sg": "hat", "pl": "haben"}[subj.person]
  en = f"{subj.en} {have_en} {verb.en_participle} {np_en}."
  de = f"{subj.de} {have_de} {np_de} {verb.de_participle}."
  return _capitalize(en), _capitalize(de)


def _template_with(rng: random.Random) -> tuple[str, str]:
  # "mit" takes the dative; separable particles go to the end.
  subj, verb = rng.choice(_SUBJECTS), rng.choice(_WITH_VERBS)
  np_en, np_de = sample_noun_phrase(rng, "dat")
  verb_de = _german_past(verb.de_past_sg, verb.de_past_pl, subj.person)
  particle = f" {verb.de_particle}" if verb.de_particle else ""
  en = f"{subj.en} {verb.en_past} with {np_en}."
  de = f"{subj.de} {verb_de} mit {np_de}{particle}."
  return _capitalize(en), _capitalize(de)


def _template_price(rng: random.Random) -> tuple[str, str]:
  noun, adj = rng.choice(NOUNS), sample_adjective(rng)
  q = sample_quantity(rng)
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


def _template_capacities() -> dict[str, int]:
  quantities = sum(
    1 for q in range(1, MAX_NUMBER + 1) if quantity_allowed(q))
  noun_heads = len(NOUNS) * (len(ADJECTIVES) + 1)
  phrases = quantities * noun_heads
  dates = count_dates()
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
