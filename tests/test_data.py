"""Offline corpora, splits and shards, tokenizers and their cache, samples per microbatch."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skippipe.data import tokenizer as tokmod
from skippipe.data.batches import microbatch_ranks, microbatch_starts, validation_starts, windows
from skippipe.data.corpora import bible, clean_markdown, shakespeare, shard_bounds, split_document
from skippipe.data.dataset import load_token_data
from skippipe.data.tokenizer import ByteTokenizer, cached_bpe, train_bpe
from skippipe.errors import UserError
from toy_plans import full_plan, skip_plan

SAMPLE_TEXT = [
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n",
    "In the beginning God created the heaven and the earth.\nAnd the earth was without form, and void.\n",
] * 20


def test_corpora_ship_in_packages():
    plays = shakespeare()
    books = bible()
    assert len(plays) >= 37 and len(books) == 66
    assert sum(len(d.text) for d in plays) > 4_000_000
    assert sum(len(d.text) for d in books) > 4_000_000
    hamlet = next(d for d in plays if d.name.endswith("hamlet"))
    assert "To be, or not to be" in hamlet.text and "**" not in hamlet.text
    assert books[0].name == "bible/Genesis" and "In the beginning God created" in books[0].text


def test_clean_markdown():
    md = "# Play\n\n**HAMLET**  \nTo be, or _not_ to be.  \n_\\[Aside]_\n"
    assert clean_markdown(md) == "Play\n\nHAMLET\nTo be, or not to be.\n[Aside]\n"


def test_split_is_a_tail_at_a_line_break():
    text = "".join(f"line {i}\n" for i in range(100))
    train, val = split_document(text, 0.1)
    assert train + val == text
    assert train.endswith("\n") and 0.05 < len(val) / len(text) < 0.15


@given(length=st.integers(0, 10_000), count=st.integers(1, 50))
def test_shards_partition_the_tokens(length, count):
    bounds = [shard_bounds(length, i, count) for i in range(count)]
    assert bounds[0][0] == 0 and bounds[-1][1] == length
    for (a, b), (c, _) in zip(bounds, bounds[1:]):
        assert a <= b == c
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=50, deadline=None)
@given(text=st.text(max_size=200))
def test_byte_tokenizer_round_trip(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids + [tok.eot_id]) == text


@pytest.fixture(scope="module")
def small_bpe():
    return train_bpe(SAMPLE_TEXT, 400)


@settings(max_examples=50, deadline=None)
@given(text=st.text(max_size=200))
def test_bpe_round_trip_any_text(small_bpe, text):
    assert small_bpe.decode(small_bpe.encode(text)) == text


def test_bpe_compresses_and_is_deterministic(small_bpe):
    text = SAMPLE_TEXT[0]
    assert 300 < small_bpe.vocab_size <= 400  # fewer when the text runs out of pairs
    assert len(small_bpe.encode(text)) < len(text.encode()) / 3
    assert train_bpe(SAMPLE_TEXT, 400).encode(text) == small_bpe.encode(text)


def test_tokenizer_cache_is_reused(tmp_path, monkeypatch):
    first = cached_bpe(SAMPLE_TEXT, 280, "fp", tmp_path)
    files = list(tmp_path.glob("bpe-*.json"))
    assert len(files) == 1

    def no_training(*args, **kwargs):
        raise AssertionError("the cached tokenizer should have been read")

    monkeypatch.setattr(tokmod, "train_bpe", no_training)
    again = cached_bpe(SAMPLE_TEXT, 280, "fp", tmp_path)
    assert again.encode(SAMPLE_TEXT[1]) == first.encode(SAMPLE_TEXT[1])
    with pytest.raises(AssertionError):
        cached_bpe(SAMPLE_TEXT, 281, "fp", tmp_path)  # another size is another file


def test_bad_tokenizer_file(tmp_path):
    bad = tmp_path / "tok.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="not a tokenizer file"):
        tokmod.BPETokenizer.from_file(bad)


def test_byte_token_data_and_cache(tmp_path):
    data = load_token_data(("bible",), tokenizer="bytes", cache_dir=tmp_path)
    assert data.vocab_size == 257 and data.train.dtype == np.int32
    assert 0.03 < len(data.val) / (len(data.train) + len(data.val)) < 0.07
    assert data.tokenizer.decode(data.train[:40]).startswith("Genesis")
    again = load_token_data(("bible",), tokenizer="bytes", cache_dir=tmp_path)
    assert np.array_equal(again.val, data.val)
    with pytest.raises(UserError, match="unknown corpus"):
        load_token_data(("poems",), tokenizer="bytes", cache_dir=tmp_path)


def test_samples_are_a_pure_function_and_shared_across_plans():
    skip = skip_plan([5, 3, 3, 3], 3, 6, 12)
    full = full_plan(4, 3, 10, 12)
    assert len(skip.microbatches) == len(full.microbatches) == 30
    n = 100_000
    for it in (0, 7):
        a = [microbatch_starts(skip, mb.id, it, n, 64, 4) for mb in skip.microbatches]
        b = [microbatch_starts(full, mb.id, it, n, 64, 4) for mb in full.microbatches]
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    first = microbatch_starts(skip, 0, 0, n, 64, 4)
    assert not np.array_equal(first, microbatch_starts(skip, 0, 1, n, 64, 4))
    assert not np.array_equal(first, microbatch_starts(skip, 1, 0, n, 64, 4))
    assert not np.array_equal(first, microbatch_starts(skip, 0, 0, n, 64, 4, seed=1))
    assert sorted(microbatch_ranks(skip).values()) == list(range(30))


def test_node_sharding_keeps_each_data_node_in_its_shard():
    plan = skip_plan([5, 3, 3, 3], 3, 6, 12)
    n = 50_000
    for mb in plan.microbatches:
        j = plan.stages[0].index(mb.data_node)
        lo, hi = shard_bounds(n, j, 5)
        starts = microbatch_starts(plan, mb.id, 3, n, 64, 8, sharding="node")
        assert np.all(starts >= lo) and np.all(starts + 65 <= hi)


def test_windows_and_validation_starts():
    tokens = np.arange(1000, dtype=np.int32)
    x, y = windows(tokens, np.array([0, 10]), 5)
    assert x.tolist()[1] == [10, 11, 12, 13, 14] and y.tolist()[1] == [11, 12, 13, 14, 15]
    starts = validation_starts(1000, 50, 8)
    assert starts[0] == 0 and starts[-1] == 1000 - 51 and len(set(starts)) == 8


def test_data_and_config_modules_import_without_torch():
    import subprocess
    import sys

    code = ("import sys, skippipe.train.config, skippipe.model.config, skippipe.data.batches, "
            "skippipe.data.dataset; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
