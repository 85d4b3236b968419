// The cluster: its leader and term, and every node as the answering node sees it.

import {get} from "../api.js";
import {errorBox, h, table} from "../dom.js";
import {poll} from "../poll.js";

const REFRESH_MS = 2000;

function nodeRows(cluster) {
  return Object.entries(cluster.nodes).sort().map(([id, node]) => [
    h("span", {class: id === cluster.leader ? "leader" : ""}, id),
    h("span", {class: node.role === "unreachable" ? "bad" : ""}, node.role || "-"),
    node.term ?? "-", node.commit_index ?? "-", node.applied_index ?? "-",
    node.shards_owned ?? "-",
    node.clock_offset_ms === null || node.clock_offset_ms === undefined ? "-" :
      `${node.clock_offset_ms} ms`,
    h("span", {class: node.breakers_open ? "bad" : ""}, node.breakers_open ?? "-"),
    node.http || "-", node.raft || "-",
  ]);
}

function summary(cluster) {
  const terms = Object.values(cluster.nodes).map((n) => n.term).filter((t) => t !== null);
  const term = terms.length ? Math.max(...terms) : "-";
  return h("dl", {class: "facts"},
    h("dt", {}, "leader"), h("dd", {id: "leader"}, cluster.leader || "none (election?)"),
    h("dt", {}, "term"), h("dd", {}, term),
    h("dt", {}, "answered by"), h("dd", {}, cluster.self),
    h("dt", {}, "shards"), h("dd", {}, cluster.shard_count),
    h("dt", {}, "stale fires refused"), h("dd", {}, cluster.stale_fires_total ?? 0));
}

export function render(el) {
  const body = h("div", {id: "cluster"});
  el.append(h("h1", {}, "Cluster"), body);
  return poll(async () => {
    const cluster = await get("/v1/cluster");
    body.replaceChildren(summary(cluster), table(
      ["node", "role", "term", "commit", "applied", "shards", "clock offset",
       "breakers open", "http", "raft"],
      nodeRows(cluster), {id: "nodes"}));
  }, REFRESH_MS, (err) => body.replaceChildren(errorBox(err)));
}
