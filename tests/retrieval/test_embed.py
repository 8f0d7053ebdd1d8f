"""Embeddings made ahead (`kgreasoner kg embed`): a first search afterwards encodes nothing, a killed
run resumes, progress is reported, and the cache's tables are looked up, merged and shared."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from kgreasoner.cli import main
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.kg.sparql import SparqlKG
from kgreasoner.records.ids import is_literal_id
from kgreasoner.records.schema import Answer, QAExample, TopicEntity, write_jsonl
from kgreasoner.retrieval.embed import embed_ahead, first_search_texts, kg_texts
from kgreasoner.retrieval.encoder import CachedEncoder, EmbeddingTable, HashingEncoder
from kgreasoner.retrieval.ranker import GATRanker, RankerModelConfig
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig

DIM = 32
# A hub (ranked relation first above 4 edges), mediators (one with a mediator beyond it, one with a
# single edge), literals, two-way edges and relations read both ways.
TRIPLES = (
    [
        ("m.utah", "location.location.time_zones", "m.mtz"),
        ("m.utah", "location.us_state.capital", "m.slc"),
        ("m.utah", "location.location.contains", "m.provo"),
        ("m.slc", "location.location.containedby", "m.utah"),
        ("m.utah", "government.jurisdiction.officials", "m.cvt"),
        ("m.cvt", "government.position_held.office_holder", "m.cox"),
        ("m.cvt", "government.position_held.from", '"2021-01-04"'),
        ("m.cvt", "government.position_held.term", "m.cvt2"),
        ("m.cvt2", "government.term.length", '"4"'),
        ("m.cvt2", "government.term.kind", "m.elected"),
        ("m.provo", "location.location.alias", "m.lone"),
        ("m.mtz", "common.topic.alias", '"MST"'),
    ]
    + [(f"m.town{i}", "location.location.containedby", "m.usa") for i in range(6)]
    + [
        ("m.usa", "location.country.capital", "m.dc"),
        ("m.usa", "location.location.contains", "m.utah"),
    ]
)
NAMES = {
    "m.utah": "Utah",
    "m.mtz": "Mountain Time Zone",
    "m.slc": "Salt Lake City",
    "m.provo": "Provo",
    "m.cox": "Spencer Cox",
    "m.elected": "elected",
    "m.usa": "United States",
    "m.dc": "Washington",
    **{f"m.town{i}": f"Town {i}" for i in range(6)},
}
QUESTIONS = ["what time zone is utah in", "who governs utah", "which towns are in the united states"]


def write_dataset(folder, triples=TRIPLES, names=NAMES):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kb.tsv").write_text("".join(f"{s}\t{r}\t{o}\n" for s, r, o in triples), encoding="utf-8")
    (folder / "names.tsv").write_text("".join(f"{k}\t{v}\n" for k, v in names.items()), encoding="utf-8")
    topics = ["m.utah", "m.utah", "m.usa"]
    write_jsonl(
        [
            QAExample(f"q{i}", q, (TopicEntity(t, names[t]),), (Answer("m.mtz", "Mountain Time Zone"),))
            for i, (q, t) in enumerate(zip(QUESTIONS, topics))
        ],
        folder / "questions.jsonl",
    )
    return folder


class CountingEncoder(HashingEncoder):
    def __init__(self):
        super().__init__(DIM)
        self.seen: list[str] = []

    def encode(self, texts):
        self.seen.extend(texts)
        return super().encode(texts)


def tool_over(kg, encoder, **config) -> KGSearchTool:
    torch.manual_seed(0)
    settings = dict(ranking="gat", top_k=3, relation_first=4, rerank_pool=2, max_context=2) | config
    return KGSearchTool(
        kg,
        ToolConfig(**settings),
        ranker=GATRanker(RankerModelConfig(dim=DIM, hidden=8, head_hidden=4, dropout=0.0)).eval(),
        encoder=encoder,
    )


def shown_nodes(kg: MemoryKG) -> list[str]:
    """Every node a search can show: all but the mediators that searches expand."""
    return [
        n
        for n in kg.entities
        if is_literal_id(n) or not kg.is_unnamed(n) or kg.degree(n) < 2 or n in ("m.cvt", "m.cvt2")
    ]  # each lies beyond the other


def search_everything(tool: KGSearchTool, kg: MemoryKG) -> list[str]:
    """The first page of every shown node for every question; the pages' texts."""
    pages = []
    for question in QUESTIONS:
        for node in shown_nodes(kg):
            label = kg.label(node)
            result = tool.session(question, [TopicEntity(node, label)]).call(label)
            assert result.error is None, result.text
            pages.append(result.text)
    return pages


def embed_cli(dataset, cache, *extra) -> int:
    return main(
        [
            "kg",
            "embed",
            str(dataset),
            "--cache-dir",
            str(cache),
            "--encoder",
            "hashing",
            "--hashing-dim",
            str(DIM),
            "--max-context",
            "2",
            *extra,
        ]
    )


@pytest.mark.parametrize("context", ["all", "first"])
def test_after_kg_embed_a_first_search_of_any_node_encodes_nothing(tmp_path, capsys, context):
    dataset = write_dataset(tmp_path / "data")
    kg = MemoryKG.from_file(dataset / "kb.tsv")
    cold = CountingEncoder()
    cold_pages = search_everything(tool_over(kg, CachedEncoder(cold)), kg)
    read = set(cold.seen)

    assert embed_cli(dataset, tmp_path / "cache", "--context", context) == 0
    written = set(kg_texts(kg, None if context == "all" else 3)) | set(QUESTIONS)
    # every text a search read was written (more was: labels and contexts that only the edges a
    # relation-first hub leaves unscored lead to, a degree-1 node's edge back, mediator-only relations)
    assert read <= written and len(read) > 40

    fresh = CountingEncoder()
    cached = CachedEncoder(fresh, tmp_path / "cache")
    assert search_everything(tool_over(kg, cached), kg) == cold_pages
    assert fresh.seen == [] and cached.misses == 0 and cached.batches == 0
    out = capsys.readouterr()
    assert (
        f"kg embed: {len(written - set(QUESTIONS))} graph texts ({kg.num_triples} triples, {context} context "
        f"edges) and 3 questions of {dataset / 'questions.jsonl'} -> hashing-{DIM} in {tmp_path / 'cache'}" in out.out
    )


def test_topics_embed_the_first_search_of_each_topic_entity_over_memory_and_sparql(tmp_path, oxigraph_server):
    dataset = write_dataset(tmp_path / "data")
    memory = MemoryKG.from_file(dataset / "kb.tsv")
    sparql = SparqlKG(oxigraph_server(dataset))
    for kg, spec in ((memory, str(dataset)), (sparql, f"sparql:{sparql.endpoint}")):
        cache = tmp_path / f"cache-{type(kg).__name__}"
        assert (
            embed_cli(
                spec,
                cache,
                "--topics",
                "--relation-first",
                "4",
                "--rerank-pool",
                "2",
                "--questions",
                str(dataset / "questions.jsonl"),
            )
            == 0
        )
        fresh = CountingEncoder()
        tool = tool_over(kg, CachedEncoder(fresh, cache))
        for question, topic in zip(QUESTIONS, ["Utah", "Utah", "United States"]):
            assert tool.session(question, [TopicEntity(memory.resolve(topic)[0], topic)]).call(topic).error is None
        assert fresh.seen == [], type(kg).__name__
        # a second hop was not embedded: its search encodes
        tool.session(QUESTIONS[0], [TopicEntity("m.cox", "Spencer Cox")]).call("Spencer Cox")
        assert fresh.seen


def test_whole_graph_embedding_needs_a_memory_store(tmp_path, oxigraph_server, capsys):
    url = oxigraph_server(write_dataset(tmp_path / "data"))
    assert embed_cli(f"sparql:{url}", tmp_path / "cache") == 1
    assert "kg embed reads a whole graph from a memory store, not sparql: give the kb.tsv" in capsys.readouterr().err
    assert embed_cli(f"sparql:{url}", tmp_path / "cache", "--topics") == 1
    assert "kg embed --topics needs questions: pass --questions FILE" in capsys.readouterr().err


def test_a_crashed_embed_resumes_with_what_it_lacks_and_ends_with_one_table(tmp_path):
    texts = [f"text number {i}" for i in range(50)]

    class Crashing(CountingEncoder):
        def encode(self, batch):
            if len(self.seen) >= 20:
                raise KeyboardInterrupt
            return super().encode(batch)

    crashing = Crashing()
    with pytest.raises(KeyboardInterrupt):
        embed_ahead(CachedEncoder(crashing, tmp_path), texts, batch=5, chunk=10, progress=False)
    done = set(crashing.seen)
    assert len(done) == 20  # two chunks written, the third lost
    folder = tmp_path / f"hashing-{DIM}"
    assert len(list(folder.glob(f"*{EmbeddingTable.KEYS}"))) == 2

    again = CountingEncoder()
    report = embed_ahead(CachedEncoder(again, tmp_path), texts + texts[:3], batch=5, chunk=10, progress=False)
    assert sorted(again.seen) == sorted(set(texts) - done)
    assert (report.texts, report.cached, report.encoded, report.table_texts) == (50, 20, 30, 50)
    assert report.table_bytes == sum(p.stat().st_size for p in folder.iterdir())
    assert len(list(folder.glob(f"*{EmbeddingTable.KEYS}"))) == 1 and not list(folder.glob(".*"))
    reader = CachedEncoder(CountingEncoder(), tmp_path)
    assert np.array_equal(reader.encode(texts), HashingEncoder(DIM).encode(texts))
    assert reader.misses == 0 and reader.encoder.seen == []


def test_progress_counts_cached_texts_and_the_summary_gives_rate_and_size(tmp_path, capsys):
    dataset = write_dataset(tmp_path / "data")
    assert embed_cli(dataset, tmp_path / "cache", "--chunk", "7") == 0
    first = capsys.readouterr()
    total = len(set(kg_texts(MemoryKG.from_file(dataset / "kb.tsv")))) + len(QUESTIONS)
    assert f"kg embed: 100%|██████████| {total}/{total} " in first.err
    lines = first.out.splitlines()
    assert lines[1].startswith(f"kg embed: {total} texts encoded in ") and lines[1].endswith(", 0 already cached")
    table_bytes = sum(p.stat().st_size for p in (tmp_path / "cache" / f"hashing-{DIM}").iterdir())
    assert lines[2].startswith(
        f"kg embed: the table holds {total} texts, {table_bytes / 1e6:,.1f} MB "
        f"({table_bytes / total:,.0f} bytes a text): {tmp_path / 'cache' / f'hashing-{DIM}'}/"
    )
    assert embed_cli(dataset, tmp_path / "cache") == 0
    again = capsys.readouterr()
    assert f"{total}/{total}" in again.err and "kg embed: 0 texts encoded in " in again.out
    assert again.out.splitlines()[1].endswith(f", {total} already cached")


def test_a_live_encoder_reads_tables_written_after_it_opened_and_after_a_merge(tmp_path):
    reader = CachedEncoder(CountingEncoder(), tmp_path)  # before any table exists
    writer = CachedEncoder(HashingEncoder(DIM), tmp_path)
    writer.add_table(["a", "b"], HashingEncoder(DIM).encode(["a", "b"]))
    writer.add_table(["b", "c"], HashingEncoder(DIM).encode(["b", "c"]))
    assert sorted(reader.missing(["a", "b", "c", "d", "a"])) == ["d"]
    merged = writer.merge_tables()
    assert len(EmbeddingTable(merged, DIM)) == 3
    assert np.array_equal(reader.encode(["c", "a", "d"]), HashingEncoder(DIM).encode(["c", "a", "d"]))
    assert reader.encoder.seen == ["d"] and (reader.hits, reader.misses) == (2, 1)
    with pytest.raises(ValueError, match="one row per distinct key"):
        writer.add_table(["x", "x"], HashingEncoder(DIM).encode(["x", "x"]))


def test_first_search_texts_follow_the_search_at_a_hub_ranked_relation_first():
    kg = MemoryKG.from_triples(
        [("hub", "r.a", f"a{i}") for i in range(5)] + [("hub", "r.b", f"b{i}") for i in range(3)]
    )
    texts = set(first_search_texts(kg, [("hub", None)], max_context=1, rerank_pool=2, relation_first=4))
    # the relations' words, the first two edges of each relation, and those targets' contexts
    assert texts == {"r a", "r b", "a0", "a1", "b0", "b1", "r a of hub", "r b of hub", "r a of", "r b of"}


# --- MiniLM --------------------------------------------------------------------------------------------


def minilm_tool(kg, cache, ranker):
    from kgreasoner.retrieval.encoder import EncoderConfig, build_encoder

    encoder = build_encoder(EncoderConfig(kind="minilm", cache_dir=str(cache)))
    passes = []
    encoder.encoder.model.register_forward_pre_hook(lambda *_: passes.append(1))
    return KGSearchTool(
        kg, ToolConfig(ranking="gat", relation_first=4, rerank_pool=2), ranker=ranker, encoder=encoder
    ), passes


@pytest.mark.slow
def test_minilm_a_new_process_first_search_runs_no_forward_pass_after_kg_embed(tmp_path):
    dataset = write_dataset(tmp_path / "data")
    kg = MemoryKG.from_file(dataset / "kb.tsv")
    torch.manual_seed(0)
    ranker = GATRanker(RankerModelConfig(dim=384)).eval()
    cold, cold_passes = minilm_tool(kg, tmp_path / "cold", ranker)
    cold_pages = [cold.session(q, [TopicEntity("m.utah", "Utah")]).call("Utah").text for q in QUESTIONS]
    assert cold_passes  # without the cache, MiniLM runs

    done = subprocess.run(
        [sys.executable, "-m", "kgreasoner.cli", "kg", "embed", str(dataset), "--cache-dir", str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr
    tool, passes = minilm_tool(kg, tmp_path / "cache", ranker)
    pages = [tool.session(q, [TopicEntity("m.utah", "Utah")]).call("Utah").text for q in QUESTIONS]
    assert passes == [] and pages == cold_pages


@pytest.mark.slow
def test_minilm_a_killed_embed_resumes_where_it_stopped(tmp_path):
    dataset = write_dataset(
        tmp_path / "data",
        TRIPLES + [(f"m.p{i}", f"people.person.rel_{i % 30}", f"m.q{i}") for i in range(600)],
        {**NAMES, **{f"m.p{i}": f"person {i}" for i in range(600)}},
    )
    command = [
        sys.executable,
        "-m",
        "kgreasoner.cli",
        "kg",
        "embed",
        str(dataset),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--chunk",
        "64",
        "--batch-size",
        "32",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    folder = tmp_path / "cache" / "minilm_all-MiniLM-L6-v2"
    deadline = time.time() + 120
    while len(list(folder.glob(f"*{EmbeddingTable.KEYS}"))) < 2 and time.time() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait(30)
    written = sum(len(EmbeddingTable(k, 384)) for k in folder.glob(f"*{EmbeddingTable.KEYS}"))
    total = int(process.stdout.readline().split()[2]) + len(QUESTIONS)
    assert 128 <= written < total
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = done.stdout.splitlines()[1]
    assert summary.startswith(f"kg embed: {total - written} texts encoded in ")
    assert summary.endswith(f", {written} already cached")
