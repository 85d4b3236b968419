// The create-job form: a schedule (one-off, cron or every), an HTTP or command
// target, retries and the concurrency policy. "Preview" shows the next 10
// fire times of the schedule as typed (POST /v1/schedules:preview), DST
// changes marked; "Create" posts the job and opens its page.

import {post} from "../api.js";
import {errorBox, h} from "../dom.js";
import {fireTimesTable} from "./firetimes.js";

const POLICIES = ["allow", "skip_if_running", "queue", "replace"];
const PREVIEW_COUNT = 10;

function field(label, input, hint) {
  return h("label", {class: "field"}, h("span", {}, label), input,
    hint ? h("small", {}, hint) : null);
}

function inputs() {
  const soon = new Date(Date.now() + 60000).toISOString().replace(/\.\d+Z$/, "Z");
  return {
    name: h("input", {name: "name", size: 40, placeholder: "nightly-report"}),
    kind: h("select", {name: "kind"}, ["once", "cron", "every"].map((k) =>
      h("option", {value: k}, {once: "one-off (run at)", cron: "cron", every: "every"}[k]))),
    runAt: h("input", {name: "run_at", size: 30, value: soon}),
    cron: h("input", {name: "cron", placeholder: "0 2 * * *"}),
    timezone: h("input", {name: "timezone", value: "UTC"}),
    every: h("input", {name: "every", placeholder: "15m"}),
    after: h("input", {name: "after", size: 30, placeholder: "now"}),
    type: h("select", {name: "target_type"}, ["http", "command"].map((t) =>
      h("option", {value: t}, t))),
    url: h("input", {name: "url", size: 50, placeholder: "https://example.com/hook"}),
    method: h("select", {name: "method"}, ["POST", "GET", "PUT", "PATCH", "DELETE"].map((m) =>
      h("option", {value: m}, m))),
    argv: h("input", {name: "argv", size: 50, placeholder: '["/usr/bin/backup", "--full"]'}),
    attempts: h("input", {name: "max_attempts", type: "number", min: 1, value: 3}),
    policy: h("select", {name: "concurrency"}, POLICIES.map((p) => h("option", {value: p}, p))),
  };
}

// The schedule members of a create or preview body, from the form.
function scheduleOf(f) {
  if (f.kind.value === "cron") return {schedule: {cron: f.cron.value, timezone: f.timezone.value}};
  if (f.kind.value === "every") return {schedule: {every: f.every.value}};
  return {run_at: f.runAt.value};
}

function targetOf(f) {
  if (f.type.value === "command") return {type: "command", argv: JSON.parse(f.argv.value)};
  return {type: "http", url: f.url.value, method: f.method.value};
}

function bodyOf(f) {
  const body = {...scheduleOf(f), target: targetOf(f),
                retry: {max_attempts: Number(f.attempts.value)},
                concurrency: {policy: f.policy.value}};
  if (f.name.value) body.name = f.name.value;
  return body;
}

// Show only the inputs of the chosen schedule kind and target type.
function syncVisible(f, rows) {
  rows.runAt.hidden = f.kind.value !== "once";
  rows.cron.hidden = f.kind.value !== "cron";
  rows.every.hidden = f.kind.value !== "every";
  rows.http.hidden = f.type.value !== "http";
  rows.command.hidden = f.type.value !== "command";
}

export function render(el) {
  const f = inputs();
  const rows = {
    runAt: field("run at", f.runAt, "RFC 3339 with an offset, e.g. 2026-03-29T02:30:00+01:00"),
    cron: h("div", {}, field("cron", f.cron, "5 or 6 fields, H allowed"),
            field("timezone", f.timezone, "IANA name")),
    every: field("every", f.every, "e.g. 30s, 15m, 1h"),
    http: h("div", {}, field("URL", f.url), field("method", f.method)),
    command: field("argv (JSON list)", f.argv),
  };
  const result = h("div", {id: "create-result"});
  const preview = h("div", {id: "create-preview"});
  f.kind.addEventListener("change", () => syncVisible(f, rows));
  f.type.addEventListener("change", () => syncVisible(f, rows));
  syncVisible(f, rows);

  async function showPreview() {
    try {
      const body = {...scheduleOf(f), count: PREVIEW_COUNT};
      if (f.after.value) body.after = f.after.value;
      const answer = await post("/v1/schedules:preview", body);
      preview.replaceChildren(h("h3", {}, "Next fire times"),
        answer.resolved ? h("p", {}, `resolved: ${answer.resolved}`) : "",
        fireTimesTable(answer.fire_times, "preview-fires"));
    } catch (err) {
      preview.replaceChildren(errorBox(err));
    }
  }
  async function submit(event) {
    event.preventDefault();
    try {
      const job = await post("/v1/jobs", bodyOf(f));
      location.hash = `#/jobs/${job.job_id}`;
    } catch (err) {
      result.replaceChildren(errorBox(err));
    }
  }
  el.append(h("h1", {}, "New job"), h("form", {id: "create-form", class: "panel", onsubmit: submit},
    field("name", f.name, "optional: made from the target when left out"),
    field("schedule", f.kind), rows.runAt, rows.cron, rows.every,
    field("preview from", f.after, "optional RFC 3339 instant; default now"),
    field("target", f.type), rows.http, rows.command,
    field("max attempts", f.attempts), field("concurrency", f.policy),
    h("div", {class: "toolbar"},
      h("button", {type: "button", id: "preview", onclick: showPreview}, "Preview"),
      h("button", {type: "submit", id: "create"}, "Create")), result), preview);
}
