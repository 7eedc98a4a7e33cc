"""Tests for the self-made English->German demo corpus.

Expected strings are written by hand so that they check the generator rather
than repeat it.
"""

import calendar
import re

import pytest

from transformer_nmt.data import demo as demo_data
from transformer_nmt.data import demo_numbers

NUMBER_WORDS = [
  (0, "zero", "null"),
  (1, "one", "eins"),
  (7, "seven", "sieben"),
  (10, "ten", "zehn"),
  (11, "eleven", "elf"),
  (12, "twelve", "zwölf"),
  (13, "thirteen", "dreizehn"),
  (16, "sixteen", "sechzehn"),
  (17, "seventeen", "siebzehn"),
  (20, "twenty", "zwanzig"),
  (21, "twenty-one", "einundzwanzig"),
  (30, "thirty", "dreißig"),
  (31, "thirty-one", "einunddreißig"),
  (57, "fifty-seven", "siebenundfünfzig"),
  (70, "seventy", "siebzig"),
  (99, "ninety-nine", "neunundneunzig"),
  (100, "one hundred", "einhundert"),
  (101, "one hundred one", "einhunderteins"),
  (111, "one hundred eleven", "einhundertelf"),
  (200, "two hundred", "zweihundert"),
  (324, "three hundred twenty-four", "dreihundertvierundzwanzig"),
  (999, "nine hundred ninety-nine", "neunhundertneunundneunzig"),
  (1000, "one thousand", "eintausend"),
  (1001, "one thousand one", "eintausendeins"),
  (1999, "one thousand nine hundred ninety-nine",
  "eintausendneunhundertneunundneunzig"),
  (2024, "two thousand twenty-four", "zweitausendvierundzwanzig"),
  (7777, "seven thousand seven hundred seventy-seven",
  "siebentausendsiebenhundertsiebenundsiebzig"),
  (9999, "nine thousand nine hundred ninety-nine",
  "neuntausendneunhundertneunundneunzig"),
]

# Hand-checked pairs from generate_pairs(400, seed=0), at least one per
# template and covering "one" with every gender and case.
GOLDEN_PAIRS = [
  ("The number is one thousand three hundred thirty-one.",
  "Die Zahl ist eintausenddreihunderteinunddreißig."),
  ("I counted to eight hundred two.", "Ich zählte bis achthundertzwei."),
  ("My birthday was on the twenty-first of March.",
  "Mein Geburtstag war am einundzwanzigsten März."),
  ("My birthday was on December 18, 1966.",
  "Mein Geburtstag war am achtzehnten Dezember 1966."),
  ("She paints one big shoe.", "Sie malt einen großen Schuh."),
  ("They buy six thousand one hundred seventy-five old tables.",
  "Sie kaufen sechstausendeinhundertfünfundsiebzig alte Tische."),
  ("There are forty-two old windows in the garden.",
  "Im Garten gibt es zweiundvierzig alte Fenster."),
  ("There is one stone in the village.", "Im Dorf gibt es einen Stein."),
  ("On the eleventh of January 2067, they sold one red flower.",
  "Am elften Januar 2067 verkauften sie eine rote Blume."),
  ("On February 6, 1905, my sister counted forty-eight boats.",
  "Am sechsten Februar 1905 zählte meine Schwester achtundvierzig Boote."),
  ("The children painted four hundred forty-five black doors on "
  "October 31, 1932.",
  "Die Kinder malten am einunddreißigsten Oktober 1932 "
  "vierhundertfünfundvierzig schwarze Türen."),
  ("She ordered one small ball on the first of June.",
  "Sie bestellte am ersten Juni einen kleinen Ball."),
  ("My father has counted one new dog.",
  "Mein Vater hat einen neuen Hund gezählt."),
  ("He has bought ninety-six apples.",
  "Er hat sechsundneunzig Äpfel gekauft."),
  ("She traveled with fifty-one black books.",
  "Sie reiste mit einundfünfzig schwarzen Büchern."),
  ("He played with twenty-one yellow apples.",
  "Er spielte mit einundzwanzig gelben Äpfeln."),
  ("They traveled with one blue horse.",
  "Sie reisten mit einem blauen Pferd."),
  ("I came with one lamp.", "Ich kam mit einer Lampe."),
  ("They arrived with one window.", "Sie kamen mit einem Fenster an."),
  ("The car costs one euro.", "Das Auto kostet einen Euro."),
  ("The red house cost four thousand five hundred thirty-eight euros.",
  "Das rote Haus kostete viertausendfünfhundertachtunddreißig Euro."),
  ("The beautiful cat costs one hundred forty-eight euros.",
  "Die schöne Katze kostet einhundertachtundvierzig Euro."),
]

ORDINALS = {
  1: ("first", "ersten"),
  2: ("second", "zweiten"),
  3: ("third", "dritten"),
  7: ("seventh", "siebten"),
  8: ("eighth", "achten"),
  20: ("twentieth", "zwanzigsten"),
  21: ("twenty-first", "einundzwanzigsten"),
  30: ("thirtieth", "dreißigsten"),
  31: ("thirty-first", "einunddreißigsten"),
}

MONTHS = {
  "January": "Januar", "February": "Februar", "March": "März",
  "April": "April", "May": "Mai", "June": "Juni", "July": "Juli",
  "August": "August", "September": "September", "October": "Oktober",
  "November": "November", "December": "Dezember",
}

# English plural -> German dative plural, as needed after "mit".
DATIVE_PLURALS = {
  "apples": "Äpfeln", "houses": "Häusern", "cats": "Katzen",
  "dogs": "Hunden", "books": "Büchern", "tables": "Tischen",
  "chairs": "Stühlen", "flowers": "Blumen", "birds": "Vögeln",
  "trees": "Bäumen", "cars": "Autos", "bottles": "Flaschen",
  "balls": "Bällen", "horses": "Pferden", "cups": "Tassen",
  "shoes": "Schuhen", "keys": "Schlüsseln", "windows": "Fenstern",
  "lamps": "Lampen", "eggs": "Eiern", "boats": "Booten",
  "stones": "Steinen", "doors": "Türen", "clocks": "Uhren",
}


@pytest.fixture(scope="module")
def corpus():
  return demo_data.generate_pairs(20000, seed=0)


@pytest.mark.parametrize("n, english, german", NUMBER_WORDS)
def test_number_words(n, english, german):
  assert demo_numbers.number_to_english(n) == english
  assert demo_numbers.number_to_german(n) == german


@pytest.mark.parametrize("bad", [-1, 10000])
def test_number_words_reject_out_of_range(bad):
  with pytest.raises(ValueError):
    demo_numbers.number_to_english(bad)
  with pytest.raises(ValueError):
    demo_numbers.number_to_german(bad)


def test_golden_pairs():
  translations = dict(demo_data.generate_pairs(400, seed=0))
  for english, german in GOLDEN_PAIRS:
    assert translations.get(english) == german, english


@pytest.mark.parametrize("day", sorted(ORDINALS))
def test_date_ordinals(corpus, day):
  english_ordinal, german_ordinal = ORDINALS[day]
  word_form = re.compile(
    rf"\b[Oo]n the {english_ordinal} of ([A-Z][a-z]+)\b")
  digit_form = re.compile(rf"\b[Oo]n ([A-Z][a-z]+) {day}\b(?!\d)")
  seen = set()
  for english, german in corpus:
    for form, pattern in (("word", word_form), ("digit", digit_form)):
      match = pattern.search(english)
      if match and match.group(1) in MONTHS:
        expected = f"m {german_ordinal} {MONTHS[match.group(1)]}"
        assert expected in german, (english, german)
        seen.add(form)
  assert seen == {"word", "digit"}


def test_dates_are_valid(corpus):
  pattern = re.compile(r"\b[Oo]n ([A-Z][a-z]+) (\d+)(?:, (\d{4}))?\b")
  checked = 0
  for english, _ in corpus:
    match = pattern.search(english)
    if not match or match.group(1) not in MONTHS:
      continue
    month = list(MONTHS).index(match.group(1)) + 1
    year = int(match.group(3)) if match.group(3) else 2000  # leap year
    assert 1 <= int(match.group(2)) <= calendar.monthrange(year, month)[1]
    checked += 1
  assert checked > 100
  assert not any("thirty-first of April" in en or "thirtieth of February"
         in en for en, _ in corpus)


def test_dative_plurals(corpus):
  seen = set()
  for english, german in corpus:
    if " with " in english and not re.search(r" with one ", english):
      noun = english.rstrip(".").split()[-1]
      german_words = german.rstrip(".").split()
      if german_words[-1] == "an":  # separable verb particle
        german_words.pop()
      assert german_words[-1] == DATIVE_PLURALS[noun], (english, german)
      seen.add(noun)
  assert seen == set(DATIVE_PLURALS)


def test_sentence_shape(corpus):
  for english, german in corpus:
    for sentence in (english, german):
      assert sentence[0].isupper() and sentence.endswith(".")
      assert "  " not in sentence and "\n" not in sentence
    assert len(english.split()) <= 20
  # No quantity like 101 or 2301 before a noun ("hunderteins Äpfel").
  number_frames = ("The number", "The answer", "The room", "I counted to")
  ends_in_01 = re.compile(r"\b(hundred|thousand) one (?!hundred\b)")
  assert not any(ends_in_01.search(en) for en, _ in corpus
         if not en.startswith(number_frames))


def test_mapping_is_a_function(corpus):
  translations = {}
  for english, german in corpus:
    assert translations.setdefault(english, german) == german


def test_determinism_and_uniqueness():
  first = demo_data.generate_pairs(3000, seed=7)
  assert first == demo_data.generate_pairs(3000, seed=7)
  assert first != demo_data.generate_pairs(3000, seed=8)
  assert len({english for english, _ in first}) == len(first)
  assert demo_data.generate_pairs(1000, seed=7) == first[:1000]


def test_all_templates_are_used(corpus):
  starts = {
    "The number is", "I counted to", "My birthday", "There are",
    "There is", "On ", "The children have",
  }
  for start in starts:
    assert any(en.startswith(start) for en, _ in corpus), start
  for marker in (" with ", " costs ", " cost ", " has ", " on "):
    assert any(marker in en for en, _ in corpus), marker


def test_write_demo_corpus(tmp_path):
  out_dir = tmp_path / "nested" / "demo"
  paths = demo_data.write_demo_corpus(out_dir, num_train=500, num_valid=60,
                    num_test=70, seed=3)
  assert set(paths) == {"train", "valid", "test"}
  english_by_split = {}
  for split, size in (("train", 500), ("valid", 60), ("test", 70)):
    en_path, de_path = paths[split]
    assert en_path == out_dir / f"{split}.en"
    assert de_path == out_dir / f"{split}.de"
    en_text = en_path.read_text(encoding="utf-8")
    de_text = de_path.read_text(encoding="utf-8")
    assert "\r" not in en_text + de_text
    en_lines, de_lines = en_text.splitlines(), de_text.splitlines()
    assert len(en_lines) == len(de_lines) == size
    english_by_split[split] = set(en_lines)
  assert not english_by_split["train"] & english_by_split["valid"]
  assert not english_by_split["train"] & english_by_split["test"]
  assert not english_by_split["valid"] & english_by_split["test"]
  assert sorted(p.name for p in out_dir.iterdir()) == sorted(
    f"{s}.{lang}" for s in ("train", "valid", "test") for lang in ("en", "de"))


def test_write_demo_corpus_pairs_lines(tmp_path):
  paths = demo_data.write_demo_corpus(tmp_path, 50, 5, 5, seed=1)
  en_path, de_path = paths["test"]
  translations = dict(demo_data.generate_pairs(60, seed=1))
  en_lines = en_path.read_text(encoding="utf-8").splitlines()
  de_lines = de_path.read_text(encoding="utf-8").splitlines()
  for english, german in zip(en_lines, de_lines):
    assert translations[english] == german


def test_impossible_size_raises(tmp_path):
  too_many = demo_data._capacity() + 1
  with pytest.raises(ValueError, match="distinct"):
    demo_data.generate_pairs(too_many, seed=0)
  with pytest.raises(ValueError, match="distinct"):
    demo_data.write_demo_corpus(tmp_path / "x", too_many, 0, 0)
  assert not (tmp_path / "x").exists()
  with pytest.raises(ValueError):
    demo_data.generate_pairs(-1, seed=0)


def test_held_out_splits_do_not_depend_on_train_size(tmp_path):
  small = demo_data.write_demo_corpus(tmp_path / "a", 10, 20, 30, seed=5)
  large = demo_data.write_demo_corpus(tmp_path / "b", 300, 20, 30, seed=5)
  for split in ("valid", "test"):
    for small_path, large_path in zip(small[split], large[split]):
      assert small_path.read_bytes() == large_path.read_bytes()
