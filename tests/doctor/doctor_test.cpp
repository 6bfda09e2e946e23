// Doctor's findings from constructed inputs, the JSON structure, and run_doctor itself on this
// machine: with NVML hidden (the no-GPU path) and against the fake NVML.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>

#include "../monitor/fake_script.h"
#include "dlprobe/doctor/doctor.h"

namespace dlprobe::doctor {
namespace {

bool has_id(const std::vector<Finding>& findings, std::string_view id) {
  return std::any_of(findings.begin(), findings.end(),
                     [&](const Finding& f) { return f.id == id; });
}

GpuReport healthy_h200() {
  GpuReport g;
  g.index = 0;
  g.name = "NVIDIA H200";
  g.cc_major = 9;
  g.cc_minor = 0;
  g.nvml = true;
  g.persistence_enabled = true;
  g.ecc_enabled = true;
  g.mig_enabled = false;
  g.power_limit_w = 700;
  g.power_default_limit_w = 700;
  g.clock_event_reasons = 0;
  return g;
}

TEST(GpuFindings, HealthyGpuHasNone) {
  EXPECT_TRUE(gpu_findings(healthy_h200(), "90-real;90-virtual").empty());
}

TEST(GpuFindings, EachProblem) {
  struct Case {
    const char* id;
    void (*mutate)(GpuReport&);
    Severity severity;
  };
  const Case cases[] = {
      {"other_processes",
       [](GpuReport& g) {
         g.other_processes = {{4242, 8ull << 30}, {4343, std::nullopt}};
       },
       Severity::warning},
      {"clocks_throttled",
       [](GpuReport& g) {
         g.throttled = true;
         g.clock_event_names = {"sw_power_cap"};
       },
       Severity::warning},
      {"power_capped", [](GpuReport& g) { g.power_limit_w = 500; }, Severity::warning},
      {"persistence_off", [](GpuReport& g) { g.persistence_enabled = false; }, Severity::info},
      {"ecc_off", [](GpuReport& g) { g.ecc_enabled = false; }, Severity::info},
      {"mig_enabled", [](GpuReport& g) { g.mig_enabled = true; }, Severity::warning},
      {"no_nvml_for_gpu", [](GpuReport& g) { g.nvml = false; }, Severity::info},
      {"architecture_not_built",
       [](GpuReport& g) {
         g.cc_major = 8;
         g.cc_minor = 0;
       },
       Severity::error},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.id);
    GpuReport g = healthy_h200();
    c.mutate(g);
    auto findings = gpu_findings(g, "90-real;90-virtual");
    ASSERT_EQ(findings.size(), 1U);
    EXPECT_EQ(findings[0].id, c.id);
    EXPECT_EQ(findings[0].severity, c.severity);
    EXPECT_FALSE(findings[0].fix.empty());
  }
}

TEST(GpuFindings, OtherProcessesMessage) {
  GpuReport g = healthy_h200();
  g.other_processes = {{4242, 8ull << 30}, {4343, std::nullopt}};
  auto f = gpu_findings(g, "90-real");
  ASSERT_EQ(f.size(), 1U);
  EXPECT_NE(f[0].message.find("2 other processes"), std::string::npos) << f[0].message;
  EXPECT_NE(f[0].message.find("at least 8.00 GiB"), std::string::npos) << f[0].message;
  EXPECT_NE(f[0].message.find("4242, 4343"), std::string::npos) << f[0].message;
}

TEST(GpuFindings, NewerArchitectureRunsThroughPtx) {
  GpuReport g = healthy_h200();
  g.cc_major = 10;
  EXPECT_FALSE(has_id(gpu_findings(g, "90-real;90-virtual"), "architecture_not_built"));
  EXPECT_FALSE(has_id(gpu_findings(g, "native"), "architecture_not_built"));
}

TEST(CeilingFindings, LowAgainstTheoretical) {
  Ceilings c;
  GemmCeiling ok{};
  ok.dtype = GemmDtype::bf16;
  ok.measured = true;
  ok.tflops = 790;
  ok.theoretical_tflops = 1070;
  GemmCeiling low = ok;
  low.dtype = GemmDtype::fp16;
  low.tflops = 200;
  GemmCeiling unmeasured{};
  unmeasured.dtype = GemmDtype::fp8_e4m3;
  unmeasured.theoretical_tflops = 2000;
  c.gemm = {ok, low, unmeasured};
  BandwidthCeiling copy;
  copy.name = "device_copy_kernel";
  copy.measured = true;
  copy.gbs = 4200;
  copy.theoretical_gbs = 4917;
  c.bandwidth = {copy};
  auto f = ceiling_findings(c);
  ASSERT_EQ(f.size(), 1U);
  EXPECT_EQ(f[0].id, "gemm_ceiling_low");
  EXPECT_NE(f[0].message.find("fp16"), std::string::npos);
  c.bandwidth[0].gbs = 1000;
  EXPECT_TRUE(has_id(ceiling_findings(c), "bandwidth_ceiling_low"));
}

TEST(Helpers, PciBusId) {
  EXPECT_EQ(normalize_pci_bus_id("0000:19:00.0"), "00000000:19:00.0");
  EXPECT_EQ(normalize_pci_bus_id("00000000:19:00.0"), "00000000:19:00.0");
  EXPECT_EQ(normalize_pci_bus_id("00000000:9a:00.0"), "00000000:9A:00.0");
}

TEST(Helpers, LowestArchitecture) {
  EXPECT_EQ(lowest_cuda_architecture("90-real;90-virtual"), 90);
  EXPECT_EQ(lowest_cuda_architecture("80;86-real;90"), 80);
  EXPECT_EQ(lowest_cuda_architecture("native"), std::nullopt);
  EXPECT_EQ(lowest_cuda_architecture(""), std::nullopt);
}

Report sample_report() {
  Report r;
  r.dlprobe_version = "0.1.0";
  r.git_hash = "abc";
  r.with_cuda = true;
  r.host.cpu.model = "Test CPU";
  r.host.cpu.isa = {{"avx2", true}, {"amx_tile", false}};
  r.versions.cuda_driver_api = 13000;
  r.versions.cuda_runtime_built = 13000;
  r.versions.cuda_runtime_loaded = 13000;
  r.versions.cudnn.name = "cuDNN";
  r.versions.cudnn.detail = "not found";
  r.gpu_found = true;
  GpuReport g = healthy_h200();
  g.sm_count = 132;
  g.theoretical_tflops = {{GemmDtype::bf16, 1070.5}};
  g.other_processes = {{77, 1ull << 30}};
  g.capabilities = {{"energy_counter", true, ""}};
  r.gpus = {g};
  r.capabilities = {{"gpu", true, ""}, {"cupti", false, "not found"}};
  Ceilings c;
  GemmCeiling bf16{};
  bf16.dtype = GemmDtype::bf16;
  bf16.m = bf16.n = bf16.k = 8192;
  bf16.measured = true;
  bf16.tflops = 793.7;
  bf16.theoretical_tflops = 1070.5;
  bf16.check_error = 1e-3;
  GemmCeiling fp8{};
  fp8.dtype = GemmDtype::fp8_e4m3;
  fp8.why_not = "no algorithm";
  c.gemm = {bf16, fp8};
  BandwidthCeiling h2d;
  h2d.name = "h2d_pinned";
  h2d.measured = true;
  h2d.bytes = 1ull << 30;
  h2d.gbs = 55.4;
  c.bandwidth = {h2d};
  r.ceilings = c;
  r.findings = {{Severity::warning, "other_processes", "1 other process", "stop it"}};
  return r;
}

TEST(RenderJson, StableFields) {
  auto doc = nlohmann::json::parse(render_json(sample_report()));
  EXPECT_EQ(doc["schema"], "dlprobe.doctor/1");
  for (const char* key : {"dlprobe", "host", "versions", "gpu_found", "no_gpu_reason", "gpus",
                          "capabilities", "ceilings", "ceilings_note", "findings"})
    EXPECT_TRUE(doc.contains(key)) << key;
  EXPECT_EQ(doc["host"]["cpu"]["isa"]["avx2"], true);
  EXPECT_EQ(doc["versions"]["cuda_driver_api"], "13.0");
  EXPECT_EQ(doc["versions"]["cuda_runtime"]["built_with"], "13.0");
  EXPECT_EQ(doc["versions"]["cudnn"]["loaded"], false);
  EXPECT_TRUE(doc["versions"]["cudnn"]["version"].is_null());
  EXPECT_EQ(doc["versions"]["cudnn"]["detail"], "not found");
  const auto& gpu = doc["gpus"][0];
  EXPECT_EQ(gpu["compute_capability"], "9.0");
  EXPECT_EQ(gpu["sm_count"], 132);
  EXPECT_TRUE(gpu["l2_bytes"].is_null());  // unknown is null, never 0
  EXPECT_EQ(gpu["theoretical"]["gemm_tflops"]["bf16"], 1070.5);
  EXPECT_EQ(gpu["other_processes"][0]["pid"], 77);
  EXPECT_EQ(gpu["capabilities"]["energy_counter"]["available"], true);
  EXPECT_EQ(doc["capabilities"]["cupti"]["why_not"], "not found");
  EXPECT_TRUE(doc["capabilities"]["gpu"]["why_not"].is_null());
  const auto& gemm = doc["ceilings"]["gemm"];
  EXPECT_EQ(gemm[0]["dtype"], "bf16");
  EXPECT_EQ(gemm[0]["tflops"], 793.7);
  EXPECT_NEAR(gemm[0]["fraction_of_theoretical"].get<double>(), 793.7 / 1070.5, 1e-9);
  EXPECT_EQ(gemm[1]["measured"], false);
  EXPECT_TRUE(gemm[1]["tflops"].is_null());
  EXPECT_EQ(gemm[1]["why_not"], "no algorithm");
  EXPECT_EQ(doc["ceilings"]["bandwidth"][0]["gbs"], 55.4);
  EXPECT_EQ(doc["findings"][0]["severity"], "warning");
  EXPECT_EQ(doc["findings"][0]["fix"], "stop it");
}

TEST(RenderText, Sections) {
  const std::string text = render_text(sample_report());
  for (const char* section :
       {"Host\n", "Versions\n", "GPUs\n", "Capabilities\n", "Ceilings\n", "Findings\n"})
    EXPECT_NE(text.find(section), std::string::npos) << section;
  EXPECT_NE(text.find("793.7 TFLOP/s"), std::string::npos) << text;
  EXPECT_NE(text.find("of 1070.5 theoretical (74%)"), std::string::npos) << text;
  EXPECT_NE(text.find("not measured: no algorithm"), std::string::npos) << text;
  EXPECT_NE(text.find("fix: stop it"), std::string::npos) << text;
}

// A GPU whose clock events and compute capability could not be read shows them unknown, not
// "none" (which says they were read and nothing was set).
TEST(RenderText, UnreadFieldsAreUnknownNotNone) {
  Report r = sample_report();
  EXPECT_NE(render_text(r).find("clock events: none\n"), std::string::npos) << render_text(r);
  r.gpus[0].clock_event_reasons.reset();
  r.gpus[0].cc_major.reset();
  r.gpus[0].cc_minor.reset();
  const std::string text = render_text(r);
  EXPECT_NE(text.find("clock events: unknown\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tensor cores: unknown\n"), std::string::npos) << text;
}

// CUDA sees no device and NVML cannot load: what CI and GPU-less machines get.
void hide_gpus() {
  setenv("CUDA_VISIBLE_DEVICES", "-1", 1);
  setenv("DLPROBE_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
}

TEST(RunDoctor, NoGpu) {
  hide_gpus();
  DoctorOptions options;  // ceilings on by default: skipped with a note when there is no GPU
  auto report = run_doctor(options);
  ASSERT_TRUE(report) << report.status().message();
  EXPECT_FALSE(report->gpu_found);
  EXPECT_FALSE(report->no_gpu_reason.empty());
  EXPECT_TRUE(report->gpus.empty());
  EXPECT_FALSE(report->ceilings.has_value());
  // "no GPU", or "built without CUDA" in the sanitizer build.
  EXPECT_EQ(report->ceilings_note.rfind("not measured: ", 0), 0U) << report->ceilings_note;
  EXPECT_TRUE(has_id(report->findings, "no_gpu"));
  EXPECT_GE(report->host.cpu.threads, 1);
  auto doc = nlohmann::json::parse(render_json(*report));
  EXPECT_EQ(doc["gpu_found"], false);
  EXPECT_EQ(doc["capabilities"]["gpu"]["available"], false);
  EXPECT_EQ(doc["capabilities"]["nvml"]["available"], false);
  EXPECT_NE(doc["capabilities"]["nvml"]["why_not"].get<std::string>().find("nonexistent"),
            std::string::npos);
  // The reason in the words bench gives, never the runtime's "insufficient driver".
  EXPECT_EQ(report->no_gpu_reason.find("insufficient"), std::string::npos) << report->no_gpu_reason;
  // The GPU libraries may be installed, but with no GPU to run them they are no capability.
  for (const char* library : {"cupti", "cudnn", "cublaslt", "nccl"}) {
    EXPECT_EQ(doc["capabilities"][library]["available"], false) << library;
  }
}

// The GPU known from the fake NVML only (CUDA is told to see nothing), so its state and the
// findings come from the script.
Result<Report> doctor_with_fake_nvml() {
  setenv("CUDA_VISIBLE_DEVICES", "-1", 1);
  setenv("DLPROBE_NVML_LIBRARY", DLPROBE_FAKE_NVML, 1);
  DoctorOptions options;
  options.ceilings = false;
  return run_doctor(options);
}

TEST(RunDoctor, FakeNvmlH200) {
  dlprobe::testing::FakeScript script(dlprobe::testing::kH200Script);
  auto report = doctor_with_fake_nvml();
  ASSERT_TRUE(report) << report.status().message();
  EXPECT_TRUE(report->gpu_found);
  ASSERT_EQ(report->gpus.size(), 1U);
  const GpuReport& g = report->gpus[0];
  EXPECT_FALSE(g.cuda_visible);
  EXPECT_TRUE(g.nvml);
  EXPECT_EQ(g.name, "NVIDIA H200");
  EXPECT_EQ(g.pci_bus_id, "00000000:19:00.0");
  EXPECT_EQ(g.cc_major, 9);
  EXPECT_EQ(g.max_sm_clock_mhz, 1980.0);
  EXPECT_EQ(g.clock_source, "nvml");
  EXPECT_EQ(g.persistence_enabled, true);
  EXPECT_EQ(g.mig_enabled, false);
  EXPECT_FALSE(g.throttled);  // the first sample reports only "idle"
  ASSERT_EQ(g.other_processes.size(), 2U);
  EXPECT_EQ(g.other_processes[0].pid, 4242U);
  EXPECT_EQ(g.other_processes[0].used_bytes, 1ull << 30);
  EXPECT_EQ(g.other_processes[1].used_bytes, std::nullopt);
  EXPECT_NEAR(*g.theoretical_pcie_gbs, 63.0, 0.1);
  EXPECT_EQ(report->versions.driver, "580.95.05");
  EXPECT_EQ(report->versions.driver_source, "NVML");
  EXPECT_TRUE(has_id(report->findings, "other_processes"));
  EXPECT_FALSE(has_id(report->findings, "persistence_off"));
  EXPECT_FALSE(has_id(report->findings, "no_gpu"));
  // CUDA cannot see the GPU NVML lists: said as an error, and no ceilings.
  EXPECT_TRUE(has_id(report->findings, "cuda_unusable"));
  EXPECT_FALSE(report->ceilings.has_value());
  auto doc = nlohmann::json::parse(render_json(*report));
  EXPECT_EQ(doc["gpus"][0]["persistence_mode"], true);
  EXPECT_EQ(doc["capabilities"]["nvml"]["available"], true);
}

TEST(RunDoctor, FakeNvmlTroubledGpu) {
  dlprobe::testing::FakeScript script(R"(
driver_version 580.95.05
cuda_driver_version 13000
device
name NVIDIA H200
pci_bus_id 00000000:19:00.0
power_limit_mw 500000
default_power_limit_mw 700000
cc_major 9
cc_minor 0
ecc 1
mig 1
persistence 0
clock_events 0x44
)");
  auto report = doctor_with_fake_nvml();
  ASSERT_TRUE(report) << report.status().message();
  ASSERT_EQ(report->gpus.size(), 1U);
  EXPECT_TRUE(report->gpus[0].throttled);
  for (const char* id : {"clocks_throttled", "power_capped", "persistence_off", "mig_enabled"})
    EXPECT_TRUE(has_id(report->findings, id)) << id;
  EXPECT_FALSE(has_id(report->findings, "other_processes"));
}

}  // namespace
}  // namespace dlprobe::doctor
