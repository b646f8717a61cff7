"""`skippipe prepare`: text files / folders / JSON Lines -> token shards -> memory-mapped windows;
the split by document, epoch sampling (each data node its share, a resume continues the stream),
tokenizers beyond the built-in BPE, and the one-line errors."""

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skippipe.data.batches import microbatch_starts, windows
from skippipe.data.dataset import load_prepared, token_data_for
from skippipe.data.prepare import find_inputs, hash_fraction, prepare_dataset
from skippipe.data.shards import ShardWriter, TokenShards, open_split
from skippipe.data.stream import permute, sample_windows
from skippipe.data.tokenizers_hf import gpt2_tokenizer, load_tokenizer_json, resolve_tokenizer
from skippipe.errors import DataError, UserError
from skippipe.train.config import TrainConfig
from toy_plans import skip_plan


def _docs(n: int) -> dict[str, str]:
    return {f"doc{i:02d}.txt": "".join(f"document {i} line {k}: é ü ☃\n" for k in range(5 + i % 7)) for i in range(n)}


@pytest.fixture
def folder(tmp_path):
    src = tmp_path / "texts"
    (src / "sub").mkdir(parents=True)
    (src / ".hidden").mkdir()
    (src / ".hidden" / "skip.txt").write_text("never read\n")
    (src / "notes.bin").write_bytes(b"\x00\x01")
    docs = _docs(30)
    for i, (name, text) in enumerate(docs.items()):
        (src / ("sub" if i % 3 == 0 else "") / name).write_text(text)
    return src, docs


def _decoded_docs(tok, tokens) -> list[str]:
    ids = np.asarray(tokens[:], dtype=np.int64)
    cuts = np.flatnonzero(ids == tok.eot_id)
    assert len(cuts) and cuts[-1] == len(ids) - 1  # every document ends with end-of-text
    out, start = [], 0
    for c in cuts:
        out.append(tok.decode(ids[start:c].tolist()))
        start = c + 1
    return out


def test_round_trip_text_folder_to_shards_split_by_document(folder, tmp_path):
    src, docs = folder
    s = prepare_dataset([src], tmp_path / "ds", tokenizer="bytes", val_fraction=0.2, shard_tokens=500, progress=False)
    assert s.documents["train"] + s.documents["val"] == 30 and s.documents["val"] >= 1
    assert s.shards["train"] > 1  # several shards, read back as one array
    data = load_prepared(tmp_path / "ds", check=True)
    train, val = _decoded_docs(data.tokenizer, data.train), _decoded_docs(data.tokenizer, data.val)
    # whole documents, each in exactly one split, in file order; the split is the hash rule
    assert sorted(train + val) == sorted(docs.values())
    keys = {(f"sub/{name}" if i % 3 == 0 else name): text for i, (name, text) in enumerate(docs.items())}
    expected = [k for k in keys if hash_fraction(k) < 0.2] or [min(keys, key=hash_fraction)]
    assert sorted(val) == sorted(keys[k] for k in expected)
    assert len(data.train) == s.tokens["train"] and len(data.val) == s.tokens["val"]
    # deterministic: a second preparation writes the same bytes
    prepare_dataset([src], tmp_path / "ds2", tokenizer="bytes", val_fraction=0.2, shard_tokens=500, progress=False)
    for split in ("train", "val"):
        assert np.array_equal(open_split(tmp_path / "ds2", split)[:], data.train[:] if split == "train" else data.val[:])


def test_training_reads_windows_from_the_memory_mapped_shards(folder, tmp_path):
    src, _ = folder
    prepare_dataset([src], tmp_path / "ds", tokenizer="bpe", vocab_size=300, val_fraction=0.2, shard_tokens=97,
                    progress=False)
    data = token_data_for(TrainConfig(data=str(tmp_path / "ds")))
    assert isinstance(data.train, TokenShards) and all(isinstance(m, np.memmap) for m in data.train.maps)
    assert data.vocab_size == 300 and (tmp_path / "ds" / "tokenizer.json").is_file()
    flat = np.concatenate([np.fromfile(f, dtype="<u2") for f in data.train.files])
    starts = np.array([0, 5, 96, 97, 150, len(flat) - 17])
    x, y = windows(data.train, starts, 16)
    fx, fy = windows(flat, starts, 16)
    assert np.array_equal(x, fx) and np.array_equal(y, fy)
    text = data.tokenizer.decode(flat[: 60].tolist())
    assert text.startswith("document")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=8), st.integers(1, 30), st.data())
def test_token_shards_behave_like_one_array(tmp_path_factory, sizes, shard_tokens, data):
    folder = tmp_path_factory.mktemp("shards")
    w = ShardWriter(folder, "train", np.dtype("<u2"), shard_tokens)
    parts = [np.arange(n, dtype=np.uint16) + 7 * i for i, n in enumerate(sizes)]
    for p in parts:
        w.write(p)
    info = w.finish()
    flat = np.concatenate(parts)
    assert info["tokens"] == len(flat) and all(s["tokens"] <= shard_tokens for s in info["shards"])
    arr = TokenShards([folder / s["file"] for s in info["shards"]], np.dtype("<u2"))
    assert len(arr) == len(flat) and np.array_equal(arr[:], flat)
    if len(flat):
        idx = np.array(data.draw(st.lists(st.integers(0, len(flat) - 1), max_size=20)), dtype=np.int64)
        assert np.array_equal(arr[idx], flat[idx])
        a, b = sorted(data.draw(st.lists(st.integers(0, len(flat)), min_size=2, max_size=2)))
        assert np.array_equal(arr[a:b], flat[a:b])


def test_jsonl_records_are_documents_split_by_hash(tmp_path):
    recs = [{"text": f"record {i} " * (1 + i % 5), "id": i} for i in range(60)]
    f = tmp_path / "corpus.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in recs) + "\n\n")
    s = prepare_dataset([f], tmp_path / "ds", tokenizer="bytes", val_fraction=0.25, progress=False)
    data = load_prepared(tmp_path / "ds")
    val = _decoded_docs(data.tokenizer, data.val)
    assert s.documents == {"train": 60 - len(val), "val": len(val)}
    assert sorted(val) == sorted(r["text"] for r in recs if hash_fraction(r["text"]) < 0.25)


def test_json_files_of_records_as_hugging_face_writes_them(tmp_path):
    """A ``.json`` file of JSON Lines (``Dataset.to_json``'s default) or of one array of records
    prepares the same dataset as the ``.jsonl`` file; other JSON is one line."""
    recs = [{"text": f"record {i} " * (1 + i % 5), "id": i} for i in range(40)]
    lines = "\n".join(json.dumps(r) for r in recs) + "\n"
    (tmp_path / "a.jsonl").write_text(lines)
    (tmp_path / "b.json").write_text(lines)
    (tmp_path / "c.json").write_text("  \n" + json.dumps(recs, indent=2))
    got = []
    for name in ("a.jsonl", "b.json", "c.json"):
        prepare_dataset([tmp_path / name], tmp_path / f"ds-{name}", tokenizer="bytes", val_fraction=0.25, progress=False)
        data = load_prepared(tmp_path / f"ds-{name}")
        got.append((_decoded_docs(data.tokenizer, data.train), _decoded_docs(data.tokenizer, data.val)))
    assert got[0] == got[1] == got[2] and len(got[0][0]) + len(got[0][1]) == 40
    for text, message in [("42", "not JSON records"), ("", "not JSON records"),
                          ('[{"text": "a"}, {"body": "b"}]', "record 1: no string field 'text'"),
                          ('{"transfer_s": [[0, 1], [1, 0]]}', ":1: no string field 'text'")]:
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(DataError, match=message):
            prepare_dataset([tmp_path / "bad.json"], tmp_path / "out", tokenizer="bytes", progress=False)
        assert not (tmp_path / "out").exists()


def test_gzipped_inputs_prepare_as_the_plain_ones(tmp_path):
    """``.txt.gz`` / ``.jsonl.gz`` / ``.json.gz``, given by name or found in a folder, prepare the
    same dataset as the same files uncompressed; a file that is not gzip, or is cut off, is one line."""
    texts = {f"doc{i}.txt": "".join(f"line {j} of document {i}\n" for j in range(30 + i)) for i in range(6)}
    records = "".join(json.dumps({"text": f"record {i} " * 7}) + "\n" for i in range(30))
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    for folder, wrap in ((plain, lambda b: b), (packed, gzip.compress)):
        folder.mkdir()
        suffix = ".gz" if folder is packed else ""
        for name, text in texts.items():
            (folder / (name + suffix)).write_bytes(wrap(text.encode()))
        (folder / ("records.jsonl" + suffix)).write_bytes(wrap(records.encode()))
    got = []
    for folder in (plain, packed):
        prepare_dataset([folder], tmp_path / f"ds-{folder.name}", tokenizer="bytes", val_fraction=0.3, progress=False)
        data = load_prepared(tmp_path / f"ds-{folder.name}")
        got.append((_decoded_docs(data.tokenizer, data.train), _decoded_docs(data.tokenizer, data.val)))
    assert got[0] == got[1] and len(got[0][0]) + len(got[0][1]) == 36
    (tmp_path / "records.json.gz").write_bytes(gzip.compress(records.encode()))
    summary = prepare_dataset([tmp_path / "records.json.gz"], tmp_path / "ds-json", tokenizer="bytes", progress=False)
    assert summary.documents["train"] + summary.documents["val"] == 30
    (tmp_path / "fake.txt.gz").write_text("not gzip at all")
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(records.encode())[:-20])
    for name, message in (("fake.txt.gz", "cannot decompress it"), ("cut.jsonl.gz", "cannot decompress it")):
        out = subprocess.run([sys.executable, "-m", "skippipe.cli", "prepare", str(tmp_path / name), "--out",
                              str(tmp_path / "o"), "--tokenizer", "bytes", "--no-progress"], capture_output=True, text=True)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr and name in out.stderr
        assert not (tmp_path / "o").exists()


def test_a_failed_prepare_leaves_nothing_behind(tmp_path):
    """Shards already finished when a later record fails, or when no document falls into the
    validation split, are removed; a folder the run made is removed, one the user made stays."""
    good = "".join(json.dumps({"text": f"document {i} " * 50}) + "\n" for i in range(200))
    bad = tmp_path / "late.jsonl"
    bad.write_text(good + '{"body": "no text"}\n')
    with pytest.raises(DataError, match=r"late.jsonl:201: no string field"):
        prepare_dataset([bad], tmp_path / "new", tokenizer="bytes", shard_tokens=500, progress=False)
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"text": "a single record"}) + "\n")
    with pytest.raises(DataError, match="no document fell into the validation split"):
        prepare_dataset([one], tmp_path / "mine", tokenizer="bytes", progress=False)
    assert (tmp_path / "mine").is_dir() and list((tmp_path / "mine").iterdir()) == []


def test_a_single_text_file_keeps_its_tail_for_validation(tmp_path):
    f = tmp_path / "one.txt"
    f.write_text("".join(f"line {i}\n" for i in range(400)))
    s = prepare_dataset([f], tmp_path / "ds", tokenizer="bytes", val_fraction=0.1, progress=False)
    data = load_prepared(tmp_path / "ds")
    assert s.split == "tail"
    assert _decoded_docs(data.tokenizer, data.train)[0] + _decoded_docs(data.tokenizer, data.val)[0] == f.read_text()


@pytest.mark.parametrize("sharding", ["stream", "node"])
def test_epoch_sampling_reads_every_window_once_and_resume_continues(sharding):
    plan = skip_plan([3, 2, 2], 2, 4, 6)
    seq, spm, n_tokens = 8, 2, 8 * 240 + 1  # 240 windows, 24 samples per iteration: 10 iterations an epoch
    W = (n_tokens - 1) // seq

    def iteration(it):
        return {mb.id: microbatch_starts(plan, mb.id, it, n_tokens, seq, spm, seed=3, sharding=sharding, sampling="epoch")
                for mb in plan.microbatches}

    epoch = np.concatenate([s for it in range(10) for s in iteration(it).values()])
    assert sorted(epoch.tolist()) == [w * seq for w in range(W)]  # every window once
    nxt = np.concatenate([s for it in range(10, 20) for s in iteration(it).values()])
    assert sorted(nxt.tolist()) == sorted(epoch.tolist()) and not np.array_equal(nxt, epoch)  # reshuffled
    # a run resumed at iteration 7 reads exactly what an uninterrupted run reads there: new samples
    resumed = iteration(7)
    seen = set(np.concatenate([s for it in range(7) for s in iteration(it).values()]).tolist())
    assert all(not (set(v.tolist()) & seen) for v in resumed.values())
    if sharding == "node":  # each data node only reads its own share of the windows
        owner = {}
        for it in range(10):
            for mb_id, s in iteration(it).items():
                for w in s.tolist():
                    owner.setdefault(w, set()).add(plan.microbatch(mb_id).data_node)
        assert all(len(v) == 1 for v in owner.values())


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3000), st.integers(0, 2**32))
def test_permutation_is_a_bijection(n, key):
    out = permute(np.arange(n), n, np.uint64(key))
    assert sorted(out.tolist()) == list(range(n))
    assert np.array_equal(sample_windows(0, n, n, key % 1000) >= 0, np.ones(n, bool))


def test_tokenizer_json_and_gpt2(tmp_path):
    gpt2 = gpt2_tokenizer()
    assert gpt2.vocab_size == 50257 and gpt2.eot_id == 50256
    assert gpt2.encode("Hello world") == [15496, 995]  # GPT-2's own ids
    assert gpt2.decode(gpt2.encode("naïve café ☃")) == "naïve café ☃"
    gpt2.save(tmp_path / "tokenizer.json")
    again = resolve_tokenizer(str(tmp_path / "tokenizer.json"))
    assert again.eot_id == 50256 and again.encode("Hello world") == [15496, 995]
    assert load_tokenizer_json(tmp_path).vocab_size == 50257  # a folder holding tokenizer.json
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(DataError, match="not a tokenizer file"):
        resolve_tokenizer(str(tmp_path / "bad.json"))


def test_prepare_with_a_tokenizer_json_and_the_model_follows_it(folder, tmp_path):
    src, _ = folder
    gpt2_tokenizer().save(tmp_path / "tokenizer.json")
    prepare_dataset([src], tmp_path / "ds", tokenizer=str(tmp_path / "tokenizer.json"), progress=False)
    data = load_prepared(tmp_path / "ds")
    assert data.vocab_size == 50257 and data.train.dtype == np.dtype("<u2")
    cfg = TrainConfig(data=str(tmp_path / "ds"), model={"preset": "tiny"})
    assert cfg.model_config(data.vocab_size).vocab_size == 50257
    note = cfg.vocab_note(data.vocab_size)
    assert note is not None and "4,096" in note and "50,257" in note and "\n" not in note
    assert TrainConfig(model={"preset": "tiny"}).vocab_note(4096) is None
    with pytest.raises(UserError, match="smaller than the tokenizer"):
        TrainConfig(model={"preset": "tiny", "vocab_size": 1000}).model_config(50257)


def test_errors_are_one_line(folder, tmp_path):
    src, _ = folder
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: no string field 'text'"):
        prepare_dataset([bad], tmp_path / "o1", tokenizer="bytes", progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no text files"):
        find_inputs([tmp_path / "empty"])
    prepare_dataset([src], tmp_path / "ds", tokenizer="bytes", progress=False)
    with pytest.raises(DataError, match="--force"):
        prepare_dataset([src], tmp_path / "ds", tokenizer="bytes", progress=False)
    prepare_dataset([src], tmp_path / "ds", tokenizer="bytes", force=True, progress=False)
    shard = tmp_path / "ds" / "train-000000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(DataError, match="the index says"):
        load_prepared(tmp_path / "ds")
    with pytest.raises(DataError, match="not a prepared dataset"):
        load_prepared(tmp_path)
    out = subprocess.run([sys.executable, "-m", "skippipe.cli", "prepare", str(bad), "--out", str(tmp_path / "o2")],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "no string field" in out.stderr
