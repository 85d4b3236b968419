"""`raftsched chaos`: break a local cluster under load and check the promises.

A run starts a local cluster, an HTTP sink and a workload (every-second jobs
with the fire_all misfire policy, so every occurrence must run, plus a stream
of one-off creates), then injects faults one phase at a time and checks, from
what the sink received, what the API acknowledged and what the run records say:

  lost          acknowledged one-off jobs that never called the sink       (must be 0)
  lost          occurrences of every-second jobs with no run at all        (must be 0)
  duplicates    (job, scheduled_for) called more than once, other than by
                an executor SIGKILLed between the calls (at-least-once:
                a run it had called but not yet reported runs again after
                its restart, with the same execution id; counted apart)     (must be 0)
  stale         calls fired under a fencing token that had already been
                superseded when the occurrence was due                    (must be 0)
  digests       replica state digests after healing                       (must be equal)

and reports trigger lateness (an ended run's call start - scheduled: a run
fired ahead of its second is created and held before it) and call lateness
(sink arrival - scheduled) per phase. Every random choice comes from the
printed seed; `--seed N` replays the same choices.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import datetime as dt
import os
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from raftsched.core import keys
from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import call, wait_until
from raftsched.testing.sink import Sink

SCENARIOS = ("kill-leader", "kill-random", "kill-owner", "freeze-owner", "partition",
             "kill-all", "restart", "restart-leader")


# How long a call may be in flight between its sender and the sink's stamp.
IN_FLIGHT_SLACK_S = 1.0


@dataclasses.dataclass
class Phase:
    name: str
    started_s: float
    ended_s: float = 0.0
    victim: str | None = None
    notes: dict = dataclasses.field(default_factory=dict)
    victim_stopped_s: float = 0.0   # restart: when its SIGTERM was sent
    # The name, and for a scenario run again in one chaos run, "#2", "#3"...:
    # what Report.lateness is keyed by.
    label: str = ""


@dataclasses.dataclass
class Report:
    seed: int
    phases: list[Phase]
    acknowledged: int
    lost_one_offs: list[str]
    lost_occurrences: int
    duplicates: int
    redelivered: int            # repeats after an executor failed (allowed)
    stale_accepted: int
    stale_refused: int
    digests_equal: bool
    digest_problem: str
    lateness: dict[str, dict[str, tuple[float, float, float, int]]]   # by Phase.label

    @property
    def ok(self) -> bool:
        return not self.lost_one_offs and self.lost_occurrences == 0 and self.duplicates == 0 \
            and self.stale_accepted == 0 and self.digests_equal

    def render(self) -> str:
        lines = [f"seed={self.seed}  (replay with --seed {self.seed})"]
        for phase in self.phases:
            notes = " ".join(f"{k}={v}" for k, v in phase.notes.items())
            lines.append(f"  phase {phase.label:<13} victim={phase.victim or '-':<4} "
                         f"{phase.ended_s - phase.started_s:5.1f} s  {notes}")
            for kind, (p50, p99, mx, n) in self.lateness.get(phase.label, {}).items():
                lines.append(f"    {kind:<18} n={n:<6} p50={p50 * 1000:7.0f} ms  "
                             f"p99={p99 * 1000:7.0f} ms  max={mx * 1000:7.0f} ms")
        lines += [f"  acknowledged one-off creates: {self.acknowledged}",
                  f"  lost one-offs: {len(self.lost_one_offs)}   lost occurrences: "
                  f"{self.lost_occurrences}   duplicate calls: {self.duplicates}   "
                  f"redelivered (later attempt or executor kill): {self.redelivered}",
                  f"  stale fires accepted: {self.stale_accepted}   refused (counted by apply): "
                  f"{self.stale_refused}   digests equal: {self.digests_equal}",
                  *([f"  digest check: {self.digest_problem}"] if self.digest_problem else []),
                  f"  verdict: {'PASS' if self.ok else 'FAIL'}"]
        return "\n".join(lines)


def _pcts(values: list[float]) -> tuple[float, float, float, int]:
    if not values:
        return (0.0, 0.0, 0.0, 0)
    ordered = sorted(values)
    at = lambda p: ordered[min(len(ordered) - 1, int(round(p * (len(ordered) - 1))))]  # noqa: E731
    return (at(0.5), at(0.99), ordered[-1], len(ordered))


def _ts(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Chaos:
    def __init__(self, base: Path, *, seed: int, jobs: int, create_rate: float,
                 phase_s: float, freeze_s: float, log: Callable[[str], None] = print) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.jobs = jobs
        self.create_rate = create_rate
        self.phase_s = phase_s
        self.freeze_s = freeze_s
        self.log = log
        self.cluster = LocalCluster(base / "cluster", partitionable=True,
                                    extra_env={"RAFTSCHED_LOG_LEVEL": os.environ.get(
                                        "RAFTSCHED_CHAOS_NODE_LOG_LEVEL", "WARNING")})
        self.sink = Sink()
        self.every_jobs: dict[str, int] = {}       # job_id -> shard
        self.one_offs: dict[str, float] = {}       # acknowledged job_id -> run_at (s)
        self.shard_of: dict[str, int] = {}
        self.superseded: dict[tuple[int, int], float] = {}  # (shard, token) -> first seen newer
        self._last_tokens: dict[int, int] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.phases: list[Phase] = []

    # --- workload --------------------------------------------------------------------

    def _api(self, method: str, path: str, body: object = None,
             among: list[str] | None = None):
        nodes = [n for n in self.cluster.responsive() if among is None or n in among]
        # Which node a request goes to is load spreading, not a fault choice:
        # it does not draw from the seeded generator, so replays stay exact.
        random.shuffle(nodes)
        last = None
        for nid in nodes:
            try:
                return self.cluster.api(nid, method, path, body, timeout_s=8)
            except OSError as exc:
                last = exc
        raise OSError(f"no node answered {method} {path}: {last!r}")

    def create_every_second_jobs(self) -> None:
        body = {"schedule": {"every": "1s"}, "misfire": {"policy": "fire_all"},
                "target": {"type": "http", "url": self.sink.url, "timeout_s": 5}}

        def create(i: int) -> None:
            r = self._api("POST", "/v1/jobs", dict(body, name=f"every-{i}"))
            assert r.status == 201, r
            self.every_jobs[r.body["job_id"]] = r.body["shard"]
            self.shard_of[r.body["job_id"]] = r.body["shard"]

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(create, range(self.jobs)))

    def _one_off_stream(self) -> None:
        rng = random.Random(self.seed + 1)
        while not self._stop.is_set():
            run_at = time.time() + rng.uniform(2.0, 4.0)
            body = {"name": "one-off", "run_at": dt.datetime.fromtimestamp(
                        run_at, dt.timezone.utc).isoformat(timespec="milliseconds"),
                    "target": {"type": "http", "url": self.sink.url, "timeout_s": 5}}
            try:
                r = self._api("POST", "/v1/jobs", body)
                if r.status == 201:
                    self.one_offs[r.body["job_id"]] = run_at
                    self.shard_of[r.body["job_id"]] = r.body["shard"]
            except OSError:
                pass   # not acknowledged: nothing is promised
            self._stop.wait(1.0 / self.create_rate)

    def _watch_shards(self) -> None:
        while not self._stop.is_set():
            try:
                shards = self._api("GET", "/v1/cluster/shards").body["shards"]
                now = time.time()
                for s in shards:
                    old = self._last_tokens.get(s["shard"])
                    if old is not None and s["token"] > old:
                        for token in range(old, s["token"]):
                            self.superseded.setdefault((s["shard"], token), now)
                    self._last_tokens[s["shard"]] = max(old or 0, s["token"])
            except (OSError, KeyError, TypeError):
                pass
            self._stop.wait(0.1)

    def owners(self, among: list[str] | None = None) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for s in self._api("GET", "/v1/cluster/shards", among=among).body["shards"]:
            out.setdefault(s["owner"], []).append(s["shard"])
        return out

    # --- faults ----------------------------------------------------------------------

    def _phase(self, name: str) -> Phase:
        earlier = sum(1 for p in self.phases if p.name == name)
        phase = Phase(name=name, started_s=time.time(),
                      label=f"{name}#{earlier + 1}" if earlier else name)
        self.phases.append(phase)
        self.log(f"[chaos] phase {name}")
        return phase

    def _heal(self, phase: Phase) -> None:
        for nid in self.cluster.ids:
            if nid not in self.cluster.alive():
                self.cluster.start(nid)
        self.cluster.wait_ready(timeout_s=30)
        phase.ended_s = time.time()

    def kill(self, name: str, victim: str) -> None:
        """SIGKILL `victim`. When it was the leader, the phase notes
        `new_leader_after_s`: when the survivors first agreed on a new leader
        (polled every 50 ms). pysyncobj's election takes 0.4-1.4 s
        (limits.election_timeout_min_s..max_s), about twice that with a
        split vote; the dead leader's runs wait for it, or for its lease to
        lapse by the survivors' renewals if that is later."""
        phase = self._phase(name)
        phase.victim = victim
        was_leader = self._agreed_leader(self.cluster.responsive()) == victim
        killed_at = time.time()
        self.cluster.kill(victim)
        if was_leader:
            survivors = [n for n in self.cluster.ids if n != victim]
            try:
                wait_until(lambda: self._agreed_leader(survivors) not in (None, victim),
                           self.phase_s, "a new leader", 0.05)
                phase.notes["new_leader_after_s"] = round(time.time() - killed_at, 2)
            except TimeoutError:
                phase.notes["new_leader_after_s"] = None
        time.sleep(max(0.0, killed_at + self.phase_s - time.time()))
        self._heal(phase)

    def _agreed_leader(self, among: list[str]) -> str | None:
        try:
            return self.cluster.leader(among)
        except (OSError, KeyError, TypeError):
            return None

    def restart(self, leader_too: bool = False) -> None:
        """Stop a node that owns shards (not the leader; the leader with
        `leader_too`) with SIGTERM and start it again at once, as a rolling
        upgrade does; wait until it owns shards again. No fault: no call of
        this phase is repeated, and none is made as a later attempt (phase
        notes `repeated_calls`, `later_attempts`, filled in by the check)."""
        phase = self._phase("restart-leader" if leader_too else "restart")
        leader = self.cluster.wait_ready()
        victim = leader if leader_too else \
            self.rng.choice([n for n in self.cluster.ids if n != leader])
        phase.victim = victim
        wait_until(lambda: self.owners().get(victim), 15, f"{victim} to own shards", 0.05)
        phase.victim_stopped_s = time.time()
        phase.notes["exit_code"] = self.cluster.stop(victim)
        self.cluster.start(victim)
        self.cluster.wait_ready(timeout_s=30)
        wait_until(lambda: self.owners().get(victim), 30, f"{victim} to own shards again", 0.05)
        time.sleep(self.phase_s)
        phase.ended_s = time.time()

    def freeze_owner(self) -> None:
        """SIGSTOP a shard owner (never the leader) for freeze_s, then SIGCONT."""
        phase = self._phase("freeze-owner")
        leader = self.cluster.wait_ready()
        victim = self.rng.choice([n for n in self.cluster.ids if n != leader])
        self._isolate(phase, victim, self.cluster.pause, self.cluster.resume, "frozen")

    def partition(self) -> None:
        """Cut a node's Raft links (both directions, silently) for freeze_s."""
        phase = self._phase("partition")
        leader = self.cluster.wait_ready()
        victim = self.rng.choice(self.cluster.ids)
        phase.notes["was_leader"] = victim == leader
        self._isolate(phase, victim, self.cluster.cut, self.cluster.heal, "cut-off")

    def _isolate(self, phase: Phase, victim: str, isolate: Callable[[str], None],
                 restore: Callable[[str], None], what: str) -> None:
        """Isolate `victim` for freeze_s and note how fast its shards moved and
        how many fires it proposed under its old tokens (refused by apply).
        Ownership is read from the other nodes only: the victim's own view is
        what is in question."""
        phase.victim = victim
        others = [n for n in self.cluster.ids if n != victim]

        def victims_shards() -> list[set[int]]:
            # Each other node's own view: one read from whichever answers could
            # come from a node that has not yet applied the latest assignment
            # (a restarted victim is often still being given shards), and
            # compare its view before the fault with another's after it.
            return [set(self.owners([n]).get(victim, [])) for n in others]

        def settled() -> set[int] | None:
            views = victims_shards()
            return views[0] if views[0] and all(v == views[0] for v in views) else None
        held = wait_until(settled, 15, f"{victim} to own shards, by every other node's view",
                          0.05)
        refused_before = self._api("GET", "/v1/cluster", among=others).body["stale_fires_total"]
        isolated_at = time.time()
        isolate(victim)
        moved = wait_until(
            lambda: not any(v & held for v in victims_shards()) and time.time(),
            30, f"the shards of {what} {victim} to move", 0.05)
        phase.notes["shards_moved_after_s"] = round(moved - isolated_at, 2)
        remaining = self.freeze_s - (time.time() - isolated_at)
        if remaining > 0:
            time.sleep(remaining)
        restore(victim)
        time.sleep(min(self.phase_s, 5.0))
        self._heal(phase)
        phase.notes["stale_fires_refused"] = \
            self._api("GET", "/v1/cluster").body["stale_fires_total"] - refused_before

    def kill_all(self) -> None:
        phase = self._phase("kill-all")
        body = {"name": "burst", "target": {"type": "http", "url": self.sink.url,
                                            "timeout_s": 5}}
        stop = threading.Event()
        answers: collections.Counter = collections.Counter()

        def burst() -> None:
            while not stop.is_set():
                run_at = time.time() + 5
                b = dict(body, run_at=dt.datetime.fromtimestamp(
                    run_at, dt.timezone.utc).isoformat(timespec="milliseconds"))
                try:
                    r = self._api("POST", "/v1/jobs", b)
                    answers[r.status] += 1
                    if r.status == 201:
                        self.one_offs[r.body["job_id"]] = run_at
                        self.shard_of[r.body["job_id"]] = r.body["shard"]
                except OSError as exc:
                    answers[f"no answer ({type(exc).__name__})"] += 1

        workers = [threading.Thread(target=burst, daemon=True) for _ in range(4)]
        before = len(self.one_offs)
        for w in workers:
            w.start()
        time.sleep(self.rng.uniform(1.0, 2.0))
        self.cluster.kill_all()
        stop.set()
        for w in workers:
            w.join(15)
        phase.notes["acknowledged_in_burst"] = len(self.one_offs) - before
        phase.notes["burst_answers"] = ",".join(f"{k}:{v}" for k, v in sorted(
            answers.items(), key=str))
        time.sleep(1.0)
        self._heal(phase)

    # --- the run ---------------------------------------------------------------------

    def run(self, scenarios: list[str]) -> Report:
        self.log(f"[chaos] seed={self.seed} scenarios={','.join(scenarios)} jobs={self.jobs}")
        with self.cluster, self.sink:
            self.cluster.wait_ready()
            self.create_every_second_jobs()
            for target in (self._one_off_stream, self._watch_shards):
                thread = threading.Thread(target=target, daemon=True)
                thread.start()
                self._threads.append(thread)
            time.sleep(3)
            calm = self._phase("steady")
            time.sleep(self.phase_s)
            calm.ended_s = time.time()
            for scenario in scenarios:
                self._inject(scenario)
            self._stop.set()
            for thread in self._threads:
                thread.join(15)
            return self._check()

    def _inject(self, scenario: str) -> None:
        if scenario == "kill-leader":
            self.kill(scenario, self.cluster.wait_ready())
        elif scenario == "kill-random":
            self.kill(scenario, self.rng.choice(self.cluster.ids))
        elif scenario == "kill-owner":
            leader = self.cluster.wait_ready()
            self.kill(scenario, self.rng.choice([n for n in self.cluster.ids if n != leader]))
        elif scenario == "freeze-owner":
            self.freeze_owner()
        elif scenario == "partition":
            self.partition()
        elif scenario == "kill-all":
            self.kill_all()
        elif scenario == "restart":
            self.restart()
        elif scenario == "restart-leader":
            self.restart(leader_too=True)
        else:
            raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")

    def _check(self) -> Report:
        end = time.time()
        last_due = max(self.one_offs.values(), default=end)
        # Wait for the last one-offs (and any runs resumed after restarts).
        try:
            wait_until(lambda: all(j in self.sink.by_job() for j in self.one_offs),
                       max(15.0, last_due - time.time() + 15), "every acknowledged one-off", 0.2)
        except TimeoutError:
            pass
        digests_equal, digest_problem = True, ""
        try:
            self.cluster.ensure_same(timeout_s=30)
        except (TimeoutError, AssertionError) as exc:
            digests_equal, digest_problem = False, str(exc)
        calls = self.sink.snapshot()
        by_job = self.sink.by_job()
        lost = sorted(j for j in self.one_offs if j not in by_job)
        duplicates, redelivered = self._duplicates(calls)
        stale = 0
        for c in calls:
            token = int(c.headers.get("X-Raftsched-Fencing-Token", "0"))
            shard = self.shard_of.get(c.job_id)
            superseded = self.superseded.get((shard, token)) if shard is not None else None
            # Slack for the watcher's 100 ms polling.
            if superseded is not None and c.scheduled_s > superseded + 0.5:
                stale += 1
        lost_occ, trigger_late = self._every_second_runs(end)
        for phase in self.phases:
            if phase.name in ("restart", "restart-leader"):
                # The runs due from the SIGTERM until the phase ended (their
                # calls may come a little after); not those of a phase before
                # (kill-all's one-offs come due up to 5 s after it).
                inside = [c for c in calls
                          if phase.victim_stopped_s <= c.scheduled_s < (phase.ended_s or end)]
                seen = collections.Counter((c.job_id, round(c.scheduled_s * 1000))
                                           for c in inside)
                phase.notes["calls"] = len(inside)
                phase.notes["repeated_calls"] = sum(n - 1 for n in seen.values())
                phase.notes["later_attempts"] = sum(1 for c in inside if _attempt(c) > 1)
        lateness: dict[str, dict] = {}
        for phase in self.phases:
            window = lambda t: phase.started_s <= t < (phase.ended_s or end)  # noqa: E731
            lateness[phase.label] = {
                "trigger lateness": _pcts([late for due, late in trigger_late if window(due)]),
                "call lateness": _pcts([c.lateness_s for c in calls if window(c.scheduled_s)]),
            }
        refused = call("GET", self.cluster.url(self.cluster.ids[0]) + "/v1/cluster").body
        return Report(seed=self.seed, phases=self.phases, acknowledged=len(self.one_offs),
                      lost_one_offs=lost, lost_occurrences=lost_occ, duplicates=duplicates,
                      redelivered=redelivered,
                      stale_accepted=stale, stale_refused=refused["stale_fires_total"],
                      digests_equal=digests_equal, digest_problem=digest_problem,
                      lateness=lateness)

    def _duplicates(self, calls: list) -> tuple[int, int]:
        """(unexplained repeat calls, repeats explained by the executor failing:
        a later attempt, which apply grants only after the earlier one's lease
        expired or it failed (a frozen or cut-off executor), or a SIGKILL of the
        run's executor between the first call and the repeat)."""
        groups: dict[tuple[str, int], list] = {}
        for c in calls:
            groups.setdefault((c.job_id, int(round(c.scheduled_s * 1000))), []).append(c)
        duplicates = redelivered = 0
        for (job_id, scheduled_ms), group in groups.items():
            if len(group) == 1:
                continue
            group.sort(key=lambda c: c.received_s)
            run = self._api("GET", f"/v1/runs/{keys.run_id(job_id, scheduled_ms)}")
            executor = run.body.get("node") if run.status == 200 else None
            for earlier, repeat in zip(group, group[1:]):
                if _attempt(repeat) > _attempt(earlier):
                    redelivered += 1
                    continue
                # A call is sent before the sink stamps it: one in flight when
                # its sender died is stamped after the kill, by up to the slack.
                if any(nid == executor and
                       earlier.received_s - IN_FLIGHT_SLACK_S <= at <= repeat.received_s
                       for nid, at in self.cluster.kills):
                    redelivered += 1
                else:
                    duplicates += 1
        return duplicates, redelivered


    def _every_second_runs(self, end: float) -> tuple[int, list[tuple[float, float]]]:
        """Occurrences of the every-second jobs without any run, and each run's
        (scheduled, trigger lateness)."""
        lost = 0
        trigger_late: list[tuple[float, float]] = []
        first = self.phases[0].started_s
        for job_id in self.every_jobs:
            path = f"/v1/jobs/{job_id}/runs?limit=500&consistent=true"
            runs = wait_until(lambda: (r := self._api("GET", path)).status == 200 and r.body,
                              30, f"the run history of {job_id}", 0.2)
            scheduled = set()
            for run in runs["runs"]:
                due = _ts(run["scheduled_for"])
                scheduled.add(int(round(due)))
                # An ended attempt's start is when its node began the call (a
                # run is held from its fire, which may be ahead of its second).
                if run["state"] in ("succeeded", "failed", "retry_wait") \
                        and run.get("started_at"):
                    trigger_late.append((due, _ts(run["started_at"]) - due))
            expected = range(int(first) + 1, int(end) - 3)
            lost += sum(1 for t in expected if t not in scheduled)
        return lost, trigger_late


def run_chaos(*, scenarios: list[str], seed: int | None = None, jobs: int = 100,
              create_rate: float = 5.0, phase_s: float = 8.0, freeze_s: float = 20.0,
              base_dir: str | None = None, log: Callable[[str], None] = print) -> Report:
    seed = seed if seed is not None else random.SystemRandom().randrange(1, 10 ** 9)
    with tempfile.TemporaryDirectory(prefix="raftsched-chaos-") as tmp:
        base = Path(base_dir or tmp)
        return Chaos(base, seed=seed, jobs=jobs, create_rate=create_rate, phase_s=phase_s,
                     freeze_s=freeze_s, log=log).run(scenarios)


def _attempt(call: object) -> int:
    return int(call.headers.get("X-Raftsched-Attempt", "1"))  # type: ignore[attr-defined]
