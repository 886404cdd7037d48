// Jobs page: the list is polled every 2 s and redrawn in place (new rows, states, reasons,
// durations, state counts), keeping the page's filters. Text always goes in as text.
"use strict";
(() => {
  const table = document.getElementById("jobs");
  if (!table) return;
  const body = table.querySelector("tbody"), ws = table.dataset.ws, back = table.dataset.back;
  const counts = document.getElementById("job-counts");
  const ACTIVE = ["queued", "preparing", "running", "finalizing"];
  const STATES = Array.from(counts.querySelectorAll("[data-count]"), (c) => c.dataset.count);
  function action(j) {
    if (!j.can_manage) return "";  // a reader, or another user's job: no buttons
    const url = by.jobUrl(ws, j.experiment, j.name);
    const live = ACTIVE.includes(j.state);
    return by.el("form", { method: "post", action: url + (live ? "/terminate" : "/delete"),
      "data-confirm": live ? "Terminate " + j.name + "?" : "Delete " + j.name + " and its files?" },
      by.el("input", { type: "hidden", name: "csrf", value: by.csrf() }),
      by.el("input", { type: "hidden", name: "back", value: back }),
      by.el("button", { type: "submit", class: live ? "danger" : null, text: live ? "Terminate" : "Delete" }));
  }
  function row(j) {
    const cell = (cls, label, ...kids) => by.el("td", { class: cls, "data-label": label }, ...kids);
    return by.el("tr", { "data-job": j.name, "data-experiment": j.experiment, "data-state": j.state },
      cell("name", "job", by.el("a", { href: by.jobUrl(ws, j.experiment, j.name), text: j.name })),
      cell("name", "experiment", by.el("a", { href: by.expUrl(ws, j.experiment), text: j.experiment })),
      cell("name", "cluster", j.cluster || ""),
      cell(null, "state", by.pill(j.state)),
      cell("reason", "reason", j.pending_reason || j.message || ""),
      cell("nowrap", "nodes", j.nodes + "×" + j.processes_per_node),
      cell("num", "attempt", j.attempt),
      cell("num", "exit", j.exit_code === null ? "" : j.exit_code),
      cell("nowrap", "submitted", by.time(j.submitted_at)),
      cell("name", "by", j.created_by || ""),
      cell("nowrap", "duration", by.duration(j.duration)),
      cell("actions", null, action(j)));
  }
  let last = "";
  function apply(jobs) {
    const seen = JSON.stringify(jobs);
    if (seen === last) return;
    last = seen;
    const n = Object.fromEntries(STATES.map((s) => [s, 0]));
    for (const j of jobs) n[j.state] = (n[j.state] || 0) + 1;
    by.counts(counts, n);
    if (!jobs.length) {
      body.replaceChildren(by.el("tr", { class: "none" }, by.el("td", { colspan: 12, class: "empty", text: "no jobs match" })));
      return;
    }
    body.replaceChildren(...jobs.map(row));
  }
  const tick = async () => {
    if (!document.hidden) { try { apply(await by.json(table.dataset.api)); } catch (e) { /* retry */ } }
    setTimeout(tick, 2000);
  };
  setTimeout(tick, 2000);
})();
