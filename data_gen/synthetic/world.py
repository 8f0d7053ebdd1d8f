"""The world: how many entities of each type a scale gives, their mids, and the edges between them.

`build_world` draws everything from one seeded generator, in a fixed order: named entities type by
type (`TYPE_SIZES`), then geography, people, institutions and films; mediators (CVT nodes) get
their node indices after every named entity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from data_gen.synthetic.names import (
    ACTOR,
    ATHLETE,
    CITY_ENDINGS,
    COUNTRY_ENDINGS,
    CURRENCY_UNITS,
    DIRECTOR,
    GENRES,
    INDUSTRIES,
    LANGUAGE_ENDINGS,
    POSITIONS,
    PROFESSIONS,
    SPORTS,
    NameMaker,
)
from data_gen.synthetic.ontology import (
    AWARDS_WON,
    CAPITAL,
    CONTAINEDBY,
    CURRENCY,
    DATE_FOUNDED,
    DATE_OF_BIRTH,
    DIRECTED_BY,
    EDU_END,
    EDU_INSTITUTION,
    EDU_STUDENT,
    EDUCATION,
    FILM_COUNTRY,
    FILM_LANGUAGE,
    FOUNDERS,
    GENDER,
    GENRE,
    HONOR_AWARD,
    HONOR_WINNER,
    HONOR_YEAR,
    INDUSTRY,
    LANGUAGE_FAMILY,
    LANGUAGES,
    LANGUAGES_SPOKEN,
    MARRIAGE_FROM,
    MARRIAGE_SPOUSE,
    NATIONALITY,
    OFFICIAL_LANGUAGE,
    PARENTS,
    PERF_ACTOR,
    PERF_CHARACTER,
    PLACE_FOUNDED,
    PLACE_OF_BIRTH,
    POPULATION,
    PRESENTED_BY,
    PRODUCED_BY,
    PROFESSION,
    RELEASE_DATE,
    RELIGION,
    ROSTER,
    ROSTER_FROM,
    ROSTER_PLAYER,
    ROSTER_POSITION,
    SPOUSE_S,
    STARRING,
    TEAM_LOCATION,
    TEAM_SPORT,
    TIME_ZONES,
    UNDERGRADUATES,
    XSD_DATE,
    XSD_GYEAR,
    XSD_INTEGER,
)
from kgreasoner.records.ids import make_literal

MIN_NAMED_ENTITIES = 100


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
# Triples per unit of scale, a slight underestimate (measured: 18.8k-19.0k at scale 1, 18.6k at scale 11,
# across seeds), so that a scale computed from `target_triples` reaches the target on the first try.
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


# --- mids ----------------------------------------------------------------------------------------
_MID_ALPHABET = np.frombuffer(b"0123456789bcdfghjklmnpqrstvwxyz_", dtype=np.uint8)
_MID_DIGITS = 5
MID_SPACE = 32**_MID_DIGITS
_MID_MULTIPLIER = 2654435761 % MID_SPACE  # odd, hence a bijection modulo a power of two


def make_mids(count: int, offset: int) -> np.ndarray:
    """`count` distinct Freebase-style mids (`m.0` + 5 characters), scrambled; an object array."""
    if count > MID_SPACE:
        raise ValueError(f"at most {MID_SPACE} nodes fit the mid space, asked for {count}")
    nums = (np.arange(count, dtype=np.int64) * _MID_MULTIPLIER + offset) % MID_SPACE
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


class WorldBuilder:
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


def build_world(rng: np.random.Generator, scale: float) -> WorldBuilder:
    world = WorldBuilder(rng)
    _name_entities(world, type_counts(scale))
    _geography(world)
    _people(world)
    _institutions(world)
    _films(world)
    return world


def _name_entities(w: WorldBuilder, counts: dict[str, int]) -> None:
    """Create every named entity, type by type (the order of `TYPE_SIZES`)."""
    nm = NameMaker(w.rng)

    def coined(kind: str, form: str = "{}", **kwargs) -> None:
        w.entities(kind, [form.format(x) for x in nm.unique_words(counts[kind], **kwargs)])

    short = {"min_syllables": 1, "max_syllables": 2}
    w.entities("gender", ["Male", "Female"])
    coined("continent", endings=("a", "ia"), **short)
    country_names = nm.unique_words(counts["country"], endings=COUNTRY_ENDINGS, **short)
    w.entities("country", country_names)
    coined("language_family", "{} languages", endings=("ic",))
    coined("language", endings=LANGUAGE_ENDINGS, **short)
    coined("time_zone", "{} Standard Time", **short)
    units = nm.pick(CURRENCY_UNITS, counts["currency"])
    w.entities("currency", [f"{x} {u}" for x, u in zip(nm.unique_words(counts["currency"], **short), units)])
    coined("religion", "{}ism", **short)
    for kind, fixed in (
        ("profession", PROFESSIONS),
        ("genre", GENRES),
        ("industry", INDUSTRIES),
        ("sport", SPORTS),
        ("position", POSITIONS),
    ):
        w.entities(kind, list(fixed[: counts[kind]]))
    cities = nm.unique_words(counts["city"], min_syllables=1, max_syllables=3, endings=CITY_ENDINGS)
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


def _geography(w: WorldBuilder) -> None:
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


def _people(w: WorldBuilder) -> None:
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


def _institutions(w: WorldBuilder) -> None:
    """Education, organisations, universities, awards won, sports teams and their rosters."""
    rng, r = w.rng, w.ranges
    industries, cities, persons, orgs = r["industry"], r["city"], r["person"], r["organisation"]
    universities, awards, sports, positions, teams = (
        r["university"],
        r["award"],
        r["sport"],
        r["position"],
        r["sports_team"],
    )
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
    athletes = np.flatnonzero(roles == ATHLETE)
    stints = np.repeat(athletes, rng.choice(3, size=len(athletes), p=[0.6, 0.3, 0.1]) + 1)
    roster = w.mediators("sports.sports_team_roster", len(stints))
    w.add(ROSTER, teams[w.zipf(len(teams), len(stints), 0.8)], roster)
    w.add(ROSTER_PLAYER, roster, persons[stints])
    joined = np.minimum(birth_year[stints] + rng.integers(18, 32, size=len(stints)), 2024)
    w.add(ROSTER_FROM, roster, _years(joined))
    w.add(ROSTER_POSITION, roster, positions[rng.integers(len(positions), size=len(stints))])


def _films(w: WorldBuilder) -> None:
    """Films: direction, production, release, language, country, genres and performances."""
    rng, r = w.rng, w.ranges
    countries, languages, genres, orgs, films = r["country"], r["language"], r["genre"], r["organisation"], r["film"]
    characters = r["character"]
    n = len(films)
    roles = w.roles
    directors = np.flatnonzero(roles == DIRECTOR)
    actors = np.flatnonzero(roles == ACTOR)
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
