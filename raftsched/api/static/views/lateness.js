// Lateness over the last hour: for each run scheduled in the hour that has
// started, how long after its scheduled time (less the jitter its job asked
// for) it started. Drawn as an SVG scatter over time, with percentiles.

import {get, query} from "../api.js";
import {duration, errorBox, h, ms, s, table} from "../dom.js";
import {poll} from "../poll.js";
import {STATE_COLOURS} from "./dag.js";
import {startLateMs} from "./runs.js";

const REFRESH_MS = 10000;
const WINDOW_MS = 3600 * 1000;
const PAGE_SIZE = 500;
// Pages read per refresh: a busy hour is sampled (the newest runs), not read whole.
const PAGES_MAX = 6;
const W = 760, H = 280, LEFT = 64, RIGHT = 16, TOP = 16, BOTTOM = 36;

async function lastHourRuns(nowMs) {
  const after = new Date(nowMs - WINDOW_MS).toISOString();
  const runs = [];
  let token = "";
  for (let page = 0; page < PAGES_MAX; page++) {
    const answer = await get("/v1/runs" + query({scheduled_after: after, limit: PAGE_SIZE,
                                                  page_token: token}));
    runs.push(...answer.runs);
    token = answer.next_page_token;
    if (!token) return {runs, sampled: false};
  }
  return {runs, sampled: true};
}

export function percentile(sorted, p) {
  if (!sorted.length) return null;
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
}

// A round upper bound for the y axis: 1, 2 or 5 times a power of ten (ms).
function niceMax(value) {
  const floor = Math.max(value, 10);
  const power = 10 ** Math.floor(Math.log10(floor));
  return [1, 2, 5, 10].map((k) => k * power).find((v) => v >= floor);
}

function chart(points, nowMs) {
  const yMax = niceMax(Math.max(0, ...points.map((p) => p.late)));
  const x = (t) => LEFT + ((t - (nowMs - WINDOW_MS)) / WINDOW_MS) * (W - LEFT - RIGHT);
  const y = (v) => TOP + (1 - Math.max(0, v) / yMax) * (H - TOP - BOTTOM);
  const grid = [0, 0.25, 0.5, 0.75, 1].map((f) => [
    s("line", {x1: LEFT, x2: W - RIGHT, y1: y(f * yMax), y2: y(f * yMax), class: "grid"}),
    s("text", {x: LEFT - 6, y: y(f * yMax) + 4, class: "axis", "text-anchor": "end"},
      duration(f * yMax))]);
  const ticks = [60, 45, 30, 15, 0].map((minAgo) => s("text", {
    x: x(nowMs - minAgo * 60000), y: H - 12, class: "axis", "text-anchor": "middle"},
    minAgo ? `-${minAgo} min` : "now"));
  const dots = points.map((p) => s("circle", {cx: x(p.at), cy: y(p.late), r: 3, "data-run": p.id,
    fill: STATE_COLOURS[p.state] || "#333", class: "dot"},
    s("title", {}, `${p.id}: started ${duration(p.late)} late (${p.state})`)));
  return s("svg", {id: "lateness-chart", width: W, height: H, viewBox: `0 0 ${W} ${H}`,
                   role: "img", "aria-label": "start lateness of the last hour's runs"},
    grid, ticks, s("line", {x1: LEFT, x2: LEFT, y1: TOP, y2: H - BOTTOM, class: "axis-line"}),
    dots);
}

// This node's own figures, or null where the token may not read them (403).
async function nodeOrNull() {
  try {
    return await get("/v1/node");
  } catch (err) {
    if (err.status === 403) return null;
    throw err;
  }
}

function stats(points, node) {
  const sorted = points.map((p) => p.late).sort((a, b) => a - b);
  const rows = [
    ["runs started, last hour", String(sorted.length), duration(percentile(sorted, 50)),
     duration(percentile(sorted, 95)), duration(percentile(sorted, 99)),
     duration(sorted[sorted.length - 1] ?? null)]];
  if (node) {   // null for a tenant's token: the node's figures are every tenant's
    const t = node.trigger_lateness || {};
    rows.push([`first calls made by ${node.id}, since it started`, String(t.count ?? 0), "", "",
               "", duration(t.max_ms ?? null)]);
  }
  return table(["", "runs", "p50", "p95", "p99", "max"], rows, {id: "lateness-stats"});
}

export function render(el) {
  const body = h("div", {});
  el.append(h("h1", {}, "Lateness, last hour"),
    h("p", {}, "Each dot is a run scheduled in the last hour that has started: how long " +
      "after its scheduled time (less its job's jitter) it started. Its colour is its state. " +
      "Backfilled and re-driven runs start late on purpose and are left out."),
    body);
  return poll(async () => {
    const nowMs = Date.now();
    const [{runs, sampled}, node] = await Promise.all([lastHourRuns(nowMs), nodeOrNull()]);
    const points = runs.map((r) => ({id: r.run_id, at: ms(r.scheduled_for),
                                      late: startLateMs(r), state: r.state}))
      .filter((p) => p.late !== null);
    body.replaceChildren(chart(points, nowMs), stats(points, node),
      sampled ? h("p", {}, `Sampled: the newest ${runs.length} runs of the hour.`) : "");
  }, REFRESH_MS, (err) => body.replaceChildren(errorBox(err)));
}
