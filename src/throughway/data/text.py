"""Character-level text data: the verified text cache, the vocabulary, and blocks of a context length.

A text data set is three splits of UTF-8 text (train, validation, test). It is cached as one text
file per split beside a manifest holding the SHA-256 of each, written last (a folder without a
manifest is an unfinished cache and is rebuilt; a file whose checksum differs is an error that
names it). `TextSplits` holds the splits as token ids on a device:

* The vocabulary is built from the training split only: id 0 is `UNKNOWN` (shown as U+FFFD), and
  ids 1.. are the training split's distinct characters in code-point order. A character of the
  validation or test split that the training split never uses is encoded as `UNKNOWN`: it stays in
  the text and is scored like any other target (a model never trained on it predicts it badly, as
  it should), and `TextSplits.unknown` counts those characters per split.
* Training takes nanoGPT's random-offset blocks (`random_blocks`): each row of a batch is the
  `context + 1` tokens starting at an offset drawn uniformly from the split, with the caller's
  generator. Evaluation takes non-overlapping blocks (`evaluation_blocks`): block i starts at
  i·context, so every token of the split after the first is a target exactly once (the tail that
  does not fill a block is left out), or a fixed, evenly spaced subset of them: the loss is the same
  number on every call.

A block holds the inputs and the targets unshifted: `block[:, :-1]` goes into the model, and
`block[:, 1:]` are the targets (train.lm computes the loss; the model is never given targets).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .._io import atomic_write_json, atomic_write_text, read_json, sha256_file
from .cache import data_root

__all__ = ["TextSplits", "TEXT_SPLITS", "UNKNOWN", "UNKNOWN_CHARACTER", "build_vocabulary", "encode", "decode",
           "save_text_cache", "cached_texts", "to_text_splits", "random_blocks", "evaluation_blocks"]

TEXT_SPLITS = ("train", "val", "test")
UNKNOWN = 0
# How UNKNOWN is shown by `decode`: the Unicode replacement character.
UNKNOWN_CHARACTER = "\ufffd"
TEXT_CACHE_FORMAT = 1


@dataclass(frozen=True)
class TextSplits:
    """Token ids (int64, 1-d) of the train, validation and test splits of a character-level text data set.

    `vocabulary[i]` is the character of id i (id 0: `UNKNOWN`, shown as U+FFFD); `works` lists the
    works (file names without extension) of each split, in the order they are concatenated;
    `unknown` counts each split's characters outside the training vocabulary; `checksums` holds the
    SHA-256 of each split's cached text file, which every run records in its environment.
    """

    name: str
    vocabulary: str
    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor
    works: dict[str, tuple[str, ...]] = field(default_factory=dict)
    unknown: dict[str, int] = field(default_factory=dict)
    checksums: dict[str, str] = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        """The number of token ids, UNKNOWN included."""
        return len(self.vocabulary)

    @property
    def num_classes(self) -> int:
        """The number of classes of next-character prediction: the vocabulary size."""
        return len(self.vocabulary)

    def summary(self) -> dict[str, Any]:
        """What a run records of its data (results.json's `data`): the data set's name, the number of
        characters of each split, the vocabulary size, the works of each split and each split's characters
        outside the training vocabulary."""
        return {"dataset": self.name, "train": len(self.train), "val": len(self.val), "test": len(self.test),
                "vocab_size": self.vocab_size, "works": {k: list(v) for k, v in self.works.items()},
                "unknown": dict(self.unknown)}

    def encode(self, text: str) -> torch.Tensor:
        """`text` as int64 token ids on the splits' device (characters outside the vocabulary: UNKNOWN)."""
        return torch.from_numpy(encode(text, self.vocabulary)).to(self.train.device)

    def decode(self, ids: torch.Tensor | np.ndarray | list[int]) -> str:
        """The characters of token `ids` (UNKNOWN as U+FFFD)."""
        return decode(ids, self.vocabulary)


def build_vocabulary(train_text: str) -> str:
    """The vocabulary of a training text: UNKNOWN_CHARACTER (id 0), then every distinct character of
    `train_text` in code-point order (ids 1..). A U+FFFD in the text is the unknown id itself."""
    codes = np.unique(_code_points(train_text))
    return UNKNOWN_CHARACTER + "".join(chr(c) for c in codes.tolist() if chr(c) != UNKNOWN_CHARACTER)


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def encode(text: str, vocabulary: str) -> np.ndarray:
    """`text` as int64 ids of `vocabulary` (a `build_vocabulary` string); characters not in it: UNKNOWN."""
    codes = _code_points(text)
    known = _code_points(vocabulary[1:])
    if len(known) == 0:
        return np.full(len(codes), UNKNOWN, dtype=np.int64)
    order = np.argsort(known)
    sorted_known = known[order]
    position = np.minimum(np.searchsorted(sorted_known, codes), len(sorted_known) - 1)
    ids = np.where(sorted_known[position] == codes, order[position] + 1, UNKNOWN)
    return ids.astype(np.int64)


def decode(ids: torch.Tensor | np.ndarray | list[int], vocabulary: str) -> str:
    """The characters of token `ids` in `vocabulary`; IndexError naming the id for one outside it."""
    values = ids.tolist() if isinstance(ids, (torch.Tensor, np.ndarray)) else list(ids)
    out = []
    for i in values:
        if not 0 <= int(i) < len(vocabulary):
            raise IndexError(f"token id {i} is outside the vocabulary of {len(vocabulary)} characters")
        out.append(vocabulary[int(i)])
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# The cache


def save_text_cache(folder: Path, name: str, texts: dict[str, str], works: dict[str, tuple[str, ...]],
                    source: str) -> dict[str, str]:
    """Write the split texts (`texts`: split → text) as a verified cache in `folder`: one UTF-8 file per
    split, each atomically, then the manifest with their SHA-256 (last: a folder without it is an
    unfinished cache). Returns the checksums."""
    files = {}
    for split in TEXT_SPLITS:
        data = texts[split].encode("utf-8")
        atomic_write_text(folder / f"{split}.txt", texts[split])
        files[f"{split}.txt"] = hashlib.sha256(data).hexdigest()
    atomic_write_json(folder / "manifest.json", {
        "format": TEXT_CACHE_FORMAT, "dataset": name, "source": source, "files": files,
        "works": {split: list(works.get(split, ())) for split in TEXT_SPLITS},
    })
    return files


def _load_text_cache(folder: Path, name: str) -> tuple[dict[str, str], dict[str, tuple[str, ...]], dict[str, str]] | None:
    # The cache is untrusted input: the manifest's fields are type-checked and every file's checksum is
    # checked on every load, not only when the cache is built.
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        return None
    manifest = read_json(manifest_path)
    advice = f"delete {folder} to rebuild the {name} cache"
    if not isinstance(manifest, dict):
        raise ValueError(f"{manifest_path}: holds {type(manifest).__name__}, expected a JSON object; {advice}")
    if manifest.get("format") != TEXT_CACHE_FORMAT or manifest.get("dataset") != name:
        raise ValueError(f"{manifest_path}: fields 'format' / 'dataset' are {manifest.get('format')!r} / "
                         f"{manifest.get('dataset')!r}; accepted: {TEXT_CACHE_FORMAT} / {name!r}; {advice}")
    files = manifest.get("files")
    keys = [f"{split}.txt" for split in TEXT_SPLITS]
    if not (isinstance(files, dict) and all(isinstance(files.get(k), str) for k in keys)):
        raise ValueError(f"{manifest_path}: field 'files' must map each of {keys} to its SHA-256 (a string); {advice}")
    works = manifest.get("works", {})
    if not (isinstance(works, dict) and all(isinstance(works.get(s, []), list)
                                            and all(isinstance(w, str) for w in works.get(s, [])) for s in TEXT_SPLITS)):
        raise ValueError(f"{manifest_path}: field 'works' must map each split to a list of work names; {advice}")
    texts = {}
    for split in TEXT_SPLITS:
        path = folder / f"{split}.txt"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing from the {name} cache; {advice}")
        if sha256_file(path) != files[f"{split}.txt"]:
            raise ValueError(f"{path}: checksum does not match the cache manifest (the file was changed or "
                             f"damaged); {advice}")
        try:
            texts[split] = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 text ({exc}); {advice}") from exc
    return texts, {s: tuple(works.get(s, [])) for s in TEXT_SPLITS}, {k: files[k] for k in keys}


def cached_texts(name: str, data_dir: str | os.PathLike[str] | None,
                 build: Callable[[Path], tuple[dict[str, str], dict[str, tuple[str, ...]], str]]
                 ) -> tuple[dict[str, str], dict[str, tuple[str, ...]], dict[str, str]]:
    """(texts, works, checksums) of text data set `name` from its verified cache in the data root, built
    first by `build(folder) -> (texts, works, source)` when the folder holds no manifest."""
    folder = data_root(data_dir) / name
    cached = _load_text_cache(folder, name)
    if cached is not None:
        return cached
    texts, works, source = build(folder)
    checksums = save_text_cache(folder, name, texts, works, source)
    return texts, works, checksums


def to_text_splits(name: str, texts: dict[str, str], works: dict[str, tuple[str, ...]] | None = None,
                   checksums: dict[str, str] | None = None, *, device: str | torch.device = "cpu",
                   limit: int | None = None) -> TextSplits:
    """Encode split texts as `TextSplits` on `device`, with the vocabulary of the whole training text.

    `limit` keeps the first `limit` characters of each split (smoke tests); the vocabulary does not
    depend on it. ValueError naming the split when one is empty.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 2):
        raise ValueError(f"limit={limit!r}: the number of characters kept of each split; accepted: an integer ≥ 2")
    vocabulary = build_vocabulary(texts["train"])
    tokens, unknown = {}, {}
    for split in TEXT_SPLITS:
        text = texts[split] if limit is None else texts[split][:limit]
        if len(text) < 2:
            raise ValueError(f"{name}: the {split} split holds {len(text)} characters; at least 2 are needed")
        ids = encode(text, vocabulary)
        unknown[split] = int((ids == UNKNOWN).sum())
        tokens[split] = torch.from_numpy(ids).to(device)
    return TextSplits(name, vocabulary, tokens["train"], tokens["val"], tokens["test"], dict(works or {}), unknown,
                      dict(checksums or {}))


# ---------------------------------------------------------------------------------------------
# Blocks


def _check_context(tokens: torch.Tensor, context: int, argument: str = "tokens") -> None:
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ValueError(f"context={context!r}: the number of input tokens of a block; accepted: an integer ≥ 1")
    if tokens.dim() != 1 or len(tokens) < context + 1:
        raise ValueError(f"{argument}: {tuple(tokens.shape)} tokens; a block of context {context} needs a 1-d "
                         f"split of at least {context + 1} tokens")


def random_blocks(tokens: torch.Tensor, context: int, batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """A training batch (batch_size, context + 1) of nanoGPT's random-offset blocks: row i is
    tokens[o_i : o_i + context + 1] for offsets o_i drawn uniformly from 0 .. len(tokens) − context − 1
    with `generator` (a CPU generator, so a checkpoint restores the sequence on any device)."""
    _check_context(tokens, context)
    offsets = torch.randint(0, len(tokens) - context, (batch_size,), generator=generator).to(tokens.device)
    return tokens[offsets.unsqueeze(1) + torch.arange(context + 1, device=tokens.device)]


def evaluation_blocks(tokens: torch.Tensor, context: int, limit: int | None = None) -> torch.Tensor:
    """The non-overlapping blocks (M, context + 1) of a split: block i is tokens[i·context : (i+1)·context + 1],
    so every token after the first is a target of exactly one block, M = (len(tokens) − 1) // context.
    `limit` keeps `limit` of them, evenly spaced over the split (the first and the last included): a
    fixed set, so an evaluation gives the same number every time."""
    _check_context(tokens, context)
    count = (len(tokens) - 1) // context
    index = torch.arange(count, device=tokens.device)
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit={limit!r}: the number of evaluation blocks; accepted: an integer ≥ 1, or None "
                             f"for every block")
        if limit < count:
            index = torch.from_numpy(np.unique(np.round(np.linspace(0, count - 1, limit)).astype(np.int64))).to(
                tokens.device)
    return tokens[index.unsqueeze(1) * context + torch.arange(context + 1, device=tokens.device)]
