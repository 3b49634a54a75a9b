"""The blocks of the roles that serve the step loop beside rollout and train: the controller pod, the
reward pods (a user's function) and the history store (in memory or Redis)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from rhymerl.api.blocks import DAY_S, MAX_PATH, PositiveInt, Probability, Replicas, Strict
from rhymerl.api.history_keys import parse_redis_url
from rhymerl.api.k8s_values import ConfigMapKey
from rhymerl.api.placement import Placement, Resources, RoleSpec


class RewardSpec(Placement):
    verifier: Literal["final-answer", "boxed"] | None = Field(
        "final-answer", description="built-in verifier: 'final-answer' compares the text after the last '=' "
        "on the response's last line with the answer; 'boxed' compares the content of the response's last "
        "\\boxed{} with it (spaces, '$', thousands commas, a leading '+' and a trailing '.0' ignored)"
    )
    function: str | None = Field(
        None,
        description="user reward 'module:function', called as fn(prompt: str, response: str, answer: str) -> float "
        "(the prompt as the model read it, chat template applied); a function with a data_source or extra_info "
        "parameter (or **kwargs) also gets the row's",
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
    )
    replicas: Replicas = Field(1, description="reward pods when a function is set (the built-in verifier runs "
                               "in the controller and needs none)")
    resources: Resources = Field(default_factory=Resources)
    workers: PositiveInt = Field(
        2, le=64, description="processes that call a user reward function in parallel (at most 64; the built-in "
        "verifier runs in the controller)"
    )
    timeout_s: float = Field(
        10.0, gt=0.0, le=DAY_S, description="seconds one call of a user reward function may take (at most "
        f"{DAY_S}, a day); past it the call fails and its worker process is replaced"
    )
    failure_reward: float = Field(
        0.0, ge=-1e6, le=1e6, description="reward of a sample whose reward call failed (raised, timed out, returned "
        "no finite number, or ended its worker), -1e6 to 1e6; the reason is the sample's reward_error in the rollout "
        "dump"
    )
    max_failed_fraction: Probability = Field(
        0.5, description="the run stops when more than this share of a step's samples failed to be scored"
    )

    @model_validator(mode="after")
    def _one_source(self) -> RewardSpec:
        if self.function is not None:
            self.verifier = None
        if self.verifier is None and self.function is None:
            raise ValueError("verifier: set a built-in verifier or a function")
        return self


class ControllerSpec(Placement):
    """The job's one controller pod (the step loop)."""

    resources: Resources = Field(default_factory=Resources)

    @model_validator(mode="after")
    def _own_account(self) -> ControllerSpec:
        if self.pod.service_account_name is not None:
            raise ValueError("pod.service_account_name: the controller runs as the job's own account (it patches "
                             "the job's status); set it on the other roles")
        return self
    termination_grace_seconds: int = Field(
        900, ge=30, le=86_400, description="SIGTERM to SIGKILL of the controller pod (30 to 86400): long enough to "
        "finish a step and checkpoint it, which it does on SIGTERM (suspend, eviction, a spot notice)")


class SecretKeyRef(Strict):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253, description="Secret in the "
                      "job's namespace")
    key: ConfigMapKey = Field("redis-password", pattern=r"^[-._a-zA-Z0-9]+$", max_length=253)


def _checked_redis_url(url: str) -> str:
    """Refuse at validation what redis-py would misread or fail on only when a pod connects, and a
    password, which belongs in the Secret (rhymerl.api.history_keys.parse_redis_url)."""
    parse_redis_url(url)
    return url


class HistorySpec(RoleSpec):
    store: Literal["memory", "redis"] = "memory"
    redis_url: Annotated[str, AfterValidator(_checked_redis_url)] | None = Field(
        None, max_length=MAX_PATH, description="redis://host:port/db, rediss://host:port/db or unix:///path/to/socket "
        "(no password: see redis_password_secret); required when store is redis")
    redis_password_secret: SecretKeyRef | None = Field(None, description="Secret key holding the Redis password "
                                                       "(never put it in redis_url: the spec is stored in a "
                                                       "ConfigMap); pods get it as RHYMERL_REDIS_PASSWORD, which "
                                                       "`rhymerl run` reads too")

    @model_validator(mode="after")
    def _redis_url(self) -> HistorySpec:
        if self.store == "redis" and not self.redis_url:
            raise ValueError("redis_url: required when store is redis")
        return self
