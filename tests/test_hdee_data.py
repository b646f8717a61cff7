"""HDEE domains, by-document splits, the config and the per-run token data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skippipe.data.corpora import Document
from skippipe.hdee.config import HDEEConfigError, hdee_config_from_dict, load_hdee_config
from skippipe.hdee.data import eval_windows, prepare_data, sample_windows
from skippipe.hdee.domains import DomainError, folder, load_domain, pydoc_topics, split_documents, strip_front_matter

ROOT = Path(__file__).resolve().parent.parent


def _docs(sizes: list[int]) -> list[Document]:
    return [Document(f"doc{i}", "x" * n) for i, n in enumerate(sizes)]


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(1, 5000), min_size=3, max_size=60), val=st.floats(0.01, 0.4), test=st.floats(0.01, 0.4),
       salt=st.text(max_size=5))
def test_splits_are_by_whole_document_and_cover_the_domain(sizes, val, test, salt):
    docs = _docs(sizes)
    s = split_documents("d", docs, val, test, salt)
    names = [[d.name for d in part] for part in (s.train, s.val, s.test)]
    assert all(names), "every split gets at least one document"
    flat = [n for part in names for n in part]
    # a partition: no document is cut or shared
    assert sorted(flat) == sorted(d.name for d in docs) and len(set(flat)) == len(flat)
    total = sum(sizes)
    for part, fraction in ((s.test, test), (s.val, val)):
        chars = sum(len(d.text) for d in part)
        # a split stops at the first document that takes it to its share, unless it must leave documents for the others
        assert chars - max(len(d.text) for d in part) < fraction * total or len(part) == 1
    # the split depends on the documents, not on the order they were listed in
    again = split_documents("d", list(reversed(docs)), val, test, salt)
    assert [[d.name for d in p] for p in (again.train, again.val, again.test)] == [sorted(n, key=flat.index) for n in names]


def test_the_split_follows_the_salt_and_refuses_tiny_domains():
    docs = _docs([100] * 40)
    a = split_documents("d", docs, 0.1, 0.1, "one")
    b = split_documents("d", docs, 0.1, 0.1, "two")
    assert {d.name for d in a.test} != {d.name for d in b.test}
    assert len(a.test) == 4 and len(a.val) == 4 and len(a.train) == 32
    with pytest.raises(DomainError):
        split_documents("d", docs[:2], 0.1, 0.1)
    with pytest.raises(DomainError):
        split_documents("d", [Document("same", "a"), Document("same", "b"), Document("c", "c")], 0.1, 0.1)


def test_stdlib_sources_need_no_download():
    topics = pydoc_topics()
    assert len(topics) > 50 and all(d.text.strip() for d in topics)
    assert strip_front_matter("---\nkey: mit\n---\nPermission is hereby granted\n") == "Permission is hereby granted\n"


def test_a_folder_domain_reads_text_files_and_refuses_binary_ones(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "sub" / "b.txt").write_text("beta")
    (tmp_path / ".hidden.txt").write_text("skip me")
    (tmp_path / "empty.txt").write_text("  \n")
    docs = folder(tmp_path, "**/*.txt")
    assert [d.text for d in docs] == ["alpha", "beta"]
    (tmp_path / "bin.dat").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(DomainError, match="not UTF-8"):
        folder(tmp_path)
    with pytest.raises(DomainError, match="no such folder"):
        folder(tmp_path / "missing")


def test_the_example_config_holds_out_at_least_two_domains():
    cfg = load_hdee_config(ROOT / "examples" / "hdee-cpu.toml")
    assert len(cfg.eval_domains) >= 2 and len(cfg.train_domains) >= 2
    assert {d.source for d in cfg.domains} == {"bible", "shakespeare", "python", "licenses", "pydoc"}
    assert set(cfg.ensemble.configurations) == {"homogeneous", "steps", "size", "both"}
    assert {"manual", "seed-loss"} <= set(cfg.ensemble.difficulty)
    assert cfg.size_table("S")["ffn_dim"] + cfg.size_table("L")["ffn_dim"] == 2 * cfg.model_config("M", 1024).ffn_dim


def _domain_tables(root: Path) -> list[dict]:
    tables = []
    kinds = (("red", "train", "easy"), ("blue", "train", "hard"), ("gold", "eval", ""), ("grey", "eval", ""))
    for name, role, difficulty in kinds:
        d = root / name
        d.mkdir()
        for i in range(6):
            (d / f"{i}.txt").write_text(f"{name} document {i}: " + (name + " ") * (60 + 7 * i))
        table = {"name": name, "source": "folder", "path": name, "role": role}
        tables.append({**table, "difficulty": difficulty} if difficulty else table)
    return tables


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"ensemble": {"configurations": ["steps", "nope"]}}, "configurations"),
        ({"ensemble": {"spread": 1.5}}, "spread"),
        ({"run": {"jobs": 0}}, "jobs must be at least 1"),
        ({"run": {"seed": "zero"}}, "seed"),
        ({"train": {"lr": -1.0}}, "lr"),
        ({"sizes": {"XL": {"ffn_dim": 8}}}, "unknown size"),
        ({"sizes": {"S": {"ctx": 8}}}, "ctx"),
        ({"ensemble": {"difficulty": ["seed-loss"]}}, "needs a seed model"),
        ({"bogus": {}}, "bogus"),
        ({"data": {"tokenizer": "words"}}, "tokenizer"),
    ],
)
def test_bad_configs_are_one_line_errors(tmp_path, change, fragment):
    data = {"data": {"tokenizer": "bytes"}, "domains": _domain_tables(tmp_path)}
    for key, value in change.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    with pytest.raises(HDEEConfigError) as err:
        hdee_config_from_dict(data, base_dir=tmp_path)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_domain_entries_are_checked(tmp_path):
    tables = _domain_tables(tmp_path)
    for bad, fragment in (
        ({**tables[0], "difficulty": "impossible"}, "difficulty"),
        ({**tables[0], "role": "both"}, "role"),
        ({**tables[0], "name": "Bad Name"}, "name"),
        ({"name": "x", "source": "folder"}, "path"),
        ({"name": "x", "source": "web"}, "source"),
    ):
        with pytest.raises(HDEEConfigError, match=fragment):
            hdee_config_from_dict({"domains": [bad, *tables[1:]]}, base_dir=tmp_path)
    with pytest.raises(HDEEConfigError, match="at least two"):
        hdee_config_from_dict({"domains": [tables[0], tables[2]]}, base_dir=tmp_path)
    with pytest.raises(HDEEConfigError, match="unique"):
        hdee_config_from_dict({"domains": [tables[0], tables[0], tables[1]]}, base_dir=tmp_path)
    no_level = [dict(tables[0]), *tables[1:]]
    no_level[0].pop("difficulty")
    with pytest.raises(HDEEConfigError, match="needs a difficulty for red"):
        hdee_config_from_dict({"domains": no_level}, base_dir=tmp_path)


def test_held_out_domains_have_no_training_tokens_and_data_is_cached(tmp_path):
    cfg = hdee_config_from_dict({"data": {"tokenizer": "bytes"}, "domains": _domain_tables(tmp_path)}, base_dir=tmp_path)
    lines: list[str] = []
    data = prepare_data(cfg, tmp_path / "run", lines.append)
    assert set(data.domains["red"].splits) == {"train", "val", "test"}
    assert set(data.domains["gold"].splits) == {"val", "test"}
    assert any("held out" in line and line.startswith("domain gold") for line in lines)
    # every split's text comes back from its tokens (bytes), and no document is in two splits
    red = load_domain(cfg.domains[0])
    texts = {s: bytes(data.domains["red"].splits[s].astype(np.uint8)).decode() for s in ("train", "val", "test")}
    for doc in red:
        assert sum(doc.text in t for t in texts.values()) == 1
    again = prepare_data(cfg, tmp_path / "run", lines.append)
    assert again.digest == data.digest and len(lines) == 4  # the second call read the cache and logged nothing


def test_batches_are_a_pure_function_of_seed_and_step():
    tokens = [np.arange(1000, dtype=np.int32), np.arange(5000, 5300, dtype=np.int32)]
    x1, y1 = sample_windows(tokens, 8, 16, seed=3, step=7)
    x2, y2 = sample_windows(tokens, 8, 16, seed=3, step=7)
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    assert np.array_equal(x1[:, 1:], y1[:, :-1])
    assert not np.array_equal(x1, sample_windows(tokens, 8, 16, seed=3, step=8)[0])
    w = eval_windows(np.arange(100), 9, 4)
    assert w.shape == (4, 10) and len({int(r[0]) for r in w}) == 4
    assert all(np.array_equal(r, np.arange(r[0], r[0] + 10)) for r in w)
