// The run page's own script: draws the curve as an SVG polyline per sub-run
// segment from the same-origin JSON endpoint, and while the run is live polls
// its figures every 2 s. Strings from the run go in with textContent only.
"use strict";
(function () {
  const body = document.body;
  const run = body.dataset.run;
  const metric = body.dataset.metric;
  const base = "/api/run/" + encodeURIComponent(run);
  const SVG = "http://www.w3.org/2000/svg";
  const COLOURS = ["#2a6fdb", "#d9480f", "#2b8a3e", "#ae3ec9", "#c92a2a", "#0b7285", "#e67700", "#5c7cfa"];
  const POLL_MS = 2000;
  let shownStep = null;

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const key in attrs) node.setAttribute(key, attrs[key]);
    return node;
  }

  function extent(segments) {
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (const seg of segments) {
      seg.steps.forEach(function (step, i) {
        const v = seg.values[i];
        if (v === null) return;
        x0 = Math.min(x0, step); x1 = Math.max(x1, step);
        y0 = Math.min(y0, v); y1 = Math.max(y1, v);
      });
    }
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) { y1 = y0 + 1; y0 = y0 - 1; }
    return { x0: x0, x1: x1, y0: y0, y1: y1 };
  }

  function draw(data) {
    const chart = document.getElementById("chart");
    const legend = document.getElementById("legend");
    chart.replaceChildren();
    legend.replaceChildren();
    const segments = data.segments.filter(function (s) { return s.values.some(function (v) { return v !== null; }); });
    if (!segments.length) {
      const note = document.createElement("p");
      note.className = "note";
      note.textContent = "no " + metric + " recorded yet";
      chart.appendChild(note);
      return;
    }
    const W = 900, H = 320, L = 60, R = 10, T = 10, B = 30;
    const e = extent(segments);
    const x = function (s) { return L + (s - e.x0) / (e.x1 - e.x0) * (W - L - R); };
    const y = function (v) { return T + (1 - (v - e.y0) / (e.y1 - e.y0)) * (H - T - B); };
    const root = svg("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "data-last-step": String(e.x1) });
    root.appendChild(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
    root.appendChild(svg("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
    const labels = [[L, H - 8, String(e.x0)], [W - R - 40, H - 8, String(e.x1)], [W / 2, H - 8, "step"],
                    [4, T + 10, e.y1.toPrecision(4)], [4, H - B, e.y0.toPrecision(4)], [4, H / 2, metric]];
    for (const [lx, ly, text] of labels) {
      const label = svg("text", { x: lx, y: ly });
      label.textContent = text;
      root.appendChild(label);
    }
    const colourOf = {};
    for (const seg of segments) {
      if (!(seg.subrun in colourOf)) colourOf[seg.subrun] = COLOURS[Object.keys(colourOf).length % COLOURS.length];
      const points = [];
      seg.steps.forEach(function (step, i) {
        if (seg.values[i] !== null) points.push(x(step).toFixed(1) + "," + y(seg.values[i]).toFixed(1));
      });
      const line = svg("polyline", { points: points.join(" "), fill: "none", stroke: colourOf[seg.subrun],
                                     "stroke-width": 2, class: seg.kept ? "kept" : "lost" });
      line.dataset.subrun = seg.subrun;
      root.appendChild(line);
    }
    for (const mark of data.incidents || []) {
      if (mark.step < e.x0 || mark.step > e.x1) continue;
      root.appendChild(svg("line", { class: "incident", x1: x(mark.step), y1: T, x2: x(mark.step), y2: H - B }));
      const nearRight = x(mark.step) > W - 120;  // a label at the right edge is written leftwards
      const label = svg("text", { class: "incident", x: x(mark.step) + (nearRight ? -3 : 3), y: T + 12,
                                  "text-anchor": nearRight ? "end" : "start" });
      label.textContent = mark.kind;
      root.appendChild(label);
    }
    chart.appendChild(root);
    for (const subrun in colourOf) {
      const item = document.createElement("span");
      const swatch = document.createElement("i");
      swatch.style.background = colourOf[subrun];
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(subrun));
      legend.appendChild(item);
    }
  }

  function loadCurve() {
    return fetch(base + "/curve?metric=" + encodeURIComponent(metric))
      .then(function (r) { if (!r.ok) throw new Error("curve: HTTP " + r.status); return r.json(); })
      .then(draw);
  }

  function showFigures(figures) {
    document.getElementById("live-state").textContent = figures.state;
    document.getElementById("live-subruns").textContent = String(figures.subruns);
    document.getElementById("live-step").textContent = String(figures.last_step);
    document.getElementById("live-ettr").textContent =
      figures.ettr === null ? "-" : (100 * figures.ettr).toFixed(1) + "%";
    const cell = document.getElementById("live-incident");
    const incident = figures.last_incident;
    if (incident) {
      const link = document.createElement("a");
      link.href = "/run/" + encodeURIComponent(run) + "/incident/" + encodeURIComponent(incident.id);
      link.textContent = incident.kind + ": " + incident.summary;
      cell.replaceChildren(link);
    }
  }

  function poll() {
    fetch(base + "/live")
      .then(function (r) { if (!r.ok) throw new Error("live: HTTP " + r.status); return r.json(); })
      .then(function (figures) {
        showFigures(figures);
        const redraw = figures.last_step !== shownStep ? loadCurve() : Promise.resolve();
        shownStep = figures.last_step;
        return redraw.then(function () { if (figures.live) setTimeout(poll, POLL_MS); });
      })
      .catch(function (err) {
        // The server went away (the command ended) or answered an error: say so, try again later.
        document.getElementById("live-state").textContent = "unknown (" + err.message + ")";
        setTimeout(poll, POLL_MS * 5);
      });
  }

  shownStep = Number(document.getElementById("live-step").textContent);
  loadCurve().then(function () { if (body.dataset.live === "yes") setTimeout(poll, POLL_MS); });
})();
