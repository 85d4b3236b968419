// Small helpers to build DOM and SVG nodes. Text always goes in through
// textContent (never innerHTML), so job names and logs cannot inject markup.

const SVG_NS = "http://www.w3.org/2000/svg";

function fill(node, attrs, children) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "text") node.textContent = String(value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function h(tag, attrs, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

export function s(tag, attrs, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), attrs, children);
}

// A table of `rows` (arrays of cells: text or nodes) under `headers`.
export function table(headers, rows, attrs) {
  return h("table", attrs,
    h("thead", {}, h("tr", {}, headers.map((name) => h("th", {}, name)))),
    h("tbody", {}, rows.map((row) => h("tr", {}, row.map((cell) => h("td", {}, cell))))));
}

export function link(href, text) {
  return h("a", {href}, text);
}

// A state as a coloured badge; the colours are in style.css (.state-NAME).
export function badge(state) {
  return h("span", {class: `badge state-${state || "none"}`}, state || "-");
}

// Show an error where a view would have been, with the API's own words.
export function errorBox(err) {
  const hint = err && err.status === 401 ? " Enter a valid API token above." :
    err && err.status === 403 ? " This token's role may not read this." : "";
  return h("p", {class: "error"}, String(err && err.message ? err.message : err) + hint);
}

// RFC 3339 text -> milliseconds since the epoch (null stays null).
export function ms(text) {
  return text ? Date.parse(text) : null;
}

// A duration in ms as the shortest readable text.
export function duration(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "-";
  const abs = Math.abs(value);
  if (abs < 1000) return `${Math.round(value)} ms`;
  if (abs < 60000) return `${(value / 1000).toFixed(1)} s`;
  return `${(value / 60000).toFixed(1)} min`;
}

// A short UTC rendering of an RFC 3339 instant, for tables.
export function utc(text) {
  if (!text) return "-";
  const when = new Date(text);
  return Number.isNaN(when.getTime()) ? text : when.toISOString().replace(".000Z", "Z");
}
