"""Desired vs actual children -> writes (rhymerl.operator.reconcile.diff), with hand-made objects and with
what the builders emit as an API server would return it."""

from __future__ import annotations

import copy
from typing import Any

from jobs import make_job

from rhymerl.operator.manifests import SPEC_HASH_ANNOTATION, Owner, desired
from rhymerl.operator.reconcile.diff import (
    APPLIED,
    DESIRED_HASH,
    ObjectRef,
    covers,
    pinned,
    plan,
    quantity,
    scaled_to_zero,
    stamped,
)


def sts(name: str = "j-rollout", replicas: int = 2, **template: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "namespace": "ns",
                                                                        "labels": {"app": "x"}},
            "spec": {"replicas": replicas, "serviceName": name, "selector": {"matchLabels": {"app": "x"}},
                     "template": {"spec": {"containers": [{"name": "c", "image": "i:1",
                                                           "resources": {"requests": {"cpu": "500m"}}}],
                                           **template}}}}


def config_map(name: str = "j-spec") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "ns"},
            "data": {"spec.yaml": "a: 1\n"}}


def as_served(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` applied and read back: the API server adds its own fields and defaults, and spells
    quantities its way."""
    out = copy.deepcopy(stamped(obj))
    out["metadata"].update(uid="u-1", resourceVersion="42", generation=3, creationTimestamp="2026-01-01T00:00:00Z",
                           managedFields=[{"manager": "rhymerl-operator"}])
    if obj["kind"] == "StatefulSet":
        out["spec"]["revisionHistoryLimit"] = 10
        container = out["spec"]["template"]["spec"]["containers"][0]
        container.update(terminationMessagePath="/dev/termination-log", imagePullPolicy="IfNotPresent")
        requests = container["resources"]["requests"]
        if requests.get("cpu") == "500m":
            requests["cpu"] = "0.5"  # the same quantity, spelled the server's way
        out["spec"]["template"]["spec"]["dnsPolicy"] = "ClusterFirst"
        out["status"] = {"replicas": 2, "readyReplicas": 1}
    return out


def test_covers_ignores_fields_the_server_added_but_not_a_changed_value() -> None:
    want = {"a": 1, "b": {"c": "x"}, "l": [{"n": 1}]}
    assert covers(want, {"a": 1, "b": {"c": "x", "extra": True}, "l": [{"n": 1, "default": "d"}], "z": 0})
    assert not covers(want, {"a": 2, "b": {"c": "x"}, "l": [{"n": 1}]})
    assert not covers(want, {"a": 1, "b": {"c": "y"}, "l": [{"n": 1}]})
    assert not covers(want, {"a": 1, "b": {"c": "x"}, "l": [{"n": 1}, {"n": 2}]})
    assert not covers(want, {"a": 1, "b": {"c": "x"}})


def test_covers_treats_an_omitted_field_as_its_zero_value() -> None:
    assert covers({"nodeSelector": {}, "tolerations": [], "hostNetwork": False, "x": None, "n": 0},
                  {"other": 1})
    assert not covers({"nodeSelector": {"k": "v"}}, {})


def test_quantities_compare_by_value_as_the_api_server_rewrites_them() -> None:
    assert quantity("500m") == quantity("0.5") == quantity(0.5)
    assert quantity("2Gi") == quantity("2048Mi") == 2 * 2**30
    assert quantity("4") == quantity(4)
    assert quantity("1k") == 1000 and quantity("1Ki") == 1024
    assert quantity("abc") is None and quantity(True) is None and quantity(None) is None
    assert covers({"cpu": "500m", "memory": "2Gi", "gpu": 4}, {"cpu": "0.5", "memory": "2048Mi", "gpu": "4"})
    assert not covers({"cpu": "500m"}, {"cpu": "1"})


def test_missing_children_are_applied_in_the_desired_order_with_their_hash() -> None:
    objects = [config_map(), sts()]
    steps = plan(objects, [])
    assert [o["kind"] for o in steps.apply] == ["ConfigMap", "StatefulSet"]
    assert all(DESIRED_HASH in o["metadata"]["annotations"] for o in steps.apply)
    assert steps.delete == () and steps.writes == 2


def test_children_as_the_server_returns_them_need_no_write() -> None:
    objects = [config_map(), sts()]
    steps = plan(objects, [as_served(o) for o in objects])
    assert steps.writes == 0
    assert steps.unchanged == ("ConfigMap/j-spec", "StatefulSet/j-rollout")


def test_a_drifted_field_is_applied_again_and_only_that_child() -> None:
    objects = [config_map(), sts()]
    served = [as_served(o) for o in objects]
    served[1]["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:1"
    steps = plan(objects, served)
    assert [key["kind"] for key in steps.apply] == ["StatefulSet"]
    assert steps.apply[0]["spec"]["template"]["spec"]["containers"][0]["image"] == "i:1"


def test_a_field_no_longer_desired_changes_the_hash_so_apply_can_drop_it() -> None:
    before = sts(nodeSelector={"pool": "a"})
    after = sts()
    served = as_served(before)
    assert covers(stamped(after)["spec"], served["spec"])  # field by field, nothing looks wrong
    steps = plan([after], [served])
    assert len(steps.apply) == 1 and "nodeSelector" not in steps.apply[0]["spec"]["template"]["spec"]


def test_an_object_carrying_our_labels_but_not_desired_is_deleted() -> None:
    steps = plan([config_map()], [as_served(config_map()), as_served(sts("j-reward"))])
    assert steps.apply == ()
    assert steps.delete == (ObjectRef("StatefulSet", "j-reward", "apps/v1", "no longer desired"),)


def test_a_change_of_a_field_that_cannot_change_in_place_replaces_the_child() -> None:
    served = as_served(sts())
    served["spec"]["selector"] = {"matchLabels": {"app": "old"}}
    steps = plan([sts()], [served])
    assert steps.apply == ()
    assert steps.delete == (ObjectRef("StatefulSet", "j-rollout", "apps/v1", "spec.selector cannot change in place"),)
    assert steps.requeue


def test_a_child_still_being_deleted_is_left_alone_and_looked_at_again() -> None:
    served = as_served(sts())
    served["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    steps = plan([sts(replicas=3)], [served])
    assert steps.writes == 0 and steps.requeue


def test_scaled_to_zero_sets_only_statefulset_replicas_and_leaves_the_input_alone() -> None:
    objects = [config_map(), sts(replicas=3)]
    out = scaled_to_zero(objects)
    assert out[1]["spec"]["replicas"] == 0 and out[0] == config_map()
    assert objects[1]["spec"]["replicas"] == 3


def test_every_child_the_builders_emit_needs_no_write_once_applied() -> None:
    rollout = {"replicas": 2, "max_replicas": 4, "resources": {"cpu": "500m", "gpu": 1}, "gpus_per_replica": 1}
    job = make_job({"metadata": {"name": "j", "namespace": "ns"}, "rollout": rollout}, base="defaults")
    objects = desired(job, Owner("rhymerl.io/v1alpha1", "RLJob", "j", "uid-1"))
    served = [as_served(o) for o in objects]
    assert plan(objects, served).writes == 0
    job.spec.rollout.replicas = 3
    rescaled = plan(desired(job, Owner("rhymerl.io/v1alpha1", "RLJob", "j", "uid-1")), served)
    assert sorted(f"{o['kind']}/{o['metadata']['name']}" for o in rescaled.apply) == ["ConfigMap/j-spec",
                                                                                       "StatefulSet/j-rollout"]


def _built(image: str, spec_hash: str, replicas: int = 2) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "j-rollout", "labels": {}},
            "spec": {"replicas": replicas, "template": {
                "metadata": {"annotations": {SPEC_HASH_ANNOTATION: spec_hash}},
                "spec": {"containers": [{"name": "rollout", "image": image}]}}}}


def _written(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as the API server holds it after the operator applied it."""
    return copy.deepcopy(pinned([obj], [])[0])


def test_pinning_keeps_what_the_operator_wrote_while_the_spec_hash_stays_and_follows_a_new_hash() -> None:
    live = _written(_built("v1", "h1"))
    upgraded = pinned([_built("v2", "h1", replicas=3)], [live])[0]  # a new release renders v2 for the same spec
    assert upgraded["spec"]["template"]["spec"]["containers"][0]["image"] == "v1"
    assert upgraded["spec"]["replicas"] == 3  # replicas always follow
    assert upgraded["metadata"]["annotations"][APPLIED] == live["metadata"]["annotations"][APPLIED]
    edited = copy.deepcopy(live)
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "evil"  # a hand edit: repaired to what was written
    assert pinned([_built("v2", "h1")], [edited])[0]["spec"]["template"]["spec"]["containers"][0]["image"] == "v1"
    changed = pinned([_built("v2", "h2")], [live])[0]  # the user changed the spec: the new rendering
    assert changed["spec"]["template"]["spec"]["containers"][0]["image"] == "v2"
    assert '"hash":"h2"' in changed["metadata"]["annotations"][APPLIED]
    others = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "j-rollout"}, "spec": {}}
    assert pinned([others], [live]) == [others]
