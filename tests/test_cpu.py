"""The CPU description every benchmark result records (clearformer.cpu)."""

from __future__ import annotations

from clearformer.cpu import NOTABLE_FLAGS, cpu_description, cpu_info, parse_cpuinfo

# Two processors of an AMD guest, as Linux prints them (flags shortened).
AMD_GUEST = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx fma avx2 hypervisor avx512f avx512_vnni avx512_bf16 avx_vnni
bogomips\t: 5192.19

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx fma avx2 hypervisor avx512f avx512_vnni avx512_bf16 avx_vnni
"""

ARM_HOST = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes crc32 asimddp sve i8mm
CPU implementer\t: 0x41
CPU architecture: 8
CPU part\t: 0xd40
"""


def test_an_x86_guest_is_read_with_its_family_and_flags():
    info = parse_cpuinfo(AMD_GUEST, logical_cpus=2)
    assert (info.model, info.vendor, info.family) == ("AMD EPYC", "AuthenticAMD", "26 / 2")
    assert info.virtualised and {"avx512f", "avx512_vnni", "fma"} <= info.flags
    assert "amx_tile" not in info.flags
    assert info.summary() == (
        "AMD EPYC (AuthenticAMD family 26 / 2), 2 CPUs, virtual machine: "
        "avx2 fma avx512f avx512_vnni avx512_bf16 avx_vnni"
    )


def test_an_arm_host_is_read_from_its_features_and_part():
    info = parse_cpuinfo(ARM_HOST, logical_cpus=64)
    assert info.family == "0x41 / 0xd40" and info.vendor == ""
    assert {"asimddp", "i8mm", "sve"} <= info.flags and not info.virtualised
    assert info.summary().endswith("64 CPUs: asimddp i8mm sve")


def test_unreadable_cpuinfo_gives_no_flags_and_says_so():
    info = parse_cpuinfo("", logical_cpus=4)
    assert info.flags == frozenset() and info.family == ""
    assert info.summary().endswith("4 CPUs: flags unread")


def test_this_machine_is_described_with_the_fields_results_record():
    described = cpu_description()
    assert described["logical_cpus"] == cpu_info().logical_cpus >= 1
    assert set(described["notable_flags"]) <= set(NOTABLE_FLAGS)
    assert described["summary"] == cpu_info().summary()
    assert isinstance(described["torch_cpu_capability"], str) and described["torch_cpu_capability"]
