"""``lake console``: look at Lake's data in a browser (``lake-sdk[console]``).

A Starlette app on uvicorn that is a client of Query like any other: every
page and every byte is fetched with the signed-in principal's own token,
kept only in an HttpOnly, SameSite=Strict cookie. Pages are rendered on the
server (every value escaped); a little plain JavaScript, no build step.

- :mod:`.settings`: what the command line configures;
- :mod:`.session`: sign-in cookie, CSRF tokens, one SDK client per principal;
- :mod:`.render`: HTML escaping, the page frame and the typed result grid;
- :mod:`.data_pages`: Tables, Versions, Query and downloads;
- :mod:`.file_pages`: Episode views and FILE bytes through bounded range reads;
- :mod:`.plot`: line, scatter and histogram charts as server-side SVG;
- :mod:`.app`: the routes; :mod:`.cli`: ``lake console``.
"""

from lake_sdk.console.settings import ConsoleSettings

__all__ = ["ConsoleSettings"]
