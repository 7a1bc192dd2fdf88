"""The daemon's live page on its metrics port (docs/operations.md, "The live
page"): static files shipped in this package (no build step, nothing fetched
from elsewhere) and `/api/status`, the JSON they poll (peerd.daemon.web.status).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from importlib import resources

from peerd.daemon.metrics import Route
from peerd.daemon.web.status import DEFAULT_POINTS, PageSource, page_status

STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
          "/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/style.css": ("style.css", "text/css; charset=utf-8"),
          "/icon.svg": ("icon.svg", "image/svg+xml; charset=utf-8")}
# Several open pages poll at once: one build serves them all for this long.
CACHE_S = 1.0


def static_routes() -> dict[str, Route]:
    """The page's files, read once: the installed package's own."""
    routes = {}
    for path, (name, kind) in STATIC.items():
        body = resources.files(__package__).joinpath(name).read_bytes()
        routes[path] = lambda query, body=body, kind=kind: (body, kind)
    return routes


def status_route(daemon: PageSource, clock: Callable[[], float] = time.monotonic) -> Route:
    cache: dict[int, tuple[float, bytes]] = {}

    def route(query: Mapping[str, str]) -> tuple[bytes, str]:
        try:
            points = int(query.get("points", DEFAULT_POINTS))
        except ValueError:
            points = DEFAULT_POINTS
        now = clock()
        built = cache.get(points)
        if built is None or now - built[0] >= CACHE_S:
            body = json.dumps(page_status(daemon, now, points), allow_nan=False, separators=(",", ":")).encode()
            cache.clear()  # one entry: a page asks for one size
            built = cache[points] = (now, body)
        return built[1], "application/json"

    return route


def page_routes(daemon: PageSource) -> dict[str, Route]:
    return {**static_routes(), "/api/status": status_route(daemon)}
