"""The Wikipedia family's tools, ``search`` and ``get_article``, over the episode's backend.

They format what a :class:`~benchmax_gym.envs.wikipedia.backends.Backend` returns and never know
which backend it is. Articles come in chunks of at most ``CHUNK_CHARS`` characters with a note
saying how to ask for the next one (``offset``) or for one section. A missing title is a tool error
that suggests the closest titles; a redirect says where it came from; a disambiguation page lists
the articles it points to. Empty or huge queries and titles, and text with lone surrogates, are tool
errors; FTS syntax in a query (``"``, ``*``, ``NEAR``, ``-``) is just text.
"""

from __future__ import annotations

from benchmax_gym.core.tools import Tool, ToolError, tool
from benchmax_gym.envs.wikipedia.backends import Article, Backend, title_key

MAX_QUERY_CHARS = 300
MAX_TITLE_CHARS = 300
MAX_RESULTS = 20
CHUNK_CHARS = 3_000


def _backend(episode) -> Backend:
    return episode.state["backend"]


def _bounded(name: str, value: str, limit: int) -> str:
    value = value.strip()
    if not value:
        raise ToolError(f"the {name} is empty")
    if len(value) > limit:
        raise ToolError(f"the {name} has {len(value)} characters; at most {limit} are allowed")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # (once "failed: UnicodeEncodeError: 'utf-8' codec can't encode ...")
            raise ToolError(f"the {name} is not valid Unicode text: it holds a lone surrogate") from None
    return value


def search(query: str, episode, limit: int = 5) -> str:
    """Search the encyclopedia. Returns up to `limit` article titles, each with a snippet of its text.

    Args:
        query: words to look for, e.g. "Vorsa Lantern novel" or an article title
        limit: how many results to return, 1 to 20
    """
    query = _bounded("query", query, MAX_QUERY_CHARS)
    if not 1 <= limit <= MAX_RESULTS:
        raise ToolError(f"limit must be from 1 to {MAX_RESULTS}, got {limit}")
    hits = _backend(episode).search(query, limit)
    if not hits:
        return f"No results for {query!r}. Try other or fewer words."
    return "\n".join(f"{i}. {hit.title} - {hit.snippet}" for i, hit in enumerate(hits, 1))


def get_article(title: str, episode, section: str | None = None, offset: int = 0) -> str:
    """Read an article by its exact title: the text from `offset` (3000 characters at a time), or one section.

    Args:
        title: the article's title, as search shows it
        section: a section heading to read only that section, e.g. "Career"
        offset: the character position to continue from, as the previous result says
    """
    title = _bounded("title", title, MAX_TITLE_CHARS)
    if offset < 0:
        raise ToolError(f"offset must be 0 or more, got {offset}")
    backend = _backend(episode)
    article = backend.article(title)
    if article is None:
        suggestions = [h.title for h in backend.search(title, 5)]
        hint = f" Similar titles: {'; '.join(suggestions)}." if suggestions else " Use search to find titles."
        raise ToolError(f"there is no article titled {title!r}.{hint}")
    header = [f"# {article.title}"]
    if article.redirected_from:
        header.append(f"(Redirected from {article.redirected_from})")
    if article.disambiguation:
        listed = f": {'; '.join(article.candidates)}" if article.candidates else " below"
        header.append(f"(Disambiguation page: {article.title!r} may mean several articles. "
                      f"Read one of them with get_article{listed}.)")
    names = [s.title for s in article.sections if s.title]
    if section is None:
        text = _full_text(article)
        if names:
            header.append("Sections: " + "; ".join(names))
        where = ""
    else:
        text = _section_text(article, section)
        where = f", section={section!r}"
    if offset and offset >= len(text):
        raise ToolError(f"offset {offset} is past the end of the text ({len(text)} characters)")
    chunk = text[offset:offset + CHUNK_CHARS]
    end = offset + len(chunk)
    parts = ["\n".join(header), chunk]
    if offset or end < len(text):
        more = f" Call get_article with offset={end}{where} for more." if end < len(text) else " End of text."
        parts.append(f"[Characters {offset}-{end} of {len(text)}.{more}]")
    return "\n\n".join(parts)


def _full_text(article: Article) -> str:
    return "\n\n".join(f"== {s.title} ==\n{s.text}" if s.title else s.text for s in article.sections).strip()


def _section_text(article: Article, section: str) -> str:
    wanted = title_key(section)
    for s in article.sections:
        if title_key(s.title) == wanted or (not s.title and wanted in ("", "lead", "introduction", "summary")):
            return s.text or "(this section has no text of its own)"
    names = [s.title for s in article.sections if s.title] or ["(none: the article is one section)"]
    raise ToolError(f"{article.title!r} has no section {section!r}; its sections are: {'; '.join(names)}")


def wikipedia_tools(inline: bool) -> list[Tool]:
    """The tools; ``inline`` where the backend is local and bounded (no timeout thread needed)."""
    return [tool(search, inline=inline), tool(get_article, inline=inline)]
