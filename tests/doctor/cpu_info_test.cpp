// /proc/cpuinfo and /proc/meminfo parsing from captured samples.
#include <gtest/gtest.h>

#include <algorithm>

#include "dlprobe/doctor/cpu_info.h"

namespace dlprobe::doctor {
namespace {

// Two sockets × one core × two threads of a Sapphire Rapids part, flags trimmed to the ones that
// matter plus neighbours (captured format, shortened).
constexpr std::string_view kXeon = R"(processor	: 0
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Platinum 8480+
physical id	: 0
siblings	: 2
core id		: 0
cpu cores	: 1
flags		: fpu sse4_2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8 avx_vnni

processor	: 1
model name	: Intel(R) Xeon(R) Platinum 8480+
physical id	: 0
core id		: 0
flags		: fpu sse4_2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8 avx_vnni

processor	: 2
model name	: Intel(R) Xeon(R) Platinum 8480+
physical id	: 1
core id		: 0
flags		: fpu sse4_2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8 avx_vnni

processor	: 3
model name	: Intel(R) Xeon(R) Platinum 8480+
physical id	: 1
core id		: 0
flags		: fpu sse4_2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8 avx_vnni
)";

// An Arm server (Grace): no model name, no core ids, "Features".
constexpr std::string_view kGrace = R"(processor	: 0
BogoMIPS	: 2000.00
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm asimddp sve sve2 bf16 i8mm
CPU implementer	: 0x41
CPU part	: 0xd4f

processor	: 1
BogoMIPS	: 2000.00
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm asimddp sve sve2 bf16 i8mm
)";

bool has(const CpuInfo& info, std::string_view name) {
  auto it = std::find_if(info.isa.begin(), info.isa.end(),
                         [&](const auto& f) { return f.first == name; });
  EXPECT_NE(it, info.isa.end()) << name << " is not in the reported list";
  return it != info.isa.end() && it->second;
}

TEST(CpuInfo, XeonWithAmx) {
  CpuInfo info = parse_cpuinfo(kXeon);
  EXPECT_EQ(info.model, "Intel(R) Xeon(R) Platinum 8480+");
  EXPECT_EQ(info.sockets, 2);
  EXPECT_EQ(info.cores, 2);
  EXPECT_EQ(info.threads, 4);
  EXPECT_TRUE(has(info, "avx2"));
  EXPECT_TRUE(has(info, "avx512f"));
  EXPECT_TRUE(has(info, "avx512_bf16"));
  EXPECT_TRUE(has(info, "avx512_fp16"));
  EXPECT_TRUE(has(info, "amx_tile"));
  EXPECT_TRUE(has(info, "amx_bf16"));
}

TEST(CpuInfo, AvxOnlyLacksAvx512) {
  CpuInfo info = parse_cpuinfo(
      "processor : 0\nmodel name : AMD EPYC\nphysical id : 0\ncore id : 0\nflags : fpu avx avx2 "
      "fma\n");
  EXPECT_EQ(info.threads, 1);
  EXPECT_TRUE(has(info, "avx2"));
  EXPECT_FALSE(has(info, "avx512f"));
  EXPECT_FALSE(has(info, "amx_tile"));
  // "avx512f" must not be matched inside a longer flag or vice versa.
  CpuInfo tricky = parse_cpuinfo("processor : 0\nflags : avx512fx avx2x\n");
  EXPECT_FALSE(has(tricky, "avx512f"));
  EXPECT_FALSE(has(tricky, "avx2"));
}

TEST(CpuInfo, ArmFeatures) {
  CpuInfo info = parse_cpuinfo(kGrace);
  EXPECT_EQ(info.model, "unknown");
  EXPECT_EQ(info.threads, 2);
  EXPECT_EQ(info.cores, 2);  // no core ids: every thread counts as a core
  EXPECT_EQ(info.sockets, 1);
  EXPECT_TRUE(has(info, "sve2"));
  EXPECT_TRUE(has(info, "bf16"));
  EXPECT_TRUE(has(info, "i8mm"));
}

TEST(CpuInfo, Empty) {
  CpuInfo info = parse_cpuinfo("");
  EXPECT_EQ(info.threads, 0);
  EXPECT_TRUE(info.isa.empty());
}

TEST(MemInfo, Total) {
  EXPECT_EQ(parse_meminfo_total("MemTotal:       24683584 kB\nMemFree:  100 kB\n"),
            24683584ULL * 1024);
  EXPECT_EQ(parse_meminfo_total("MemFree:  100 kB\n"), std::nullopt);
  EXPECT_EQ(parse_meminfo_total("MemTotal: lots\n"), std::nullopt);
}

TEST(HostInfo, ReadsThisMachine) {
  auto host = read_host_info();
  ASSERT_TRUE(host) << host.status().message();
  EXPECT_GE(host->cpu.threads, 1);
  ASSERT_TRUE(host->memory_total_bytes.has_value());
  EXPECT_GT(*host->memory_total_bytes, 0U);
  EXPECT_FALSE(host->os.empty());
}

}  // namespace
}  // namespace dlprobe::doctor
