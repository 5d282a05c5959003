// Stele console: polls /api/console every 2 s and draws the cell from it.
// Everything is built with DOM calls and textContent (names come from
// tenants: nothing is parsed as markup); charts are drawn by hand on
// <canvas>. Rows carry data-* attributes with the state they show, for
// tests and for anyone scripting the page.
"use strict";

const REFRESH_MS = 2000;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") e.className = v;
    else e.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function hex(v) { return "0x" + Number(v).toString(16).padStart(8, "0"); }

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

function age(ms) {
  if (ms === null || ms === undefined) return "never";
  if (ms < 1000) return ms + " ms ago";
  return (ms / 1000).toFixed(1) + " s ago";
}

function secs(s) {
  if (s === null || s === undefined) return "";
  if (s < 120) return s.toFixed(0) + " s";
  return (s / 60).toFixed(1) + " min";
}

function badge(kind, value) {
  return el("span", { class: "badge " + kind + "-" + value }, value);
}

// A small line chart of `values` (oldest first) at their ages, over the
// last `horizon` seconds, on a canvas; the newest value is written beside.
function chart(points, key, horizon, label) {
  const c = el("canvas", {
    class: "chart", width: 180, height: 36,
    "data-chart": key, "data-points": points.length, title: label,
  });
  const g = c.getContext && c.getContext("2d");
  if (g && points.length > 0) {
    const w = c.width, h = c.height, pad = 3;
    const max = Math.max(...points.map(p => p[key]), 1e-9);
    g.strokeStyle = key === "append_p99_ms" ? "#a86200" : "#2457a6";
    g.lineWidth = 1.5;
    g.beginPath();
    points.forEach((p, i) => {
      const x = w - (p.age_s / horizon) * w;
      const y = h - pad - (p[key] / max) * (h - 2 * pad);
      if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
    });
    g.stroke();
    if (points.length === 1) {
      // One point is no line: a dot.
      const p = points[0];
      g.fillStyle = g.strokeStyle;
      g.fillRect(w - (p.age_s / horizon) * w - 2, h - pad - (p[key] / max) * (h - 2 * pad) - 2, 4, 4);
    }
    g.fillStyle = "#66707a";
    g.font = "10px sans-serif";
    g.fillText("max " + max.toFixed(max < 10 ? 2 : 0), 3, 10);
  }
  const last = points.length ? points[points.length - 1][key] : null;
  return el("div", { class: "chart-cell" }, c,
    el("span", { class: "mono" }, last === null ? "–" : last.toFixed(last < 10 ? 2 : 0)));
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function drawCell(v) {
  document.getElementById("cell").hidden = false;
  document.body.setAttribute("data-lease-ms", v.lease_ms);
  document.body.setAttribute("data-leading", v.leading);
  document.getElementById("title").textContent =
    "cell " + (v.cell_id || "(not created)") + " · controller " + v.controller_id +
    (v.leading ? " (leader)" : "") + " · route generation " + v.route_generation;
  const notice = document.getElementById("notice");
  if (!v.initialized) {
    notice.hidden = false;
    notice.textContent = "The cell is not created yet (stele cell init).";
  } else if (!v.leading) {
    notice.hidden = false;
    notice.textContent = "This controller does not lead: node states, leaders, sizes and charts " +
      "are the leader's" + (v.leader_id ? " (controller " + v.leader_id + " at " + v.leader_endpoint + ")" : "") +
      ". Open the console of the leader's HTTP status listener.";
  } else {
    notice.hidden = true;
  }
  const s = v.summary;
  const tile = (label, value, bad, key) =>
    el("div", { class: "tile" + (bad ? " bad" : ""), "data-summary": key }, el("b", {}, value), label);
  document.getElementById("summary").replaceChildren(
    tile("nodes up", s.nodes_up + " / " + s.nodes_total, s.nodes_up < s.nodes_total, "nodes-up"),
    tile("tablets", s.tablets, false, "tablets"),
    tile("under-replicated", s.under_replicated, s.under_replicated > 0, "under-replicated"),
    tile("lost majority", s.lost_majority, s.lost_majority > 0, "lost-majority"),
    tile("unplaced", s.unplaced, s.unplaced > 0, "unplaced"),
    tile("open intents", s.intents_open, false, "intents-open"),
    tile("replication", v.replication, false, "replication"),
  );

  const horizon = 600;
  const down = new Set(v.nodes.filter(n => n.state !== "up" && n.state !== "draining").map(n => n.id));
  fill(document.querySelector("#nodes tbody"), v.nodes.map(n => el("tr", {
    "data-node-id": n.id, "data-node-state": n.state, "data-node-zone": n.zone,
  },
    el("td", { class: "mono" }, n.id),
    el("td", {}, badge("state", n.state)),
    el("td", {}, n.zone + (n.rack ? " / " + n.rack : "")),
    el("td", { class: "mono" }, n.client_endpoint),
    el("td", {}, n.replicas),
    el("td", {}, n.leaders),
    el("td", {}, age(n.heartbeat_age_ms)),
    el("td", {}, chart(n.load, "appends_per_s", horizon, "append calls per second, last 10 minutes")),
    el("td", {}, chart(n.load, "append_p99_ms", horizon, "append p99 (ms), last 10 minutes")),
    el("td", { class: "mono small" }, n.version),
  )));
  document.getElementById("chart-note").textContent =
    "Charts: the last 10 minutes, one point per " + v.chart_slot_s +
    " s; p99 is an upper bound (the top of its histogram bucket, the largest of the slot's heartbeats).";

  fill(document.querySelector("#tablets tbody"), v.tablets.map(t => el("tr", {
    "data-tablet-id": t.id, "data-tablet-health": t.health,
    "data-tablet-leader": t.leader === null ? "" : t.leader,
    "data-tablet-voters": t.voters.join(","),
  },
    el("td", { class: "mono" }, t.id),
    el("td", { class: "mono" }, "[" + hex(t.lo) + ", " + hex(t.hi) + ")"),
    el("td", {}, t.generation),
    el("td", {}, ...t.voters.flatMap((n, i) => [
      i ? ", " : null,
      el("span", { class: down.has(n) ? "voter-down" : "" }, n),
    ]), t.leaving !== null ? " (leaving: " + t.leaving + ")" : null),
    el("td", {}, t.leader === null ? "none" : t.leader),
    el("td", {}, bytes(t.segment_bytes)),
    el("td", {}, t.records_applied),
    el("td", {}, badge("health", t.health)),
    el("td", {}, t.intent ? "#" + t.intent : ""),
  )));

  fill(document.querySelector("#intents tbody"), v.intents.map(i => el("tr", {
    "data-intent-id": i.id, "data-intent-kind": i.kind, "data-intent-state": i.state,
    "data-intent-tablet": i.tablet, "data-intent-open": i.open,
  },
    el("td", { class: "mono" }, i.id),
    el("td", {}, i.kind),
    el("td", { class: "mono" }, i.tablet),
    el("td", { class: "wrap" }, i.what),
    el("td", {}, i.state),
    el("td", { class: "wrap" }, i.progress),
    el("td", {}, secs(i.age_s)),
    el("td", {}, i.reason),
  )));
}

function drawDirectory(d) {
  document.getElementById("directory").hidden = false;
  if (!document.getElementById("cell").hidden) {
    // Both roles in one process: the cell's title stays.
  } else {
    document.getElementById("title").textContent =
      "directory member " + d.member_id + (d.leading ? " (leader)" : "") + " · generation " + d.generation;
  }
  const cards = d.cells.map(c => el("div", {
    class: "cell-card", "data-cell-id": c.id, "data-cell-status": c.status,
    "data-namespace-count": c.namespace_count,
  },
    el("b", {}, "cell " + c.id), " ", badge("state", c.status === "active" ? "up" : "decommissioned"),
    el("span", { class: "muted" }, " " + c.namespace_count + " namespaces · controllers " + c.controllers.join(", ")),
    el("ul", {}, ...c.namespaces.map(n => el("li", { class: "mono", "data-namespace": n }, n))),
    c.namespaces.length < c.namespace_count
      ? el("p", { class: "muted small" }, "… and " + (c.namespace_count - c.namespaces.length) + " more")
      : null,
  ));
  if (d.orphans.length) {
    cards.push(el("p", { class: "notice" }, "Namespaces naming no registered cell: " + d.orphans.join(", ")));
  }
  if (!cards.length) cards.push(el("p", { class: "muted" }, "No cell registered yet."));
  document.getElementById("cells").replaceChildren(...cards);
}

let polls = 0;

async function refresh() {
  const status = document.getElementById("status");
  try {
    const r = await fetch("/api/console", { cache: "no-store" });
    if (!r.ok) throw new Error("HTTP " + r.status);
    const v = await r.json();
    if (v.controller) drawCell(v.controller);
    if (v.directory) drawDirectory(v.directory);
    if (!v.controller && !v.directory) {
      const notice = document.getElementById("notice");
      notice.hidden = false;
      notice.textContent = "This process runs neither a controller nor a directory member: " +
        "the cell's console is on the HTTP status listener of its controller " +
        "(a single-node stele dev has none: stele dev --nodes 3 runs a cell with one).";
    }
    polls++;
    status.textContent = "live";
    status.setAttribute("data-status", "ok");
    document.body.setAttribute("data-console-status", "ok");
    document.body.setAttribute("data-polls", polls);
    document.getElementById("refreshed").textContent =
      "Last refresh " + new Date().toLocaleTimeString() + " (stele " + v.version + ").";
  } catch (e) {
    status.textContent = "unreachable: " + e.message + " (retrying)";
    status.setAttribute("data-status", "error");
    document.body.setAttribute("data-console-status", "error");
  }
}

document.addEventListener("DOMContentLoaded", () => {
  refresh();
  setInterval(refresh, REFRESH_MS);
});
