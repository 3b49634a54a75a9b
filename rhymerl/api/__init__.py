"""The user-facing contract: the RLJob spec, its loader and the CRD generated from it."""

from rhymerl.api.load import SpecError, SpecProblem, dump_job, load_job, parse_job
from rhymerl.api.spec import API_VERSION, GROUP, KIND, VERSION, RLJob, RLJobSpec
from rhymerl.api.status import RLJobStatus

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "VERSION",
    "RLJob",
    "RLJobSpec",
    "RLJobStatus",
    "SpecError",
    "SpecProblem",
    "dump_job",
    "load_job",
    "parse_job",
]
