"""A GPU pod's preflight (workers/runtime/gpu_preflight.py, gpu_probe.py): hand-made drivers, CUDA
builds and compilers in, one plain line naming what is missing out; and the image build's compiler
check run for real with this machine's C compiler, through Triton's own builder."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from jobs import make_job

from rhymerl.workers.runtime import gpu_probe
from rhymerl.workers.runtime.gpu_preflight import (
    MINOR_COMPAT_DRIVER,
    TOOLKIT_DRIVER,
    GpuFacts,
    decide,
    driver_string,
    failure,
    version,
)

PROC_580 = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 06:54:38 UTC 2025\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
PROC_570_OPEN = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  "
                 "(dvs-builder@U16-I3-B03-4-3)  Thu Jan 23 2025\nGCC version:  gcc version 11.4.0\n")
GPU_PODS = {"metadata": {"name": "j"}, "rollout": {"resources": {"gpu": 1}}, "train": {"resources": {"gpu": 1}}}
GOOD = GpuFacts(torch_version="2.13.0+cu130", torch_cuda="13.0", driver=PROC_580, cc=None, compiler="/usr/bin/gcc",
                python_include="/usr/local/include/python3.11", python_h=True)


def _with(**changes: object) -> GpuFacts:
    return dataclasses.replace(GOOD, **changes)


def test_the_driver_version_is_read_from_the_kernel_modules_text_or_nvidia_smi_and_nothing_else() -> None:
    assert driver_string(PROC_580) == "580.65.06"
    assert driver_string(PROC_570_OPEN) == "570.86.15"
    assert driver_string("535.247.01\n535.247.01\n") == "535.247.01"  # nvidia-smi: one line per GPU
    assert driver_string("570.26") == "570.26"
    assert driver_string("GCC version: gcc version 12.2.0") is None
    assert version("570.26") == (570, 26, 0) < version("570.86.15")


def test_a_pod_with_a_new_enough_driver_a_compiler_and_pythons_headers_passes_without_notes() -> None:
    verdict = decide(GOOD)
    assert (verdict.problems, verdict.notes, failure(verdict)) == ((), (), None)


def test_a_cuda_13_torch_on_an_r570_driver_is_refused_naming_the_driver_the_minimum_and_the_cuda_12_build() -> None:
    line = failure(decide(_with(driver=PROC_570_OPEN)))
    assert line is not None and line.startswith("GPU preflight: NVIDIA driver 570.86.15 is too old")
    assert "CUDA 13.0 needs a driver >= 580" in line and "images/README.md" in line and "\n" not in line


def test_a_cuda_12_torch_runs_on_any_r525_or_newer_driver_noting_minor_version_compatibility_below_its_own() -> None:
    cu128 = _with(torch_version="2.13.0+cu128", torch_cuda="12.8")
    assert failure(decide(dataclasses.replace(cu128, driver="570.86.15"))) is None
    assert decide(dataclasses.replace(cu128, driver="570.86.15")).notes == ()
    older = decide(dataclasses.replace(cu128, driver="535.247.01"))
    assert older.problems == () and "minor version compatibility" in older.notes[0] and "570.26" in older.notes[0]
    line = failure(decide(dataclasses.replace(cu128, driver="520.61.05")))
    assert line is not None and ">= 525.60.13" in line


def test_a_cpu_build_of_torch_in_a_gpu_pod_is_refused_naming_the_gpu_image() -> None:
    line = failure(decide(_with(torch_version="2.13.0+cpu", torch_cuda=None)))
    assert line is not None and "built without CUDA" in line and "worker-gpu" in line


def test_a_pod_without_a_visible_driver_or_with_an_unreadable_one_is_refused_saying_so() -> None:
    missing = failure(decide(_with(driver=None)))
    assert missing is not None and "no NVIDIA driver" in missing and "/proc/driver/nvidia/version" in missing
    garbled = failure(decide(_with(driver="NVIDIA-SMI has failed")))
    assert garbled is not None and "could not read the NVIDIA driver version" in garbled


def test_no_compiler_a_missing_cc_and_missing_python_headers_are_each_named() -> None:
    none = failure(decide(_with(compiler=None)))
    assert none is not None and "no C compiler ($CC, gcc or clang)" in none and "Triton" in none
    cc = failure(decide(_with(cc="clang-99", compiler=None)))
    assert cc is not None and "CC=clang-99: no such compiler" in cc
    headers = failure(decide(_with(python_h=False)))
    assert headers is not None and "no Python.h in /usr/local/include/python3.11" in headers


def test_every_problem_of_a_pod_comes_in_one_line() -> None:
    line = failure(decide(_with(driver=PROC_570_OPEN, compiler=None)))
    assert line is not None and line.count("; ") >= 1 and "570.86.15" in line and "no C compiler" in line
    assert "\n" not in line


def test_each_toolkits_own_driver_is_at_least_its_majors_minimum() -> None:
    for (major, _), driver in TOOLKIT_DRIVER.items():
        assert version(driver) >= version(MINOR_COMPAT_DRIVER[major])


def test_only_rollout_and_train_pods_that_request_gpus_are_checked_unless_skipped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = make_job(GPU_PODS, base="defaults")
    cpu = make_job(GPU_PODS, "rollout.resources.gpu=0", "train.resources.gpu=0", base="defaults")
    monkeypatch.delenv(gpu_probe.SKIP_ENV, raising=False)
    assert gpu_probe.needs_preflight(gpu, "rollout") and gpu_probe.needs_preflight(gpu, "train")
    assert not gpu_probe.needs_preflight(gpu, "controller") and not gpu_probe.needs_preflight(cpu, "rollout")
    monkeypatch.setenv(gpu_probe.SKIP_ENV, "1")
    assert not gpu_probe.needs_preflight(gpu, "train")


def test_a_gpu_pod_that_fails_its_preflight_raises_a_user_error_with_exit_code_2_and_prints_its_notes(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    job = make_job(GPU_PODS, base="defaults")
    monkeypatch.delenv(gpu_probe.SKIP_ENV, raising=False)
    monkeypatch.setattr(gpu_probe, "facts", lambda: _with(driver=PROC_570_OPEN))
    with pytest.raises(gpu_probe.GpuPreflightError) as refused:
        gpu_probe.preflight(job, "rollout")
    assert refused.value.exit_code == 2 and "570.86.15" in str(refused.value)
    monkeypatch.setattr(gpu_probe, "facts", lambda: _with(torch_cuda="12.8", driver="535.247.01"))
    gpu_probe.preflight(job, "train")
    assert "train: NVIDIA driver 535.247.01 runs CUDA 12.8 under minor version compatibility" in capsys.readouterr().out


def test_the_probe_reads_the_driver_from_the_kernel_modules_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path
                                                                  ) -> None:
    proc = tmp_path / "version"
    proc.write_text(PROC_580)
    monkeypatch.setattr(gpu_probe, "PROC_VERSION", proc)
    assert gpu_probe.driver_text() == PROC_580
    monkeypatch.setattr(gpu_probe, "PROC_VERSION", proc.with_name("absent"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi either
    assert gpu_probe.driver_text() is None


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("clang") is None, reason="needs a C compiler")
def test_the_build_check_compiles_a_module_with_tritons_builder_and_names_a_missing_cc(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    monkeypatch.delenv("CC", raising=False)
    assert gpu_probe.main(["--build-check"]) == 0
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(gpu_probe.GpuPreflightError, match="CC=/nonexistent/cc: no such compiler"):
        gpu_probe.build_check()


def test_a_gpu_worker_pod_runs_the_preflight_before_it_joins_the_head(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    from rhymerl.workers.runtime import pod_supervisor

    monkeypatch.delenv(gpu_probe.SKIP_ENV, raising=False)
    monkeypatch.delenv("RHYMERL_CONTROLLER", raising=False)  # a join would fail on it, naming it
    monkeypatch.setattr(gpu_probe, "facts", lambda: _with(compiler=None))
    with pytest.raises(gpu_probe.GpuPreflightError, match="no C compiler"):
        pod_supervisor.run_member(make_job(GPU_PODS, base="defaults"), "rollout", None, tmp_path)
