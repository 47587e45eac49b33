"""``runmgr logbook serve``: a read-only local web page over one run or a
folder of runs (Starlette, Jinja2 templates with autoescape, the page's own
small JavaScript; nothing fetched from outside). See :func:`make_app`."""

from logbook.web.app import make_app

__all__ = ["make_app"]
