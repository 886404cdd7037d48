// Clusters page: every cluster (allocation state, node total, state counts, node rows with
// their job and utilisation) redrawn from the data endpoint every 2 s; clusters created or
// deleted meanwhile come and go without a reload.
"use strict";
(() => {
  const box = document.getElementById("clusters");
  if (!box) return;
  const ws = box.dataset.ws;
  const url = "/portal/api/ws/" + encodeURIComponent(ws) + "/clusters";
  function sizeText(c) {
    const s = c.size || {};
    const models = (c.gpu_models || []).length ? " (" + c.gpu_models.join(", ") + ")" : "";
    return c.vm_size + " (" + s.vcpus + " vCPU" + (s.gpus ? ", " + s.gpus + " GPU" + models : "") + (s.memory_gb ? ", " + s.memory_gb + " GB" : "") + ")";
  }
  function scaleText(c) {
    const m = c.scale && c.scale.manual, a = c.scale && c.scale.autoscale;
    if (m) return "manual: target " + m.target_node_count + (m.node_deallocation_option ? ", on shrink " + m.node_deallocation_option : "");
    if (a) return "autoscale " + a.min_nodes + "–" + a.max_nodes + ", idle " + a.idle_seconds_before_scaledown + "s before scale-down";
    return "—";
  }
  // On a phone the node table is a list of cards: each cell says what it is (data-label).
  function nodeRow(n) {
    const cells = by.utilCells(n.util);
    const job = n.job ? by.el("a", { href: by.jobUrl(ws, n.job.experiment, n.job.name), text: n.job.name }) : "";
    const cell = (cls, label, ...kids) => by.el("td", { class: cls, "data-label": label }, ...kids);
    return by.el("tr", { "data-node": n.name },
      cell("name", "node", n.name, ...(n.gpu_devices || []).map((g) => by.el("small", { class: "gpu-device", text: g }))), cell("nowrap", "address", n.address || ""),
      cell(null, "state", by.pill(n.state)), cell("reason", "reason", n.reason || ""),
      cell("name", "job", job),
      ...cells.map((c, i) => by.el("td", { class: "util", "data-kind": ["cpu", "mem", "gpu"][i],
        "data-label": ["CPU", "memory", "GPU"][i] }, c)));
  }
  function queueText(c) {
    const q = c.queue || { queued: 0, running: 0 };
    return q.queued + " queued, " + q.running + " running";
  }
  function section(c) {
    const facts = by.el("dl", { class: "facts" });
    for (const [k, v, cls] of [["size", sizeText(c)], ["priority", c.vm_priority], ["scale", scaleText(c)],
      ["nodes", c.current_nodes + " of target " + c.target_nodes, "node-total"], ["queue", queueText(c), "queue"],
      ["backend", c.backend]]) {
      facts.append(by.el("dt", { text: k }), by.el("dd", { class: cls, text: v }));
    }
    facts.querySelector("dd.queue").dataset.queued = (c.queue || {}).queued || 0;
    const counts = by.el("div", { class: "counts" });
    by.counts(counts, c.node_counts || {});
    const head = by.el("thead", {}, by.el("tr", {}, ...["node", "address", "state", "reason", "job", "CPU", "memory", "GPU"]
      .map((h, i) => by.el("th", { class: i > 4 ? "w-util" : null, text: h }))));
    const rows = c.nodes.length ? c.nodes.map(nodeRow) : [by.el("tr", {}, by.el("td", { colspan: 8, class: "empty", text: "no nodes" }))];
    return by.el("section", { class: "card cluster", "data-cluster": c.name },
      by.el("h2", {}, by.el("span", { class: "name", text: c.name }), " ", by.pill(c.allocation_state)),
      facts, counts, by.el("div", { class: "scrollx" }, by.el("table", { class: "nodes cards" }, head, by.el("tbody", {}, ...rows))));
  }
  function apply(clusters) {
    if (!clusters.length) {
      box.replaceChildren(by.el("p", { class: "empty" }, "No clusters in workspace " + ws + ". Create one with ",
        by.el("code", { text: "batchyard cluster create" }), "."));
      return;
    }
    box.replaceChildren(...clusters.map(section));
  }
  apply(JSON.parse(document.getElementById("cluster-data").textContent));
  const tick = async () => {
    if (!document.hidden) { try { apply(await by.json(url)); } catch (e) { /* retry */ } }
    setTimeout(tick, 2000);
  };
  setTimeout(tick, 2000);
})();
