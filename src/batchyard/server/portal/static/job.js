// Job page: live logs over Server-Sent Events, live metric charts, state, nodes and files.
"use strict";
(() => {
  const root = document.getElementById("job");
  if (!root) return;
  const api = root.dataset.api;
  const TERMINAL = ["succeeded", "failed", "canceled"];
  const MAX_DOM = 5000, MAX_KEPT = 50000;
  let state = root.dataset.state;

  // ---- logs: buffered, appended once per animation frame, capped -------------------------
  const logBox = document.getElementById("log"), filterSel = document.getElementById("log-filter");
  const pauseBtn = document.getElementById("log-pause"), followBox = document.getElementById("log-follow");
  const stats = document.getElementById("log-stats");
  const kept = [];            // [label, text, isErr] of every line (capped at MAX_KEPT)
  let pending = [];           // lines received but not on screen yet
  let paused = false, received = 0, dropped = 0, frameMs = 0, scheduled = false;
  const labels = new Set();
  const waitBox = document.getElementById("log-wait");
  const LABEL = /^\[([^\]]+)\] /;

  function parse(line) {
    const m = LABEL.exec(line);
    if (!m) return ["", line, false];
    const label = m[1];
    if (!labels.has(label)) {
      labels.add(label);
      filterSel.append(by.el("option", { value: label, text: label }));
    }
    return [label, line.slice(m[0].length), label.endsWith(":err")];
  }
  function lineNode(rec) {
    const d = document.createElement("div");
    if (rec[2]) d.className = "err";
    if (rec[0]) { const s = document.createElement("span"); s.className = "lbl"; s.textContent = "[" + rec[0] + "] "; d.append(s); }
    d.append(document.createTextNode(rec[1]));
    return d;
  }
  const shown = (rec) => !filterSel.value || rec[0] === filterSel.value;
  function flush() {
    scheduled = false;
    if (paused || !pending.length) return;
    const t0 = performance.now();
    let batch = pending; pending = [];
    batch = batch.filter(shown);
    if (batch.length > MAX_DOM) { dropped += batch.length - MAX_DOM; batch = batch.slice(-MAX_DOM); }
    const atEnd = followBox.checked;
    const frag = document.createDocumentFragment();
    for (const rec of batch) frag.append(lineNode(rec));
    logBox.append(frag);
    let extra = logBox.childElementCount - MAX_DOM;
    while (extra-- > 0) logBox.firstElementChild.remove();
    if (atEnd) logBox.scrollTop = logBox.scrollHeight;
    frameMs = performance.now() - t0;
    showStats();
  }
  function schedule() { if (!scheduled && !paused) { scheduled = true; requestAnimationFrame(flush); } }
  function showStats() {
    stats.textContent = received + (received === 1 ? " line" : " lines") +
      (paused ? " · paused (" + pending.length + " waiting)" : "") + (dropped ? " · " + dropped + " not shown" : "");
  }
  function redraw() {
    logBox.replaceChildren();
    pending = kept.slice(-MAX_KEPT);
    schedule();
  }
  function receive(text) {
    for (const line of text.split("\n")) {
      const rec = parse(line);
      kept.push(rec); pending.push(rec); received++;
    }
    if (kept.length > MAX_KEPT) kept.splice(0, kept.length - MAX_KEPT);
    if (pending.length > MAX_KEPT) { dropped += pending.length - MAX_KEPT; pending.splice(0, pending.length - MAX_KEPT); }
    if (paused) showStats(); else schedule();
  }
  let opened = false, source = null;
  function connect() {
    source = new EventSource(api + "/logs");
    source.addEventListener("open", () => {
      if (opened) { kept.length = 0; pending = []; received = 0; logBox.replaceChildren(); }  // a reconnect replays from the start
      opened = true;
    });
    source.addEventListener("message", (e) => receive(e.data));
    source.addEventListener("problem", (e) => { stats.textContent = e.data; });
    source.addEventListener("end", () => { source.close(); stats.dataset.ended = "1"; showStats(); stats.textContent += " · end of log"; });
  }
  pauseBtn.addEventListener("click", () => {
    paused = !paused; pauseBtn.setAttribute("aria-pressed", String(paused));
    pauseBtn.textContent = paused ? "Resume" : "Pause"; showStats(); schedule();
  });
  filterSel.addEventListener("change", redraw);
  logBox.addEventListener("scroll", () => {
    const bottom = logBox.scrollHeight - logBox.scrollTop - logBox.clientHeight < 30;
    if (followBox.checked !== bottom && !scheduled) followBox.checked = bottom;
  });
  const dl = by.el("button", { type: "button", id: "log-download", text: "Download shown" });
  dl.addEventListener("click", () => {
    const text = kept.filter(shown).map((r) => (r[0] ? "[" + r[0] + "] " : "") + r[1]).join("\n") + "\n";
    const a = by.el("a", { href: URL.createObjectURL(new Blob([text], { type: "text/plain" })), download: "logs.txt" });
    document.body.append(a); a.click(); a.remove();
  });
  document.getElementById("log-downloads").append(dl);
  window.byLog = { stats: () => ({ received, dropped, frameMs, onScreen: logBox.childElementCount }) };

  // ---- metrics: polled, one chart per metric name, one series per rank ---------------------
  const charts = document.getElementById("charts");
  const metrics = new Map();   // name -> Map(series -> points)
  let lastId = null, metricsDone = false;
  async function pollMetrics() {
    const rows = await by.json(api + "/metrics" + (lastId === null ? "" : "?after=" + lastId));
    const changed = new Set();
    for (const m of rows) {
      lastId = m.id;
      if (typeof m.value !== "number" || m.kind !== "scalar") continue;
      if (!metrics.has(m.name)) metrics.set(m.name, new Map());
      const key = m.rank === null ? "run" : "rank " + m.rank;
      const series = metrics.get(m.name);
      if (!series.has(key)) series.set(key, []);
      const pts = series.get(key);
      pts.push([m.step === null ? pts.length : m.step, m.value]);
      changed.add(m.name);
    }
    for (const name of changed) drawMetric(name);
  }
  function drawMetric(name) {
    document.getElementById("no-metrics")?.remove();
    let box = Array.from(charts.children).find((c) => c.dataset.metric === name);
    if (!box) { box = by.el("div", { class: "chart", "data-metric": name }); charts.append(box); }
    const series = Array.from(metrics.get(name), ([k, points]) => ({ name: k, points }));
    // drawn at the box's own width, so its text stays legible on a phone
    box.replaceChildren(byChart.panel(name, series, { key: name, width: Math.max(280, Math.round(charts.clientWidth || 560)) }));
  }

  let resized = null;
  window.addEventListener("resize", () => {
    clearTimeout(resized);
    resized = setTimeout(() => { for (const name of metrics.keys()) drawMetric(name); }, 200);
  });

  // ---- state, nodes, attempts, files: polled --------------------------------------------
  function setText(id, v) { const n = document.getElementById(id); if (n) n.textContent = v; }
  function showError(error) {  // the failure cause and the failing rank's last lines
    const lines = (error && error.lines) || [];
    setText("job-cause", error ? error.cause : "");
    setText("job-error", lines.join("\n"));
    const hide = (id, hidden) => { const n = document.getElementById(id); if (n) n.hidden = hidden; };
    hide("job-cause-label", !error); hide("job-cause", !error); hide("job-error", !lines.length);
  }
  async function pollJob() {
    const j = await by.json(api);
    state = j.state;
    const pill = document.getElementById("job-state");
    pill.textContent = j.state; pill.className = "pill state-" + j.state;
    setText("job-attempt", j.attempt);
    setText("job-exit", j.exit_code === null ? "—" : j.exit_code);
    setText("job-duration", by.duration(j.duration));
    setText("job-reason", j.pending_reason || j.message || "—");
    setText("job-capacity", j.capacity || "");  // borrowed capacity, or given back
    for (const id of ["job-capacity-label", "job-capacity"]) {
      const n = document.getElementById(id); if (n) n.hidden = !j.capacity;
    }
    showEstimate(j);
    showCheckpoint(j.checkpoint);
    setText("job-straggler", j.straggler_text || "—");
    showError(j.error);
    showWaiting(j);
    showObserved(j);
    const terminate = document.getElementById("terminate-form");  // none for a reader
    if (terminate) terminate.hidden = !j.can_manage || TERMINAL.includes(j.state);
    const body = document.querySelector("#node-status tbody");
    body.replaceChildren(...j.node_status.map((n) => {
      const [cpu, mem] = by.utilCells(n.util);
      const ranks = n.ranks.filter((r) => r.rank >= 0).map((r) => r.rank + (r.exit_code === null ? "" : " (" + r.exit_code + ")")).join(", ");
      const cell = (cls, label, ...kids) => by.el("td", { class: cls, "data-label": label }, ...kids);
      return by.el("tr", { "data-node": n.node }, cell("name", "node", n.node),
        cell(null, "state", n.state + (n.exit_code != null ? " · exit " + n.exit_code : "")),
        cell(null, "ranks (exit)", ranks), cell("util", "CPU", cpu), cell("util", "memory", mem));
    }));
    const att = document.getElementById("attempts");
    if (j.attempts.length) att.replaceChildren(...j.attempts.map((a) => by.el("tr", {},
      by.el("td", { text: a.number }), by.el("td", { text: a.state }), by.el("td", { text: a.exit_code ?? "" }),
      by.el("td", { class: "nowrap" }, by.time(a.started_at)), by.el("td", { class: "nowrap" }, by.time(a.ended_at)),
      by.el("td", { class: "reason", text: a.message || "" }))));
  }
  // The GPUs' utilisation as a chart first among the metrics, and the TensorBoard link once
  // the job has event files.
  let gpuShown = "";
  function showObserved(j) {
    const tb = document.getElementById("tensorboard");
    if (tb && j.tensorboard) { tb.href = j.tensorboard; tb.hidden = false; }
    const series = j.gpu_series || [];
    const seen = JSON.stringify(series);
    if (!series.length || seen === gpuShown) return;
    gpuShown = seen;
    document.getElementById("no-metrics")?.remove();
    let box = document.getElementById("gpu-chart");
    if (!box) { box = by.el("div", { class: "chart", id: "gpu-chart", "data-metric": "GPU utilisation" }); charts.prepend(box); }
    box.replaceChildren(byChart.panel("GPU utilisation (%)", series, { key: "gpu-utilisation", xTitle: "minutes",
      yTitle: "utilisation %", width: Math.max(280, Math.round(charts.clientWidth || 560)) }));
  }
  // A queued job's estimated start (services.estimates): when, or unknown, and its caveat.
  function showCheckpoint(saved) {  // batchyard.checkpoint_saved(step): the last one
    const box = document.getElementById("job-checkpoint");
    if (!box) return;
    const known = !!(saved && saved.at);
    box.hidden = !known;
    document.getElementById("job-checkpoint-label").hidden = !known;
    if (!known) return;
    const step = saved.step === null || saved.step === undefined ? "" : "step " + saved.step + ", ";
    box.replaceChildren(document.createTextNode(step), by.time(saved.at));
  }
  function showEstimate(j) {
    const queued = j.state === "queued" && !!j.estimate;
    const box = document.getElementById("job-estimate");
    if (!box) return;
    box.hidden = !queued;
    document.getElementById("job-estimate-label").hidden = !queued;
    if (!queued) return;
    const note = j.estimate.note ? by.el("small", { text: " (" + j.estimate.note + ")" }) : "";
    box.replaceChildren(j.estimated_start ? by.time(j.estimated_start) : document.createTextNode("unknown"), note);
  }
  // Until the job's processes print, the log pane says why there is nothing yet.
  function showWaiting(j) {
    const waiting = (j.state === "queued" || j.state === "preparing") && !received;
    waitBox.hidden = !waiting;
    if (waiting) waitBox.textContent = j.state === "queued" ? "Waiting to start: " + (j.pending_reason || "queued")
      : "Preparing the nodes; logs appear when the job's processes start.";
  }
  async function pollFiles() {
    const f = await by.json(api + "/files");
    const list = document.getElementById("files");
    if (!f.files.length) return;
    list.replaceChildren(...f.files.map((x) => by.el("li", {},
      by.el("a", { href: api + "/files/content?path=" + encodeURIComponent(x.path) + "&attempt=" + f.attempt, download: "", text: x.path }),
      " ", by.el("span", { class: "muted", text: by.bytes(x.size) }))));
  }
  function every(ms, fn, stopWhenDone) {
    let finals = 0;
    const tick = async () => {
      try { await fn(); } catch (e) { /* next tick retries */ }
      if (stopWhenDone && TERMINAL.includes(state) && ++finals > 2) return;
      setTimeout(tick, ms);
    };
    tick();
  }
  connect();
  every(1500, pollJob, true);
  every(1000, pollMetrics, true);
  every(3000, pollFiles, true);
})();
