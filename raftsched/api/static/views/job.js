// A job's page: what it is, its next 10 fire times (DST changes marked), its
// runs paged, why occurrences did not run, and the actions an operator takes
// on it (pause, resume, trigger, backfill, edit).

import {get, patch, post, query} from "../api.js";
import {badge, errorBox, h} from "../dom.js";
import {poll} from "../poll.js";
import {fireTimesTable} from "./firetimes.js";
import {scheduleText} from "./jobs.js";
import {runsTable} from "./runs.js";
import {notRunTable} from "./why.js";

const REFRESH_MS = 2000;
const RUNS_PAGE = 10;
const FIRE_TIMES = 10;

function facts(job) {
  return h("dl", {class: "facts"},
    h("dt", {}, "id"), h("dd", {}, h("code", {}, job.job_id)),
    h("dt", {}, "status"), h("dd", {id: "job-status"}, badge(job.status)),
    h("dt", {}, "schedule"), h("dd", {}, scheduleText(job)),
    h("dt", {}, "next run"), h("dd", {}, job.next_run_at || "-"),
    h("dt", {}, "target"), h("dd", {}, targetText(job)),
    h("dt", {}, "concurrency"), h("dd", {}, job.concurrency.policy),
    h("dt", {}, "misfire"), h("dd", {}, `${job.misfire.policy}` +
      (job.misfires_omitted ? `, ${job.misfires_omitted} occurrences omitted` : "")),
    job.pause_note ? [h("dt", {}, "paused because"), h("dd", {}, job.pause_note)] : null,
    h("dt", {}, "version"), h("dd", {}, String(job.version)));
}

function targetText(job) {
  const t = job.target;
  if (!t) return job.dag ? `DAG of ${job.dag.tasks.length} tasks` : "-";
  if (t.type === "http") return `${t.method} ${t.url}`;
  if (t.type === "command") return `command ${(t.argv || []).join(" ")}`;
  return `publish to ${t.topic}`;
}

// Runs of the job, newest first, paged forward by the API's tokens.
function runsSection(jobId) {
  const box = h("div", {id: "job-runs"});
  const pager = h("div", {class: "pager"});
  const tokens = [""];
  let next = null;
  async function load() {
    const page = await get("/v1/runs" + query({job_id: jobId, limit: RUNS_PAGE,
                                                page_token: tokens[tokens.length - 1]}));
    next = page.next_page_token;
    box.replaceChildren(page.runs.length ? runsTable(page.runs, "runs") :
      h("p", {}, "No runs yet."));
    pager.replaceChildren(
      h("button", {disabled: tokens.length === 1, onclick: () => { tokens.pop(); load(); }},
        "Newer"),
      h("span", {}, ` page ${tokens.length} `),
      h("button", {disabled: !next, onclick: () => { tokens.push(next); load(); }}, "Older"));
  }
  return {node: h("section", {}, h("h2", {}, "Runs"), box, pager), load, box};
}

function actions(job, say, reload) {
  const act = (label, path, body) => h("button", {id: `act-${label.toLowerCase()}`,
    onclick: async () => {
      try {
        const answer = await post(`/v1/jobs/${job.job_id}:${path}`, body);
        say(label === "Trigger" ? `Triggered run ${answer.run_id} (${answer.state}).` :
          `${label}d: the job is ${answer.status}.`);
        reload();
      } catch (err) {
        say(`${label} refused: ${err.message}`, true);
      }
    }}, label);
  const forms = h("div", {});
  const toggle = (label, build) => h("button", {id: `act-${label.toLowerCase()}`,
    onclick: () => {
      if (forms.firstElementChild?.dataset.form === label) forms.replaceChildren();
      else forms.replaceChildren(build());
    }}, label);
  return [h("div", {class: "toolbar"},
    job.status === "paused" ? act("Resume", "resume") : act("Pause", "pause"),
    act("Trigger", "trigger"),
    toggle("Backfill", () => backfillForm(job, say)),
    toggle("Edit", () => editForm(job, say, reload))), forms];
}

function backfillForm(job, say) {
  const hourMs = 3600 * 1000;
  const end = new Date(Math.floor(Date.now() / hourMs) * hourMs);
  const start = new Date(end.getTime() - 24 * hourMs);
  const startIn = h("input", {name: "start", value: start.toISOString(), size: 26});
  const endIn = h("input", {name: "end", value: end.toISOString(), size: 26});
  const dry = h("input", {type: "checkbox", name: "dry_run", checked: true});
  const out = h("div", {id: "backfill-result"});
  async function submit(event) {
    event.preventDefault();
    try {
      const answer = await post(`/v1/jobs/${job.job_id}:backfill`,
        {start: startIn.value, end: endIn.value, dry_run: dry.checked});
      if (answer.dry_run) {
        out.replaceChildren(h("p", {}, `${answer.occurrences} occurrences ` +
          `(${answer.existing || 0} already have a run): `),
          h("ul", {}, answer.scheduled_for.slice(0, 20).map((t) => h("li", {}, t))));
        return;
      }
      say(`Backfill ${answer.backfill_id} started: ${answer.occurrences} occurrences.`);
      const stop = poll(async () => {
        const b = await get(`/v1/backfills/${answer.backfill_id}`);
        out.replaceChildren(h("progress", {max: b.total, value: b.done}),
          ` ${b.done}/${b.total} done, ${b.running} running, ${b.failed} failed: ${b.state}`);
        if (b.state !== "running") stop();
      }, REFRESH_MS, (err) => out.replaceChildren(errorBox(err)));
    } catch (err) {
      out.replaceChildren(errorBox(err));
    }
  }
  return h("form", {class: "panel", "data-form": "Backfill", onsubmit: submit},
    h("h3", {}, "Backfill occurrences of [start, end)"),
    h("label", {}, "start ", startIn), h("label", {}, " end ", endIn),
    h("label", {}, " ", dry, " dry run (list, run nothing)"), " ", h("button", {}, "Run"), out);
}

// The fields an operator changes most, plus any other patch member as JSON.
function editForm(job, say, reload) {
  const s = job.schedule || {};
  const name = h("input", {name: "name", value: job.name, size: 40});
  const cron = h("input", {name: "cron", value: s.cron || "", placeholder: "0 2 * * *"});
  const tz = h("input", {name: "timezone", value: s.timezone || "UTC"});
  const every = h("input", {name: "every", value: s.every || "", placeholder: "15m"});
  const runAt = h("input", {name: "run_at", value: job.run_at || "", size: 28});
  const extra = h("textarea", {name: "extra", rows: 4, cols: 60},
    JSON.stringify({retry: job.retry, labels: job.labels}, null, 2));
  const out = h("div", {});
  async function submit(event) {
    event.preventDefault();
    // The schedule is sent only when changed: sending it again would re-arm it.
    const body = {};
    if (name.value !== job.name) body.name = name.value;
    if (cron.value && (cron.value !== (s.cron || "") || tz.value !== (s.timezone || "UTC"))) {
      body.schedule = {cron: cron.value, timezone: tz.value || "UTC"};
    } else if (every.value && every.value !== (s.every || "")) {
      body.schedule = {every: every.value};
    } else if (runAt.value && runAt.value !== (job.run_at || "")) {
      body.run_at = runAt.value;
    }
    try {
      Object.assign(body, extra.value.trim() ? JSON.parse(extra.value) : {});
      const saved = await patch(`/v1/jobs/${job.job_id}`, body);
      say(`Saved: version ${saved.version}.`);
      reload();
    } catch (err) {
      out.replaceChildren(errorBox(err));
    }
  }
  return h("form", {class: "panel", "data-form": "Edit", id: "edit-form", onsubmit: submit},
    h("h3", {}, "Edit (PATCH: only what is given changes)"),
    h("label", {}, "name ", name), h("br"),
    h("label", {}, "cron ", cron), h("label", {}, " timezone ", tz),
    h("label", {}, " or every ", every), h("label", {}, " or run at ", runAt), h("br"),
    h("label", {}, "other members (JSON) ", extra), h("br"), h("button", {}, "Save"), out);
}

export async function render(el, [jobId]) {
  const status = h("p", {id: "action-result"});
  const say = (text, bad) => {
    status.textContent = text;
    status.className = bad ? "error" : "ok";
  };
  const head = h("div", {});
  const fires = h("div", {id: "fire-times"});
  const runs = runsSection(jobId);
  const why = h("div", {id: "job-why"});
  async function loadJob() {
    const job = await get(`/v1/jobs/${jobId}`);
    head.replaceChildren(h("h1", {}, job.name), facts(job), ...actions(job, say, loadJob));
    const preview = await get(`/v1/jobs/${jobId}/preview?count=${FIRE_TIMES}`);
    fires.replaceChildren(fireTimesTable(preview.fire_times, "fires"));
  }
  await loadJob().catch((err) => head.replaceChildren(errorBox(err)));
  el.append(head, status, h("section", {}, h("h2", {}, `Next ${FIRE_TIMES} fire times`), fires),
    runs.node, h("section", {}, h("h2", {}, "Why occurrences did not run"), why));
  return poll(async () => {
    await runs.load();
    why.replaceChildren(await notRunTable({job_id: jobId}));
  }, REFRESH_MS, (err) => runs.box.replaceChildren(errorBox(err)));
}
