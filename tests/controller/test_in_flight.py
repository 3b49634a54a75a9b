"""The record of what a pipelined run had in flight at a checkpoint (run_folder/in_flight.py)."""

from __future__ import annotations

import pytest

from rhymerl.workers.run_folder.in_flight import NOTHING, InFlight, carried


def test_a_record_reads_back_as_it_was_written() -> None:
    record = InFlight(ahead=4, groups={(2, "p7"): 3, (2, "p9"): 4})
    assert InFlight.from_json(record.to_json(), version=5) == record
    assert record.versions() == {3, 4}
    assert carried(sorted(record.versions()), 5) == [3, 4]
    assert carried([4, 5], 5) == [4]


def test_open_groups_of_a_record_without_versions_take_the_checkpoints_own() -> None:
    old = {"open_groups": [[1, "p3"], [2, "p0"]]}
    assert InFlight.from_json(old, version=6) == InFlight(None, {(1, "p3"): 6, (2, "p0"): 6})
    assert InFlight.from_json({}, version=6).versions() == set() == NOTHING.versions()


@pytest.mark.parametrize("bad", [{"ahead_version": -1}, {"ahead_version": "1"}, {"open_groups": {}},
                                 {"open_groups": [[1]]}, {"open_groups": [["1", "p", 0]]},
                                 {"open_groups": [[1, "p", -2]]}])
def test_a_damaged_record_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        InFlight.from_json(bad, version=1)
