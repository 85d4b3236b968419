// A run's page: its facts, each attempt with its output (stdout, stderr, the
// HTTP body or the published message, from whichever node keeps it), and for
// a DAG run the graph of its tasks coloured by state.

import {call, get} from "../api.js";
import {badge, duration, errorBox, h, link, table, utc} from "../dom.js";
import {poll} from "../poll.js";
import {dagGraph} from "./dag.js";
import {startLateMs} from "./runs.js";

// A finished run can still change (a retry re-drives it), so the page polls
// for as long as it is open.
const REFRESH_MS = 1500;

function facts(run) {
  return h("dl", {class: "facts"},
    h("dt", {}, "job"), h("dd", {}, link(`#/jobs/${run.job_id}`, run.job_id)),
    h("dt", {}, "state"), h("dd", {id: "run-state"}, badge(run.state)),
    run.reason ? [h("dt", {}, "reason"), h("dd", {id: "run-reason"}, run.reason)] : null,
    h("dt", {}, "scheduled for"), h("dd", {}, utc(run.scheduled_for)),
    run.armed_at ? [h("dt", {}, "armed"), h("dd", {id: "run-armed"},
      `${utc(run.armed_at)} (fired ahead; called at its scheduled time` +
      (run.state === "armed" ? ", not yet)" : ")"))] : null,
    h("dt", {}, "started"), h("dd", {}, `${utc(run.started_at)} (late by ` +
      `${duration(startLateMs(run))})`),
    h("dt", {}, "finished"), h("dd", {}, utc(run.finished_at)),
    h("dt", {}, "trigger"), h("dd", {}, run.trigger + (run.redrives ? `, re-driven ${run.redrives}x` : "")),
    h("dt", {}, "execution id"), h("dd", {}, h("code", {}, run.execution_id)),
    run.dag_run_id ? [h("dt", {}, "task of"), h("dd", {},
      link(`#/runs/${run.dag_run_id}`, `${run.dag_run_id} (task ${run.task_id})`))] : null,
    run.error ? [h("dt", {}, "error"), h("dd", {class: "bad"}, run.error)] : null);
}

function attemptsTable(run) {
  return table(["attempt", "holder", "started (UTC)", "finished (UTC)", "HTTP", "exit", "error",
                "retry after"],
    run.attempts.map((a) => [String(a.attempt), a.holder || "-", utc(a.started_at),
      utc(a.finished_at), a.http_status ?? "-", a.exit_code ?? "-", a.error || "",
      a.retry_delay_ms === null || a.retry_delay_ms === undefined ? "" :
        duration(a.retry_delay_ms)]), {id: "attempts"});
}

function output(name, text) {
  if (text === undefined || text === null || text === "") return null;
  const shown = typeof text === "string" ? text : JSON.stringify(text, null, 2);
  return [h("h4", {}, name), h("pre", {class: "log"}, shown)];
}

function logsView(logs) {
  const parts = logs.attempts.map((a) => h("div", {class: "attempt-log"},
    h("h3", {}, `Attempt ${a.attempt}` + (a.output_node ? ` (output kept on ${a.output_node})` : "")),
    output("stdout", a.stdout), output("stderr", a.stderr), output("HTTP body", a.http_body),
    output("published", a.published),
    a.truncated ? h("p", {class: "bad"}, "Output truncated at the node's bound.") : null,
    [a.stdout, a.stderr, a.http_body, a.published].every((x) => x === undefined || x === "") ?
      h("p", {}, "No output recorded.") : null));
  const missing = logs.unavailable.map((u) => h("p", {class: "bad"}, `${u.node}: ${u.error}`));
  return parts.length || missing.length ? [...parts, ...missing] :
    [h("p", {}, "No attempt has started yet.")];
}

export async function render(el, [runId]) {
  const head = h("div", {}), dag = h("div", {}), attempts = h("div", {}),
    logs = h("div", {id: "logs"}), buttons = h("div", {class: "toolbar"}), said = h("p", {});
  el.append(h("h1", {}, "Run ", h("code", {}, runId)), buttons, said, head, dag,
    h("h2", {}, "Attempts"), attempts, h("h2", {}, "Logs"), logs);
  const act = (label, path) => h("button", {id: `act-${label.toLowerCase()}`, onclick: async () => {
    try {
      const answer = await call("POST", `/v1/runs/${runId}:${path}`);
      said.textContent = `${label}: the run is ${answer.state}.`;
    } catch (err) {
      said.textContent = `${label} refused: ${err.message}`;
    }
  }}, label);
  buttons.append(act("Cancel", "cancel"), act("Retry", "retry"));
  return poll(async () => {
    const run = await get(`/v1/runs/${runId}`);
    head.replaceChildren(facts(run));
    if (run.tasks) dag.replaceChildren(h("h2", {}, "Tasks"), dagGraph(run.tasks));
    if (run.tasks) {
      // A DAG run does no work of its own: each task is a run with its own attempts.
      const note = "Each task is a run of its own: open a task in the graph for its " +
        "attempts and logs.";
      attempts.replaceChildren(h("p", {}, note));
      logs.replaceChildren(h("p", {}, note));
      return;
    }
    attempts.replaceChildren(run.attempts.length ? attemptsTable(run) : h("p", {}, "None yet."));
    logs.replaceChildren(...logsView(await get(`/v1/runs/${runId}/logs`)));
  }, REFRESH_MS, (err) => head.replaceChildren(errorBox(err)));
}
