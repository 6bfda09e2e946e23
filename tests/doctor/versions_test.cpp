// Version decoding, the compatibility verdicts (table-driven) and the dlopen probe.
#include <gtest/gtest.h>

#include <algorithm>

#include "dlprobe/doctor/versions.h"

namespace dlprobe::doctor {
namespace {

TEST(Versions, Decoding) {
  EXPECT_EQ(decode_cuda_version(13000).str(), "13.0");
  EXPECT_EQ(decode_cuda_version(12040).str(), "12.4");
  EXPECT_EQ(decode_cuda_version(12090).str(), "12.9");
  EXPECT_EQ(decode_cudnn_version(8907).str(), "8.9.7");
  EXPECT_EQ(decode_cudnn_version(91900).str(), "9.19.0");
  EXPECT_EQ(decode_cudnn_version(90100).str(), "9.1.0");
  EXPECT_EQ(decode_mmp_version(130100).str(), "13.1.0");
  EXPECT_EQ(decode_mmp_version(22703).str(), "2.27.3");
}

TEST(Versions, ProcDriverVersion) {
  EXPECT_EQ(parse_proc_driver_version(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:48 "
                "UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"),
            "580.65.06");
  EXPECT_EQ(parse_proc_driver_version("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "
                                      "570.133.20  Release Build  (dvs-builder@U16-I3-B03-4-3)"),
            "570.133.20");
  EXPECT_EQ(parse_proc_driver_version("something else"), std::nullopt);
}

TEST(Versions, MinimumDriver) {
  EXPECT_EQ(minimum_driver_for_cuda_major(13), "580.65.06");
  EXPECT_EQ(minimum_driver_for_cuda_major(12), "525.60.13");
  EXPECT_EQ(minimum_driver_for_cuda_major(7), std::nullopt);
}

LibraryProbe loaded(std::string name, std::int64_t raw, std::string version,
                    std::string built_with = "") {
  LibraryProbe p;
  p.name = std::move(name);
  p.loaded = true;
  p.raw_version = raw;
  p.version = std::move(version);
  p.built_with = std::move(built_with);
  p.path = "/opt/lib/" + p.name;
  return p;
}

// A stack that fits: driver for CUDA 13.0, runtime 13.0, cuDNN 9 for CUDA 13, cuBLAS 13, CUPTI.
StackVersions good_stack() {
  StackVersions v;
  v.cuda_driver_api = 13000;
  v.cuda_runtime_built = 13000;
  v.cuda_runtime_loaded = 13000;
  v.cudnn = loaded("cuDNN", 91900, "9.19.0", "9.19.0");
  v.cudnn_cudart_version = 13010;
  v.cublas = loaded("cuBLAS", 130100, "13.1.0");
  v.cupti = loaded("CUPTI", 130001, "13.0.1");
  return v;
}

std::vector<std::string> ids(const std::vector<Finding>& findings) {
  std::vector<std::string> out;
  for (const auto& f : findings) out.push_back(f.id);
  return out;
}

struct CompatCase {
  const char* name;
  void (*mutate)(StackVersions&);
  std::vector<std::string> expected_ids;
  Severity severity;  // of the first expected finding
};

TEST(Compatibility, Table) {
  const CompatCase cases[] = {
      {"fits", [](StackVersions&) {}, {}, Severity::info},
      {"driver 12.4 vs runtime 13.0",
       [](StackVersions& v) { v.cuda_driver_api = 12040; },
       {"runtime_newer_than_driver"},
       Severity::error},
      {"driver 13.0 vs runtime 13.2 (minor compatibility)",
       [](StackVersions& v) { v.cuda_runtime_built = 13020; },
       {"runtime_minor_newer_than_driver"},
       Severity::warning},
      {"driver newer than runtime",
       [](StackVersions& v) { v.cuda_driver_api = 13020; },
       {},
       Severity::info},
      {"no driver",
       [](StackVersions& v) { v.cuda_driver_api = 0; },
       {"no_driver"},
       Severity::error},
      {"cuDNN 8 loaded, built with 9",
       [](StackVersions& v) {
         v.cudnn = loaded("cuDNN", 8907, "8.9.7", "9.19.0");
         v.cudnn_cudart_version = 13000;
       },
       {"cudnn_major_mismatch"},
       Severity::error},
      {"cuDNN 9.14 loaded, built with 9.19",
       [](StackVersions& v) { v.cudnn = loaded("cuDNN", 91400, "9.14.0", "9.19.0"); },
       {"cudnn_older_than_built"},
       Severity::info},
      {"cuDNN built for CUDA 12",
       [](StackVersions& v) { v.cudnn_cudart_version = 12090; },
       {"cudnn_cuda_major_mismatch"},
       Severity::error},
      {"cuDNN missing",
       [](StackVersions& v) {
         v.cudnn = LibraryProbe{};
         v.cudnn.name = "cuDNN";
         v.cudnn.built_with = "9.19.0";
         v.cudnn.detail = "not found";
         v.cudnn_cudart_version.reset();
       },
       {"cudnn_not_found"},
       Severity::warning},
      {"cuBLAS 12 with runtime 13",
       [](StackVersions& v) { v.cublas = loaded("cuBLAS", 120904, "12.9.4"); },
       {"cublas_cuda_major_mismatch"},
       Severity::error},
      {"CUPTI missing",
       [](StackVersions& v) { v.cupti = LibraryProbe{}; },
       {"cupti_not_found"},
       Severity::info},
      {"built without CUDA: no runtime verdicts",
       [](StackVersions& v) {
         v.cuda_runtime_built = 0;
         v.cuda_driver_api.reset();
       },
       {},
       Severity::info},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    StackVersions v = good_stack();
    c.mutate(v);
    auto findings = compatibility_findings(v);
    EXPECT_EQ(ids(findings), c.expected_ids);
    if (!findings.empty()) {
      EXPECT_EQ(findings[0].severity, c.severity);
      EXPECT_FALSE(findings[0].message.empty());
      EXPECT_FALSE(findings[0].fix.empty());
    }
  }
}

TEST(Compatibility, DriverTooOldNamesTheFix) {
  StackVersions v = good_stack();
  v.cuda_driver_api = 12040;
  auto findings = compatibility_findings(v);
  ASSERT_EQ(findings.size(), 1U);
  EXPECT_NE(findings[0].message.find("13.0"), std::string::npos);
  EXPECT_NE(findings[0].message.find("12.4"), std::string::npos);
  EXPECT_NE(findings[0].fix.find("580.65.06"), std::string::npos);
  EXPECT_NE(findings[0].fix.find("CUDA 12.x"), std::string::npos);
}

TEST(ProbeLibrary, LoadsAndReportsPath) {
  // glibc's __ctype_get_mb_cur_max has the size_t f(void) shape of cudnnGetVersion (it is what
  // MB_CUR_MAX expands to, at least 1), so it stands in for a library version call.
  auto p = probe_library("libc", {"libdlprobe_does_not_exist.so.1", "libc.so.6"},
                         "__ctype_get_mb_cur_max", VersionCall::returns_size_t);
  EXPECT_TRUE(p.loaded) << p.detail;
  EXPECT_NE(p.path.find("libc"), std::string::npos);
  EXPECT_GE(p.raw_version, 1);
  EXPECT_TRUE(p.detail.empty());
}

TEST(ProbeLibrary, MissingLibraryIsNotFound) {
  auto p = probe_library("nothing", {"libdlprobe_does_not_exist.so.1", "libnope.so.2"}, "version",
                         VersionCall::returns_size_t);
  EXPECT_FALSE(p.loaded);
  EXPECT_NE(p.detail.find("libdlprobe_does_not_exist.so.1"), std::string::npos);
  EXPECT_NE(p.detail.find("libnope.so.2"), std::string::npos);
}

TEST(ProbeLibrary, MissingSymbol) {
  auto p =
      probe_library("libc", {"libc.so.6"}, "dlprobe_no_such_symbol", VersionCall::returns_size_t);
  EXPECT_FALSE(p.loaded);
  EXPECT_NE(p.detail.find("dlprobe_no_such_symbol"), std::string::npos);
}

}  // namespace
}  // namespace dlprobe::doctor
