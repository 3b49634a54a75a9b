"""The base of every RLJob spec block and the bounds its fields share.

One place for what makes a block strict (unknown keys, inf and nan refused, camelCase aliases) and for
the numeric bounds several blocks reuse, so that a bound is stated once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

from rhymerl.api.k8s_values import quantity

PositiveInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]

# Upper bounds. Past them a number is a slip (`num_prompts: 1e26`) that would exhaust memory or
# run for years before saying anything, not a plan; each is far above any job we know of. What
# really bounds a local run is this machine's memory: `rhymerl run` checks that separately.
MAX_REPLICAS = 1024  # pods of one role
MAX_TOKENS = 131_072  # 128K: the longest context of current open models
MAX_BATCH = 16_384  # sequences one engine decodes together (vLLM's max_num_seqs is 256 by default)
MAX_PATH = 4096  # PATH_MAX on Linux
MAX_INT64 = 2**63 - 1  # what Kubernetes, numpy and torch hold in an integer
DAY_S = 86_400
WEEK_S = 7 * DAY_S
MAX_COEF = 1e3  # a loss weight, penalty or length factor: far past any tuned value

Replicas = Annotated[int, Field(gt=0, le=MAX_REPLICAS, description=f"at most {MAX_REPLICAS}")]
Seed = Annotated[int, Field(ge=0, le=2**32 - 1, description="0 to 2**32-1 (sampling keys use 32 bits)")]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Quantity = Annotated[str | Annotated[int, WithJsonSchema({"type": "integer", "minimum": 0, "maximum": MAX_INT64})],
                     AfterValidator(quantity),
                     Field(description="Kubernetes quantity, e.g. '500m', '2Gi' or 4 (at most 2**63-1)")]


class Strict(BaseModel):
    """Base for every spec block: unknown keys are errors.

    Each field is named once, in snake_case; its camelCase alias is generated from it. The CRD and what
    rhymerl writes (`dump_job`) use the alias, Kubernetes' convention; a file may use either spelling
    (rhymerl.api.load names each field back as the file wrote it)."""

    # inf and nan are never a meaningful setting (`lr: .inf` turned every weight into NaN). A refused
    # value is never echoed (a Redis URL may hold a password); messages name the field instead.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, allow_inf_nan=False,
                              hide_input_in_errors=True)

    @classmethod
    def written(cls, data: object, name: str) -> Any:
        """Field `name` of this block in an unvalidated mapping (an RLJob as the API server holds it, one
        stored before the camelCase CRD included), under its alias or its name; None where absent."""
        if not isinstance(data, Mapping):
            return None
        alias = cls.model_fields[name].alias
        return data[alias] if alias in data else data.get(name)
