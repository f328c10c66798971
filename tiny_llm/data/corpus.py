"""The embedded demo corpus: real English prose that pip installs, written as C4-format local shards.

Sources are two files of the gensim 4.4.0 wheel's test data, read straight from the installed package
directory (gensim itself is never imported): a shortened English Wikipedia dump (106 articles, CC BY-SA;
wiki markup is removed here, each article section becomes one document) and ``lee_background.cor``
(300 news articles, one per line). Every k-th document goes to the held-out validation split.
"""

from __future__ import annotations

import bz2
import gzip
import html
import importlib.util
import json
import math
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tiny_llm.errors import DataError
from tiny_llm.output_dirs import check_replaceable, replacing_directory

WIKI_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
LEE_FILE = "lee_background.cor"
TIMESTAMP = "2019-04-25T00:00:00Z"
MIN_DOCUMENT_CHARS = 200
SHARD_CHARS = 1_000_000
SKIPPED_SECTIONS = {"references", "external links", "see also", "further reading", "notes", "bibliography",
                    "sources", "footnotes", "citations", "notes and references"}  # fmt: skip
_LINK_PREFIXES = ("file:", "image:", "category:", "media:", "wikt:", "wiktionary:")


@dataclass(frozen=True)
class Document:
    text: str
    url: str


def gensim_test_data() -> Path:
    """The installed gensim package's test_data directory, located without importing gensim."""
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "the demo corpus needs the gensim 4.4.0 wheel installed (pip install 'tiny-llm[demo]')"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "test" / "test_data"
    for name in (WIKI_FILE, LEE_FILE):
        if not (folder / name).is_file():
            raise DataError(f"gensim test data file {name} not found in {folder}; install gensim==4.4.0")
    return folder


# ----------------------------------------------------------------------------- wiki markup


def strip_wiki_markup(text: str) -> str:
    """Plain prose from MediaWiki markup: templates, tables, refs, files and tags go; link texts stay."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"<ref[^>/]*/>", "", text)
    text = re.sub(r"<ref[^>]*>.*?</ref>", "", text, flags=re.S)
    text = _replace_nested(text, r"\{\{([^{}]*)\}\}", _template)
    text = _remove_nested(text, r"\{\|(?:(?!\{\|).)*?\|\}", flags=re.S)
    text = _replace_links(text)
    text = re.sub(r"\[(?:https?:)?//[^\s\]]+ ([^\]]*)\]", r"\1", text)
    text = re.sub(r"\[(?:https?:)?//[^\s\]]+\]", "", text)
    text = re.sub(r"'{2,}", "", text)
    text = re.sub(
        r"<(gallery|math|timeline|syntaxhighlight|source|score)[^>]*>.*?</\1>", "", text, flags=re.S
    )
    text = re.sub(r"<[^>]+>", "", text)
    text = html.unescape(text).replace("\u00a0", " ")
    lines = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(("|", "!", "{", "}")):
            continue  # table or template leftovers
        line = re.sub(r"^[*#:;]+\s*", "", line)
        line = re.sub(r"[ \t]+", " ", line)
        lines.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _remove_nested(text: str, pattern: str, flags: int = 0) -> str:
    regex = re.compile(pattern, flags)
    while True:
        text, count = regex.subn("", text)
        if not count:
            return text


def _replace_nested(text: str, pattern: str, replace: Callable[[re.Match[str]], str]) -> str:
    regex = re.compile(pattern)
    while True:
        text, count = regex.subn(replace, text)
        if not count:
            return text


def _template(match: re.Match[str]) -> str:
    """Inline templates that carry prose keep it ({{convert|5|km}} -> "5 km"); all others vanish."""
    name, *params = (part.strip() for part in match.group(1).split("|"))
    positional = [p for p in params if "=" not in p]
    name = name.lower()
    if name in ("convert", "cvt") and len(positional) >= 2:
        return (
            " ".join(positional[:2]) if positional[1] not in ("-", "to", "and") else " ".join(positional[:4])
        )
    if name in ("lang", "transl") and positional:
        return positional[-1]
    if name in ("small", "nowrap", "nobr", "em", "big", "smaller", "lang-en") and positional:
        return positional[0]
    return ""


def _replace_links(text: str) -> str:
    regex = re.compile(r"\[\[([^\[\]]*)\]\]")

    def link(match: re.Match[str]) -> str:
        inner = match.group(1)
        target = inner.split("|", 1)[0].strip().lower()
        if target.startswith(_LINK_PREFIXES) or re.match(r"^[a-z\-]{2,12}:", target):
            return ""  # media, categories and interlanguage links carry no prose
        return inner.rsplit("|", 1)[-1]

    while True:
        text, count = regex.subn(link, text)
        if not count:
            return text


def wiki_documents(path: Path) -> Iterator[Document]:
    """One document per article section (prose only) of a MediaWiki XML dump."""
    with bz2.open(path, "rb") as stream:
        for _, element in ET.iterparse(stream, events=("end",)):
            if element.tag.rsplit("}", 1)[-1] != "page":
                continue
            fields = {child.tag.rsplit("}", 1)[-1]: child for child in element}
            title = (fields["title"].text or "").strip()
            revision = fields.get("revision")
            text_node = revision.find("{*}text") if revision is not None else None
            raw = text_node.text if text_node is not None and text_node.text else ""
            namespace = (fields["ns"].text or "0").strip() if "ns" in fields else "0"
            element.clear()
            if namespace != "0" or "redirect" in fields or raw.lstrip().upper().startswith("#REDIRECT"):
                continue
            yield from _article_sections(title, strip_wiki_markup(raw))


def _article_sections(title: str, text: str) -> Iterator[Document]:
    parts = re.split(r"^==\s*([^=].*?)\s*==\s*$", text, flags=re.M)
    sections = [(title, parts[0])] + list(zip(parts[1::2], parts[2::2], strict=True))
    for index, (heading, body) in enumerate(sections):
        body = re.sub(r"^=+\s*(.*?)\s*=+$", r"\1", body, flags=re.M).strip()  # sub-headings become lines
        if heading.lower() in SKIPPED_SECTIONS or len(body) < MIN_DOCUMENT_CHARS:
            continue
        prefix = f"{title}\n\n" if index == 0 else f"{title}: {heading}\n\n"
        anchor = "" if index == 0 else "#" + heading.replace(" ", "_")
        yield Document(prefix + body, f"https://en.wikipedia.org/wiki/{title.replace(' ', '_')}{anchor}")


def lee_documents(path: Path) -> Iterator[Document]:
    """One news article per line."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle):
            text = line.strip()
            if len(text) >= MIN_DOCUMENT_CHARS:
                yield Document(text, f"lee_background.cor#{number}")


def demo_documents(max_chars: int | None = None) -> list[Document]:
    """Lee news first, then Wikipedia sections, until ``max_chars`` characters (None = everything)."""
    folder = gensim_test_data()
    documents, chars = [], 0
    for doc in _chain(lee_documents(folder / LEE_FILE), wiki_documents(folder / WIKI_FILE)):
        if max_chars is not None and chars >= max_chars:
            break
        documents.append(doc)
        chars += len(doc.text)
    return documents


def _chain(*iterators: Iterator[Document]) -> Iterator[Document]:
    for iterator in iterators:
        yield from iterator


# ----------------------------------------------------------------------------- C4-format output


def check_validation_fraction(fraction: float) -> None:
    if not 0 < fraction < 0.5:
        raise DataError(f"--validation-fraction must be in (0, 0.5), got {fraction}")


def split_documents(
    documents: list[Document], validation_fraction: float
) -> tuple[list[Document], list[Document]]:
    """Every k-th document (k = round(1 / fraction)) is held out for validation."""
    check_validation_fraction(validation_fraction)
    every = max(2, round(1 / validation_fraction))
    validation = [d for i, d in enumerate(documents) if i % every == every - 1]
    train = [d for i, d in enumerate(documents) if i % every != every - 1]
    return train, validation


def write_c4_dir(
    output: Path, train: list[Document], validation: list[Document], *, force: bool = False
) -> dict[str, int]:
    """Write ``c4-{split}.NNNNN-of-NNNNN.json.gz`` shards into a fresh directory, renamed into place: an
    earlier one of ours is replaced only with ``force``, and a directory tiny-llm did not write (real C4
    shards have the same names) never."""
    output = Path(output)
    with replacing_directory(output, force=force) as tmp:
        counts = {
            split: _write_split(tmp, split, docs)
            for split, docs in (("train", train), ("validation", validation))
        }
    return counts


def _write_split(directory: Path, split: str, documents: list[Document]) -> int:
    if not documents:
        raise DataError(f"no {split} documents to write")
    chars = sum(len(d.text) for d in documents)
    num_shards = max(1, math.ceil(chars / SHARD_CHARS))
    per_shard = math.ceil(len(documents) / num_shards)
    for shard in range(num_shards):
        lines = "".join(
            json.dumps({"text": d.text, "timestamp": TIMESTAMP, "url": d.url}, ensure_ascii=False) + "\n"
            for d in documents[shard * per_shard : (shard + 1) * per_shard]
        )
        path = directory / f"c4-{split}.{shard:05d}-of-{num_shards:05d}.json.gz"
        with open(path, "wb") as raw:
            # Fixed header fields (no name, mtime 0) so the same corpus gives the same bytes.
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as handle:
                handle.write(lines.encode("utf-8"))
            raw.flush()
            os.fsync(raw.fileno())
    return len(documents)


def build_demo_corpus(
    output: Path, validation_fraction: float = 0.05, max_chars: int | None = None, *, force: bool = False
) -> dict[str, int]:
    """The embedded demo corpus as a C4-format directory (an earlier one replaced only with ``force``);
    returns document counts per split."""
    check_validation_fraction(validation_fraction)  # before the seconds of parsing
    check_replaceable(output, force=force)
    train, validation = split_documents(demo_documents(max_chars), validation_fraction)
    counts = write_c4_dir(output, train, validation, force=force)
    counts["train_chars"] = sum(len(d.text) for d in train)
    counts["validation_chars"] = sum(len(d.text) for d in validation)
    return counts
