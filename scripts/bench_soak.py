#!/usr/bin/env python3
"""Soak benchmark: every-second jobs with bounded history on a local cluster, for an hour.

Starts a LocalCluster, creates --jobs every-second jobs (history max_runs
--max-runs) that call a local counting sink, and every --sample-s samples
each node: the LMDB map's used bytes and file size (GET /v1/node `storage`),
the data directory's size on disk, RssAnon and RssFile (/proc/PID/status),
and its Raft term and leader. Prints the conditions and a table, writes the
samples as JSON (--out), and ends with a verdict:

  - flat: for each node, the LMDB used bytes, the data directory and RssAnon
    grow by less than --flat-pct percent from the baseline (the largest of the
    first three samples at or after --warmup-s; default minute 10, or half of
    a shorter run) to the end (the largest of the last three samples);
  - the Raft term and the leader never change after the first sample;
  - the jobs ran: sink calls per second near --jobs.

    .venv/bin/python scripts/bench_soak.py --duration-s 3600 --out soak.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.server
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import call

MB = 1024 ** 2


class CountingSink:
    """An HTTP target that answers 200 and only counts calls (the test Sink
    keeps every call, which an hour of calls would make large)."""

    def __init__(self) -> None:
        self.calls = 0
        lock = threading.Lock()
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                with lock:
                    sink.calls += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            request_queue_size = 1024
            daemon_threads = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def dir_bytes_on_disk(path: Path) -> int:
    """Allocated blocks, as du counts them (LMDB's file may be sparse)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass   # a snapshot or journal file replaced while we walked
    return total


def proc_rss(pid: int) -> tuple[int | None, int | None]:
    """(RssAnon, RssFile) in bytes from /proc/PID/status."""
    values: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                name, _, rest = line.partition(":")
                if name in ("RssAnon", "RssFile"):
                    values[name] = int(rest.split()[0]) * 1024
    except OSError:
        return None, None
    return values.get("RssAnon"), values.get("RssFile")


def sample_node(cluster: LocalCluster, nid: str) -> dict:
    proc = cluster.procs[nid]
    anon, file_ = proc_rss(proc.pid)
    row = {"node": nid, "alive": proc.poll() is None, "rss_anon_bytes": anon,
           "rss_file_bytes": file_, "data_dir_bytes": dir_bytes_on_disk(cluster.base / nid)}
    try:
        status = cluster.api(nid, "GET", "/v1/node", timeout_s=5).body
        storage = status.get("storage", {})
        row.update(term=status["term"], role=status["role"], leader_raft=status["leader_raft"],
                   applied_index=status["applied_index"],
                   lmdb_used_bytes=storage.get("used_bytes"),
                   lmdb_file_bytes=storage.get("file_bytes"),
                   purged_runs_total=status.get("purged", {}).get("runs_total"))
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        row["error"] = repr(exc)
    return row


def create_jobs(cluster: LocalCluster, count: int, max_runs: int, url: str) -> list[str]:
    def create(i: int) -> str:
        body = {"name": f"soak-{i}", "schedule": {"every": "1s"},
                "history": {"max_runs": max_runs},
                "target": {"type": "http", "url": url, "timeout_s": 10}}
        answer = call("POST", cluster.url(cluster.ids[i % len(cluster.ids)]) + "/v1/jobs", body)
        assert answer.status == 201, answer
        return answer.body["job_id"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return list(pool.map(create, range(count)))


def fmt_mb(value: int | None) -> str:
    return "-" if value is None else f"{value / MB:7.1f}"


def print_row(t_s: float, rows: list[dict], calls_per_s: float | None) -> None:
    parts = [f"{t_s:6.0f}"]
    for row in rows:
        parts.append(f"{row['node']} {fmt_mb(row.get('lmdb_used_bytes'))} "
                     f"{fmt_mb(row.get('lmdb_file_bytes'))} {fmt_mb(row['data_dir_bytes'])} "
                     f"{fmt_mb(row['rss_anon_bytes'])} {fmt_mb(row['rss_file_bytes'])} "
                     f"t{row.get('term', '-')}{'*' if row.get('role') == 'leader' else ' '}")
    parts.append("     -" if calls_per_s is None else f"{calls_per_s:6.1f}")
    print(" | ".join(parts), flush=True)


def growth(samples: list[dict], nid: str, metric: str, warmup_s: float) -> dict:
    """Baseline: the largest of the first three samples at or after warmup;
    end: the largest of the last three. Taking maxima of three smooths the saw
    tooth of journal compaction and garbage collection."""
    series = [(s["t_s"], r.get(metric)) for s in samples for r in s["nodes"]
              if r["node"] == nid and r.get(metric) is not None]
    after = [v for t, v in series if t >= warmup_s]
    if len(after) < 2:
        return {"metric": metric, "node": nid, "judged": False}
    baseline, end = max(after[:3]), max(after[-3:])
    minutes = max((series[-1][0] - warmup_s) / 60, 1e-9)
    return {"metric": metric, "node": nid, "judged": True, "baseline": baseline, "end": end,
            "growth_pct": 100.0 * (end - baseline) / baseline if baseline else 0.0,
            "mb_per_min": (end - baseline) / MB / minutes}


def verdict(samples: list[dict], ids: list[str], args: argparse.Namespace,
            warmup_s: float) -> dict:
    growths = [growth(samples, nid, metric, warmup_s) for nid in ids
               for metric in ("lmdb_used_bytes", "data_dir_bytes", "rss_anon_bytes")]
    flat = all(g["judged"] and g["growth_pct"] < args.flat_pct for g in growths)
    terms = {(r["node"], r.get("term")) for s in samples for r in s["nodes"]}
    first_terms = {(r["node"], r.get("term")) for r in samples[0]["nodes"]}
    leaders = {r.get("leader_raft") for s in samples for r in s["nodes"]}
    alive = all(r["alive"] for s in samples for r in s["nodes"])
    calls = [s["calls_per_s"] for s in samples[1:]]
    return {"flat": flat, "growth": growths, "term_unchanged": terms == first_terms,
            "leader_unchanged": len(leaders) == 1, "all_alive": alive,
            "calls_per_s_min": min(calls) if calls else None,
            "ok": flat and terms == first_terms and len(leaders) == 1 and alive}


def print_verdict(result: dict, args: argparse.Namespace, warmup_s: float) -> None:
    print(f"\nverdict (flat: growth from the baseline at >= {warmup_s:.0f} s to the end under "
          f"{args.flat_pct:g}%, maxima of three samples each):")
    for g in result["growth"]:
        if not g["judged"]:
            print(f"  {g['node']} {g['metric']:<16} not judged: too few samples after warmup")
            continue
        print(f"  {g['node']} {g['metric']:<16} {g['baseline'] / MB:8.1f} MB -> "
              f"{g['end'] / MB:8.1f} MB  {g['growth_pct']:+6.1f}%  "
              f"({g['mb_per_min']:+.2f} MB/min)")
    print(f"  data and RssAnon flat: {'yes' if result['flat'] else 'NO'}")
    print(f"  Raft term unchanged: {'yes' if result['term_unchanged'] else 'NO'}; leader "
          f"unchanged: {'yes' if result['leader_unchanged'] else 'NO'}; every node alive: "
          f"{'yes' if result['all_alive'] else 'NO'}")
    print(f"  slowest sink rate after start: {result['calls_per_s_min']} calls/s "
          f"(expected about {args.jobs})")
    print(f"  overall: {'PASS' if result['ok'] else 'FAIL'}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=3600.0)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--max-runs", type=int, default=100, help="each job's history.max_runs")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--sample-s", type=float, default=30.0)
    parser.add_argument("--warmup-s", type=float, default=None,
                        help="start of the flatness baseline (default: 600, or half of a "
                             "shorter run)")
    parser.add_argument("--flat-pct", type=float, default=10.0,
                        help="largest growth after warmup still judged flat (default 10)")
    parser.add_argument("--out", default=None, help="write the samples and verdict as JSON")
    parser.add_argument("--keep", default=None, help="keep node data and logs in this folder")
    return parser.parse_args()


def run(args: argparse.Namespace, base: str) -> dict:
    warmup_s = args.warmup_s if args.warmup_s is not None else min(600.0, args.duration_s / 2)
    conditions = {"nodes": args.nodes, "cores": os.cpu_count(), "jobs": args.jobs,
                  "schedule": "every 1s", "history_max_runs": args.max_runs,
                  "duration_s": args.duration_s, "sample_s": args.sample_s,
                  "warmup_s": warmup_s, "flat_pct": args.flat_pct,
                  "python": sys.version.split()[0],
                  "node_settings": "defaults (--raft-snapshot-entries 20000, --fsync periodic, "
                                   "--max-data-bytes 64 GiB), log level WARNING",
                  "machine": "nodes, sink and this script share one machine (127.0.0.1)"}
    print("conditions: " + json.dumps(conditions), flush=True)
    sink = CountingSink()
    samples: list[dict] = []
    try:
        with LocalCluster(base, nodes=args.nodes,
                          extra_env={"RAFTSCHED_LOG_LEVEL": "WARNING"}) as cluster:
            cluster.wait_ready()
            create_jobs(cluster, args.jobs, args.max_runs, sink.url)
            print("columns per node: used MB, LMDB file MB, data dir MB, RssAnon MB, "
                  "RssFile MB, term (* leader); last: sink calls/s", flush=True)
            start = time.monotonic()
            last_calls, last_t = sink.calls, start
            k = 0
            while True:
                now = time.monotonic()
                t_s = now - start
                rows = [sample_node(cluster, nid) for nid in cluster.ids]
                calls_per_s = (sink.calls - last_calls) / (now - last_t) if k else None
                last_calls, last_t = sink.calls, now
                samples.append({"t_s": round(t_s, 1), "nodes": rows,
                                "calls_per_s": None if k == 0 else round(calls_per_s, 1)})
                print_row(t_s, rows, calls_per_s)
                if t_s >= args.duration_s:
                    break
                k += 1
                time.sleep(max(0.0, start + min(k * args.sample_s, args.duration_s)
                               - time.monotonic()))
            result = verdict(samples, cluster.ids, args, warmup_s)
    finally:
        sink.close()
    print_verdict(result, args, warmup_s)
    return {"conditions": conditions, "samples": samples, "verdict": result}


def main() -> int:
    args = parse_args()
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        report = run(args, args.keep)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            report = run(args, tmp)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}")
    return 0 if report["verdict"]["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
