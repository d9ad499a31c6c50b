"""A user's documents as a corpus: read, titled, chunked.

``load_documents(path)`` reads a file or a folder (recursively, in name order) of plain text
(``.txt``: titled by the file name), Markdown (``.md``: its first ``#`` heading, else the file
name), HTML (``.html``/``.htm``: ``<title>``, else the first ``<h1>``; scripts and styles dropped)
and JSON Lines or JSON arrays of ``{title, text}`` (a HotpotQA file too); PDF when the ``pdf``
extra (``pypdf``) is installed. Text is UTF-8 (or UTF-16 with its byte-order mark); a file in
another encoding is refused naming it. Sub-headings become ``== Heading ==`` lines, the section
convention of the Wikipedia family's backend, so ``get_article`` can read a section at a time.
A document seen twice (one title, one text: a file copied into two folders, a record given twice)
is kept once; another document of a title seen before gets `` (2)``, `` (3)``...: the index keeps
one article per title (a JSON file's own records of one title and different texts are refused). A
file of a folder that links outside it is refused (a folder from elsewhere could otherwise put
any file of this machine into the index and the questions).

``benchmax/Wikipedia-v0`` with ``backend="local", backend_args={"corpus": path}`` indexes the
same documents (SQLite FTS5, cached under a hash of their content).
"""

from __future__ import annotations

import html.parser
import os
import re
from dataclasses import dataclass
from pathlib import Path

TEXT_SUFFIXES = (".txt", ".text")
MARKDOWN_SUFFIXES = (".md", ".markdown")
HTML_SUFFIXES = (".html", ".htm")
JSON_SUFFIXES = (".jsonl", ".json")
SUFFIXES = TEXT_SUFFIXES + MARKDOWN_SUFFIXES + HTML_SUFFIXES + JSON_SUFFIXES + (".pdf",)
MAX_DOCUMENT_BYTES = 64 << 20  # a larger file is refused (a corpus of many files is fine)


@dataclass(frozen=True)
class Document:
    title: str
    text: str
    source: str  # the file it came from


@dataclass(frozen=True)
class Chunk:
    """A passage of a document: what a question is generated from and checked against."""

    title: str
    index: int
    text: str


def document_files(path: str | os.PathLike) -> list[Path]:
    """The documents under ``path`` (itself when a file), in name order; hidden files skipped."""
    root = Path(path)
    if root.exists() and not root.is_file() and not root.is_dir():  # a FIFO or a device: never opened
        raise ValueError(f"DOCS {str(path)!r}: not a regular file or folder")
    if root.is_file():
        if root.suffix.lower() not in SUFFIXES:
            raise ValueError(f"DOCS {str(path)!r}: not a document this reads ({', '.join(SUFFIXES)})")
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(f"DOCS {str(path)!r}: no such file or folder")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES
                   and not any(part.startswith(".") for part in p.relative_to(root).parts))
    if not files:
        raise ValueError(f"DOCS {str(path)!r}: no documents ({', '.join(SUFFIXES)}) in the folder")
    inside = root.resolve()
    for file in files:  # (a folder from elsewhere may link "notes.txt" to ~/.ssh/id_rsa)
        target = file.resolve()
        if not target.is_relative_to(inside):
            raise ValueError(f"DOCS {str(path)!r}: {file} links outside the folder (to {target}); copy that "
                             "document into the folder, or pass it as DOCS itself")
    return files


def load_documents(path: str | os.PathLike) -> list[Document]:
    """Every document under ``path`` (see the module docstring), titles made unique."""
    return read_documents(path)[0]


def read_documents(path: str | os.PathLike) -> tuple[list[Document], int]:
    """:func:`load_documents`'s documents, and how many duplicates (one title, one text) it
    dropped: indexed twice, as "X" and "X (2)", search returned the same text twice."""
    documents: list[Document] = []
    dropped = 0
    for file in document_files(path):
        if file.stat().st_size > MAX_DOCUMENT_BYTES:
            raise ValueError(f"{file}: larger than {MAX_DOCUMENT_BYTES >> 20} MiB; split it")
        read, duplicates = _read(file)
        documents += read
        dropped += duplicates
    seen: dict[str, int] = {}
    taken: set[str] = set()  # (a suffixed title may be another document's own: "X (2)" twice loses one)
    texts: set[tuple[str, str]] = set()  # (title key, text) of each document kept
    unique = []
    for doc in documents:
        if not doc.text.strip():
            continue
        key = " ".join(doc.title.split()).casefold()
        if (key, doc.text.strip()) in texts:
            dropped += 1
            continue
        texts.add((key, doc.text.strip()))
        title = doc.title
        while " ".join(title.split()).casefold() in taken:
            seen[key] = seen.get(key, 1) + 1
            title = f"{doc.title} ({seen[key]})"
        taken.add(" ".join(title.split()).casefold())
        unique.append(Document(title, doc.text, doc.source))
    if not unique:
        raise ValueError(f"DOCS {str(path)!r}: the documents hold no text")
    return unique, dropped


def _stem_title(file: Path) -> str:
    return " ".join(re.sub(r"[_]+", " ", file.stem).split()) or file.name


def _read(file: Path) -> tuple[list[Document], int]:
    """The documents of ``file`` and how many duplicates a JSON corpus file held (dropped)."""
    suffix = file.suffix.lower()
    if suffix in JSON_SUFFIXES:
        from benchmax_gym.envs.wikipedia.tasks import read_corpus

        try:
            records, _, dropped = read_corpus(file)
        except RecursionError:  # json.loads of a hostile or broken file
            raise ValueError(f"{file}: JSON nested too deeply to read") from None
        except UnicodeDecodeError as exc:  # (its message alone did not say which file)
            raise ValueError(f"{file}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
        return [Document(r["title"], r["text"], str(file)) for r in records], dropped
    if suffix == ".pdf":
        return [Document(_stem_title(file), _pdf_text(file), str(file))], 0
    raw = _decode(file)
    if suffix in MARKDOWN_SUFFIXES:
        title, text = _markdown(raw)
    elif suffix in HTML_SUFFIXES:
        title, text = _html(raw)
    else:
        title, text = None, raw
    return [Document(title or _stem_title(file), text.strip(), str(file))], 0


def _decode(file: Path) -> str:
    """``file``'s text: UTF-8 (a byte-order mark dropped: it hid a Markdown title), or UTF-16 with
    its byte-order mark. Anything else is refused naming the byte: decoded with replacement
    characters, its words went into the index and the questions silently garbled. So is a
    binary file (a NUL character), whatever its name."""
    data = file.read_bytes()
    try:
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            text = data.decode("utf-16")
        else:
            text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{file}: not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r}); "
                         "save it as UTF-8") from None
    if "\x00" in text:  # a binary file named .txt decodes as UTF-8 when it is mostly zeros: its bytes were indexed
        raise ValueError(f"{file}: binary, not text (a NUL character at {text.index(chr(0))}); "
                         "remove it from the folder or save it as text")
    return text


_MD_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_MD_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_MD_EMPHASIS = re.compile(r"(\*\*|__|\*|`)")


def _markdown(raw: str) -> tuple[str | None, str]:
    title, lines = None, []
    for line in raw.splitlines():
        heading = _MD_HEADING.match(line)
        if heading:
            words = _MD_EMPHASIS.sub("", _MD_LINK.sub(r"\1", heading[2])).strip()
            if len(heading[1]) == 1 and title is None:
                title = words
            else:
                lines += ["", f"== {words} ==", ""]
            continue
        lines.append(_MD_EMPHASIS.sub("", _MD_LINK.sub(r"\1", line)))
    return title, "\n".join(lines)


class _HTMLText(html.parser.HTMLParser):
    """Text of an HTML page: blocks on their own lines, h2-h6 as ``== x ==``, no script/style."""

    BLOCKS = {"p", "div", "li", "br", "tr", "section", "article", "blockquote", "pre", "table", "ul", "ol", "dd", "dt"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title: str | None = None
        self.h1: str | None = None
        self._skip = 0
        self._in: str | None = None
        self._buffer: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "noscript", "template"):
            self._skip += 1
        elif tag in ("title", "h1", "h2", "h3", "h4", "h5", "h6"):
            self._in, self._buffer = tag, []
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style", "noscript", "template"):
            self._skip = max(0, self._skip - 1)
        elif tag == self._in:
            words = " ".join("".join(self._buffer).split())
            if tag == "title":
                self.title = self.title or words
            elif tag == "h1":
                self.h1 = self.h1 or words
                self.parts.append(f"\n{words}\n")
            elif words:
                self.parts.append(f"\n\n== {words} ==\n\n")
            self._in = None
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data):
        if self._skip:
            return
        if self._in is not None:
            self._buffer.append(data)
        else:
            self.parts.append(data)


def _html(raw: str) -> tuple[str | None, str]:
    parser = _HTMLText()
    parser.feed(raw)
    parser.close()
    text = "".join(parser.parts)
    lines = [" ".join(line.split()) for line in text.splitlines()]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines))
    return parser.title or parser.h1, text


def _pdf_text(file: Path) -> str:
    try:
        import pypdf
    except ImportError:
        raise ValueError(f"{file}: reading PDF needs pypdf: pip install 'benchmax-gym[pdf]'") from None
    try:
        reader = pypdf.PdfReader(str(file))
        return "\n\n".join((page.extract_text() or "").strip() for page in reader.pages)
    except Exception as exc:  # a broken or encrypted file: pypdf's own errors, or any from its parsing
        raise ValueError(f"{file}: not a PDF this can read ({type(exc).__name__}: {exc})") from None


# -- chunks ---------------------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


_HEADING_LINE = re.compile(r"^\s*={2,6}.*={2,6}\s*$")


def sentences(text: str) -> list[str]:
    """``text`` split into sentences (a plain rule: end punctuation, then a capital or digit),
    paragraph by paragraph; ``== Heading ==`` lines are not sentences."""
    out = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [line for line in paragraph.splitlines() if not _HEADING_LINE.match(line)]
        joined = " ".join(" ".join(lines).split())
        out += [s.strip() for s in _SENTENCE_END.split(joined) if s.strip()]
    return out


def _cut(sentence: str, limit: int) -> list[str]:
    """``sentence`` in parts of at most ``limit`` characters, cut at spaces (anywhere when there
    are none): a text without sentence ends (a log, a table) was one chunk of any size."""
    parts, start = [], 0
    while len(sentence) - start > limit:
        cut = sentence.rfind(" ", start + 1, start + limit + 1)
        cut = cut if cut > start else start + limit
        parts.append(sentence[start:cut].strip())
        start = cut
    return parts + [sentence[start:].strip()]


def chunk_document(doc: Document, chunk_chars: int = 1200) -> list[Chunk]:
    """Paragraphs of ``doc`` grouped into passages of about ``chunk_chars`` characters (a heading
    stays with what follows it; a longer paragraph is split between sentences, a longer sentence
    between words)."""
    if chunk_chars < 200:
        raise ValueError(f"chunk_chars must be at least 200, got {chunk_chars}")
    pieces: list[str] = []
    for paragraph in re.split(r"\n\s*\n", doc.text):
        paragraph = paragraph.strip()
        if not paragraph:
            continue
        if len(paragraph) <= chunk_chars:
            pieces.append(paragraph)
            continue
        current = ""
        for sentence in (part for s in sentences(paragraph) for part in _cut(s, chunk_chars)):
            if current and len(current) + len(sentence) + 1 > chunk_chars:
                pieces.append(current)
                current = ""
            current = f"{current} {sentence}".strip()
        if current:
            pieces.append(current)
    chunks, current = [], ""
    for piece in pieces:
        heading = piece.startswith("==") and piece.endswith("==")
        if current and len(current) + len(piece) + 2 > chunk_chars and not current.endswith("=="):
            chunks.append(current)
            current = ""
        current = f"{current}\n\n{piece}".strip() if current else piece
        if heading:
            continue
    if current:
        chunks.append(current)
    return [Chunk(doc.title, i, text) for i, text in enumerate(chunks)]


def corpus_records(documents: list[Document]) -> list[dict[str, str]]:
    """``{title, text}`` records, what the Wikipedia family's local backend indexes."""
    return [{"title": d.title, "text": d.text} for d in documents]
