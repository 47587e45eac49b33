"""The Starlette app behind ``runmgr logbook serve``: HTML pages rendered by
Jinja2 (autoescape on, so every string from a run is text), JSON endpoints the
page's own script polls, its static files. It answers GET and HEAD only and
opens every logbook read-only, so nothing on it can change a run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from bokeh.util.paths import bokehjs_path
from jinja2 import Environment, FileSystemLoader
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from logbook.changes import skip_ranges
from logbook.errors import LogbookError
from logbook.schema import LOGBOOK_FILENAME
from logbook.textfmt import clock_text, duration
from logbook.report import run_report
from logbook.plot import PLOT_METRICS
from logbook.web import compare_view, curves_json, figures, files, incident_view, sources
from logbook.web.guard import PLOT_PAGE_CSP, ReadOnlyGuard
from logbook.web.readonly import open_read_only

HERE = Path(__file__).parent
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
"""Host headers answered by default: a page on 127.0.0.1 refuses other names (DNS rebinding)."""
SkippedDecoder = Callable[[Path], str]
"""Run dir -> the decoded text of its skipped samples (runmgr wires `runmgr logbook skipped`)."""


def run_dirs(root: Path) -> dict[str, Path]:
    """The runs the page serves by name: ``root`` itself when it is a run, else its run folders."""
    if (root / LOGBOOK_FILENAME).is_file():
        return {root.name: root}
    return {p.name: p for p in sorted(root.iterdir()) if (p / LOGBOOK_FILENAME).is_file()}


def _templates() -> Jinja2Templates:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True)
    env.filters.update(
        when=lambda t: "-" if t is None else clock_text(t, with_date=True),
        took=duration,
        pct=lambda x: "-" if x is None else f"{100 * x:.1f}%",
        label=lambda incident: incident_view.label(incident["kind"], incident["summary"]),
        pretty=lambda value: json.dumps(value, indent=2, default=str),
    )
    return Jinja2Templates(env=env)


def make_app(root: Path, decode_skipped: Optional[SkippedDecoder] = None,
             allowed_hosts: Sequence[str] = LOCAL_HOSTS) -> Starlette:
    """The read-only site over ``root`` (a run directory or a folder of runs).

    ``decode_skipped`` turns a run dir into the text of its skipped samples;
    without it the page says that decoding is not available.
    """
    root = Path(root)
    templates = _templates()

    def find(name: str) -> Path:
        run_dir = run_dirs(root).get(name)
        if run_dir is None:
            raise HTTPException(404, f"no run {name!r} under {root}")
        return run_dir

    def page(request: Request, template: str, **context) -> Response:
        return templates.TemplateResponse(request, template, context)

    def index(request: Request) -> Response:
        runs = run_dirs(root)
        if (root / LOGBOOK_FILENAME).is_file():
            return RedirectResponse(f"/run/{root.name}", status_code=303)
        rows = []
        for name, run_dir in runs.items():
            try:
                with open_read_only(run_dir) as book:
                    rows.append({"name": name, **sources.overview(book)})
            except LogbookError as err:  # one damaged run hides none of the others
                rows.append({"name": name, "error": str(err)})
        return page(request, "runs.html", root=str(root), rows=rows)

    def view(request: Request) -> tuple[str, tuple[str, ...]]:
        try:
            return curves_json.parse_view(request.query_params.get("x"), request.query_params.get("metrics"))
        except LogbookError as err:
            raise HTTPException(400, str(err)) from None

    def run_page(request: Request) -> Response:
        name = request.path_params["name"]
        run_dir = find(name)
        x, metrics = view(request)
        with open_read_only(run_dir) as book:
            events = book.events()
            figures, subruns = sources.overview(book, events), sources.timeline(book, events)
            report = run_report(book)
        return page(request, "run.html", name=name, figures=figures, subruns=subruns, report=report,
                    x=x, metrics=metrics, x_axes=curves_json.X_AXES, all_metrics=PLOT_METRICS,
                    others=[other for other in run_dirs(root) if other != name],
                    plots=files.plot_images(run_dir), html_plots=files.html_plots(run_dir),
                    health=files.health_reports(run_dir))

    def timeline_fragment(request: Request) -> Response:
        name = request.path_params["name"]
        with open_read_only(find(name)) as book:
            subruns = sources.timeline(book, book.events())
        return page(request, "timeline.html", name=name, subruns=subruns)

    def incident_page(request: Request) -> Response:
        name, incident_id = request.path_params["name"], request.path_params["incident"]
        run_dir = find(name)
        with open_read_only(run_dir) as book:
            events, lineage = book.events(), book.lineage()
        incident = next((e for e in events if e["type"] == "incident" and e["id"] == incident_id), None)
        if incident is None:
            raise HTTPException(404, f"no incident {incident_id} in run {name}")
        decisions = [e for e in events if e["type"] == "decision" and e["incident_id"] == incident_id]
        starts = [e for e in events if e["type"] == "subrun_start" and e["seq"] > incident["seq"]]
        following = next((s for s in lineage if starts and s.id == starts[0]["subrun"]), None)
        before = next((s for s in lineage if s.id == incident["subrun"]), None)
        new_skips = [] if following is None else [
            r for r in skip_ranges(following.plan) if before is None or r not in skip_ranges(before.plan)]
        return page(request, "incident.html", name=name, incident=incident,
                    facts=incident_view.facts(incident, before), evidence=incident_view.flatten(incident["evidence"]),
                    decisions=incident_view.decision_rows(decisions),
                    following=following, new_skips=new_skips, skipped_text=_skipped(run_dir, new_skips),
                    stacks=files.stack_dumps(run_dir, incident["subrun"]),
                    health=files.health_reports(run_dir) if following and "health" in following.evidence else [])

    def _skipped(run_dir: Path, new_skips: list) -> Optional[str]:
        if not new_skips:
            return None
        if decode_skipped is None:
            return "(decoding skipped samples needs runmgr: run `runmgr logbook skipped RUN`)"
        try:
            return decode_skipped(run_dir)
        except LogbookError as err:  # a run whose samples cannot be rebuilt still shows the rest
            return f"(cannot decode the skipped samples: {err})"

    def live_api(request: Request) -> Response:
        with open_read_only(find(request.path_params["name"])) as book:
            return JSONResponse(sources.overview(book))

    def figure_api(request: Request) -> Response:
        name = request.path_params["name"]
        x, metrics = view(request)
        data = read_curves(name, x, metrics)
        if not data["subruns"]:
            return JSONResponse({"shape": "", "item": None})
        return JSONResponse({"shape": data["shape"], "item": figures.layout_item(data, name)})

    def curves_api(request: Request) -> Response:
        x, metrics = view(request)
        return JSONResponse(read_curves(request.path_params["name"], x, metrics))

    def read_curves(name: str, x: str, metrics: tuple[str, ...]) -> dict:
        with open_read_only(find(name)) as book:
            try:
                return curves_json.run_curves(book, x, metrics)
            except LogbookError as err:  # e.g. tokens asked of a run that counted none
                raise HTTPException(400, str(err)) from None

    def compared(request: Request, read: Callable[[dict, str, str], Any]) -> tuple[str, str, Any]:
        """The two runs ``?runs=A,B`` names and what ``read`` makes of them; bad input is a 400."""
        dirs = run_dirs(root)
        try:
            a, b = compare_view.parse_runs(request.query_params.get("runs"), set(dirs))
            return a, b, read(dirs, a, b)
        except LogbookError as err:
            raise HTTPException(400, str(err)) from None

    def compare_page(request: Request) -> Response:
        a, b, result = compared(request, compare_view.comparison)
        return page(request, "compare.html", a=a, b=b, result=result)

    def overlay_api(request: Request) -> Response:
        a, b, lines = compared(request, compare_view.overlay)
        return JSONResponse({"item": figures.overlay_item(f"{b} (red, dashed) over {a} (blue)", lines,
                                                          compare_view.COMPARED, compare_view.labels())})

    def html_plot(request: Request) -> Response:
        path = files.html_plot_path(find(request.path_params["name"]), request.path_params["file"])
        if path is None:
            raise HTTPException(404, "no such plot: `runmgr logbook plot RUN --html` writes one")
        return FileResponse(path, media_type="text/html", headers={"content-security-policy": PLOT_PAGE_CSP})

    def skipped_api(request: Request) -> Response:
        run_dir = find(request.path_params["name"])
        if decode_skipped is None:
            raise HTTPException(404, "decoding skipped samples needs runmgr: run `runmgr logbook skipped RUN`")
        return PlainTextResponse(decode_skipped(run_dir))

    def runs_api(request: Request) -> Response:
        return JSONResponse(sorted(run_dirs(root)))

    def plot_file(request: Request) -> Response:
        path = files.plot_path(find(request.path_params["name"]), request.path_params["file"])
        if path is None:
            raise HTTPException(404, "no such plot")
        return FileResponse(path, media_type="image/png")

    async def error_page(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else str(exc)
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": detail}, status_code=status)
        return templates.TemplateResponse(request, "error.html", {"detail": detail}, status_code=status)

    routes = [
        Route("/", index, methods=["GET"]),
        Route("/run/{name}", run_page, methods=["GET"]),
        Route("/run/{name}/incident/{incident:int}", incident_page, methods=["GET"]),
        Route("/run/{name}/plots/{file}", plot_file, methods=["GET"]),
        Route("/run/{name}/timeline", timeline_fragment, methods=["GET"]),
        Route("/run/{name}/html/{file}", html_plot, methods=["GET"]),
        Route("/compare", compare_page, methods=["GET"]),
        Route("/api/runs", runs_api, methods=["GET"]),
        Route("/api/run/{name}/live", live_api, methods=["GET"]),
        Route("/api/run/{name}/figure", figure_api, methods=["GET"]),
        Route("/api/run/{name}/curves", curves_api, methods=["GET"]),
        Route("/api/compare", overlay_api, methods=["GET"]),
        Route("/api/run/{name}/skipped", skipped_api, methods=["GET"]),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
        # BokehJS from bokeh's own package, the version that wrote the figures: nothing from a CDN.
        Mount("/bokeh", app=StaticFiles(directory=Path(bokehjs_path()) / "js"), name="bokeh"),
    ]
    middleware = [Middleware(ReadOnlyGuard), Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))]
    return Starlette(routes=routes, middleware=middleware,
                     exception_handlers={HTTPException: error_page, LogbookError: error_page})
