"""Names of the world's entities: seeded pseudo-words from syllables, and the fixed vocabularies
(professions, genres, ...) that types such as professions take their names from."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_ONSETS = (
    "b",
    "br",
    "c",
    "ch",
    "d",
    "dr",
    "f",
    "g",
    "gr",
    "h",
    "j",
    "k",
    "kr",
    "l",
    "m",
    "n",
    "p",
    "pr",
    "r",
    "s",
    "sh",
    "st",
    "t",
    "th",
    "tr",
    "v",
    "w",
    "z",
    "",
    "",
    "",
)
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "ai", "ea", "ou", "y")
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "nd", "rk", "th", "x", "ld", "st")
_FIRST_ENDINGS = ("", "", "a", "o", "en", "in", "ia", "as", "el", "is")
_SURNAME_ENDINGS = ("", "", "", "son", "ez", "ov", "ski", "er", "man", "ley", "ford", "ini", "escu", "berg")
CITY_ENDINGS = (
    "",
    "",
    "",
    "ton",
    "ville",
    "burg",
    "port",
    " Falls",
    " Springs",
    "field",
    "ford",
    "mouth",
    "haven",
    "stad",
    "grad",
)
COUNTRY_ENDINGS = ("ia", "land", "stan", "ora", "ica", "esh", "ania", "ova")
LANGUAGE_ENDINGS = ("ish", "ese", "ic", "an", "i", "ian")
CURRENCY_UNITS = (
    "dollar",
    "franc",
    "crown",
    "mark",
    "peso",
    "rupee",
    "dinar",
    "lira",
    "shilling",
    "florin",
    "real",
    "krona",
)
_ORG_SUFFIXES = (
    "Pictures",
    "Studios",
    "Industries",
    "Group",
    "Holdings",
    "Systems",
    "Labs",
    "Motors",
    "Records",
    "Media",
    "Bank",
    "Airlines",
    "Foundation",
    "Press",
    "Energy",
    "Robotics",
)
_MASCOTS = (
    "Falcons",
    "Lions",
    "Rovers",
    "United",
    "Wanderers",
    "Tigers",
    "Bears",
    "Sharks",
    "Comets",
    "Rangers",
    "Athletic",
    "Titans",
    "Hawks",
    "Wolves",
    "Pirates",
    "Giants",
    "Stallions",
    "Kings",
    "Eagles",
    "Vipers",
    "Dragons",
    "Mariners",
    "Rockets",
    "Bulls",
)
_ADJECTIVES = (
    "Silent",
    "Broken",
    "Golden",
    "Last",
    "Hidden",
    "Burning",
    "Crimson",
    "Distant",
    "Endless",
    "Frozen",
    "Dark",
    "Little",
    "Lost",
    "Wild",
    "Secret",
    "Midnight",
    "Forgotten",
    "Bright",
    "Savage",
    "Hollow",
    "Iron",
    "Paper",
    "Glass",
    "Velvet",
    "Quiet",
    "Eternal",
    "Scarlet",
    "Lonely",
    "Stolen",
    "Sweet",
    "Bitter",
    "Northern",
    "Final",
    "Electric",
    "Wicked",
    "Gentle",
)
_NOUNS = (
    "River",
    "Garden",
    "Storm",
    "Kingdom",
    "Shadow",
    "Promise",
    "Road",
    "Heart",
    "Mirror",
    "City",
    "Harbor",
    "Winter",
    "Summer",
    "Empire",
    "Voyage",
    "Letter",
    "Island",
    "Dream",
    "Hunter",
    "Crown",
    "Station",
    "Journey",
    "Horizon",
    "Witness",
    "Stranger",
    "Orchard",
    "Tide",
    "Fortress",
    "Lantern",
    "Canyon",
    "Melody",
    "Circle",
    "Bridge",
    "Signal",
    "Frontier",
    "Machine",
    "Ghost",
    "Season",
)
_TITLES = (
    "Captain",
    "Detective",
    "Doctor",
    "Agent",
    "Professor",
    "Sergeant",
    "Lady",
    "Sir",
    "Inspector",
    "Uncle",
    "Aunt",
    "Officer",
)
_AWARD_FORMS = (
    "{w} Award for Best Actor",
    "{w} Award for Best Actress",
    "{w} Award for Best Director",
    "{w} Award for Best Picture",
    "{w} Prize",
    "{w} Medal",
    "{w} Award for Best Screenplay",
    "{w} Lifetime Achievement Award",
    "{w} Sportsperson of the Year",
)
PROFESSIONS = (
    "Actor",
    "Film director",
    "Athlete",
    "Politician",
    "Writer",
    "Engineer",
    "Singer",
    "Painter",
    "Physician",
    "Lawyer",
    "Journalist",
    "Entrepreneur",
    "Scientist",
    "Teacher",
    "Architect",
    "Economist",
    "Photographer",
    "Composer",
    "Film producer",
    "Screenwriter",
    "Diplomat",
    "Historian",
    "Businessperson",
    "Model",
)
ACTOR, DIRECTOR, ATHLETE = 0, 1, 2  # indices into PROFESSIONS of the role professions
GENRES = (
    "Drama",
    "Comedy",
    "Thriller",
    "Action",
    "Romance",
    "Horror",
    "Documentary",
    "Science fiction",
    "Fantasy",
    "Animation",
    "Crime",
    "Western",
    "Musical",
    "Mystery",
    "War",
    "Adventure",
    "Biography",
    "Family",
    "Historical",
    "Sports",
)
INDUSTRIES = (
    "Film",
    "Music",
    "Banking",
    "Software",
    "Automotive",
    "Aviation",
    "Publishing",
    "Energy",
    "Telecommunications",
    "Retail",
    "Pharmaceuticals",
    "Mining",
    "Media",
    "Robotics",
    "Agriculture",
)
SPORTS = ("Football", "Basketball", "Ice hockey", "Baseball", "Cricket", "Rugby union", "Volleyball", "Handball")
POSITIONS = (
    "Goalkeeper",
    "Defender",
    "Midfielder",
    "Forward",
    "Point guard",
    "Center",
    "Pitcher",
    "Catcher",
    "Winger",
    "Fly-half",
    "Setter",
    "Bowler",
)


class NameMaker:
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
        return self.with_namesakes([f"{firsts[f]} {lasts[s]}" for f, s in zip(fi, li)], 0.02)

    def characters(self, count: int, person_names: list[str]) -> list[str]:
        """Film characters: a first name alone, a title and surname, or a full name (namesakes abound)."""
        firsts = [n.split(" ", 1)[0] for n in person_names]
        lasts = [n.split(" ", 1)[1] for n in person_names]
        forms = self.rng.integers(3, size=count)
        fi = self.rng.integers(len(firsts), size=count)
        li = self.rng.integers(len(lasts), size=count)
        ti = self.rng.integers(len(_TITLES), size=count)
        names = []
        for form, f, s, t in zip(forms, fi, li, ti):
            if form == 0:
                names.append(firsts[f])
            elif form == 1:
                names.append(f"{_TITLES[t]} {lasts[s]}")
            else:
                names.append(f"{firsts[f]} {lasts[s]}")
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
                (
                    f"University of {cities[c]}",
                    f"{stem} Institute of Technology",
                    f"{surnames[s]} University",
                    f"{cities[c]} State College",
                )[form]
            )
        return names

    def teams(self, cities: list[str]) -> list[str]:
        return [f"{c} {m}" for c, m in zip(cities, self.pick(_MASCOTS, len(cities)))]

    def awards(self, count: int) -> list[str]:
        stems = self.unique_words(count, min_syllables=2, max_syllables=2)
        return [form.format(w=s) for s, form in zip(stems, self.pick(_AWARD_FORMS, count))]
