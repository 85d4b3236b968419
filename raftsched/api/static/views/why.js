// "Why did it not run?": occurrences that ended without running (skipped,
// missed, cancelled) with the reason apply recorded on each, jobs paused with
// their note, occurrences a misfire policy omitted, and fires the cluster
// refused for a stale fencing token (those never became runs, so they are counts).

import {get, query} from "../api.js";
import {errorBox, h, link, ms, table, utc} from "../dom.js";
import {poll} from "../poll.js";
import {runsTable} from "./runs.js";

const REFRESH_MS = 5000;
const PER_STATE = 50;
const NOT_RUN_STATES = ["skipped", "missed", "cancelled"];

export async function notRunRuns(filters) {
  const pages = await Promise.all(NOT_RUN_STATES.map((state) =>
    get("/v1/runs" + query({...filters, state, limit: PER_STATE}))));
  return pages.flatMap((page) => page.runs)
    .sort((a, b) => ms(b.scheduled_for) - ms(a.scheduled_for));
}

export async function notRunTable(filters) {
  const runs = await notRunRuns(filters);
  return runs.length ? runsTable(runs, "not-run") :
    h("p", {id: "not-run"}, "Every occurrence so far ran (none skipped, missed or cancelled).");
}

async function jobsNotRunning() {
  const page = await get("/v1/jobs" + query({limit: 500}));
  const rows = page.jobs.filter((j) => j.status === "paused" || j.misfires_omitted)
    .map((j) => [link(`#/jobs/${j.job_id}`, j.name), j.status,
      j.status === "paused" ? `paused at ${utc(j.paused_at)}: ${j.pause_note || "no note"}` : "",
      j.misfires_omitted ? `${j.misfires_omitted} occurrences omitted by misfire policy ` +
        j.misfire.policy : ""]);
  return rows.length ? table(["job", "status", "paused", "misfires"], rows, {id: "held"}) :
    h("p", {}, "No job is paused or has omitted occurrences.");
}

async function refusals() {
  let cluster, node;
  try {
    [cluster, node] = await Promise.all([get("/v1/cluster"), get("/v1/node")]);
  } catch (err) {
    // The cluster's counts are every tenant's: a tenant's token may not read them.
    if (err.status !== 403) throw err;
    return h("p", {id: "refusals"}, "Fires refused are counted for the whole cluster: " +
      "an operator or admin token shows them.");
  }
  // Runs held behind an open circuit breaker read running and are not called.
  const open = Object.entries(cluster.nodes).filter(([, n]) => n.breakers_open)
    .map(([id, n]) => `${id}: ${n.breakers_open}`);
  const here = (node.breakers?.hosts || [])
    .map((b) => `${b.tenant} → ${b.host} (one call in ${b.calls_resume_in_s} s)`);
  return h("dl", {class: "facts", id: "refusals"},
    h("dt", {}, "stale fires refused (cluster)"), h("dd", {}, cluster.stale_fires_total ?? 0),
    h("dt", {}, `fires refused by ${node.id}`), h("dd", {}, node.refused_fires_total ?? 0),
    h("dt", {}, "circuit breakers open"),
    h("dd", {id: "breakers", class: open.length ? "bad" : ""}, open.length ? open.join(", ") :
      "none"),
    ...(here.length ? [h("dt", {}, `held by ${node.id}`), h("dd", {}, here.join("; "))] : []));
}

export function render(el, _match, params) {
  const jobId = params.get("job") || "";
  const runs = h("div", {}), held = h("div", {}), refused = h("div", {});
  el.append(h("h1", {}, "Why it did not run"),
    h("p", {}, "Occurrences that ended without running, each with the reason recorded when " +
      "it was decided. Skipped: the concurrency policy or the misfire tolerance. Missed: the " +
      "misfire policy ran a later occurrence instead. Cancelled: by an operator, a replace " +
      "policy or a cancelled backfill."),
    h("h2", {}, "Occurrences not run"), runs,
    h("h2", {}, "Jobs held back"), held,
    h("h2", {}, "Fires refused, calls held"),
    h("p", {}, "A fire from a shard owner that lost its lease is refused and never becomes " +
      "a run; the new owner fires that occurrence. When most of a tenant's recent calls to " +
      "a host failed, a node holds that tenant's runs for the host (they read running, not " +
      "called, spending no attempt) and lets one call through every 30 s until one " +
      "succeeds; a run held an hour is called anyway."),
    refused);
  return poll(async () => {
    runs.replaceChildren(await notRunTable(jobId ? {job_id: jobId} : {}));
    held.replaceChildren(await jobsNotRunning());
    refused.replaceChildren(await refusals());
  }, REFRESH_MS, (err) => runs.replaceChildren(errorBox(err)));
}
