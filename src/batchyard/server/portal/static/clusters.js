// Clusters page: node states and utilisation, refreshed every 2 s.
"use strict";
(() => {
  const box = document.getElementById("clusters");
  if (!box) return;
  const url = "/portal/api/ws/" + encodeURIComponent(box.dataset.ws) + "/clusters";
  function apply(clusters) {
    for (const c of clusters) {
      const section = Array.from(box.querySelectorAll("section[data-cluster]")).find((s) => s.dataset.cluster === c.name);
      if (!section) continue;
      for (const n of c.nodes) {
        const row = Array.from(section.querySelectorAll("tr[data-node]")).find((r) => r.dataset.node === n.name);
        if (!row) continue;
        const pill = row.querySelector(".pill");
        pill.textContent = n.state; pill.className = "pill state-" + n.state;
        row.querySelector(".reason").textContent = n.reason || "";
        const cells = by.utilCells(n.util);
        row.querySelectorAll("td.util").forEach((td, i) => td.replaceChildren(cells[i]));
      }
    }
  }
  apply(JSON.parse(document.getElementById("cluster-data").textContent));
  const tick = async () => {
    try { apply(await by.json(url)); } catch (e) { /* retry */ }
    setTimeout(tick, 2000);
  };
  setTimeout(tick, 2000);
})();
