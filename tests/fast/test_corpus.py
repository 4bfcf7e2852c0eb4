"""Reading the corpus: complete, disjoint worker shares for every input kind; bad inputs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from payload.config import DataConfig
from payload.core.errors import UserError
from payload.data import corpus


def read_all(sources, data, num_workers):
    per_worker = []
    stats_total = 0
    for index in range(num_workers):
        stats = corpus.ReadStats()
        pieces = corpus.share(sources, worker_index=index, num_workers=num_workers)
        texts = [t for b in corpus.iter_batches(sources, pieces, data, stats=stats)
                 for t in b.texts]
        per_worker.append(texts)
        stats_total += stats.invalid_utf8_lines
    return per_worker, stats_total


_word = st.text(alphabet="abcdefgh éß中", min_size=1, max_size=12).filter(lambda w: w.strip())
_doc_lines = st.lists(st.lists(_word, min_size=1, max_size=6).map(" ".join), min_size=1,
                      max_size=3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(st.lists(_doc_lines, max_size=25), min_size=1, max_size=3),
       blank=st.booleans(), extra_blank=st.integers(0, 2), trailing_newline=st.booleans())
def test_every_document_goes_to_exactly_one_worker(tmp_path_factory, files, blank, extra_blank,
                                                   trailing_newline):
    folder = tmp_path_factory.mktemp("share")
    expected = []
    for n, docs in enumerate(files):
        if blank:
            body = ("\n" * (2 + extra_blank)).join("\n".join(lines) for lines in docs)
            expected += ["\n".join(lines) for lines in docs]
        else:
            flat = [" ".join(lines) for lines in docs]
            body = ("\n" * (1 + extra_blank)).join(flat)
            expected += flat
        (folder / f"f{n}.txt").write_text(body + ("\n" if trailing_newline else ""), "utf-8")
    data = DataConfig(corpus=[str(folder / "*.txt")],
                      document_split="blank_line" if blank else "line")
    if not any(files) and not trailing_newline:  # every file has 0 bytes
        with pytest.raises(UserError, match="empty"):
            corpus.resolve_sources(data)
        return
    sources = corpus.resolve_sources(data)
    for num_workers in (1, 2, 3, 7):
        per_worker, _ = read_all(sources, data, num_workers)
        got = [t for texts in per_worker for t in texts]
        assert sorted(got) == sorted(expected), num_workers


def write_inputs(folder: Path, docs: list[str]) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = {
        "txt": folder / "a.txt", "gz": folder / "b.txt.gz", "jsonl": folder / "c.jsonl",
        "jsonl.gz": folder / "d.jsonl.gz", "parquet": folder / "e.parquet",
    }
    paths["txt"].write_text("\n".join(docs) + "\n")
    with gzip.open(paths["gz"], "wt") as f:
        f.write("\n".join(docs) + "\n")
    paths["jsonl"].write_text("".join(json.dumps({"text": d, "id": i}) + "\n"
                                      for i, d in enumerate(docs)))
    with gzip.open(paths["jsonl.gz"], "wt") as f:
        f.write("".join(json.dumps({"text": d}) + "\n" for d in docs))
    pq.write_table(pa.table({"text": docs, "n": list(range(len(docs)))}), paths["parquet"],
                   row_group_size=7)
    return paths


@pytest.mark.parametrize("kind", ["txt", "gz", "jsonl", "jsonl.gz", "parquet"])
def test_each_input_kind_is_read_and_shared(tmp_path, kind):
    docs = [f"document number {i} with some text é" for i in range(41)]
    path = write_inputs(tmp_path, docs)[kind]
    data = DataConfig(corpus=[str(path)])
    sources = corpus.resolve_sources(data)
    for num_workers in (1, 3):
        per_worker, _ = read_all(sources, data, num_workers)
        assert sorted(t for w in per_worker for t in w) == sorted(docs)
        assert all(per_worker), "every worker gets a share"


def test_globs_folders_and_mixed_kinds(tmp_path):
    docs = [f"doc {i}" for i in range(10)]
    write_inputs(tmp_path, docs)
    data = DataConfig(corpus=[str(tmp_path / "*.txt"), str(tmp_path / "*.gz"),
                              str(tmp_path / "e.parquet")])
    sources = corpus.resolve_sources(data)
    assert [Path(s.path).name for s in sources] == ["a.txt", "b.txt.gz", "d.jsonl.gz",
                                                    "e.parquet"]
    per_worker, _ = read_all(sources, data, 2)
    assert sorted(t for w in per_worker for t in w) == sorted(docs * 4)
    folder = DataConfig(corpus=[str(tmp_path)])
    assert len(corpus.resolve_sources(folder)) == 5


def test_invalid_utf8_is_replaced_and_counted_once(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"good line one\nbad \xff\xfe line\nanother good line\nalso \xc3 bad\n")
    data = DataConfig(corpus=[str(path)])
    sources = corpus.resolve_sources(data)
    for num_workers in (1, 2, 3):
        per_worker, invalid = read_all(sources, data, num_workers)
        texts = [t for w in per_worker for t in w]
        assert len(texts) == 4
        assert invalid == 2
        assert sum("\ufffd" in t for t in texts) == 2


@pytest.mark.parametrize(
    ("setup", "needles"),
    [
        (lambda d: [str(d / "missing.txt")], ["no such file", "missing.txt"]),
        (lambda d: [str(d / "nothing-*.txt")], ["no file matches", "nothing-*.txt"]),
        (lambda d: ["wikitext"], ["no such file 'wikitext'", "hf:"]),
        (lambda d: [str(_write(d / "empty.txt", b""))], ["corpus is empty"]),
        (lambda d: [str(_write(d / "blob.bin", b"\x7fELF\x00\x01\x02" * 100))],
         ["looks binary", "blob.bin"]),
        (lambda d: [str(_write(d / "fake.gz", b"this is not gzip"))], ["gzip", "fake.gz"]),
        (lambda d: [str(d)], ["has no files"]),
    ],
)
def test_bad_inputs(tmp_path, setup, needles):
    data = DataConfig(corpus=setup(tmp_path))
    with pytest.raises(UserError) as info:
        corpus.resolve_sources(data)
    for needle in needles:
        assert needle in str(info.value)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("split", ["line", "blank_line"])
def test_a_huge_document_is_refused_with_its_position(tmp_path, split):
    path = tmp_path / "long.txt"
    path.write_bytes(b"short one\n\n" + b"x" * (10 << 20) + b"\n\nshort two\n")
    data = DataConfig(corpus=[str(path)], document_split=split)
    sources = corpus.resolve_sources(data)
    pieces = corpus.share(sources, worker_index=0, num_workers=1)
    with pytest.raises(UserError) as info:
        list(corpus.iter_batches(sources, pieces, data))
    assert "long.txt" in str(info.value) and "byte 11" in str(info.value)
    assert "max_document_mb" in str(info.value)


def test_jsonl_without_the_text_column(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"body": "hello"}\n')
    data = DataConfig(corpus=[str(path)])
    sources = corpus.resolve_sources(data)
    with pytest.raises(UserError, match=r"no 'text' field.*body"):
        list(corpus.iter_batches(sources, corpus.share(sources, worker_index=0, num_workers=1),
                                 data))


def test_resume_from_a_cursor_continues_exactly(tmp_path):
    docs = [f"line {i} " + "w" * (i % 17) for i in range(5000)]
    (tmp_path / "a.txt").write_text("\n".join(docs[:2500]) + "\n")
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write("\n".join(docs[2500:]) + "\n")
    data = DataConfig(corpus=[str(tmp_path / "a.txt"), str(tmp_path / "b.txt.gz")])
    sources = corpus.resolve_sources(data)
    pieces = corpus.share(sources, worker_index=1, num_workers=2)
    corpus._BATCH_DOCS, saved = 100, corpus._BATCH_DOCS
    try:
        batches = list(corpus.iter_batches(sources, pieces, data))
        assert len(batches) > 4
        for cut in (1, len(batches) // 2, len(batches) - 1):
            resumed = list(corpus.iter_batches(sources, pieces, data,
                                               start=batches[cut].cursor))
            assert [t for b in resumed for t in b.texts] == [
                t for b in batches[cut:] for t in b.texts]
    finally:
        corpus._BATCH_DOCS = saved


@pytest.mark.parametrize("entry", ["*.txt", "**/*.txt", "deep/**", "deep"])
def test_an_entry_that_reaches_too_many_paths_is_one_line(tmp_path, monkeypatch, entry):
    """Issue 32, item 5: a glob, a ** walk or a folder past MAX_CORPUS_PATHS is refused in one
    line naming the entry and the limit (a pattern rooted too high would walk for minutes)."""
    monkeypatch.setattr(corpus, "MAX_CORPUS_PATHS", 5)
    for i in range(6):
        (tmp_path / f"{i}.txt").write_text(f"document {i}\n")
    deep = tmp_path / "deep" / "a" / "b"
    deep.mkdir(parents=True)
    for i in range(6):
        (deep / f"{i}.txt").write_text(f"document {i}\n")
    with pytest.raises(UserError) as info:
        corpus.resolve_sources(DataConfig(corpus=[str(tmp_path / entry)]))
    assert f"'{tmp_path / entry}' reaches more than 5 paths" in str(info.value)
    assert "\n" not in str(info.value)
    monkeypatch.setattr(corpus, "MAX_CORPUS_PATHS", 100)
    assert corpus.resolve_sources(DataConfig(corpus=[str(tmp_path / entry)]))


def test_a_glob_stops_at_the_limit_without_walking_the_rest(monkeypatch):
    """The limit ends the walk itself: a glob over an endless tree is refused, not walked."""
    import itertools

    from payload.core import storage

    walked = []

    def endless(pattern, recursive):
        for n in itertools.count():
            walked.append(n)
            yield f"/endless/{n}.txt"

    monkeypatch.setattr(storage._glob, "iglob", endless)
    with pytest.raises(UserError, match="reaches more than 100,000 paths"):
        corpus.resolve_sources(DataConfig(corpus=["/endless/**"]))
    assert len(walked) == corpus.MAX_CORPUS_PATHS + 1


@pytest.mark.parametrize("entry", ["/**", "/", "/*/**", "//**/*.txt", "/tmp/../**"])
def test_a_corpus_that_would_walk_the_whole_filesystem_is_refused_at_load(entry):
    with pytest.raises(ValueError, match="would walk the whole filesystem"):
        DataConfig(corpus=[entry])


@pytest.mark.parametrize("entry", ["/*.txt", "/tmp/**", "gs://bucket/**", "hf:owner/name"])
def test_a_corpus_rooted_below_the_root_or_not_recursive_loads(entry):
    assert DataConfig(corpus=[entry]).corpus == [entry]


def test_a_file_reached_by_two_sources_of_a_mixture_is_refused(tmp_path):
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text(f"text of {name}\n")
    pattern, a = str(tmp_path / "*.txt"), str(tmp_path / "a.txt")
    mixed = DataConfig(corpus=[pattern, {"path": a, "weight": 0.5}])
    with pytest.raises(UserError, match=f"{a} is reached by both {a} and the plain entries"):
        corpus.resolve_groups(mixed)
    apart = DataConfig(corpus=[str(tmp_path / "b.txt"), {"path": a, "weight": 0.5}])
    assert [(n, [s.path for s in g]) for n, g in corpus.resolve_groups(apart)] == [
        ("", [str(tmp_path / "b.txt")]), (a, [a])]
