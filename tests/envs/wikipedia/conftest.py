"""Fixtures for the Wikipedia family: a private index cache, and a local MediaWiki API server."""

import pytest

from benchmax_gym.testing.mediawiki import MediaWikiStub
from benchmax_gym.envs.wikipedia.tasks import encyclopedia

EXTRA_PAGES = [
    {"title": "Zürich", "text": "Zürich is a city on the Limmat.\n\n== History ==\nIt was founded as Turicum."},
    {"title": "東京", "text": "東京 is the capital of Japan."},
    {"title": "Mercury", "text": "Mercury may refer to:\n* [[Mercury (planet)]]\n* [[Mercury (element)]]"},
    {"title": "Mercury (planet)", "text": "Mercury is the closest planet to the Sun."},
    {"title": "Mercury (element)", "text": "Mercury is a chemical element with symbol Hg."},
    {"title": "Hg", "text": "#REDIRECT [[Mercury (element)]]"},
]


@pytest.fixture(autouse=True)
def index_cache(tmp_path_factory, monkeypatch):
    """Indexes built by tests go to a temporary folder, never to ~/.cache."""
    folder = tmp_path_factory.getbasetemp() / "benchmax-gym-cache"
    monkeypatch.setenv("BENCHMAX_GYM_CACHE", str(folder))
    return folder


@pytest.fixture(scope="module")
def world():
    return encyclopedia(0, 300)


@pytest.fixture
def mediawiki(world):
    """A real HTTP server on 127.0.0.1 answering MediaWiki API requests over the encyclopedia."""
    with MediaWikiStub(world.records + EXTRA_PAGES) as server:
        yield server
