// The UI's entry point: the token form, and a hash router that renders one
// view at a time into <main id="view">. No build step: the browser loads
// these ES modules as they are from /ui/.

import {setToken, token} from "./api.js";
import {errorBox, h} from "./dom.js";
import * as cluster from "./views/cluster.js";
import * as create from "./views/create.js";
import * as job from "./views/job.js";
import * as jobs from "./views/jobs.js";
import * as lateness from "./views/lateness.js";
import * as run from "./views/run.js";
import * as why from "./views/why.js";

// Hash routes: pattern -> view module. The first that matches renders.
const ROUTES = [
  [/^\/?$/, cluster],
  [/^\/jobs$/, jobs],
  [/^\/jobs\/(job_[0-9a-f]{20})$/, job],
  [/^\/runs\/(run_[0-9a-f]{24}(?:[0-9a-f]{8})?)$/, run],
  [/^\/new$/, create],
  [/^\/why$/, why],
  [/^\/lateness$/, lateness],
];

let stopCurrent = null;

function parseHash() {
  const raw = decodeURIComponent(location.hash.replace(/^#/, ""));
  const [path, search] = raw.split("?");
  return {path: path || "/", params: new URLSearchParams(search || "")};
}

async function route() {
  if (stopCurrent) stopCurrent();
  stopCurrent = null;
  const {path, params} = parseHash();
  const view = document.querySelector("#view");
  view.replaceChildren();
  for (const [pattern, module] of ROUTES) {
    const match = path.match(pattern);
    if (!match) continue;
    try {
      stopCurrent = (await module.render(view, match.slice(1), params)) || null;
    } catch (err) {
      view.append(errorBox(err));
    }
    return;
  }
  view.append(h("p", {class: "error"}, `No page ${path}.`));
}

function showAuthState() {
  document.querySelector("#authstate").textContent =
    token() ? "token set for this tab" : "no token: enter one to read the cluster";
}

document.querySelector("#auth").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.querySelector("#token");
  setToken(input.value);
  input.value = "";
  showAuthState();
  route();
});
window.addEventListener("hashchange", route);
showAuthState();
route();
