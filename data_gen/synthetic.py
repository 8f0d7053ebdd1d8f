"""A synthetic Freebase-like KG with 1-, 2- and 3-hop questions: the embedded default dataset.

The world (deterministic per seed) has named entities of about twenty types (persons, cities,
countries, films, characters, organisations, universities, sports teams, awards, languages,
time zones, ...), 48 relations named the Freebase way (`people.person.nationality`,
`location.location.containedby`, `film.film.directed_by`, ...), hub nodes (genders, countries,
languages, continents: degree 200+ by default, thousands at benchmark sizes), unnamed mediator
(CVT) nodes (`people.marriage`, `education.education`, `film.performance`,
`award.award_honor`, `sports.sports_team_roster`) and literal values (dates, years, integers) in
N-Triples form. Ids are Freebase-style mids (`m.0b7x_q`); names repeat on purpose (namesakes:
people, cities, characters and films sharing a name), so resolving a name is not trivial, but no
question's topic entity shares its name (exactly or after `normalize_answer`) with another entity.

Questions come from a catalogue of relation paths (`PATTERNS`), each with several paraphrase
templates. Conventions:
- `gold_paths` holds one path of relation ids; `^rel` walks an edge backwards (object to
  subject), as in `kgreasoner.kg.base`. About a fifth of all steps are backwards.
- `hops` is the number of relations in the path, i.e. the number of edges a search walks.
  Passing a mediator costs two: "who is X married to" is
  [`people.person.spouse_s`, `people.marriage.spouse`], a 2-hop question.
- The answer set is what executing the path on the KG returns (`execute_path` on a `MemoryKG`
  of the triples), minus the topic entity itself: through a marriage, `people.marriage.spouse`
  leads back to both spouses. A (topic, path) with no answer or more than `MAX_ANSWERS` is not
  asked. Each (topic, path) group gets one to three paraphrases.
- Literal answers are named by their value (`1987-03-02`, `42`) with aliases for other common
  spellings (`March 2, 1987`, `2 March 1987`; `1,234,567`).
- Splits are pre-assigned with the seeded `grouped` scheme (no (topic, path) group on two sides).
- Multi-topic questions (`multi_topic_share` of them, 10% by default) come from `JOINT_PATTERNS`:
  two topic entities, one path from each (one hop or more), `intersect: true` and as answers what
  both paths reach ("Which people born in {a} are citizens of {b}?"). A pair is asked only when the
  intersection is narrower than each path's own answers, so neither search alone answers it; its
  `hops` is the longer path's length.

Files written by `write_synthetic` (the dataset-folder layout of the README):
`kb.tsv` (`subject \\t relation \\t object`, ids), `names.tsv` (`id \\t label`, named entities
only; mediators are absent, hence unnamed) and `questions.jsonl` (our QA schema).

    python -m data_gen.synthetic --out DIR --seed 0 [--target-triples N]
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pandas as pd

from kgreasoner.data.normalize import normalize_answer
from kgreasoner.data.schema import Answer, QAExample, TopicEntity, write_jsonl
from kgreasoner.data.splits import assign_splits
from kgreasoner.kg.base import INVERSE_PREFIX, execute_path, is_literal_id, literal_value, make_literal
from kgreasoner.kg.memory import MemoryKG

SOURCE = "synthetic"
DEFAULT_QUESTIONS = 3000
DEFAULT_MULTI_TOPIC_SHARE = 0.1
MAX_ANSWERS = 10
MIN_NAMED_ENTITIES = 100

XSD = "http://www.w3.org/2001/XMLSchema#"
XSD_DATE = XSD + "date"
XSD_GYEAR = XSD + "gYear"
XSD_INTEGER = XSD + "integer"

# --- relations ---------------------------------------------------------------------------------
NATIONALITY = "people.person.nationality"
PLACE_OF_BIRTH = "people.person.place_of_birth"
DATE_OF_BIRTH = "people.person.date_of_birth"
GENDER = "people.person.gender"
PROFESSION = "people.person.profession"
LANGUAGES = "people.person.languages"
RELIGION = "people.person.religion"
PARENTS = "people.person.parents"
SPOUSE_S = "people.person.spouse_s"
MARRIAGE_SPOUSE = "people.marriage.spouse"
MARRIAGE_FROM = "people.marriage.from"
EDUCATION = "people.person.education"
EDU_INSTITUTION = "education.education.institution"
EDU_STUDENT = "education.education.student"
EDU_END = "education.education.end_date"
CONTAINEDBY = "location.location.containedby"
TIME_ZONES = "location.location.time_zones"
POPULATION = "location.statistical_region.population"
CAPITAL = "location.country.capital"
OFFICIAL_LANGUAGE = "location.country.official_language"
LANGUAGES_SPOKEN = "location.country.languages_spoken"
CURRENCY = "location.country.currency_used"
DIRECTED_BY = "film.film.directed_by"
PRODUCED_BY = "film.film.production_companies"
RELEASE_DATE = "film.film.initial_release_date"
FILM_LANGUAGE = "film.film.language"
FILM_COUNTRY = "film.film.country"
GENRE = "film.film.genre"
STARRING = "film.film.starring"
PERF_ACTOR = "film.performance.actor"
PERF_CHARACTER = "film.performance.character"
AWARDS_WON = "award.award_winner.awards_won"
HONOR_AWARD = "award.award_honor.award"
HONOR_YEAR = "award.award_honor.year"
HONOR_WINNER = "award.award_honor.award_winner"
PRESENTED_BY = "award.award.presented_by"
ROSTER = "sports.sports_team.roster"
TEAM_SPORT = "sports.sports_team.sport"
TEAM_LOCATION = "sports.sports_team.location"
ROSTER_PLAYER = "sports.sports_team_roster.player"
ROSTER_FROM = "sports.sports_team_roster.from"
ROSTER_POSITION = "sports.sports_team_roster.position"
FOUNDERS = "organization.organization.founders"
PLACE_FOUNDED = "organization.organization.place_founded"
DATE_FOUNDED = "organization.organization.date_founded"
INDUSTRY = "business.business_operation.industry"
UNDERGRADUATES = "education.university.number_of_undergraduates"
LANGUAGE_FAMILY = "language.human_language.language_family"


def inverse(relation: str) -> str:
    """The path step that walks `relation` backwards."""
    return INVERSE_PREFIX + relation


# --- sizes ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TypeSize:
    """How many entities of a type exist at scale `s`: `base` at s = 1.

    `growth` is `linear` (base * s), `sqrt` (base * sqrt(s), at most `cap`; hub types such as
    countries stay few while what points at them grows) or `fixed`.
    """

    base: int
    growth: str = "linear"
    cap: int | None = None

    def count(self, scale: float) -> int:
        if self.growth == "fixed":
            return self.base
        raw = self.base * (scale if self.growth == "linear" else scale**0.5)
        if self.cap is not None:
            raw = min(raw, self.cap)
        return max(1, int(round(raw)))


# Order matters: it is the order in which node indices (and so mids) are handed out.
TYPE_SIZES: dict[str, TypeSize] = {
    "gender": TypeSize(2, "fixed"),
    "continent": TypeSize(6, "fixed"),
    "country": TypeSize(40, "sqrt", cap=195),
    "language_family": TypeSize(8, "fixed"),
    "language": TypeSize(30, "sqrt", cap=150),
    "time_zone": TypeSize(16, "sqrt", cap=40),
    "currency": TypeSize(28, "sqrt", cap=160),
    "religion": TypeSize(10, "fixed"),
    "profession": TypeSize(24, "fixed"),
    "genre": TypeSize(20, "fixed"),
    "industry": TypeSize(15, "fixed"),
    "sport": TypeSize(8, "fixed"),
    "position": TypeSize(12, "fixed"),
    "city": TypeSize(350),
    "person": TypeSize(900),
    "organisation": TypeSize(120),
    "university": TypeSize(80),
    "sports_team": TypeSize(60),
    "award": TypeSize(40, "sqrt", cap=600),
    "film": TypeSize(200),
    "character": TypeSize(800),  # one per film performance: four per film on average
}
PERFORMANCES_PER_FILM = 4
# Triples per unit of scale, a slight underestimate (measured: 18.8k-19.0k at scale 1, 18.6k at scale 11, across seeds),
# so that a scale computed from `target_triples` reaches the target on the first try.
TRIPLES_PER_SCALE = 18_000


def type_counts(scale: float) -> dict[str, int]:
    counts = {name: size.count(scale) for name, size in TYPE_SIZES.items()}
    counts["character"] = PERFORMANCES_PER_FILM * counts["film"]
    return counts


def named_entity_count(scale: float) -> int:
    return sum(type_counts(scale).values())


def scale_for(num_entities: int | None = None, target_triples: int | None = None) -> float:
    """The world scale for `num_entities` named entities and (see `generate`) `target_triples` triples.

    With neither, scale 1: about 2,800 named entities and 19k triples. With both, the larger.
    """
    scales = []
    if num_entities is not None:
        if num_entities < MIN_NAMED_ENTITIES:
            raise ValueError(f"num_entities must be at least {MIN_NAMED_ENTITIES}, got {num_entities}")
        lo, hi = 1e-3, 1e5
        for _ in range(60):  # bisection: the count is monotone in the scale
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if named_entity_count(mid) < num_entities else (lo, mid)
        scales.append(hi)
    if target_triples is not None:
        if target_triples <= 0:
            raise ValueError(f"target_triples must be positive, got {target_triples}")
        scales.append(target_triples / TRIPLES_PER_SCALE)
        if named_entity_count(scales[-1]) < MIN_NAMED_ENTITIES:
            raise ValueError(
                f"target_triples={target_triples} is too small: "
                f"a world has at least {MIN_NAMED_ENTITIES} named entities"
            )
    return max(scales, default=1.0)


# --- names ---------------------------------------------------------------------------------------
_ONSETS = ("b", "br", "c", "ch", "d", "dr", "f", "g", "gr", "h", "j", "k", "kr", "l", "m", "n", "p", "pr",
           "r", "s", "sh", "st", "t", "th", "tr", "v", "w", "z", "", "", "")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "ai", "ea", "ou", "y")
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "nd", "rk", "th", "x", "ld", "st")
_FIRST_ENDINGS = ("", "", "a", "o", "en", "in", "ia", "as", "el", "is")
_SURNAME_ENDINGS = ("", "", "", "son", "ez", "ov", "ski", "er", "man", "ley", "ford", "ini", "escu", "berg")
_CITY_ENDINGS = ("", "", "", "ton", "ville", "burg", "port", " Falls", " Springs", "field", "ford", "mouth",
                 "haven", "stad", "grad")
_COUNTRY_ENDINGS = ("ia", "land", "stan", "ora", "ica", "esh", "ania", "ova")
_LANGUAGE_ENDINGS = ("ish", "ese", "ic", "an", "i", "ian")
_CURRENCY_UNITS = ("dollar", "franc", "crown", "mark", "peso", "rupee", "dinar", "lira", "shilling", "florin",
                   "real", "krona")
_ORG_SUFFIXES = ("Pictures", "Studios", "Industries", "Group", "Holdings", "Systems", "Labs", "Motors",
                 "Records", "Media", "Bank", "Airlines", "Foundation", "Press", "Energy", "Robotics")
_MASCOTS = ("Falcons", "Lions", "Rovers", "United", "Wanderers", "Tigers", "Bears", "Sharks", "Comets",
            "Rangers", "Athletic", "Titans", "Hawks", "Wolves", "Pirates", "Giants", "Stallions", "Kings",
            "Eagles", "Vipers", "Dragons", "Mariners", "Rockets", "Bulls")
_ADJECTIVES = ("Silent", "Broken", "Golden", "Last", "Hidden", "Burning", "Crimson", "Distant", "Endless",
               "Frozen", "Dark", "Little", "Lost", "Wild", "Secret", "Midnight", "Forgotten", "Bright",
               "Savage", "Hollow", "Iron", "Paper", "Glass", "Velvet", "Quiet", "Eternal", "Scarlet",
               "Lonely", "Stolen", "Sweet", "Bitter", "Northern", "Final", "Electric", "Wicked", "Gentle")
_NOUNS = ("River", "Garden", "Storm", "Kingdom", "Shadow", "Promise", "Road", "Heart", "Mirror", "City",
          "Harbor", "Winter", "Summer", "Empire", "Voyage", "Letter", "Island", "Dream", "Hunter", "Crown",
          "Station", "Journey", "Horizon", "Witness", "Stranger", "Orchard", "Tide", "Fortress", "Lantern",
          "Canyon", "Melody", "Circle", "Bridge", "Signal", "Frontier", "Machine", "Ghost", "Season")
_TITLES = ("Captain", "Detective", "Doctor", "Agent", "Professor", "Sergeant", "Lady", "Sir", "Inspector",
           "Uncle", "Aunt", "Officer")
_AWARD_FORMS = ("{w} Award for Best Actor", "{w} Award for Best Actress", "{w} Award for Best Director",
                "{w} Award for Best Picture", "{w} Prize", "{w} Medal", "{w} Award for Best Screenplay",
                "{w} Lifetime Achievement Award", "{w} Sportsperson of the Year")
_PROFESSIONS = ("Actor", "Film director", "Athlete", "Politician", "Writer", "Engineer", "Singer",
                "Painter", "Physician", "Lawyer", "Journalist", "Entrepreneur", "Scientist", "Teacher",
                "Architect", "Economist", "Photographer", "Composer", "Film producer", "Screenwriter",
                "Diplomat", "Historian", "Businessperson", "Model")
_ACTOR, _DIRECTOR, _ATHLETE = 0, 1, 2  # indices into _PROFESSIONS of the role professions
_GENRES = ("Drama", "Comedy", "Thriller", "Action", "Romance", "Horror", "Documentary", "Science fiction",
           "Fantasy", "Animation", "Crime", "Western", "Musical", "Mystery", "War", "Adventure",
           "Biography", "Family", "Historical", "Sports")
_INDUSTRIES = ("Film", "Music", "Banking", "Software", "Automotive", "Aviation", "Publishing",
               "Energy", "Telecommunications", "Retail", "Pharmaceuticals", "Mining", "Media",
               "Robotics", "Agriculture")
_SPORTS = ("Football", "Basketball", "Ice hockey", "Baseball", "Cricket", "Rugby union", "Volleyball",
           "Handball")
_POSITIONS = ("Goalkeeper", "Defender", "Midfielder", "Forward", "Point guard", "Center", "Pitcher",
              "Catcher", "Winger", "Fly-half", "Setter", "Bowler")


class _NameMaker:
    """Seeded pseudo-words from syllables, and names of each entity type built from them."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def words(
        self, count: int, min_syllables: int = 2, max_syllables: int = 3, endings: Sequence[str] = ("",)
    ) -> list[str]:
        rng = self.rng
        lengths = rng.integers(min_syllables, max_syllables + 1, size=count)
        onsets = rng.integers(len(_ONSETS), size=(count, max_syllables))
        vowels = rng.integers(len(_VOWELS), size=(count, max_syllables))
        codas = rng.integers(len(_CODAS), size=count)
        ends = rng.integers(len(endings), size=count)
        words = []
        for i in range(count):
            body = "".join(_ONSETS[o] + _VOWELS[v] for o, v in zip(onsets[i, : lengths[i]], vowels[i, : lengths[i]]))
            word = body + _CODAS[codas[i]] + endings[ends[i]]
            words.append(word[:1].upper() + word[1:])
        return words

    def unique_words(self, count: int, **kwargs) -> list[str]:
        """`count` distinct words (pseudo-words of 2+ syllables rarely repeat; repeats are redrawn)."""
        seen: dict[str, None] = {}
        while len(seen) < count:
            for word in self.words(max(16, 2 * (count - len(seen))), **kwargs):
                if len(seen) < count:
                    seen.setdefault(word, None)
        return list(seen)

    def pick(self, options: Sequence[str], count: int) -> list[str]:
        return [options[i] for i in self.rng.integers(len(options), size=count)]

    def with_namesakes(self, names: list[str], share: float) -> list[str]:
        """Give a `share` of the entities the name of another entity of the same type."""
        count = int(len(names) * share)
        if count == 0 or len(names) < 2:
            return names
        names = list(names)
        targets = self.rng.choice(len(names), size=count, replace=False)
        sources = self.rng.integers(len(names), size=count)
        for target, source in zip(targets.tolist(), sources.tolist()):
            names[target] = names[source]
        return names

    def persons(self, count: int) -> list[str]:
        num_firsts = max(60, min(800, count // 4))
        firsts = self.unique_words(num_firsts, min_syllables=1, max_syllables=2, endings=_FIRST_ENDINGS)
        lasts = self.unique_words(max(200, count // 2), min_syllables=1, max_syllables=3, endings=_SURNAME_ENDINGS)
        fi = self.rng.integers(len(firsts), size=count)
        li = self.rng.integers(len(lasts), size=count)
        return self.with_namesakes([f"{firsts[f]} {lasts[l]}" for f, l in zip(fi, li)], 0.02)

    def characters(self, count: int, person_names: list[str]) -> list[str]:
        """Film characters: a first name alone, a title and surname, or a full name (namesakes abound)."""
        firsts = [n.split(" ", 1)[0] for n in person_names]
        lasts = [n.split(" ", 1)[1] for n in person_names]
        forms = self.rng.integers(3, size=count)
        fi = self.rng.integers(len(firsts), size=count)
        li = self.rng.integers(len(lasts), size=count)
        ti = self.rng.integers(len(_TITLES), size=count)
        names = []
        for form, f, l, t in zip(forms, fi, li, ti):
            if form == 0:
                names.append(firsts[f])
            elif form == 1:
                names.append(f"{_TITLES[t]} {lasts[l]}")
            else:
                names.append(f"{firsts[f]} {lasts[l]}")
        return names

    def films(self, count: int, place_names: list[str]) -> list[str]:
        rng = self.rng
        forms = rng.integers(5, size=count)
        a = rng.integers(len(_ADJECTIVES), size=count)
        n = rng.integers(len(_NOUNS), size=count)
        p = rng.integers(len(place_names), size=count)
        sequel = rng.integers(2, 5, size=count)
        names = []
        for form, ai, ni, pi, k in zip(forms, a, n, p, sequel):
            if form == 0:
                names.append(f"The {_ADJECTIVES[ai]} {_NOUNS[ni]}")
            elif form == 1:
                names.append(f"The {_NOUNS[ni]} of {place_names[pi]}")
            elif form == 2:
                names.append(f"{_ADJECTIVES[ai]} {_NOUNS[ni]} {k}")
            elif form == 3:
                names.append(f"Return to {place_names[pi]}")
            else:
                names.append(f"{_NOUNS[ni]}s of the {_ADJECTIVES[ai]} {_NOUNS[(ni + 7) % len(_NOUNS)]}")
        return names

    def organisations(self, count: int) -> list[str]:
        stems = self.words(count, min_syllables=2, max_syllables=2)
        return [f"{s} {x}" for s, x in zip(stems, self.pick(_ORG_SUFFIXES, count))]

    def universities(self, count: int, cities: list[str], surnames: list[str]) -> list[str]:
        rng = self.rng
        forms = rng.integers(4, size=count)
        ci = rng.integers(len(cities), size=count)
        si = rng.integers(len(surnames), size=count)
        stems = self.words(count, min_syllables=2, max_syllables=2)
        names = []
        for form, c, s, stem in zip(forms, ci, si, stems):
            names.append(
                (f"University of {cities[c]}", f"{stem} Institute of Technology", f"{surnames[s]} University",
                 f"{cities[c]} State College")[form]
            )
        return names

    def teams(self, cities: list[str]) -> list[str]:
        return [f"{c} {m}" for c, m in zip(cities, self.pick(_MASCOTS, len(cities)))]

    def awards(self, count: int) -> list[str]:
        stems = self.unique_words(count, min_syllables=2, max_syllables=2)
        return [form.format(w=s) for s, form in zip(stems, self.pick(_AWARD_FORMS, count))]


# --- mids ----------------------------------------------------------------------------------------
_MID_ALPHABET = np.frombuffer(b"0123456789bcdfghjklmnpqrstvwxyz_", dtype=np.uint8)
_MID_DIGITS = 5
_MID_SPACE = 32**_MID_DIGITS
_MID_MULTIPLIER = 2654435761 % _MID_SPACE  # odd, hence a bijection modulo a power of two


def make_mids(count: int, offset: int) -> np.ndarray:
    """`count` distinct Freebase-style mids (`m.0` + 5 characters), scrambled; an object array."""
    if count > _MID_SPACE:
        raise ValueError(f"at most {_MID_SPACE} nodes fit the mid space, asked for {count}")
    nums = (np.arange(count, dtype=np.int64) * _MID_MULTIPLIER + offset) % _MID_SPACE
    digits = (nums[:, None] // (32 ** np.arange(_MID_DIGITS - 1, -1, -1, dtype=np.int64))) % 32
    chars = np.ascontiguousarray(_MID_ALPHABET[digits])
    tails = chars.view(f"S{_MID_DIGITS}").ravel().astype(f"U{_MID_DIGITS}")
    return np.char.add("m.0", tails).astype(object)


# --- the world -----------------------------------------------------------------------------------
_EPOCH = np.datetime64("1900-01-01", "D")


def _dates(days: np.ndarray) -> list[str]:
    """xsd:date literals for day offsets from 1900-01-01."""
    iso = (_EPOCH + days.astype("timedelta64[D]")).astype(str)
    return [make_literal(d, XSD_DATE) for d in iso.tolist()]


def _years(years: np.ndarray) -> list[str]:
    return [make_literal(str(y), XSD_GYEAR) for y in years.tolist()]


def _integers(values: np.ndarray) -> list[str]:
    return [make_literal(str(v), XSD_INTEGER) for v in values.tolist()]


def _year_of(days: np.ndarray) -> np.ndarray:
    return (_EPOCH + days.astype("timedelta64[D]")).astype("datetime64[Y]").astype(np.int64) + 1970


def _days_of_year(year: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random day within each given year, as a day offset from 1900-01-01."""
    start = (np.asarray(year, dtype=np.int64) - 1970).astype("datetime64[Y]").astype("datetime64[D]")
    return (start - _EPOCH).astype(np.int64) + rng.integers(0, 365, size=len(year))


class _WorldBuilder:
    """Hands out node indices (named entities first, then mediators) and collects edge chunks."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.names: list[str] = []
        self.ranges: dict[str, np.ndarray] = {}
        self.mediator_ranges: dict[str, list[np.ndarray]] = {}
        self.num_nodes = 0
        self.chunks: list[tuple[str, np.ndarray, np.ndarray | list[str]]] = []
        # Facts that later parts of the world depend on, set by the part that draws them.
        self.city_country: np.ndarray | None = None  # city position -> country position
        self.country_language: np.ndarray | None = None  # country position -> first official language
        self.roles: np.ndarray | None = None  # person position -> 0 actor, 1 director, 2 athlete, 3 other
        self.birth_year: np.ndarray | None = None  # person position -> year of birth
        self.team_city: np.ndarray | None = None  # team position -> city position

    def entities(self, kind: str, names: list[str]) -> np.ndarray:
        if self.mediator_ranges:
            raise AssertionError("named entities must all be created before mediators")
        idx = np.arange(self.num_nodes, self.num_nodes + len(names), dtype=np.int64)
        self.names.extend(names)
        self.ranges[kind] = idx
        self.num_nodes += len(names)
        return idx

    def mediators(self, kind: str, count: int) -> np.ndarray:
        idx = np.arange(self.num_nodes, self.num_nodes + count, dtype=np.int64)
        self.mediator_ranges.setdefault(kind, []).append(idx)
        self.num_nodes += count
        return idx

    def add(self, relation: str, subjects: np.ndarray, objects: np.ndarray | list[str]) -> None:
        """Edges `subjects[i] -relation-> objects[i]`; objects are node indices or literal ids."""
        if len(subjects) != len(objects):
            raise AssertionError(f"{relation}: {len(subjects)} subjects vs {len(objects)} objects")
        if len(subjects):
            self.chunks.append((relation, np.asarray(subjects, dtype=np.int64), objects))

    def zipf(self, n: int, size: int, exponent: float = 1.0) -> np.ndarray:
        """Indices in [0, n) with Zipf-like weights over a seeded ranking: a few hubs, a long tail."""
        weights = 1.0 / (self.rng.permutation(n) + 1.0) ** exponent
        return self.rng.choice(n, size=size, p=weights / weights.sum())

    def some(self, count: int, share: float) -> np.ndarray:
        """A sorted random subset of range(count) of about `share` of it."""
        return np.flatnonzero(self.rng.random(count) < share)


def _build_world(rng: np.random.Generator, scale: float) -> _WorldBuilder:
    world = _WorldBuilder(rng)
    _name_entities(world, type_counts(scale))
    _geography(world)
    _people(world)
    _institutions(world)
    _films(world)
    return world


def _name_entities(w: _WorldBuilder, counts: dict[str, int]) -> None:
    """Create every named entity, type by type (the order of `TYPE_SIZES`)."""
    nm = _NameMaker(w.rng)

    def coined(kind: str, form: str = "{}", **kwargs) -> None:
        w.entities(kind, [form.format(x) for x in nm.unique_words(counts[kind], **kwargs)])

    short = {"min_syllables": 1, "max_syllables": 2}
    w.entities("gender", ["Male", "Female"])
    coined("continent", endings=("a", "ia"), **short)
    country_names = nm.unique_words(counts["country"], endings=_COUNTRY_ENDINGS, **short)
    w.entities("country", country_names)
    coined("language_family", "{} languages", endings=("ic",))
    coined("language", endings=_LANGUAGE_ENDINGS, **short)
    coined("time_zone", "{} Standard Time", **short)
    units = nm.pick(_CURRENCY_UNITS, counts["currency"])
    w.entities("currency", [f"{x} {u}" for x, u in zip(nm.unique_words(counts["currency"], **short), units)])
    coined("religion", "{}ism", **short)
    for kind, fixed in (("profession", _PROFESSIONS), ("genre", _GENRES), ("industry", _INDUSTRIES),
                        ("sport", _SPORTS), ("position", _POSITIONS)):
        w.entities(kind, list(fixed[: counts[kind]]))
    cities = nm.unique_words(counts["city"], min_syllables=1, max_syllables=3, endings=_CITY_ENDINGS)
    city_names = nm.with_namesakes(cities, 0.04)
    w.entities("city", city_names)
    person_names = nm.persons(counts["person"])
    w.entities("person", person_names)
    w.entities("organisation", nm.organisations(counts["organisation"]))
    surnames = [n.split(" ", 1)[1] for n in person_names]
    w.entities("university", nm.universities(counts["university"], city_names, surnames))
    w.team_city = w.zipf(len(city_names), counts["sports_team"], 0.8)
    w.entities("sports_team", nm.teams([city_names[c] for c in w.team_city.tolist()]))
    w.entities("award", nm.awards(counts["award"]))
    w.entities("film", nm.films(counts["film"], city_names + country_names))
    w.entities("character", nm.characters(counts["character"], person_names))


def _geography(w: _WorldBuilder) -> None:
    """Cities in countries on continents, time zones, capitals, languages, currencies, populations."""
    rng, r = w.rng, w.ranges
    continents, countries, families, languages = r["continent"], r["country"], r["language_family"], r["language"]
    zones, currencies, cities = r["time_zone"], r["currency"], r["city"]
    n_countries, n_cities = len(countries), len(cities)
    # Every country gets at least one city (its first is the capital); the rest go Zipf-wise.
    city_country = np.concatenate([np.arange(n_countries), w.zipf(n_countries, max(0, n_cities - n_countries))])
    w.city_country = city_country
    capitals = np.arange(n_countries)
    w.add(CONTAINEDBY, cities, countries[city_country])
    # Each country spans one to three time zones; its cities use one of them.
    zones_per_country = rng.integers(1, 4, size=n_countries)
    country_zones = w.zipf(len(zones), n_countries * 3).reshape(n_countries, 3)
    pick = (rng.random(n_cities) * zones_per_country[city_country]).astype(np.int64)
    w.add(TIME_ZONES, cities, zones[country_zones[city_country, pick]])
    population = np.exp(rng.uniform(np.log(2_000), np.log(3_000_000), size=n_cities)).astype(np.int64)
    population[capitals] *= 4
    w.add(POPULATION, cities, _integers(population))

    w.add(CONTAINEDBY, countries, continents[w.zipf(len(continents), n_countries, 0.5)])
    w.add(CAPITAL, countries, cities[capitals])
    official = w.zipf(len(languages), n_countries, 0.9)
    w.country_language = official
    w.add(OFFICIAL_LANGUAGE, countries, languages[official])
    second = w.some(n_countries, 0.15)
    w.add(OFFICIAL_LANGUAGE, countries[second], languages[(official[second] + 1) % len(languages)])
    spoken_counts = rng.integers(0, 3, size=n_countries)
    spoken_from = np.repeat(np.arange(n_countries), spoken_counts)
    w.add(LANGUAGES_SPOKEN, countries, languages[official])
    extra = w.zipf(len(languages), len(spoken_from), 0.7)
    keep = extra != official[spoken_from]
    w.add(LANGUAGES_SPOKEN, countries[spoken_from[keep]], languages[extra[keep]])
    currency = np.arange(n_countries) % len(currencies)
    shared = w.some(n_countries, 0.25)
    currency[shared] = w.zipf(len(currencies), len(shared))
    w.add(CURRENCY, countries, currencies[currency])
    country_population = np.bincount(city_country, weights=population, minlength=n_countries).astype(np.int64)
    w.add(POPULATION, countries, _integers(country_population * rng.integers(3, 12, size=n_countries)))
    w.add(LANGUAGE_FAMILY, languages, families[w.zipf(len(families), len(languages), 0.6)])


def _people(w: _WorldBuilder) -> None:
    """Persons: roles, nationality, birth, professions, languages, religion, parents, marriages."""
    rng, r = w.rng, w.ranges
    genders, countries, languages, religions = r["gender"], r["country"], r["language"], r["religion"]
    professions, cities, persons = r["profession"], r["city"], r["person"]
    city_country = w.city_country
    n = len(persons)
    # Roles decide professions and who acts, directs or plays: fixed shares, at least one each.
    role_counts = np.maximum(1, (np.array([0.35, 0.06, 0.20]) * n).astype(np.int64))
    roles = np.full(n, 3)
    order = rng.permutation(n)
    start = 0
    for role, count in enumerate(role_counts.tolist()):
        roles[order[start : start + count]] = role
        start += count
    w.roles = roles

    w.add(GENDER, persons, genders[rng.integers(2, size=n)])
    nationality = w.zipf(len(countries), n)
    w.add(NATIONALITY, persons, countries[nationality])
    # Born in a city of one's own country mostly; cities sorted by country give each country a slice.
    by_country = np.argsort(city_country, kind="stable")
    starts = np.searchsorted(city_country[by_country], np.arange(len(countries)))
    sizes = np.bincount(city_country, minlength=len(countries))
    home = by_country[starts[nationality] + (rng.random(n) * sizes[nationality]).astype(np.int64)]
    abroad = w.some(n, 0.15)
    home[abroad] = w.zipf(len(cities), len(abroad))
    w.add(PLACE_OF_BIRTH, persons, cities[home])
    dob = rng.integers(0, 106 * 365, size=n)  # 1900 .. 2005
    w.add(DATE_OF_BIRTH, persons, _dates(dob))
    birth_year = _year_of(dob)

    primary = np.where(roles < 3, roles, 3 + w.zipf(len(professions) - 3, n))
    w.add(PROFESSION, persons, professions[primary])
    second = w.some(n, 0.3)
    other = 3 + w.zipf(len(professions) - 3, len(second))
    keep = other != primary[second]
    w.add(PROFESSION, persons[second[keep]], professions[other[keep]])
    w.add(LANGUAGES, persons, languages[w.country_language[nationality]])
    extra = w.some(n, 0.3)
    lang = w.zipf(len(languages), len(extra), 0.8)
    keep = lang != w.country_language[nationality[extra]]
    w.add(LANGUAGES, persons[extra[keep]], languages[lang[keep]])
    believers = w.some(n, 0.6)
    w.add(RELIGION, persons[believers], religions[w.zipf(len(religions), len(believers))])

    # Parents: born 20 to 40 years before the child.
    by_age = np.argsort(dob, kind="stable")
    sorted_dob = dob[by_age]
    for share in (0.35, 0.15):
        children = w.some(n, share)
        lo = np.searchsorted(sorted_dob, dob[children] - 40 * 365)
        hi = np.searchsorted(sorted_dob, dob[children] - 20 * 365)
        ok = hi > lo
        children, lo, hi = children[ok], lo[ok], hi[ok]
        parent = by_age[lo + (rng.random(len(children)) * (hi - lo)).astype(np.int64)]
        w.add(PARENTS, persons[children], persons[parent])

    # Marriages (CVT): pairs of adults, a tenth of them married twice.
    adults = np.flatnonzero(birth_year <= 2000)
    married = rng.permutation(adults)[: 2 * int(0.55 * len(adults) / 2)]
    again = rng.permutation(married)[: 2 * int(0.1 * len(married) / 2)]
    pairs = np.concatenate([married, again]).reshape(-1, 2)
    m = w.mediators("people.marriage", len(pairs))
    w.add(SPOUSE_S, persons[pairs[:, 0]], m)
    w.add(SPOUSE_S, persons[pairs[:, 1]], m)
    w.add(MARRIAGE_SPOUSE, m, persons[pairs[:, 0]])
    w.add(MARRIAGE_SPOUSE, m, persons[pairs[:, 1]])
    wed = np.maximum(dob[pairs[:, 0]], dob[pairs[:, 1]]) + rng.integers(20 * 365, 40 * 365, size=len(pairs))
    w.add(MARRIAGE_FROM, m, _dates(np.minimum(wed, 124 * 365)))
    w.birth_year = birth_year


def _institutions(w: _WorldBuilder) -> None:
    """Education, organisations, universities, awards won, sports teams and their rosters."""
    rng, r = w.rng, w.ranges
    industries, cities, persons, orgs = r["industry"], r["city"], r["person"], r["organisation"]
    universities, awards, sports, positions, teams = (
        r["university"], r["award"], r["sport"], r["position"], r["sports_team"])
    team_city = w.team_city
    n = len(persons)
    roles, birth_year = w.roles, w.birth_year

    # Education (CVT): none, one or two degrees.
    degrees = rng.choice(3, size=n, p=[0.25, 0.6, 0.15])
    student = np.repeat(np.arange(n), degrees)
    edu = w.mediators("education.education", len(student))
    w.add(EDUCATION, persons[student], edu)
    w.add(EDU_INSTITUTION, edu, universities[w.zipf(len(universities), len(student), 0.8)])
    w.add(EDU_STUDENT, edu, persons[student])
    graduated = np.minimum(birth_year[student] + rng.integers(21, 31, size=len(student)), 2024)
    w.add(EDU_END, edu, _dates(_days_of_year(graduated, rng)))

    # Organisations.
    founded = np.minimum(1850 + rng.integers(0, 171, size=len(orgs)), 2020)
    w.add(DATE_FOUNDED, orgs, _dates(_days_of_year(founded, rng)))
    w.add(PLACE_FOUNDED, orgs, cities[w.zipf(len(cities), len(orgs))])
    w.add(INDUSTRY, orgs, industries[w.zipf(len(industries), len(orgs), 0.7)])
    business = np.flatnonzero(roles == 3)
    founder_counts = rng.integers(1, 3, size=len(orgs))
    founded_by = np.repeat(np.arange(len(orgs)), founder_counts)
    founders = business[rng.integers(len(business), size=len(founded_by))]
    first = np.ones(len(founded_by), dtype=bool)
    first[1:] = founded_by[1:] != founded_by[:-1]
    keep = first | (founders != np.roll(founders, 1))  # no one founds the same organisation twice
    w.add(FOUNDERS, orgs[founded_by[keep]], persons[founders[keep]])

    # Universities.
    w.add(CONTAINEDBY, universities, cities[w.zipf(len(cities), len(universities))])
    opened = 1100 + rng.integers(0, 911, size=len(universities))
    w.add(DATE_FOUNDED, universities, _dates(_days_of_year(opened, rng)))
    w.add(UNDERGRADUATES, universities, _integers(rng.integers(500, 60_000, size=len(universities))))

    # Awards and who won them (CVT).
    w.add(PRESENTED_BY, awards, orgs[w.zipf(len(orgs), len(awards))])
    share = np.array([0.15, 0.15, 0.05, 0.02])[roles]
    winners = np.flatnonzero(rng.random(n) < share)
    wins = np.repeat(winners, rng.integers(1, 3, size=len(winners)))
    honor = w.mediators("award.award_honor", len(wins))
    w.add(AWARDS_WON, persons[wins], honor)
    w.add(HONOR_AWARD, honor, awards[w.zipf(len(awards), len(wins))])
    w.add(HONOR_WINNER, honor, persons[wins])
    w.add(HONOR_YEAR, honor, _years(np.minimum(birth_year[wins] + rng.integers(25, 50, size=len(wins)), 2024)))

    # Sports teams and their rosters (CVT).
    w.add(TEAM_SPORT, teams, sports[rng.integers(len(sports), size=len(teams))])
    w.add(TEAM_LOCATION, teams, cities[team_city])
    athletes = np.flatnonzero(roles == _ATHLETE)
    stints = np.repeat(athletes, rng.choice(3, size=len(athletes), p=[0.6, 0.3, 0.1]) + 1)
    roster = w.mediators("sports.sports_team_roster", len(stints))
    w.add(ROSTER, teams[w.zipf(len(teams), len(stints), 0.8)], roster)
    w.add(ROSTER_PLAYER, roster, persons[stints])
    joined = np.minimum(birth_year[stints] + rng.integers(18, 32, size=len(stints)), 2024)
    w.add(ROSTER_FROM, roster, _years(joined))
    w.add(ROSTER_POSITION, roster, positions[rng.integers(len(positions), size=len(stints))])


def _films(w: _WorldBuilder) -> None:
    """Films: direction, production, release, language, country, genres and performances."""
    rng, r = w.rng, w.ranges
    countries, languages, genres, orgs, films = r["country"], r["language"], r["genre"], r["organisation"], r["film"]
    characters = r["character"]
    n = len(films)
    roles = w.roles
    directors = np.flatnonzero(roles == _DIRECTOR)
    actors = np.flatnonzero(roles == _ACTOR)
    persons = r["person"]
    w.add(DIRECTED_BY, films, persons[directors[w.zipf(len(directors), n, 0.8)]])
    co = w.some(n, 0.08)
    co_director = directors[w.zipf(len(directors), len(co), 0.8)]
    w.add(DIRECTED_BY, films[co], persons[co_director])
    w.add(PRODUCED_BY, films, orgs[w.zipf(len(orgs), n)])
    w.add(RELEASE_DATE, films, _dates(rng.integers(30 * 365, 124 * 365, size=n)))
    country = w.zipf(len(countries), n)
    w.add(FILM_COUNTRY, films, countries[country])
    language = np.where(rng.random(n) < 0.7, w.country_language[country], w.zipf(len(languages), n, 0.8))
    w.add(FILM_LANGUAGE, films, languages[language])
    w.add(GENRE, films, genres[w.zipf(len(genres), n, 0.7)])
    second = w.some(n, 0.4)
    w.add(GENRE, films[second], genres[w.zipf(len(genres), len(second), 0.7)])
    # Performances (CVT): at least two per film, four on average, each a new character.
    extra = rng.integers(n, size=len(characters) - 2 * n)
    per_film = np.sort(np.concatenate([np.repeat(np.arange(n), 2), extra]))
    perf = w.mediators("film.performance", len(per_film))
    w.add(STARRING, films[per_film], perf)
    w.add(PERF_ACTOR, perf, persons[actors[w.zipf(len(actors), len(perf), 0.9)]])
    w.add(PERF_CHARACTER, perf, characters)


# --- questions -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PathPattern:
    """A relation path asked about entities of type `start`, with paraphrase templates (`{e}` = topic)."""

    start: str
    path: tuple[str, ...]
    templates: tuple[str, ...]


def _p(start: str, path: Sequence[str], *templates: str) -> PathPattern:
    return PathPattern(start, tuple(path), templates)


@dataclass(frozen=True)
class JointPattern:
    """Two relation paths from topic entities of types `starts` that meet at the answers (`{a}`, `{b}` = topics)."""

    starts: tuple[str, str]
    paths: tuple[tuple[str, ...], tuple[str, ...]]
    templates: tuple[str, ...]


_I = inverse
PATTERNS: tuple[PathPattern, ...] = (
    # 1 hop
    _p("person", [NATIONALITY], "What is the nationality of {e}?", "Which country is {e} a citizen of?", "What country does {e} come from?"),
    _p("person", [PLACE_OF_BIRTH], "Where was {e} born?", "What is the birthplace of {e}?", "In which city was {e} born?"),
    _p("person", [DATE_OF_BIRTH], "When was {e} born?", "What is the date of birth of {e}?", "On what date was {e} born?"),
    _p("person", [PROFESSION], "What is the profession of {e}?", "What does {e} do for a living?", "What is {e}'s occupation?"),
    _p("person", [LANGUAGES], "What languages does {e} speak?", "Which language is spoken by {e}?"),
    _p("person", [RELIGION], "What religion does {e} follow?", "What is {e}'s religion?", "Which faith does {e} practise?"),
    _p("person", [GENDER], "What is the gender of {e}?", "Is {e} male or female?"),
    _p("person", [PARENTS], "Who are the parents of {e}?", "Who is a parent of {e}?", "Whose child is {e}?"),
    _p("person", [_I(PARENTS)], "Who are the children of {e}?", "Who is a child of {e}?", "Name the children of {e}."),
    _p("person", [_I(DIRECTED_BY)], "Which films did {e} direct?", "What movies were directed by {e}?", "{e} directed which films?"),
    _p("person", [_I(FOUNDERS)], "Which organisations did {e} found?", "What company was founded by {e}?", "{e} is a founder of which organisation?"),
    _p("city", [CONTAINEDBY], "Which country is {e} in?", "In what country is {e} located?", "{e} is a city in which country?"),
    _p("city", [TIME_ZONES], "What time zone is {e} in?", "Which time zone does {e} use?", "What is the time zone of {e}?"),
    _p("city", [POPULATION], "What is the population of {e}?", "How many people live in {e}?"),
    _p("city", [_I(CAPITAL)], "{e} is the capital of which country?", "Which country has {e} as its capital?", "Of what country is {e} the capital?"),
    _p("city", [_I(TEAM_LOCATION)], "Which sports teams are based in {e}?", "What teams play in {e}?", "Name a sports team from {e}."),
    _p("city", [_I(PLACE_FOUNDED)], "Which organisations were founded in {e}?", "What companies started in {e}?"),
    _p("country", [CAPITAL], "What is the capital of {e}?", "Which city is the capital of {e}?", "Where is the seat of government of {e}?"),
    _p("country", [OFFICIAL_LANGUAGE], "What is the official language of {e}?", "Which language is official in {e}?"),
    _p("country", [LANGUAGES_SPOKEN], "What languages are spoken in {e}?", "Which languages do people speak in {e}?"),
    _p("country", [CURRENCY], "What currency does {e} use?", "What is the currency of {e}?", "What money is used in {e}?"),
    _p("country", [POPULATION], "What is the population of {e}?", "How many people live in {e}?"),
    _p("country", [CONTAINEDBY], "On which continent is {e}?", "{e} is part of which continent?"),
    _p("film", [DIRECTED_BY], "Who directed {e}?", "Who is the director of {e}?", "{e} was directed by whom?"),
    _p("film", [PRODUCED_BY], "Which company produced {e}?", "What studio made {e}?", "Who produced the film {e}?"),
    _p("film", [RELEASE_DATE], "When was {e} released?", "What is the release date of {e}?", "When did {e} come out?"),
    _p("film", [FILM_LANGUAGE], "What language is {e} in?", "In which language was {e} made?"),
    _p("film", [FILM_COUNTRY], "Which country is {e} from?", "In what country was {e} produced?"),
    _p("film", [GENRE], "What genre is {e}?", "What kind of film is {e}?", "Which genre does {e} belong to?"),
    _p("organisation", [FOUNDERS], "Who founded {e}?", "Who are the founders of {e}?", "{e} was founded by whom?"),
    _p("organisation", [PLACE_FOUNDED], "Where was {e} founded?", "In which city was {e} established?"),
    _p("organisation", [DATE_FOUNDED], "When was {e} founded?", "In what year was {e} established?"),
    _p("organisation", [INDUSTRY], "What industry is {e} in?", "What business is {e} in?"),
    _p("organisation", [_I(PRODUCED_BY)], "Which films did {e} produce?", "What movies were made by {e}?"),
    _p("organisation", [_I(PRESENTED_BY)], "Which awards does {e} present?", "What award is given by {e}?"),
    _p("university", [CONTAINEDBY], "In which city is {e}?", "Where is {e} located?"),
    _p("university", [DATE_FOUNDED], "When was {e} founded?", "When was {e} established?"),
    _p("university", [UNDERGRADUATES], "How many undergraduates does {e} have?", "What is the number of undergraduate students at {e}?"),
    _p("sports_team", [TEAM_SPORT], "What sport does {e} play?", "Which sport is {e} a team in?"),
    _p("sports_team", [TEAM_LOCATION], "Where are {e} based?", "Which city do {e} play in?", "What is the home city of {e}?"),
    _p("award", [PRESENTED_BY], "Who presents the {e}?", "Which organisation awards the {e}?"),
    _p("language", [LANGUAGE_FAMILY], "Which language family does {e} belong to?", "What family is the {e} language part of?"),
    _p("language_family", [_I(LANGUAGE_FAMILY)], "Which languages belong to the {e}?", "Name a language in the {e}."),
    # 2 hops
    _p("person", [SPOUSE_S, MARRIAGE_SPOUSE], "Who is {e} married to?", "Who is the spouse of {e}?", "Whom did {e} marry?"),
    _p("person", [SPOUSE_S, MARRIAGE_FROM], "When did {e} get married?", "On what date did {e} marry?", "What is the wedding date of {e}?"),
    _p("person", [EDUCATION, EDU_INSTITUTION], "Where did {e} study?", "Which university did {e} attend?", "What school did {e} go to?"),
    _p("person", [EDUCATION, EDU_END], "When did {e} graduate?", "When did {e} finish their studies?"),
    _p("person", [AWARDS_WON, HONOR_AWARD], "What awards has {e} won?", "Which award did {e} receive?", "{e} won which award?"),
    _p("person", [AWARDS_WON, HONOR_YEAR], "In what year did {e} win an award?", "When was {e} honoured with an award?"),
    _p("person", [_I(PERF_ACTOR), _I(STARRING)], "Which films did {e} act in?", "What movies has {e} appeared in?", "{e} starred in which films?"),
    _p("person", [_I(PERF_ACTOR), PERF_CHARACTER], "Which characters did {e} play?", "What roles has {e} played?", "Who did {e} portray on screen?"),
    _p("person", [_I(ROSTER_PLAYER), _I(ROSTER)], "Which team did {e} play for?", "What sports team has {e} played for?", "{e} was a player on which team?"),
    _p("person", [_I(ROSTER_PLAYER), ROSTER_POSITION], "What position does {e} play?", "Which position did {e} play in?"),
    _p("person", [PLACE_OF_BIRTH, CONTAINEDBY], "In which country was {e} born?", "{e} was born in which country?", "What country is the birthplace of {e} in?"),
    _p("person", [PLACE_OF_BIRTH, TIME_ZONES], "What time zone was {e} born in?", "What is the time zone of {e}'s birthplace?"),
    _p("person", [NATIONALITY, CAPITAL], "What is the capital of {e}'s country?", "What is the capital of the country {e} is a citizen of?"),
    _p("person", [NATIONALITY, OFFICIAL_LANGUAGE], "What is the official language of {e}'s country?", "Which language is official in the country of {e}?"),
    _p("person", [NATIONALITY, CURRENCY], "What currency is used in {e}'s home country?", "Which currency does the country of {e} use?"),
    _p("person", [PARENTS, NATIONALITY], "What is the nationality of {e}'s parents?", "Which country are the parents of {e} from?"),
    _p("person", [_I(PARENTS), DATE_OF_BIRTH], "When were {e}'s children born?", "What are the birth dates of {e}'s children?"),
    _p("city", [CONTAINEDBY, CAPITAL], "What is the capital of the country where {e} is?", "{e} lies in a country whose capital is what?"),
    _p("city", [CONTAINEDBY, OFFICIAL_LANGUAGE], "What is the official language in {e}?", "What language is officially spoken in {e}?"),
    _p("city", [CONTAINEDBY, CONTAINEDBY], "Which continent is {e} on?", "On what continent is {e} located?"),
    _p("city", [CONTAINEDBY, CURRENCY], "What currency is used in {e}?", "What money do they use in {e}?"),
    _p("city", [_I(TEAM_LOCATION), TEAM_SPORT], "What sports do teams from {e} play?", "Which sport is played by teams based in {e}?"),
    _p("city", [_I(PLACE_OF_BIRTH), PROFESSION], "What professions do people born in {e} have?", "What do people from {e} do for a living?"),
    _p("country", [CAPITAL, TIME_ZONES], "What time zone is the capital of {e} in?", "Which time zone does the capital of {e} use?"),
    _p("country", [CAPITAL, POPULATION], "What is the population of the capital of {e}?", "How many people live in {e}'s capital?"),
    _p("country", [OFFICIAL_LANGUAGE, LANGUAGE_FAMILY], "Which language family does the official language of {e} belong to?", "To what family does the official language of {e} belong?"),
    _p("film", [DIRECTED_BY, NATIONALITY], "What is the nationality of the director of {e}?", "Which country is the director of {e} from?"),
    _p("film", [DIRECTED_BY, DATE_OF_BIRTH], "When was the director of {e} born?", "What is the birth date of the person who directed {e}?"),
    _p("film", [DIRECTED_BY, PLACE_OF_BIRTH], "Where was the director of {e} born?", "In which city was the director of {e} born?"),
    _p("film", [STARRING, PERF_ACTOR], "Who acted in {e}?", "Who starred in {e}?", "Which actors appear in {e}?"),
    _p("film", [STARRING, PERF_CHARACTER], "Which characters appear in {e}?", "Who are the characters in {e}?"),
    _p("film", [DIRECTED_BY, _I(DIRECTED_BY)], "What other films did the director of {e} make?", "Which films share a director with {e}?"),
    _p("film", [FILM_COUNTRY, CAPITAL], "What is the capital of the country {e} comes from?", "Which city is the capital of the country of {e}?"),
    _p("film", [FILM_LANGUAGE, LANGUAGE_FAMILY], "Which language family does the language of {e} belong to?", "To which family does the language of {e} belong?"),
    _p("film", [PRODUCED_BY, PLACE_FOUNDED], "Where was the company that produced {e} founded?", "In which city was the producer of {e} founded?"),
    _p("organisation", [FOUNDERS, NATIONALITY], "What is the nationality of the founder of {e}?", "Which country is the founder of {e} from?"),
    _p("organisation", [FOUNDERS, DATE_OF_BIRTH], "When was the founder of {e} born?", "What is the birth date of the founder of {e}?"),
    _p("organisation", [PLACE_FOUNDED, CONTAINEDBY], "In which country was {e} founded?", "{e} was established in which country?"),
    _p("university", [CONTAINEDBY, CONTAINEDBY], "Which country is {e} in?", "In what country is {e} located?"),
    _p("university", [_I(EDU_INSTITUTION), EDU_STUDENT], "Who studied at {e}?", "Name alumni of {e}.", "Which people attended {e}?"),
    _p("sports_team", [TEAM_LOCATION, CONTAINEDBY], "Which country are {e} from?", "In what country are {e} based?"),
    _p("sports_team", [ROSTER, ROSTER_PLAYER], "Who has played for {e}?", "Name players of {e}.", "Which athletes were on the roster of {e}?"),
    _p("character", [_I(PERF_CHARACTER), PERF_ACTOR], "Who played {e}?", "Which actor portrayed {e}?", "Who plays the character {e}?"),
    _p("character", [_I(PERF_CHARACTER), _I(STARRING)], "In which film does {e} appear?", "Which movie features the character {e}?"),
    _p("award", [PRESENTED_BY, PLACE_FOUNDED], "Where was the organisation that presents the {e} founded?", "In which city was the presenter of the {e} founded?"),
    _p("award", [_I(HONOR_AWARD), HONOR_WINNER], "Who has won the {e}?", "Who received the {e}?", "Name winners of the {e}."),
    _p("language", [_I(OFFICIAL_LANGUAGE), CAPITAL], "What are the capitals of countries where {e} is official?", "Which capital city is in a country with {e} as official language?"),
    # 3 hops
    _p("person", [EDUCATION, EDU_INSTITUTION, CONTAINEDBY], "In which city is the university {e} attended?", "Where is the school that {e} went to?"),
    _p("person", [PLACE_OF_BIRTH, CONTAINEDBY, CAPITAL], "What is the capital of the country where {e} was born?", "Which city is the capital of {e}'s country of birth?"),
    _p("person", [PLACE_OF_BIRTH, CONTAINEDBY, OFFICIAL_LANGUAGE], "What is the official language of the country {e} was born in?", "Which language is official where {e} was born?"),
    _p("person", [PLACE_OF_BIRTH, CONTAINEDBY, CONTAINEDBY], "On which continent was {e} born?", "{e} was born on which continent?"),
    _p("person", [NATIONALITY, CAPITAL, TIME_ZONES], "What time zone is the capital of {e}'s country in?", "Which time zone does the capital of {e}'s nation use?"),
    _p("person", [_I(PERF_ACTOR), _I(STARRING), DIRECTED_BY], "Who directed the films {e} acted in?", "Which directors has {e} worked with?", "Who directed movies starring {e}?"),
    _p("person", [_I(PERF_ACTOR), _I(STARRING), RELEASE_DATE], "When were the films starring {e} released?", "What are the release dates of movies with {e}?"),
    _p("person", [_I(ROSTER_PLAYER), _I(ROSTER), TEAM_LOCATION], "In which city is the team {e} played for based?", "Where are the teams of {e} based?"),
    _p("person", [_I(ROSTER_PLAYER), _I(ROSTER), TEAM_SPORT], "What sport does {e} play?", "Which sport did {e} play professionally?"),
    _p("person", [AWARDS_WON, HONOR_AWARD, PRESENTED_BY], "Which organisation presented an award to {e}?", "Who presents the awards {e} has won?"),
    _p("person", [PARENTS, PLACE_OF_BIRTH, CONTAINEDBY], "In which country was a parent of {e} born?", "Where were {e}'s parents born (country)?"),
    _p("person", [_I(DIRECTED_BY), STARRING, PERF_ACTOR], "Which actors appeared in films directed by {e}?", "Who acted in movies that {e} directed?"),
    _p("film", [DIRECTED_BY, PLACE_OF_BIRTH, CONTAINEDBY], "In which country was the director of {e} born?", "The director of {e} was born in which country?"),
    _p("film", [DIRECTED_BY, NATIONALITY, CAPITAL], "What is the capital of the director of {e}'s country?", "Which city is the capital of the country the director of {e} comes from?"),
    _p("film", [DIRECTED_BY, EDUCATION, EDU_INSTITUTION], "Where did the director of {e} study?", "Which university did the director of {e} attend?"),
    _p("film", [STARRING, PERF_ACTOR, NATIONALITY], "What nationalities do the actors of {e} have?", "Which countries are the actors in {e} from?"),
    _p("film", [STARRING, PERF_ACTOR, DATE_OF_BIRTH], "When were the actors of {e} born?", "What are the birth dates of the cast of {e}?"),
    _p("film", [PRODUCED_BY, FOUNDERS, NATIONALITY], "What is the nationality of the founder of the company that produced {e}?", "Which country is the founder of {e}'s studio from?"),
    _p("film", [FILM_COUNTRY, OFFICIAL_LANGUAGE, LANGUAGE_FAMILY], "Which language family is the official language of {e}'s country in?", "To what family does the official language of the country of {e} belong?"),
    _p("film", [PRODUCED_BY, PLACE_FOUNDED, CONTAINEDBY], "In which country was the studio behind {e} founded?", "The producer of {e} was founded in which country?"),
    _p("city", [CONTAINEDBY, CAPITAL, TIME_ZONES], "What time zone is the capital of {e}'s country in?", "Which time zone does the capital of the country containing {e} use?"),
    _p("city", [CONTAINEDBY, OFFICIAL_LANGUAGE, LANGUAGE_FAMILY], "Which language family does the official language of {e} belong to?", "To what family does the official language spoken in {e} belong?"),
    _p("city", [_I(TEAM_LOCATION), ROSTER, ROSTER_PLAYER], "Who has played for teams based in {e}?", "Name athletes of teams from {e}."),
    _p("organisation", [FOUNDERS, PLACE_OF_BIRTH, CONTAINEDBY], "In which country was the founder of {e} born?", "The founder of {e} was born in which country?"),
    _p("organisation", [PLACE_FOUNDED, CONTAINEDBY, CAPITAL], "What is the capital of the country where {e} was founded?", "Which city is the capital of the country {e} was established in?"),
    _p("organisation", [_I(PRODUCED_BY), DIRECTED_BY, NATIONALITY], "What nationalities do directors of films by {e} have?", "Which countries are the directors of {e}'s films from?"),
    _p("university", [CONTAINEDBY, CONTAINEDBY, CONTAINEDBY], "On which continent is {e}?", "{e} is located on which continent?"),
    _p("university", [CONTAINEDBY, CONTAINEDBY, OFFICIAL_LANGUAGE], "What is the official language where {e} is located?", "Which language is official in the country of {e}?"),
    _p("university", [_I(EDU_INSTITUTION), EDU_STUDENT, NATIONALITY], "What nationalities do alumni of {e} have?", "Which countries are graduates of {e} from?"),
    _p("sports_team", [TEAM_LOCATION, CONTAINEDBY, CAPITAL], "What is the capital of the country {e} are from?", "Which city is the capital of the home country of {e}?"),
    _p("sports_team", [ROSTER, ROSTER_PLAYER, NATIONALITY], "Where are the players of {e} from?", "What nationalities do players of {e} have?"),
    _p("character", [_I(PERF_CHARACTER), PERF_ACTOR, NATIONALITY], "What is the nationality of the actor who played {e}?", "Which country is the actor playing {e} from?"),
    _p("character", [_I(PERF_CHARACTER), _I(STARRING), DIRECTED_BY], "Who directed the film featuring {e}?", "Which director made the movie with the character {e}?"),
    _p("character", [_I(PERF_CHARACTER), _I(STARRING), RELEASE_DATE], "When was the film featuring {e} released?", "When did the movie with {e} come out?"),
    _p("award", [_I(HONOR_AWARD), HONOR_WINNER, NATIONALITY], "What countries are winners of the {e} from?", "What nationality do winners of the {e} have?"),
    _p("award", [PRESENTED_BY, PLACE_FOUNDED, CONTAINEDBY], "In which country is the organisation that presents the {e} from?", "The {e} is presented by an organisation founded in which country?"),
)

JOINT_PATTERNS: tuple[JointPattern, ...] = (
    JointPattern(("city", "country"), ((inverse(PLACE_OF_BIRTH),), (inverse(NATIONALITY),)),
                 ("Which people born in {a} are citizens of {b}?", "Who was born in {a} and has the nationality of {b}?")),
    JointPattern(("person", "language"), ((inverse(DIRECTED_BY),), (inverse(FILM_LANGUAGE),)),
                 ("Which films directed by {a} are in {b}?", "What {b}-language films did {a} direct?")),
    JointPattern(("person", "city"), ((inverse(ROSTER_PLAYER), inverse(ROSTER)), (inverse(TEAM_LOCATION),)),
                 ("Which team based in {b} did {a} play for?", "{a} played for which team from {b}?")),
    JointPattern(("country", "genre"), ((inverse(FILM_COUNTRY),), (inverse(GENRE),)),
                 ("Which films from {a} are of the genre {b}?", "Name a {b} film produced in {a}.")),
    JointPattern(("city", "profession"), ((inverse(PLACE_OF_BIRTH),), (inverse(PROFESSION),)),
                 ("Which people born in {a} work as {b}?", "Who from {a} has the profession {b}?")),
    JointPattern(("university", "country"), ((inverse(EDU_INSTITUTION), EDU_STUDENT), (inverse(NATIONALITY),)),
                 ("Which alumni of {a} are citizens of {b}?", "Who studied at {a} and has the nationality of {b}?")),
    JointPattern(("organisation", "person"), ((inverse(PRODUCED_BY),), (inverse(PERF_ACTOR), inverse(STARRING))),
                 ("Which films produced by {a} did {b} act in?", "{b} appeared in which films made by {a}?")),
)

_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")


def literal_aliases(literal: str) -> tuple[str, ...]:
    """Other common spellings of a literal's value: dates in words, integers with thousands separators."""
    value = literal_value(literal)
    if literal.endswith(f"<{XSD_DATE}>"):
        day = datetime.date.fromisoformat(value)
        return (f"{_MONTHS[day.month - 1]} {day.day}, {day.year}", f"{day.day} {_MONTHS[day.month - 1]} {day.year}")
    if literal.endswith(f"<{XSD_INTEGER}>") and abs(int(value)) >= 1000:
        return (f"{int(value):,}",)
    return ()


@dataclass
class SyntheticData:
    """A generated world and its questions.

    Attributes:
        subjects, relations, objects: the triples as three equal-length object arrays of ids.
        names: id -> label of every named entity (mediators and literals have none).
        examples: the questions, splits assigned (grouped scheme, seeded).
        nodes_by_type: entity type (`person`, `city`, ...) or mediator kind (`people.marriage`,
            `film.performance`, ...) -> the ids of its nodes (every one has an edge).
        mediator_kinds: the keys of `nodes_by_type` that are mediator kinds.
        seed, scale: what the world was generated from (`scale_for`).
    """

    subjects: np.ndarray
    relations: np.ndarray
    objects: np.ndarray
    names: dict[str, str]
    examples: list[QAExample]
    nodes_by_type: dict[str, list[str]] = field(default_factory=dict)
    mediator_kinds: tuple[str, ...] = ()
    seed: int = 0
    scale: float = 1.0

    @property
    def num_triples(self) -> int:
        return len(self.subjects)

    def triples(self) -> Iterator[tuple[str, str, str]]:
        return zip(self.subjects.tolist(), self.relations.tolist(), self.objects.tolist())

    def kg(self) -> MemoryKG:
        """The world as an embedded KG (mediators unnamed, literals flagged)."""
        return MemoryKG(self.subjects, self.relations, self.objects, self.names)

    def stats(self) -> dict[str, object]:
        """Sizes worth printing: triples, node kinds, hubs, questions per hop, splits, backward steps."""
        degrees = pd.Series(np.concatenate([self.subjects, self.objects])).value_counts(sort=False)
        nodes = degrees.index.to_numpy(dtype=object)
        literal = np.fromiter((is_literal_id(x) for x in nodes), dtype=bool, count=len(nodes))
        degrees = degrees.to_numpy()
        top = int(np.argmax(degrees))
        steps = [r for e in self.examples for r in e.gold_paths[0]]
        return {
            "triples": self.num_triples,
            "relation_types": len(set(self.relations.tolist())),
            "named_entities": len(self.names),
            "mediators": sum(len(self.nodes_by_type[kind]) for kind in self.mediator_kinds),
            "literals": int(literal.sum()),
            "max_degree": int(degrees[top]),
            "max_degree_entity": f"{nodes[top]} ({self.names.get(str(nodes[top]), '?')})",
            "nodes_with_degree_200+": int((degrees >= 200).sum()),
            "questions": len(self.examples),
            "questions_by_hops": dict(sorted(Counter(e.hops for e in self.examples).items())),
            "splits": dict(Counter(e.split for e in self.examples)),
            "backward_step_share": round(sum(r.startswith(INVERSE_PREFIX) for r in steps) / max(1, len(steps)), 3),
        }


def _step_starts(world: _WorldBuilder) -> dict[str, np.ndarray]:
    """Path step (`rel` or `^rel`) -> the node indices that have at least one such edge."""
    starts: dict[str, list[np.ndarray]] = {}
    for relation, subjects, objects in world.chunks:
        starts.setdefault(relation, []).append(subjects)
        if isinstance(objects, np.ndarray):
            starts.setdefault(inverse(relation), []).append(objects)
    return {step: np.unique(np.concatenate(parts)) for step, parts in starts.items()}


def _unambiguous(names: list[str]) -> np.ndarray:
    """Mask of named entities whose name no other entity has, exactly or after normalisation."""
    exact = Counter(names)
    normalised = [normalize_answer(n) for n in names]
    loose = Counter(normalised)
    return np.array([exact[n] == 1 and loose[m] == 1 for n, m in zip(names, normalised)], dtype=bool)


def _make_answer(node: str, names: dict[str, str]) -> Answer:
    if is_literal_id(node):
        return Answer(id=node, name=literal_value(node), aliases=literal_aliases(node))
    return Answer(id=node, name=names[node])


def _make_questions(
    world: _WorldBuilder, ids: np.ndarray, names: dict[str, str], kg: MemoryKG, num_questions: int, seed: int,
    multi_topic_share: float = 0.0,
) -> list[QAExample]:
    """Questions balanced over 1, 2 and 3 hops, answers by executing each path on `kg`; `multi_topic_share`
    of them multi-topic (`_joint_drafts`).

    Patterns of a hop count take turns; each turn tries the pattern's next candidate topic (an
    unambiguously named entity of the right type with the path's first edge). Accepted (topic,
    path) groups get one to three paraphrases.
    """
    rng = world.rng
    starts = _step_starts(world)
    clear = _unambiguous(world.names)
    # Multi-topic questions first: the joint patterns may find fewer pairs than asked, and single ones fill in.
    joint = _joint_drafts(world, ids, names, kg, round(num_questions * multi_topic_share), clear)
    single = num_questions - len(joint)
    targets = [single // 3 + (1 if h < single % 3 else 0) for h in range(3)]
    drafts: list[tuple[str, PathPattern, str, tuple[Answer, ...]]] = []
    for hops, target in zip((1, 2, 3), targets):
        patterns = [p for p in PATTERNS if len(p.path) == hops]
        queues = []
        for pattern in patterns:
            typed = world.ranges[pattern.start]
            candidates = np.intersect1d(typed, starts.get(pattern.path[0], np.empty(0, np.int64)))
            queues.append(rng.permutation(candidates[clear[candidates]]).tolist())
        cursors = [0] * len(patterns)
        made = 0
        while made < target and any(c < len(q) for c, q in zip(cursors, queues)):
            for k, pattern in enumerate(patterns):
                if made >= target or cursors[k] >= len(queues[k]):
                    continue
                topic = ids[queues[k][cursors[k]]]
                cursors[k] += 1
                reached = execute_path(kg, topic, pattern.path)
                reached.discard(topic)
                if not 0 < len(reached) <= MAX_ANSWERS:
                    continue
                answers = tuple(sorted((_make_answer(x, names) for x in reached), key=lambda a: (a.name, a.id)))
                count = min(target - made, int(rng.integers(1, min(3, len(pattern.templates)) + 1)))
                for t in rng.permutation(len(pattern.templates))[:count].tolist():
                    drafts.append((topic, pattern, pattern.templates[t], answers))
                made += count
    order = rng.permutation(len(drafts) + len(joint)).tolist()
    examples = []
    for n, i in enumerate(order):
        common = dict(id=f"{SOURCE}-{seed}-{n:05d}", source=SOURCE)
        if i >= len(drafts):
            topics, pair, template, answers = joint[i - len(drafts)]
            examples.append(QAExample(
                question=template.format(a=names[topics[0]], b=names[topics[1]]),
                topic_entities=tuple(TopicEntity(id=t, name=names[t]) for t in topics), answers=answers,
                gold_paths=pair.paths, hops=max(map(len, pair.paths)), intersect=True, **common))
            continue
        topic, pattern, template, answers = drafts[i]
        examples.append(
            QAExample(
                question=template.format(e=names[topic]),
                topic_entities=(TopicEntity(id=topic, name=names[topic]),),
                answers=answers,
                gold_paths=(pattern.path,),
                hops=len(pattern.path),
                **common,
            )
        )
    return assign_splits(examples, "grouped", seed=seed)


def _backwards(path: Sequence[str]) -> tuple[str, ...]:
    """The path walked from its end back to its start."""
    return tuple(r[len(INVERSE_PREFIX):] if r.startswith(INVERSE_PREFIX) else inverse(r) for r in reversed(path))


def _joint_drafts(world: _WorldBuilder, ids: np.ndarray, names: dict[str, str], kg: MemoryKG, count: int,
                  clear: np.ndarray) -> list[tuple[tuple[str, str], JointPattern, str, tuple[Answer, ...]]]:
    """`count` multi-topic drafts, the joint patterns taking turns.

    Each turn draws a first topic with the first path's first edge, then tries, in a seeded order,
    the second topics that reach one of its answers by the second path; the first pair whose
    common answers are at most MAX_ANSWERS and fewer than either path's own answers is kept.
    """
    if count == 0:  # draws nothing from the world's generator: without them the questions are as they always were
        return []
    rng = world.rng
    starts = _step_starts(world)
    unambiguous = {ids[i] for i in np.flatnonzero(clear).tolist()}
    typed = {kind: set(ids[world.ranges[kind]].tolist()) for pattern in JOINT_PATTERNS for kind in pattern.starts}
    queues = []
    for pattern in JOINT_PATTERNS:
        firsts = np.intersect1d(world.ranges[pattern.starts[0]], starts.get(pattern.paths[0][0], np.empty(0, np.int64)))
        queues.append(rng.permutation(firsts[clear[firsts]]).tolist())
    cursors = [0] * len(JOINT_PATTERNS)
    drafts: list[tuple[tuple[str, str], JointPattern, str, tuple[Answer, ...]]] = []
    while len(drafts) < count and any(c < len(q) for c, q in zip(cursors, queues)):
        for k, pattern in enumerate(JOINT_PATTERNS):
            if len(drafts) >= count or cursors[k] >= len(queues[k]):
                continue
            first = ids[queues[k][cursors[k]]]
            cursors[k] += 1
            reached = sorted(execute_path(kg, first, pattern.paths[0]) - {first})
            if not reached:
                continue
            seconds = sorted({t for meeting in reached for t in execute_path(kg, meeting, _backwards(pattern.paths[1]))
                              if t in typed[pattern.starts[1]] and t in unambiguous and t != first})
            for index in rng.permutation(len(seconds)).tolist():
                second = seconds[index]
                other = execute_path(kg, second, pattern.paths[1]) - {second}
                both = set(reached) & other
                if 0 < len(both) <= MAX_ANSWERS and both != set(reached) and both != other:
                    answers = tuple(sorted((_make_answer(x, names) for x in both), key=lambda a: (a.name, a.id)))
                    template = pattern.templates[int(rng.integers(len(pattern.templates)))]
                    drafts.append(((first, second), pattern, template, answers))
                    break
    return drafts


def _materialise(world: _WorldBuilder, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The edge chunks as id triples in chunk order, each distinct triple once.

    Independent draws (a co-director, a second genre, a second parent) may repeat an edge.
    """
    subjects = np.concatenate([ids[s] for _, s, _ in world.chunks])
    relations = np.concatenate([np.full(len(s), r, dtype=object) for r, s, _ in world.chunks])
    objects = np.concatenate(
        [ids[o] if isinstance(o, np.ndarray) else np.asarray(o, dtype=object) for _, _, o in world.chunks]
    )
    keep = ~pd.DataFrame({"s": subjects, "r": relations, "o": objects}).duplicated().to_numpy()
    return subjects[keep], relations[keep], objects[keep]


def generate(
    seed: int = 0,
    num_entities: int | None = None,
    target_triples: int | None = None,
    num_questions: int = DEFAULT_QUESTIONS,
    multi_topic_share: float = DEFAULT_MULTI_TOPIC_SHARE,
) -> SyntheticData:
    """Generate the world and its questions, deterministically from `seed`.

    Args:
        seed: everything (names, edges, mids, questions, splits) follows from it.
        num_entities: about this many named entities (default: about 2,800). The world is
            sized for this many; the few drawn with no edge at all (an unused time zone, say)
            are left out, up to 3% in the smallest worlds, under 1% from the default size up.
        target_triples: at least this many triples (default: about 20k); when both are given
            the larger world wins.
        num_questions: how many questions, a third per hop count (fewer when the world has too
            few distinct (topic, path) groups, as tiny worlds may).
        multi_topic_share: the share of them that are multi-topic (two topic entities, answers
            the intersection of their paths); the rest are balanced over hop counts.
    """
    if num_questions < 0:
        raise ValueError(f"num_questions must be >= 0, got {num_questions}")
    if not 0.0 <= multi_topic_share <= 1.0:
        raise ValueError(f"multi_topic_share must be in [0, 1], got {multi_topic_share}")
    scale = scale_for(num_entities, target_triples)
    while True:
        rng = np.random.default_rng(seed)
        world = _build_world(rng, scale)
        ids = make_mids(world.num_nodes, int(rng.integers(_MID_SPACE)))
        subjects, relations, objects = _materialise(world, ids)
        if target_triples is None or len(subjects) >= target_triples:
            break
        scale *= 1.02 * target_triples / len(subjects)  # rare: the estimate fell short; grow and redo
    # A few drawn entities (a time zone no city chose, say) have no edge: they are not in the KG.
    used = np.zeros(world.num_nodes, dtype=bool)
    for _, s, o in world.chunks:
        used[s] = True
        if isinstance(o, np.ndarray):
            used[o] = True
    names = {ids[i]: world.names[i] for i in np.flatnonzero(used[: len(world.names)]).tolist()}
    kg = MemoryKG(subjects, relations, objects, names)
    examples = _make_questions(world, ids, names, kg, num_questions, seed, multi_topic_share)
    nodes_by_type = {kind: ids[idx[used[idx]]].tolist() for kind, idx in world.ranges.items()}
    for kind, parts in world.mediator_ranges.items():
        nodes_by_type[kind] = ids[np.concatenate(parts)].tolist()
    return SyntheticData(
        subjects, relations, objects, names, examples, nodes_by_type, tuple(world.mediator_ranges), seed, scale
    )


def write_synthetic(
    out_dir: str | Path,
    seed: int = 0,
    target_triples: int | None = None,
    num_entities: int | None = None,
    num_questions: int = DEFAULT_QUESTIONS,
    multi_topic_share: float = DEFAULT_MULTI_TOPIC_SHARE,
) -> Path:
    """Generate (see `generate`) and write `kb.tsv`, `names.tsv` and `questions.jsonl` into `out_dir`.

    The same arguments give byte-identical files. Returns `out_dir`.
    """
    data = generate(seed, num_entities=num_entities, target_triples=target_triples, num_questions=num_questions,
                    multi_topic_share=multi_topic_share)
    return write_data(data, out_dir)


def write_data(data: SyntheticData, out_dir: str | Path) -> Path:
    """Write an already generated world as a dataset folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "kb.tsv", "w", encoding="utf-8", newline="\n") as handle:
        handle.writelines(f"{s}\t{r}\t{o}\n" for s, r, o in data.triples())
    with open(out / "names.tsv", "w", encoding="utf-8", newline="\n") as handle:
        handle.writelines(f"{node}\t{label}\n" for node, label in data.names.items())
    write_jsonl(data.examples, out / "questions.jsonl")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data_gen.synthetic", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="dataset folder to write (kb.tsv, names.tsv, questions.jsonl)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the world and the questions")
    parser.add_argument("--target-triples", type=int, default=None, help="grow the KG to at least this many triples")
    parser.add_argument("--num-entities", type=int, default=None, help="about this many named entities")
    parser.add_argument("--questions", type=int, default=DEFAULT_QUESTIONS, help="number of questions")
    parser.add_argument("--multi-topic-share", type=float, default=DEFAULT_MULTI_TOPIC_SHARE,
                        help="share of multi-topic questions (answers: the intersection of two topics' paths)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        data = generate(
            args.seed, num_entities=args.num_entities, target_triples=args.target_triples, num_questions=args.questions,
            multi_topic_share=args.multi_topic_share,
        )
    except ValueError as err:
        parser.error(str(err))
    generated = time.perf_counter()
    write_data(data, args.out)
    written = time.perf_counter()
    print(f"wrote {args.out}: generated in {generated - started:.1f}s, written in {written - generated:.1f}s")
    for key, value in data.stats().items():
        print(f"  {key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
