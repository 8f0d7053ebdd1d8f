"""The ids the synthetic world is written in: relations named the Freebase way and literal datatypes."""

from __future__ import annotations

from kgreasoner.records.ids import INVERSE_PREFIX

XSD = "http://www.w3.org/2001/XMLSchema#"
XSD_DATE = XSD + "date"
XSD_GYEAR = XSD + "gYear"
XSD_INTEGER = XSD + "integer"

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

RELATIONS: tuple[str, ...] = (
    NATIONALITY,
    PLACE_OF_BIRTH,
    DATE_OF_BIRTH,
    GENDER,
    PROFESSION,
    LANGUAGES,
    RELIGION,
    PARENTS,
    SPOUSE_S,
    MARRIAGE_SPOUSE,
    MARRIAGE_FROM,
    EDUCATION,
    EDU_INSTITUTION,
    EDU_STUDENT,
    EDU_END,
    CONTAINEDBY,
    TIME_ZONES,
    POPULATION,
    CAPITAL,
    OFFICIAL_LANGUAGE,
    LANGUAGES_SPOKEN,
    CURRENCY,
    DIRECTED_BY,
    PRODUCED_BY,
    RELEASE_DATE,
    FILM_LANGUAGE,
    FILM_COUNTRY,
    GENRE,
    STARRING,
    PERF_ACTOR,
    PERF_CHARACTER,
    AWARDS_WON,
    HONOR_AWARD,
    HONOR_YEAR,
    HONOR_WINNER,
    PRESENTED_BY,
    ROSTER,
    TEAM_SPORT,
    TEAM_LOCATION,
    ROSTER_PLAYER,
    ROSTER_FROM,
    ROSTER_POSITION,
    FOUNDERS,
    PLACE_FOUNDED,
    DATE_FOUNDED,
    INDUSTRY,
    UNDERGRADUATES,
    LANGUAGE_FAMILY,
)
"""Every relation of the world; question patterns may walk only these."""


def inverse(relation: str) -> str:
    """The path step that walks `relation` backwards."""
    return INVERSE_PREFIX + relation
