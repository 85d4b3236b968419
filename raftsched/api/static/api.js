// The one place the UI talks to the HTTP API (/v1/...). Every call sends the
// token the operator entered; the token stays in this tab's session storage,
// never in a URL or a cookie, so closing the tab forgets it.

const TOKEN_KEY = "raftsched-token";

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(text) {
  sessionStorage.setItem(TOKEN_KEY, text.trim());
}

// An answer other than 2xx: `problem` is the problem+json body when there is one.
export class ApiError extends Error {
  constructor(status, problem, path) {
    const detail = problem && problem.detail ? problem.detail : `HTTP ${status}`;
    const field = problem && problem.field ? ` (field ${problem.field})` : "";
    super(`${detail}${field}`);
    this.status = status;
    this.problem = problem;
    this.path = path;
  }
}

export async function call(method, path, body) {
  const headers = {"Authorization": "Bearer " + token()};
  const init = {method, headers};
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let parsed = null;
  try {
    parsed = text ? JSON.parse(text) : null;
  } catch (err) {
    parsed = null;   // not JSON: the status alone says what happened
  }
  if (!response.ok) throw new ApiError(response.status, parsed, path);
  return parsed;
}

export const get = (path) => call("GET", path);
export const post = (path, body) => call("POST", path, body);
export const patch = (path, body) => call("PATCH", path, body);

// A query string from an object, leaving out empty members.
export function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(key, String(value));
  }
  const text = search.toString();
  return text ? "?" + text : "";
}
