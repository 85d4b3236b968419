"""Job ids in the order they are made (api/ids.py): the API's shape, growing
within a process whatever its clock does, distinct between processes."""

from __future__ import annotations

import re
import threading

from raftsched.api.ids import JobIds, new_job_id
from raftsched.core import keys
from raftsched.core.spec import JOB_ID_PATTERN


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def test_an_id_has_the_api_shape_and_names_its_millisecond():
    clock = Clock(1_764_900_000_123)
    made = JobIds(tag=0xABCDE, clock_ms=clock).next()
    assert re.fullmatch(JOB_ID_PATTERN, made)
    assert made == f"job_{1_764_900_000_123:011x}abcde0000"
    assert re.fullmatch(JOB_ID_PATTERN, new_job_id())


def test_ids_grow_within_a_millisecond_and_when_the_clock_steps_back():
    clock = Clock(5_000)
    ids = JobIds(tag=7, clock_ms=clock)
    made = [ids.next() for _ in range(3)]
    clock.ms = 4_000   # stepped back: the last millisecond counts on
    made += [ids.next() for _ in range(2)]
    clock.ms = 5_001
    made.append(ids.next())
    assert made == sorted(made) and len(set(made)) == len(made)
    assert made[3][4:15] == f"{5_000:011x}" and made[3].endswith("0003")
    assert made[-1][4:15] == f"{5_001:011x}" and made[-1].endswith("0000")


def test_a_full_millisecond_borrows_the_next():
    clock = Clock(9_000)
    ids = JobIds(tag=1, clock_ms=clock)
    made = [ids.next() for _ in range(0x10000 + 2)]
    assert made == sorted(made) and len(set(made)) == len(made)
    assert made[0xFFFF][4:15] == f"{9_000:011x}" and made[0xFFFF].endswith("ffff")
    assert made[0x10000][4:15] == f"{9_001:011x}" and made[0x10000].endswith("0000")
    clock.ms = 9_001   # the clock catches up with the borrowed millisecond
    assert ids.next() > made[-1]


def test_processes_with_other_tags_make_other_ids_on_the_same_millisecond():
    clock = Clock(1_000)
    a, b = JobIds(tag=1, clock_ms=clock), JobIds(tag=2, clock_ms=clock)
    assert {a.next() for _ in range(100)}.isdisjoint({b.next() for _ in range(100)})


def _from_threads(take, threads: int = 4) -> list:
    """What `take()` returned on each of `threads` threads run at once, together."""
    made: list = []
    lock = threading.Lock()

    def run() -> None:
        mine = take()
        with lock:
            made.extend(mine)

    started = [threading.Thread(target=run) for _ in range(threads)]
    for t in started:
        t.start()
    for t in started:
        t.join()
    return made


def test_threads_share_one_source_without_a_repeat():
    ids = JobIds()
    made = _from_threads(lambda: [ids.next() for _ in range(5_000)])
    assert len(set(made)) == 20_000


def test_a_batch_s_jobs_and_their_runs_sort_in_the_order_made():
    ids = JobIds(tag=3, clock_ms=Clock(2_000))
    jobs = [ids.next() for _ in range(50)]
    runs = [keys.run_id(j, 7_000) for j in jobs]
    assert runs == sorted(runs)
    assert [keys.run_occurrence(r) for r in runs] == [(j, 7_000) for j in jobs]


def test_a_forked_child_draws_a_tag_of_its_own(monkeypatch):
    clock = Clock(3_000)
    ids = JobIds(tag=5, clock_ms=clock)
    before = ids.next()
    monkeypatch.setattr("raftsched.api.ids.secrets.randbits", lambda bits: 6)
    ids.redraw()   # what os.register_at_fork runs in the child
    after = ids.next()
    assert before[15:20] == "00005" and after[15:20] == "00006"
    assert after > before


def test_a_block_of_ids_follows_one_another_and_the_ids_before_it():
    clock = Clock(8_000)
    ids = JobIds(tag=9, clock_ms=clock)
    first = ids.next()
    block = ids.block(1000)
    assert [int(b[-4:], 16) for b in block] == list(range(1, 1001))
    assert block == sorted(block) and block[0] > first and all(b[4:15] == first[4:15]
                                                               for b in block)
    assert ids.next().endswith(f"{1001:04x}")


def test_a_block_the_millisecond_cannot_hold_takes_the_next_whole():
    clock = Clock(8_000)
    ids = JobIds(tag=9, clock_ms=clock)
    ids.block(0xFFFF)   # counts 0 to 0xfffe
    block = ids.block(2)
    assert [b[4:15] for b in block] == [f"{8_001:011x}"] * 2
    assert [b[-4:] for b in block] == ["0000", "0001"]
    assert len(ids.block(0x10000)) == 0x10000


def test_blocks_drawn_at_once_do_not_interleave():
    """Batches checked at the same time (threads here, the event loop's turns
    in the API) each get ids in one run: a table keyed by job id takes each
    batch in one place."""
    ids = JobIds()
    blocks = _from_threads(lambda: [ids.block(100) for _ in range(200)])
    everything = sorted(i for block in blocks for i in block)
    assert len(set(everything)) == 80_000
    position = {an_id: at for at, an_id in enumerate(everything)}
    for block in blocks:   # each block is a run of the sorted whole
        assert position[block[-1]] - position[block[0]] == len(block) - 1
