// A table of runs, shared by the job page, the "why not run" page and others.

import {badge, duration, h, link, ms, table, utc} from "../dom.js";

// Triggers whose runs start long after their scheduled time on purpose: a
// backfill runs past occurrences, a re-drive runs a failed one again.
const NOT_LATE_TRIGGERS = new Set(["backfill", "retry"]);

// Start lateness: started minus scheduled, less the jitter the job asked for
// (null: not started, or not meant to start on time).
export function startLateMs(run) {
  if (!run.started_at || NOT_LATE_TRIGGERS.has(run.trigger)) return null;
  return ms(run.started_at) - ms(run.scheduled_for) - (run.jitter_ms || 0);
}

function outcome(run) {
  if (run.reason) return run.reason;
  if (run.error) return run.error;
  if (run.http_status !== null && run.http_status !== undefined) return `HTTP ${run.http_status}`;
  if (run.exit_code !== null && run.exit_code !== undefined) return `exit ${run.exit_code}`;
  return "";
}

export function runsTable(runs, id) {
  return table(["run", "scheduled for (UTC)", "state", "trigger", "attempt", "started late by",
                "finished (UTC)", "outcome / reason"],
    runs.map((run) => [link(`#/runs/${run.run_id}`, run.run_id), utc(run.scheduled_for),
      badge(run.state), run.trigger, String(run.attempt), duration(startLateMs(run)),
      utc(run.finished_at), h("span", {class: "reason"}, outcome(run))]),
    {id, class: "runs"});
}
