"""CPU detection from /proc/cpuinfo text (ppdlx_deploy.cpu, which ppdlx.cpu_features loads by path):
the flags that select kernel paths, the cores of this process, and the MKL vendor switch that is
set only on a non-Intel CPU with avx2 (issue 17)."""
import os
import subprocess
import sys

import pytest

from benchmarks.infer import load_deploy_module
from ppdlx import cpu_features as F

D = load_deploy_module()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_INTEL_FLAGS = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss "
                "ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid pni pclmulqdq "
                "ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm "
                "abm 3dnowprefetch fsgsbase bmi1 avx2 smep bmi2 erms invpcid avx512f avx512dq rdseed adx smap "
                "clflushopt clwb avx512cd avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx512_bf16 arat "
                "avx512vbmi avx512_vnni md_clear arch_capabilities")
_AMD_FLAGS = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
              "syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid "
              "pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand "
              "hypervisor lahf_lm cmp_legacy abm sse4a misalignsse 3dnowprefetch bmi1 avx2 smep bmi2 erms invpcid "
              "rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves clzero vaes vpclmulqdq rdpid")


def _cpuinfo(vendor, model_name, family, model, flags, cores):
    """/proc/cpuinfo text: one paragraph per (processor, core id), socket 0."""
    return "\n".join(f"processor\t: {p}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
                     f"model name\t: {model_name}\nphysical id\t: 0\nsiblings\t: {len(cores)}\ncore id\t\t: {c}\n"
                     f"cpu cores\t: {len(set(cores))}\nflags\t\t: {flags}\n" for p, c in enumerate(cores))


# 2 cores with 2 hyperthreads each: processors 0 and 2 share core 0
INTEL_AVX512 = _cpuinfo("GenuineIntel", "Intel(R) Xeon(R) Platinum 8369HB CPU @ 3.30GHz", 6, 85, _INTEL_FLAGS,
                        [0, 1, 0, 1])
AMD_AVX2 = _cpuinfo("AuthenticAMD", "AMD EPYC 7B13 64-Core Processor", 25, 1, _AMD_FLAGS, [0, 1])


def test_intel_avx512_sample_reads_its_flags_and_cores():
    f = F.parse_cpuinfo(INTEL_AVX512, usable={0, 2})
    assert f["vendor"] == "GenuineIntel" and f["model_name"] == "Intel(R) Xeon(R) Platinum 8369HB CPU @ 3.30GHz"
    assert (f["family"], f["model"]) == (6, 85)
    assert f["flags"] == ["sse4_2", "avx", "fma", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                          "avx512_bf16"]
    assert f["logical_cpus"] == 4 and f["physical_cores"] == 2 and f["sockets"] == 1
    assert f["usable_cpus"] == 2 and f["usable_physical_cores"] == 1  # two hyperthreads of one core
    assert F.has_bf16(f) and F.has_vnni(f)
    assert F.mkl_debug_cpu_type_for(f) is None  # MKL dispatches by itself on Intel; 5 would cap AVX-512 at AVX2


def test_amd_avx2_sample_gets_the_mkl_switch_and_no_bf16():
    f = F.parse_cpuinfo(AMD_AVX2, usable={0, 1})
    assert f["vendor"] == "AuthenticAMD" and f["flags"] == ["sse4_2", "avx", "fma", "avx2"]
    assert f["usable_cpus"] == 2 and f["usable_physical_cores"] == 2
    assert not F.has_bf16(f) and not F.has_vnni(f)
    assert F.mkl_debug_cpu_type_for(f) == "5"
    no_avx2 = F.parse_cpuinfo(AMD_AVX2.replace(" avx2 ", " "))
    assert "avx2" not in no_avx2["flags"] and F.mkl_debug_cpu_type_for(no_avx2) is None
    assert F.mkl_debug_cpu_type_for(F.parse_cpuinfo("")) is None  # unknown CPU: MKL left alone


def test_ppdlx_runs_the_deploy_packages_cpu_code_and_reads_cpuinfo_alike():
    deploy_file = os.path.realpath(D.cpu.__file__)
    for name in ("parse_cpuinfo", "cpu_features", "thread_environment", "has_bf16", "has_vnni",
                 "mkl_debug_cpu_type_for"):
        assert os.path.realpath(getattr(F, name).__code__.co_filename) == deploy_file, name
    for text in (INTEL_AVX512, AMD_AVX2, ""):
        assert D.cpu.parse_cpuinfo(text, usable={0, 1}) == F.parse_cpuinfo(text, usable={0, 1})
        assert D.cpu.mkl_debug_cpu_type_for(D.cpu.parse_cpuinfo(text)) == F.mkl_debug_cpu_type_for(
            F.parse_cpuinfo(text))
    here = F.cpu_features()
    assert D.cpu.cpu_features() == here and here["usable_cpus"] == len(os.sched_getaffinity(0))
    assert D.cpu.THREAD_ENV == F.THREAD_ENV
    assert D.cpu_has_bf16() == F.has_bf16(here)


@pytest.mark.parametrize("package", ["ppdlx", "ppdlx_deploy"])
def test_import_sets_mkl_switch_by_detection_and_a_users_value_wins(package):
    expected = F.mkl_debug_cpu_type_for(F.cpu_features())
    code = (f"import os, sys; sys.path.insert(0, {os.path.join(ROOT, 'deploy', 'python')!r}); import {package}; "
            f"print(os.environ.get('MKL_DEBUG_CPU_TYPE')); print('paddle' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "MKL_DEBUG_CPU_TYPE"}
    env["PYTHONPATH"] = ROOT
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(expected), "False"]  # decided before (and without) paddle
    user = subprocess.run([sys.executable, "-c", code], env={**env, "MKL_DEBUG_CPU_TYPE": "4"}, capture_output=True,
                          text=True, timeout=300)
    assert user.stdout.split() == ["4", "False"]


def test_onednn_isa_cap_limits_the_features_as_onednn_limits_dispatch():
    """ONEDNN_MAX_CPU_ISA (DNNL_MAX_CPU_ISA when unset) caps oneDNN's dispatch, and the features follow: a path
    chosen by them is one oneDNN runs (issue 39: on an AVX-512 machine capped at AVX2, bf16 looked available)."""
    assert F.onednn_isa_cap({"ONEDNN_MAX_CPU_ISA": "avx2"}) == "AVX2"
    assert F.onednn_isa_cap({"DNNL_MAX_CPU_ISA": "AVX512_CORE"}) == "AVX512_CORE"
    assert F.onednn_isa_cap({"ONEDNN_MAX_CPU_ISA": "SSE41", "DNNL_MAX_CPU_ISA": "AVX2"}) == "SSE41"
    assert F.onednn_isa_cap({"ONEDNN_MAX_CPU_ISA": "AVX10_1_512_AMX"}) == "AVX512_CORE_AMX"
    for unset in ({}, {"ONEDNN_MAX_CPU_ISA": "ALL"}, {"ONEDNN_MAX_CPU_ISA": "DEFAULT"}, {"ONEDNN_MAX_CPU_ISA": "Z80"}):
        assert F.onednn_isa_cap(unset) is None, unset
    full = D.cpu.parse_cpuinfo(INTEL_AVX512)
    assert F.has_bf16(full) and F.has_vnni(full) and F.onednn_runs_bf16(full)
    avx2 = D.cpu.parse_cpuinfo(INTEL_AVX512, isa_cap="AVX2")
    assert avx2["flags"] == ["sse4_2", "avx", "fma", "avx2"] and avx2["hardware_flags"] == full["flags"]
    assert not F.has_bf16(avx2) and not F.has_vnni(avx2) and not F.onednn_runs_bf16(avx2)
    core = D.cpu.parse_cpuinfo(INTEL_AVX512, isa_cap="AVX512_CORE")
    assert F.onednn_runs_bf16(core) and not F.has_bf16(core) and not F.has_vnni(core)
    assert D.cpu.parse_cpuinfo(INTEL_AVX512, isa_cap="AVX512_CORE_BF16")["flags"] == full["flags"]
    # MKL does not follow oneDNN's cap: its vendor switch still reads the hardware
    amd = D.cpu.parse_cpuinfo(AMD_AVX2, isa_cap="SSE41")
    assert amd["flags"] == ["sse4_2"] and F.mkl_debug_cpu_type_for(amd) == "5"
