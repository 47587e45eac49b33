// The page's own script. On a run's page: embeds the interactive curves (a
// bokeh document from the same-origin JSON endpoint, drawn by BokehJS served
// from bokeh's own package) and keeps the page live: it polls the run's
// figures and, when something changed, refreshes the header, the timeline and
// the curves without a reload (a curve's data is replaced in place, so a zoom
// is kept; a new sub-run, incident kind or skip window draws the figure anew).
// On the compare page: embeds the two runs' overlay. Strings from the run go
// in with textContent only, or as server-escaped HTML parsed by DOMParser.
"use strict";
(function () {
  const body = document.body;
  const chart = document.getElementById("chart");
  const FAST_MS = 2000;  // while the run trains or restarts
  const SLOW_MS = 15000;  // a finished or failed run may be relaunched: look now and then
  const WATCHED = ["running", "restarting", "empty"];
  const CURVES_COST = 10;  // a curves refresh waits 10x as long as the last one took: a long run's stays cheap
  let shown = null;  // the figures last shown: poll redraws only on a change
  let curvesShown = null;  // the figures the curves last showed
  let curvesDue = 0;  // when (Date.now()) the curves may be refreshed again
  let embedded = null;  // {views, doc, shape} of the curves on the page

  function getJSON(url) {
    return fetch(url).then(function (r) {
      return r.json().then(function (data) {
        if (!r.ok) throw new Error(data.error || ("HTTP " + r.status));
        return data;
      });
    });
  }

  function say(text) {
    const note = document.createElement("p");
    note.className = "note error";
    note.textContent = text;
    chart.replaceChildren(note);
  }

  function embed(item, shape) {
    if (embedded) embedded.views.clear();
    chart.replaceChildren();
    if (item === null) {
      say("nothing recorded yet");
      return Promise.resolve();
    }
    return Bokeh.embed.embed_item(item, chart).then(function (views) {
      embedded = { views: views, doc: views.roots[0].model.document, shape: shape };
      chart.dataset.shape = shape;
      chart.dataset.embedded = String(Number(chart.dataset.embedded || 0) + 1);
    });
  }

  // ---- a run's page ----------------------------------------------------

  function viewQuery() {
    return "x=" + encodeURIComponent(chart.dataset.x) + "&metrics=" + encodeURIComponent(chart.dataset.metrics);
  }

  function runBase() {
    return "/api/run/" + encodeURIComponent(body.dataset.run);
  }

  function loadFigure() {
    return getJSON(runBase() + "/figure?" + viewQuery())
      .then(function (data) { return embed(data.item, data.shape); })
      .catch(function (err) { say("cannot draw the curves: " + err.message); });
  }

  function showLegend(colours) {
    const items = Object.keys(colours).map(function (subrun) {
      const item = document.createElement("span");
      const swatch = document.createElement("i");
      swatch.style.background = colours[subrun];
      item.append(swatch, "sub-run " + subrun);
      return item;
    });
    document.getElementById("legend").replaceChildren(...items);
  }

  function refreshCurves() {
    const began = Date.now();
    return getJSON(runBase() + "/curves?" + viewQuery()).then(function (curves) {
      curvesDue = Date.now() + CURVES_COST * (Date.now() - began);
      showLegend(curves.colours);
      if (!embedded || curves.shape !== embedded.shape) return loadFigure();
      for (const name in curves.sources) {
        const source = embedded.doc.get_model_by_name(name);
        if (source) source.data = curves.sources[name];
      }
      chart.dataset.refreshed = String(Number(chart.dataset.refreshed || 0) + 1);
    });
  }

  function refreshTimeline() {
    return fetch("/run/" + encodeURIComponent(body.dataset.run) + "/timeline")
      .then(function (r) { if (!r.ok) throw new Error("timeline: HTTP " + r.status); return r.text(); })
      .then(function (html) {
        // Autoescaped by the server's templates; parsed inert (no script runs in a DOMParser document).
        const parsed = new DOMParser().parseFromString("<div>" + html + "</div>", "text/html");
        document.getElementById("timeline-body").replaceChildren(...parsed.body.firstChild.childNodes);
      });
  }

  function showFigures(figures) {
    const state = document.getElementById("live-state");
    state.textContent = figures.state;
    state.className = "state " + figures.state;
    document.getElementById("live-subruns").textContent = String(figures.subruns);
    document.getElementById("live-step").textContent = String(figures.last_step);
    document.getElementById("live-lost").textContent = String(figures.steps_lost);
    document.getElementById("live-ettr").textContent =
      figures.ettr === null ? "-" : (100 * figures.ettr).toFixed(1) + "%";
    const incident = figures.last_incident;
    if (incident) {
      const link = document.createElement("a");
      link.href = "/run/" + encodeURIComponent(body.dataset.run) + "/incident/" + encodeURIComponent(incident.id);
      link.textContent = incident.label;
      document.getElementById("live-incident").replaceChildren(link);
    }
  }

  function signature(figures) {
    const incident = figures.last_incident ? figures.last_incident.id : "";
    return [figures.state, figures.subruns, figures.last_step, figures.incidents.length, incident].join("|");
  }

  function poll() {
    getJSON(runBase() + "/live")
      .then(function (figures) {
        const now = signature(figures);
        const next = WATCHED.includes(figures.state) ? FAST_MS : SLOW_MS;
        const header = now !== shown ? (showFigures(figures), refreshTimeline()) : Promise.resolve();
        const curves = now !== curvesShown && Date.now() >= curvesDue ? refreshCurves() : null;
        shown = now;
        return Promise.all([header, curves]).then(function () {
          if (curves) curvesShown = now;
          // What the page shows in full (header, timeline and curves): the tests wait on it.
          if (curvesShown === shown) body.dataset.polled = shown;
          return curvesShown === shown ? next : Math.min(next, Math.max(curvesDue - Date.now(), 100));
        });
      })
      .catch(function (err) {
        // The server went away (the command ended) or answered an error: say so, try again later.
        document.getElementById("live-state").textContent = "unknown (" + err.message + ")";
        return SLOW_MS;
      })
      .then(function (wait) { setTimeout(poll, wait); });
  }

  function startRun() {
    // The first poll finds "changed" (nothing shown yet) and refreshes all: what happened
    // between rendering the page and drawing the curves is not missed.
    loadFigure().then(poll);
  }

  // ---- the compare page ------------------------------------------------

  function startCompare() {
    getJSON("/api/compare?runs=" + encodeURIComponent(body.dataset.compare))
      .then(function (data) { return embed(data.item, ""); })
      .catch(function (err) { say("cannot draw the overlay: " + err.message); });
  }

  if (body.dataset.run && chart) startRun();
  else if (body.dataset.compare && chart) startCompare();
})();
