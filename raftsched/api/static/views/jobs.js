// The jobs list: search by name prefix, filter by status, paged by the API's
// page tokens (the listing is in job id order).

import {get, query} from "../api.js";
import {badge, errorBox, h, link, table, utc} from "../dom.js";
import {poll} from "../poll.js";

const REFRESH_MS = 3000;
const PAGE_SIZE = 50;
const STATUSES = ["", "active", "paused", "completed"];

export function scheduleText(job) {
  if (job.schedule === null && !job.run_at) return "when triggered";
  if (job.run_at) return `at ${job.run_at}`;
  if (job.schedule.cron) return `${job.schedule.cron} (${job.schedule.timezone})`;
  return `every ${job.schedule.every}`;
}

function rows(jobs) {
  return jobs.map((job) => [
    link(`#/jobs/${job.job_id}`, job.name), h("code", {}, job.job_id), badge(job.status),
    scheduleText(job), utc(job.next_run_at),
    job.last_run_id ? link(`#/runs/${job.last_run_id}`, "last run") : "-",
  ]);
}

export function render(el, _match, params) {
  const search = h("input", {id: "search", type: "search", placeholder: "name starts with",
                             value: params.get("q") || ""});
  const status = h("select", {id: "status"},
    STATUSES.map((s) => h("option", {value: s, selected: s === (params.get("status") || "")},
                          s || "any status")));
  const list = h("div", {id: "jobs"});
  const pager = h("div", {class: "pager"});
  // Tokens of the pages before this one, to go back: the API pages forward only.
  const tokens = [""];
  let next = null;

  async function load() {
    const page = await get("/v1/jobs" + query({limit: PAGE_SIZE, name_prefix: search.value,
      status: status.value, page_token: tokens[tokens.length - 1]}));
    next = page.next_page_token;
    list.replaceChildren(page.jobs.length ?
      table(["name", "id", "status", "schedule", "next run (UTC)", ""], rows(page.jobs)) :
      h("p", {}, "No jobs match."));
    pager.replaceChildren(
      h("button", {disabled: tokens.length === 1, onclick: () => { tokens.pop(); load(); }},
        "Previous"),
      h("span", {}, ` page ${tokens.length} `),
      h("button", {disabled: !next, onclick: () => { tokens.push(next); load(); }}, "Next"));
  }
  function restart() {
    tokens.splice(1);
    load().catch((err) => list.replaceChildren(errorBox(err)));
  }
  search.addEventListener("input", restart);
  status.addEventListener("change", restart);
  el.append(h("h1", {}, "Jobs"),
    h("div", {class: "toolbar"}, search, status, link("#/new", "New job")), list, pager);
  return poll(load, REFRESH_MS, (err) => list.replaceChildren(errorBox(err)));
}
