"""The round book (scheduling/round_book.py): one record per sample, its transitions as the rollout
fleet drives them, and the executor's `unfinished` query answered from it; checked by hand and
against a brute-force model of the state machine."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from rhymerl.algorithms.scheduling.round_book import RoundBook
from rhymerl.algorithms.scheduling.types import Move

Book = RoundBook[str, str, int]


def _running(book: Book, holder: int, keys: list[str]) -> None:
    for k in keys:
        book.hold(holder, k, None, 0)
    book.report(holder, dict.fromkeys(keys, 0))


def test_a_sample_goes_from_queued_to_running_to_finished_and_the_scheduler_hears_it_once() -> None:
    book = Book()
    sid = book.open("a")
    _running(book, 7, ["a"])
    assert book.where("a").state == "queued" and book.where("a").holder == 7 and book.where("a").sid == sid
    book.report(7, {"a": 3})
    assert book.where("a").state == "running" and book.where("a").tokens == 3
    assert book.finish(7, "a", 5) and not book.finish(7, "a", 5)  # a repeated report changes nothing
    assert book.where("a").state == "finished" and "a" not in book.tokens(7)
    assert book.tell("a") == sid and book.tell("a") is None


def test_unfinished_lists_each_calls_reported_samples_in_order_but_not_moving_told_or_unknown_ones() -> None:
    book = Book()
    a, b, c, d = (book.open(k) for k in "abcd")
    _running(book, 1, ["a", "b"])
    _running(book, 2, ["c", "d", "x"])  # x has no scheduler id (its books closed)
    book.report(1, {"b": 4, "a": 2})  # the worker's order, not the call's
    book.report(2, {"c": 1, "d": 6, "x": 9})
    book.ask("c", Move(sid=c, src=1, dst=0, generated=1))
    book.finish(2, "d", 6)
    book.tell("d")
    assert book.unfinished([2, 1]) == [(b, 4), (a, 2)]
    assert book.answer("c") == Move(sid=c, src=1, dst=0, generated=1) and book.answer("c") is None
    assert book.unfinished([2]) == [(c, 1)] and d not in dict(book.unfinished([1, 2]))


def test_a_watch_is_met_once_and_waits_while_a_move_is_asked() -> None:
    book = Book()
    sid = book.open("a")
    book.watch("a", 5)
    assert not book.reached("a", 4)
    book.ask("a", Move(sid=sid, src=0, dst=1, generated=4))
    assert not book.reached("a", 6) and book.where("a").state == "moving"
    book.answer("a")
    assert book.reached("a", 6) and not book.reached("a", 7)


def test_a_handed_back_sample_leaves_its_call_is_parked_and_placed_into_another() -> None:
    book = Book()
    book.open("a")
    book.open("b")
    _running(book, 1, ["a", "b"])
    book.release(1, ["a"])
    book.park("a", 11, deferred=False)
    assert list(book.held(1)) == ["b"] and book.where("a").state == "handed_back"
    book.park("b", 12, deferred=False)
    book.defer("b")
    assert book.where("b").state == "parked" and book.parked_items() == [("a", 11), ("b", 12)]
    assert book.unpark("a") == 11
    book.hold(2, "a", "snapshot", 3, tokens=3)
    assert book.where("a").holder == 2 and book.held(2)["a"].resume == "snapshot" and book.tokens(2)["a"] == 3


def test_a_sample_counts_its_lost_workers_until_its_group_trains() -> None:
    book = Book()
    book.open("a")
    assert [book.lose("a") for _ in range(3)] == [1, 2, 3]
    book.forget("a")
    assert book.sid("a") is None and book.where("a").state == "unknown" and len(book) == 0
    assert book.lose("a") == 1  # a forgotten sample that loses a worker again counts afresh


def test_a_closed_call_holds_nothing_and_a_snapshot_reaches_only_its_holder() -> None:
    book = Book()
    book.open("a")
    _running(book, 1, ["a"])
    book.snapshot(2, "a", "elsewhere", 9)  # another call's stale report
    book.snapshot(1, "a", "here", 4)
    assert book.held(1)["a"].resume == "here" and book.held(1)["a"].resumed == 4
    book.close(1)
    assert book.held(1) == {} and book.where("a").holder is None and book.sid("a") is not None


# ---------------------------------------------------------------------- against a brute-force model
@dataclass
class Model:
    """The fleet's maps before the round book: one dict or set per fact."""

    sid: dict[str, int] = field(default_factory=dict)
    tokens: dict[int, dict[str, int]] = field(default_factory=dict)
    samples: dict[int, list[str]] = field(default_factory=dict)
    finished: dict[int, set[str]] = field(default_factory=dict)
    moving: set[str] = field(default_factory=set)
    told: set[str] = field(default_factory=set)
    watches: dict[str, int] = field(default_factory=dict)
    parked: dict[str, int] = field(default_factory=dict)
    next_sid: int = 0


KEYS = ["a", "b", "c", "d"]
ops = st.lists(st.tuples(st.sampled_from(["open", "hold", "report", "finish", "tell", "ask", "answer", "watch",
                                          "reached", "park", "unpark", "release", "forget"]),
                         st.sampled_from(KEYS), st.integers(0, 2), st.integers(0, 9)), max_size=60)


def _ids(book: Book, m: Model, op: str, k: str, n: int) -> object:
    if op == "open":
        m.sid[k], m.next_sid = m.next_sid, m.next_sid + 1
        return book.open(k) == m.sid[k]
    if op == "tell":
        told = m.sid.get(k) if k in m.sid and k not in m.told else None
        if told is not None:
            m.told.add(k)
        return book.tell(k) == told
    m.sid.pop(k, None)
    m.told.discard(k)
    m.watches.pop(k, None)
    book.forget(k)
    return None


def _calls(book: Book, m: Model, op: str, k: str, h: int, n: int) -> object:
    if op == "hold":
        m.samples.setdefault(h, [])
        if k not in m.samples[h]:
            m.samples[h].append(k)
        m.tokens.setdefault(h, {})[k] = n
        book.hold(h, k, None, n, tokens=n)
    elif op == "report":
        m.tokens[h] = {q: n for q in KEYS if q != k and q in m.samples.get(h, [])}
        book.report(h, {q: n for q in KEYS if q != k})
    elif op == "finish":
        new = k not in m.finished.setdefault(h, set())
        m.finished[h].add(k)
        m.tokens.get(h, {}).pop(k, None)
        return book.finish(h, k, n) == new
    else:
        if k in m.samples.get(h, []):
            m.samples[h].remove(k)
        m.tokens.get(h, {}).pop(k, None)
        book.release(h, [k])
    return None


def _moves(book: Book, m: Model, op: str, k: str, n: int) -> object:
    if op == "ask":
        m.moving.add(k)
        book.ask(k, Move(sid=0, src=0, dst=1, generated=n))
    elif op == "answer":
        was = k in m.moving
        m.moving.discard(k)
        return (book.answer(k) is not None) == was
    elif op == "watch":
        m.watches[k] = n
        book.watch(k, n)
    else:
        met = k in m.watches and n >= m.watches[k] and k not in m.moving
        if met:
            del m.watches[k]
        return book.reached(k, n) == met
    return None


def _parking(book: Book, m: Model, op: str, k: str, n: int) -> object:
    if op == "park":
        m.parked[k] = n
        book.park(k, n, deferred=False)
    elif k in m.parked:
        return book.unpark(k) == m.parked.pop(k)
    return None


def _step(book: Book, m: Model, op: str, k: str, h: int, n: int) -> object:
    if op in ("open", "tell", "forget"):
        return _ids(book, m, op, k, n)
    if op in ("hold", "report", "finish", "release"):
        return _calls(book, m, op, k, h, n)
    if op in ("ask", "answer", "watch", "reached"):
        return _moves(book, m, op, k, n)
    return _parking(book, m, op, k, n)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_book_answers_as_the_fleets_separate_maps_did(seq: list[tuple[str, str, int, int]]) -> None:
    book, m = Book(), Model()
    for op, k, h, n in seq:
        assert _step(book, m, op, k, h, n) is not False, (op, k, h, n)
        expected = [(m.sid[q], t) for hh in (0, 1, 2) for q, t in m.tokens.get(hh, {}).items()
                    if q in m.sid and q not in m.moving and q not in m.told]
        assert book.unfinished([0, 1, 2]) == expected
        assert book.parked_items() == list(m.parked.items())
        for hh in (0, 1, 2):
            assert list(book.held(hh)) == m.samples.get(hh, [])
