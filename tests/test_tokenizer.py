import json

import pytest

from kgreasoner.config import ConfigError
from kgreasoner.protocol import ANSWER_CLOSE, ANSWER_OPEN, SEARCH_CLOSE, SEARCH_OPEN, TAGS
from kgreasoner.tokenizer import (
    BYTE_ALPHABET,
    CHAT_ROLES,
    EOS_TOKEN,
    PAD_TOKEN,
    TURN_START,
    TokenizerConfig,
    handle_tokens,
    read_training_texts,
    train_tokenizer,
)

TEXTS = [
    "what timezone is Utah in",
    "what is the capital of Utah",
    "Utah",
    "Mountain Time Zone",
    "Salt Lake City",
    "time zone",
    "capital",
    "which nationality is frederica_of_mecklenburg-strelitz 's couple ?",
    "frederica_of_mecklenburg-strelitz",
]

HOSTILE = [
    "",
    " ",
    "   leading and trailing   ",
    "\n\n\nmulti\n\nline\n",
    "\t tabs\tand\r\nCRLF\r",
    "Ünïcödé café naïve 日本語 中文 한국어 العربية עברית",
    "emoji 👨‍👩‍👧‍👦 🎉🏳️‍🌈",
    "combining e\u0301, zero\u200bwidth, nbsp\u00a0here, \u2028sep\u2029 nel\x85",
    "control \x00\x01\x1b[31m\x7f",
    "punctuation !@#$%^&*()_+-=[]{}|;':\",./<>?`~",
    "<think> I need Utah's time zone. <search>Utah</search>\n<triples>\n(E2 Utah, time zone, "
    "E5 Mountain Time Zone)\n</triples>\n</think>\n<answer>E5</answer>",
    "<thinking> </search <answer >x</answer >< think>",
    "E1E2 E0 E01 E65 E640 xE2 E2x _E2 E2_ E2-E3 (E2) [E64] e2",
    "<|im_end|><|endoftext|><|im_start|>user",
    "  E2  Utah  ",
    "unknownword qwxzj zzzzz 12345678901234567890",
    "'s 's''' don't Utah's",
]


@pytest.fixture(scope="module")
def word_tok():
    return train_tokenizer(TEXTS, TokenizerConfig(kind="word", num_handles=64))


@pytest.fixture(scope="module")
def bpe_tok():
    return train_tokenizer(TEXTS * 3, TokenizerConfig(kind="bpe", vocab_size=300, num_handles=8))


def tokens(tok, text):
    return tok.convert_ids_to_tokens(tok.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("kind", ["word", "bpe"])
@pytest.mark.parametrize("text", HOSTILE)
def test_round_trip_is_exact(word_tok, bpe_tok, kind, text):
    tok = word_tok if kind == "word" else bpe_tok
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text


def test_pieces_decode_independently(word_tok):
    # The rollout engine decodes and concatenates spans tokenised on their own.
    text = HOSTILE[10] + HOSTILE[6] + HOSTILE[8]
    ids = word_tok.encode(text, add_special_tokens=False)
    clean_cuts = 0
    for cut in range(len(ids) + 1):
        left, right = word_tok.decode(ids[:cut]), word_tok.decode(ids[cut:])
        if "\ufffd" in left + right:
            continue  # a cut inside a multi-byte character: each half alone is not valid UTF-8
        assert left + right == text
        clean_cuts += 1
    assert clean_cuts > len(ids) // 2


def test_known_words_are_one_token_each_in_both_space_forms(word_tok):
    assert tokens(word_tok, "what timezone is Utah in") == ["what", "Ġtimezone", "Ġis", "ĠUtah", "Ġin"]
    assert tokens(word_tok, "<search>Utah</search>") == [SEARCH_OPEN, "Utah", SEARCH_CLOSE]
    assert tokens(word_tok, "frederica_of_mecklenburg-strelitz 's") == ["frederica_of_mecklenburg-strelitz", "Ġ's"]


def test_tags_and_handles_are_single_tokens(word_tok, bpe_tok):
    for tok in (word_tok, bpe_tok):
        for tag in TAGS:
            assert tokens(tok, tag) == [tag]
    for handle in handle_tokens(64):
        assert tokens(word_tok, handle) == [handle]
    assert tokens(word_tok, "(E2 Utah, time zone, E5 Mountain Time Zone)") == [
        "(",
        "E2",
        "ĠUtah",
        ",",
        "Ġtime",
        "Ġzone",
        ",",
        "Ġ",
        "E5",
        "ĠMountain",
        "ĠTime",
        "ĠZone",
        ")",
    ]
    assert tokens(word_tok, f"{ANSWER_OPEN}E64{ANSWER_CLOSE}") == [ANSWER_OPEN, "E64", ANSWER_CLOSE]


def test_handles_match_only_whole_words(word_tok):
    # E65 is beyond num_handles; E2x, xE2 and E640 contain a handle but are other words.
    assert tokens(word_tok, "E65") == ["E", "6", "5"]
    assert tokens(word_tok, "E640") == ["E", "6", "4", "0"]
    assert tokens(word_tok, "E2x") == ["E", "2", "x"]
    assert tokens(word_tok, "xE2") == ["x", "E", "2"]
    assert tokens(word_tok, "E12") == ["E12"]


def test_unknown_words_fall_back_to_bytes(word_tok):
    assert tokens(word_tok, "qwxzj") == ["q", "w", "x", "z", "j"]
    assert tokens(word_tok, " Utahs") == ["Ġ", "U", "t", "a", "h", "s"]
    unknown = "日本語!"
    ids = word_tok.encode(unknown, add_special_tokens=False)
    assert len(ids) == len(unknown.encode("utf-8"))
    assert set(word_tok.convert_ids_to_tokens(ids)) <= set(BYTE_ALPHABET)
    assert word_tok.decode(ids) == unknown
    assert word_tok.unk_token is None


def test_skip_special_tokens_keeps_tags_and_handles(word_tok):
    ids = word_tok.encode(f"{ANSWER_OPEN}E2{ANSWER_CLOSE}{EOS_TOKEN}{PAD_TOKEN}", add_special_tokens=False)
    assert word_tok.decode(ids, skip_special_tokens=True) == f"{ANSWER_OPEN}E2{ANSWER_CLOSE}"


def test_special_tokens_and_no_automatic_bos(word_tok):
    assert word_tok.eos_token == EOS_TOKEN and word_tok.pad_token == PAD_TOKEN
    assert word_tok.bos_token is None
    assert word_tok.eos_token_id != word_tok.pad_token_id
    assert word_tok("Utah")["input_ids"] == word_tok.encode("Utah", add_special_tokens=False)


def test_chat_template_renders_turns_and_masks_the_assistant(word_tok):
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "what timezone is Utah in"},
        {"role": "assistant", "content": "<answer>E5</answer>"},
    ]
    text = word_tok.apply_chat_template(messages, tokenize=False)
    assert text == (
        f"{TURN_START}system\nS{EOS_TOKEN}\n{TURN_START}user\nwhat timezone is Utah in{EOS_TOKEN}\n"
        f"{TURN_START}assistant\n<answer>E5</answer>{EOS_TOKEN}\n"
    )
    prompt = word_tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt == text[: text.index("<answer>")]
    out = word_tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    labelled = [i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    assert word_tok.convert_ids_to_tokens(labelled) == [ANSWER_OPEN, "E5", ANSWER_CLOSE, EOS_TOKEN]
    for role in CHAT_ROLES:
        assert tokens(word_tok, role) == [role]
    with pytest.raises(Exception, match="unknown role tool"):
        word_tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_word_vocabulary_keeps_the_most_frequent_words():
    texts = ["alpha beta", "alpha gamma", "alpha beta"]
    tok = train_tokenizer(
        texts, TokenizerConfig(vocab_size=len(BYTE_ALPHABET) + 3 + 3, num_handles=0, include_prompt=False)
    )
    learned = set(tok.get_vocab()) - set(tok.get_added_vocab()) - set(BYTE_ALPHABET) - set(CHAT_ROLES)
    # counts: alpha 3, Ġalpha 3 (first-word space forms), Ġbeta 2; Ġgamma (1) does not fit.
    assert learned == {"alpha", "Ġalpha", "Ġbeta"}
    assert len(tok) == len(BYTE_ALPHABET) + 3 + 3 + len(TAGS) + 3


def test_min_frequency_drops_rare_words():
    tok = train_tokenizer(
        ["alpha beta", "alpha"], TokenizerConfig(min_frequency=2, num_handles=0, include_prompt=False)
    )
    learned = set(tok.get_vocab()) - set(tok.get_added_vocab()) - set(BYTE_ALPHABET) - set(CHAT_ROLES)
    assert learned == {"alpha", "Ġalpha"}


def test_training_is_deterministic(word_tok):
    again = train_tokenizer(TEXTS, TokenizerConfig(kind="word", num_handles=64))
    assert again.backend_tokenizer.to_str() == word_tok.backend_tokenizer.to_str()


def test_tags_in_training_texts_do_not_enter_the_vocabulary():
    tok = train_tokenizer(["<search>Utah</search> E2 Utah"], TokenizerConfig(num_handles=4, include_prompt=False))
    learned = set(tok.get_vocab()) - set(tok.get_added_vocab()) - set(BYTE_ALPHABET) - set(CHAT_ROLES)
    assert learned == {"Utah", "ĠUtah", "Ġ"} - set(BYTE_ALPHABET)


def test_the_system_prompt_is_learned_as_words(word_tok):
    from kgreasoner.protocol import build_prompt

    prompt = build_prompt("what timezone is Utah in", [{"id": "Utah", "name": "Utah"}], word_tok)
    pieces = tokens(word_tok, prompt)
    assert not set(pieces) & set(BYTE_ALPHABET) - {"Ġ", "Ċ", '"', ",", ".", ":", "(", ")"}
    assert len(pieces) < 280
    bare = train_tokenizer(TEXTS, TokenizerConfig(num_handles=64, include_prompt=False))
    assert len(tokens(bare, prompt)) > 3 * len(pieces)


def test_warmup_trajectories_are_training_texts(tmp_path):
    from kgreasoner.records.schema import TopicEntity
    from kgreasoner.records.trajectories import Segment, WarmupRecord, write_warmup

    record = WarmupRecord(
        "q1",
        "what timezone is utah in",
        (TopicEntity("m.1", "Utah"),),
        (
            Segment("<think> I look for the zone. <search>E1</search>", True),
            Segment("\n<triples>\n(E1 Utah, time_zone, E2 Mountain)\n</triples>\n", False),
            Segment("</think>\n<answer>E2</answer>", True),
        ),
    )
    path = write_warmup([record], tmp_path / "warmup.jsonl")
    assert list(read_training_texts([path])) == ["what timezone is utah in", *(s.text for s in record.segments)]


def test_bpe_respects_vocab_size(bpe_tok):
    assert len(bpe_tok) - len(bpe_tok.get_added_vocab()) <= 300
    assert len(bpe_tok.get_added_vocab()) == len(TAGS) + 8 + 3


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("kind", "wordpiece", "tokenizer.kind must be one of"),
        ("vocab_size", 256, "tokenizer.vocab_size must exceed the 256 byte symbols"),
        ("min_frequency", 0, "tokenizer.min_frequency must be >= 1"),
        ("num_handles", -1, "tokenizer.num_handles must be >= 0"),
    ],
)
def test_bad_settings_name_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        TokenizerConfig(**{field: value})


def test_read_training_texts(tmp_path):
    questions = tmp_path / "questions.jsonl"
    questions.write_text(
        json.dumps(
            {
                "id": "q1",
                "question": "what timezone is utah in",
                "topic_entities": [{"id": "m.1", "name": "Utah"}],
                "answers": [{"id": "m.2", "name": "Mountain Time Zone", "aliases": ["MST"]}],
            }
        )
        + "\n",
        encoding="utf-8",
    )
    kb = tmp_path / "kb.tsv"
    kb.write_text("Utah\ttime zone\tMountain Time Zone\n\nSalt Lake City\tcapital of\tUtah\r\n", encoding="utf-8")
    assert list(read_training_texts([questions, kb])) == [
        "what timezone is utah in",
        "Utah",
        "Mountain Time Zone",
        "MST",
        "Utah",
        "time zone",
        "Mountain Time Zone",
        "Salt Lake City",
        "capital of",
        "Utah",
    ]
    with pytest.raises(FileNotFoundError, match="training text file not found: .*missing.txt"):
        list(read_training_texts([tmp_path / "missing.txt"]))


def test_read_training_texts_maps_kg_ids_to_labels(tmp_path):
    named = tmp_path / "named"
    named.mkdir()
    (named / "kb.tsv").write_text(
        'm.1\ttime_zone\tm.2\nm.1\tpopulation\t"3.4e6"^^<http://www.w3.org/2001/XMLSchema#double>\n'
        "m.1\tcontains\tm.9\n",
        encoding="utf-8",
    )  # m.9: an unnamed mediator node
    (named / "names.tsv").write_text("m.1\tUtah\nm.2\tMountain Time Zone\n", encoding="utf-8")
    assert list(read_training_texts([named / "kb.tsv"])) == [
        "Utah",
        "time_zone",
        "Mountain Time Zone",
        "Utah",
        "population",
        "3.4e6",
        "Utah",
        "contains",
    ]
    assert list(read_training_texts([named / "names.tsv"])) == ["Utah", "Mountain Time Zone"]
    (named / "kb.tsv").write_text("m.1\ttime_zone\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"kb\.tsv:1: expected 'subject<TAB>relation<TAB>object'"):
        list(read_training_texts([named / "kb.tsv"]))
    nt = tmp_path / "kb.nt"
    entity, relation = "http://kgreasoner.local/entity/", "http://kgreasoner.local/relation/"
    nt.write_text(
        f'<{entity}m.1> <http://www.w3.org/2000/01/rdf-schema#label> "Utah" .\n'
        f"<{entity}m.1> <{relation}time_zone> <{entity}m.2> .\n"
        f'<{entity}m.2> <http://www.w3.org/2000/01/rdf-schema#label> "Mountain Time Zone"@en .\n',
        encoding="utf-8",
    )
    assert list(read_training_texts([nt])) == ["Utah", "time_zone", "Mountain Time Zone"]
