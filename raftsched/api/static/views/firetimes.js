// Upcoming fire times as the API gives them (RFC 3339 in the job's zone, with
// its UTC offset), each with its UTC instant; where the offset changes from
// one fire to the next (a DST change in the job's zone) the row is marked.

import {h, table} from "../dom.js";

// The "+02:00" / "Z" suffix of an RFC 3339 instant.
export function offsetOf(text) {
  const match = /(Z|[+-]\d\d:\d\d)$/.exec(text);
  return match ? (match[1] === "Z" ? "+00:00" : match[1]) : "?";
}

export function fireTimesTable(times, id) {
  if (!times.length) return h("p", {id}, "No fire time left (a one-off that ran, or past not_after).");
  let previous = null;
  const rows = times.map((text, i) => {
    const offset = offsetOf(text);
    const changed = previous !== null && offset !== previous;
    const mark = changed ? h("span", {class: "dst"}, `DST change: ${previous} \u2192 ${offset}`) : "";
    previous = offset;
    return [String(i + 1), text, offset, new Date(text).toISOString().replace(".000Z", "Z"), mark];
  });
  const node = table(["#", "local time", "UTC offset", "UTC", ""], rows, {id, class: "fires"});
  node.querySelectorAll("tbody tr").forEach((tr, i) => {
    if (rows[i][4]) tr.classList.add("dst-row");
  });
  return node;
}
