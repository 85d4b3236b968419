// A DAG run's tasks as an SVG graph: a task stands in the column one past its
// deepest upstream task, an arrow runs from each upstream task to it, and its
// box is coloured by its state (the legend lists the colours).

import {h, s} from "../dom.js";

const BOX_W = 170;
const BOX_H = 40;
const GAP_X = 60;
const GAP_Y = 22;
const PAD = 16;

export const STATE_COLOURS = {
  pending: "#d9d9d9", scheduled: "#d9d9d9", armed: "#dbeafe", queued: "#9ecbff", running: "#3b82f6",
  retry_wait: "#f5b041", succeeded: "#4caf50", failed: "#e53935", skipped: "#b39ddb",
  missed: "#b39ddb", upstream_failed: "#ef9a9a", cancelled: "#8d8d8d",
};

// Column of each task: 0 for a task without upstream, else 1 + its deepest upstream's.
function columns(tasks) {
  const byId = new Map(tasks.map((t) => [t.id, t]));
  const depth = new Map();
  const visit = (id, seen) => {
    if (depth.has(id)) return depth.get(id);
    if (seen.has(id)) return 0;   // a cycle cannot be stored; draw rather than hang
    seen.add(id);
    const ups = (byId.get(id)?.depends_on || []).filter((u) => byId.has(u));
    const d = ups.length ? 1 + Math.max(...ups.map((u) => visit(u, seen))) : 0;
    depth.set(id, d);
    return d;
  };
  tasks.forEach((t) => visit(t.id, new Set()));
  return depth;
}

function layout(tasks) {
  const depth = columns(tasks);
  const rows = new Map();
  const at = new Map();
  for (const t of tasks) {
    const col = depth.get(t.id);
    const row = rows.get(col) || 0;
    rows.set(col, row + 1);
    at.set(t.id, {x: PAD + col * (BOX_W + GAP_X), y: PAD + row * (BOX_H + GAP_Y)});
  }
  const width = PAD * 2 + (Math.max(...depth.values()) + 1) * (BOX_W + GAP_X) - GAP_X;
  const height = PAD * 2 + Math.max(...rows.values()) * (BOX_H + GAP_Y) - GAP_Y;
  return {at, width, height};
}

function edge(from, to) {
  const x1 = from.x + BOX_W, y1 = from.y + BOX_H / 2, x2 = to.x - 4, y2 = to.y + BOX_H / 2;
  const mid = (x1 + x2) / 2;
  return s("path", {d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}`,
                    class: "dag-edge", "marker-end": "url(#arrow)"});
}

function box(task, p) {
  const label = s("text", {x: p.x + 8, y: p.y + 16, class: "dag-label"}, task.id);
  const state = s("text", {x: p.x + 8, y: p.y + 32, class: "dag-state"},
    `${task.state}${task.attempt > 1 ? ` (attempt ${task.attempt})` : ""}`);
  const g = s("g", {class: "dag-task", "data-task": task.id, "data-state": task.state},
    s("title", {}, `${task.id}: ${task.state}${task.error ? " - " + task.error : ""}`),
    s("rect", {x: p.x, y: p.y, width: BOX_W, height: BOX_H, rx: 6,
               fill: STATE_COLOURS[task.state] || "#ffffff", stroke: "#444"}), label, state);
  if (!task.run_id) return g;
  const a = s("a", {href: `#/runs/${task.run_id}`});
  a.append(g);
  return a;
}

export function dagGraph(tasks) {
  const {at, width, height} = layout(tasks);
  const arrow = s("marker", {id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5,
                             markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse"},
    s("path", {d: "M0,0 L10,5 L0,10 z", fill: "#444"}));
  const edges = tasks.flatMap((t) => (t.depends_on || []).filter((u) => at.has(u))
    .map((u) => edge(at.get(u), at.get(t.id))));
  const svg = s("svg", {id: "dag", width, height, viewBox: `0 0 ${width} ${height}`,
                        role: "img", "aria-label": "the run's task graph"},
    s("defs", {}, arrow), edges, tasks.map((t) => box(t, at.get(t.id))));
  const used = [...new Set(tasks.map((t) => t.state))];
  const legend = h("p", {class: "legend"}, used.map((state) => h("span", {},
    h("i", {style: `background:${STATE_COLOURS[state] || "#fff"}`}), state)));
  return h("div", {class: "dag"}, svg, legend);
}
