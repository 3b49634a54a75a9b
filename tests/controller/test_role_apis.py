"""The typed seam between the step loop and its role workers: every worker answers its API, remote
methods are named by the API's methods (never a string), the seam imports no concrete worker, and
the in-process transport keeps a worker's calls in order behind its running rollout call."""

from __future__ import annotations

import ast
import inspect
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from rhymerl.workers.controller import role_apis
from rhymerl.workers.controller.role_apis import (
    HistoryAPI,
    RewardAPI,
    RolloutAPI,
    TrainAPI,
    concurrency_group,
)
from rhymerl.workers.controller.transport import (
    HandbackReport,
    LocalTransport,
    OutputReport,
    ProgressReport,
    Report,
    StateReport,
    Stream,
)
from rhymerl.workers.roles.history_worker import HistoryWorker
from rhymerl.workers.roles.reward_worker import RewardWorker
from rhymerl.workers.roles.rollout_worker import RolloutWorker
from rhymerl.workers.roles.samples import (
    CallState,
    Handback,
    HandbackTag,
    OutputTag,
    ProgressTag,
    RolloutOutput,
    RolloutProgress,
    SampleRef,
    StateTag,
    Tag,
)
from rhymerl.workers.roles.train_worker import TrainWorker
from rhymerl.workers.runtime.ray_transport import RayTransport, _Actor, _RayStream, _Ref

REPO = Path(__file__).resolve().parents[2]
A, B = SampleRef("p", 0, 1), SampleRef("p", 1, 1)
OUTPUT = RolloutOutput([], [], 0, 0.0, False, 0)
PAIRS = [(RolloutAPI, RolloutWorker), (TrainAPI, TrainWorker), (RewardAPI, RewardWorker), (HistoryAPI, HistoryWorker)]


def _api_methods(api: type) -> list[str]:
    return [n for n, v in vars(api).items() if inspect.isfunction(v) and not n.startswith("_")]


@pytest.mark.parametrize(("api", "worker"), PAIRS, ids=[a.__name__ for a, _ in PAIRS])
def test_each_role_worker_answers_every_method_of_its_api_with_the_same_parameters(api: type, worker: type) -> None:
    for name in _api_methods(api):
        assert hasattr(worker, name), f"{worker.__name__} lacks {api.__name__}.{name}"
        want = list(inspect.signature(getattr(api, name)).parameters)
        assert list(inspect.signature(getattr(worker, name)).parameters) == want, f"{worker.__name__}.{name}"


def test_the_apis_concurrency_groups_are_the_ones_the_worker_classes_declare() -> None:
    assert role_apis.group_methods("control") == RolloutWorker.CONTROL
    assert role_apis.group_methods("drafts") == RolloutWorker.DRAFTS
    assert role_apis.group_methods("weights") == RolloutWorker.WEIGHTS | TrainWorker.WEIGHTS
    assert concurrency_group(RolloutAPI.release) == "control" and concurrency_group(RolloutAPI.generate) is None
    assert concurrency_group(TrainAPI.send_weights) == "weights" and concurrency_group(TrainAPI.step) is None


def _production_files() -> Iterator[Path]:
    for top in ("rhymerl", "workers", "operator"):
        yield from (REPO / top).rglob("*.py")


def test_no_production_code_names_a_remote_method_by_a_string() -> None:
    named = []
    for path in _production_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("call", "call2", "tell") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                named.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert named == []


def test_the_seam_imports_no_concrete_role_worker() -> None:
    code = ("import sys, rhymerl.workers.controller.transport, rhymerl.workers.controller.role_apis; "
            "print([m for m in sys.modules if m.endswith('_worker') and '.roles.' in m])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


class _Worker:
    """A rollout worker stand-in: its rollout call yields `reports` (each an item and its tag; by
    default a state, then the output); `end_step` and `release` are logged."""

    def __init__(self, reports: list[tuple[object, Tag]] | None = None) -> None:
        self.log: list[str] = []
        self.reports = reports or [(None, StateTag(CallState({}, {}))), (OUTPUT, OutputTag(CallState({}, {})))]

    def generate(self, call: object, indexes: object, resume: object = None) -> Iterator[object]:
        for item, tag in self.reports:
            self.log.append(f"report {type(tag).__name__}")
            yield item
            yield tag

    def end_step(self) -> None:
        self.log.append("end_step")

    def release(self, call: int, samples: object) -> None:
        self.log.append("release")


def _report(t: LocalTransport, stream: Stream) -> Report:
    report = t.next_report([stream], timeout=0)
    assert report is not None
    return report


def test_a_call_to_a_worker_running_a_rollout_call_waits_for_its_output_but_a_control_request_does_not() -> None:
    t = LocalTransport()
    handle = t.start("rollout", _Worker)
    stream = t.stream(handle, 1, None, None, None)  # type: ignore[arg-type]
    assert isinstance(_report(t, stream), StateReport)
    waiting = t.call(handle, RolloutAPI.end_step)
    t.tell(handle, RolloutAPI.release, 1, [])
    assert not t.done(waiting) and _local_log(t, handle) == ["report StateTag", "release"]
    with pytest.raises(RuntimeError, match="end_step: waits behind"):
        t.get(waiting)
    last = _report(t, stream)
    assert isinstance(last, OutputReport) and t.done(waiting)
    assert _local_log(t, handle) == ["report StateTag", "release", "report OutputTag", "end_step"]


def _local_log(t: LocalTransport, handle: object) -> list[str]:
    return list(handle.obj.log)  # type: ignore[attr-defined]


def _stream(t: LocalTransport, reports: list[tuple[object, Tag]]) -> Stream:
    return t.stream(t.start("rollout", _Worker, reports), 1, None, None, None)  # type: ignore[arg-type]


def test_each_tag_becomes_the_report_of_its_kind_with_the_item_before_it_typed_as_the_tag_says() -> None:
    state, handback, progress = CallState({A: 2}, {B: 5}), Handback({A: 2}, [B]), RolloutProgress({})
    t = LocalTransport()
    stream = _stream(t, [(None, StateTag(state)), (progress, ProgressTag(state)), (progress, HandbackTag(handback)),
                         (OUTPUT, OutputTag(state))])
    match [_report(t, stream) for _ in range(4)]:
        case [StateReport(state=s1), ProgressReport(state=s2, progress=p2), HandbackReport(handback=hb, progress=p3),
              OutputReport(state=s4, output=out)]:
            assert s1 == s2 == s4 == state and hb == handback
            assert t.get(p2) is progress and t.get(p3) is progress and t.get(out) is OUTPUT
        case reports:
            raise AssertionError(reports)


def test_a_tag_after_an_item_of_another_type_is_refused_where_it_is_read() -> None:
    t = LocalTransport()
    stream = _stream(t, [(None, OutputTag(CallState({}, {})))])
    with pytest.raises(TypeError, match="a tag for a RolloutOutput after a NoneType"):
        _report(t, stream)


def test_a_tag_travels_as_itself_without_its_fields_names() -> None:
    for tag in (StateTag(CallState({A: 2}, {B: 5})), ProgressTag(CallState({A: 2}, {})),
                HandbackTag(Handback({A: 2}, [B], leaving=True)), OutputTag(CallState({}, {B: 5}))):
        wire = pickle.dumps(tag, protocol=5)
        back = pickle.loads(wire)
        assert type(back) is type(tag) and back == tag
        assert not any(name in wire for name in (b"running", b"finished", b"handed", b"missed", b"state"))


def test_a_ray_report_fetches_its_tag_and_keeps_its_item_by_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    item, tag, gen = object(), object(), object()
    fetched: list[object] = []

    def get(ref: object, timeout: float | None = None) -> Tag:
        fetched.append(ref)
        return OutputTag(CallState({}, {A: 3}))

    monkeypatch.setattr(ray, "wait", lambda refs, num_returns, timeout: (refs[:1], refs[1:]))
    monkeypatch.setattr(ray, "get", get)
    stream = _RayStream(_Actor(_FakeActor()), 1, gen=gen, items=iter([item, tag]))  # type: ignore[arg-type]
    report = RayTransport().next_report([stream], timeout=0)
    assert isinstance(report, OutputReport) and report.state.finished == {A: 3}
    assert isinstance(report.output, _Ref) and report.output.ref is item
    assert fetched == [tag] and stream.gen is None


class _Method:
    def __init__(self, sent: list[tuple[str, dict[str, object], tuple[object, ...]]], name: str) -> None:
        self.sent, self.name, self.opts = sent, name, {}

    def options(self, **opts: object) -> _Method:
        self.opts = opts
        return self

    def remote(self, *args: object) -> object:
        self.sent.append((self.name, self.opts, args))
        returns = self.opts.get("num_returns", 1)
        return tuple(object() for _ in range(returns)) if isinstance(returns, int) and returns > 1 else object()


class _FakeActor:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, object], tuple[object, ...]]] = []

    def __getattr__(self, name: str) -> _Method:
        return _Method(self.sent, name)


def test_a_ray_call_reaches_the_actor_method_of_the_apis_name_in_its_concurrency_group() -> None:
    actor = _FakeActor()
    t, handle = RayTransport(), _Actor(actor)
    t.tell(handle, RolloutAPI.release, 3, [])
    t.call(handle, RolloutAPI.load_weights, 2, {})
    t.call2(handle, HistoryAPI.indexes, 1, ["p"], 4)  # type: ignore[arg-type]
    assert actor.sent == [("release", {"num_returns": 1, "concurrency_group": "control"}, (3, [])),
                          ("load_weights", {"num_returns": 1}, (2, {})),
                          ("indexes", {"num_returns": 2}, (1, ["p"], 4))]
