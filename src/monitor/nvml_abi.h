// The slice of NVML's C ABI that dlprobe uses, declared by hand: nvml.h ships with the driver
// development files, which are not installed on the machines that build dlprobe, and loading the
// library with dlopen needs only these types, constants and function-pointer types. Values and
// layouts follow NVIDIA's nvml.h (driver 535 and later); the fake NVML in tests/monitor/fake_nvml
// implements the same declarations.
#pragma once

#include <cstdint>

namespace dlprobe::nvml::abi {

using Return = int;  // nvmlReturn_t is a C enum: int-sized
inline constexpr Return kSuccess = 0;
inline constexpr Return kErrorUninitialized = 1;
inline constexpr Return kErrorInvalidArgument = 2;
inline constexpr Return kErrorNotSupported = 3;
inline constexpr Return kErrorNoPermission = 4;
inline constexpr Return kErrorNotFound = 6;
inline constexpr Return kErrorInsufficientSize = 7;
inline constexpr Return kErrorDriverNotLoaded = 9;
inline constexpr Return kErrorLibraryNotFound = 12;
inline constexpr Return kErrorFunctionNotFound = 13;
inline constexpr Return kErrorGpuIsLost = 15;
inline constexpr Return kErrorNoData = 21;
inline constexpr Return kErrorUnknown = 999;

// NVML_VALUE_NOT_AVAILABLE: what usedGpuMemory holds when the driver cannot attribute memory.
inline constexpr unsigned long long kValueNotAvailable = ~0ULL;

using Device = struct NvmlDeviceHandle*;  // nvmlDevice_t

// nvmlClockType_t
inline constexpr int kClockGraphics = 0;
inline constexpr int kClockSm = 1;
inline constexpr int kClockMem = 2;
// nvmlTemperatureSensors_t
inline constexpr int kTemperatureGpu = 0;
// nvmlPcieUtilCounter_t
inline constexpr int kPcieUtilTxBytes = 0;
inline constexpr int kPcieUtilRxBytes = 1;
// nvmlEnableState_t
inline constexpr int kFeatureDisabled = 0;
inline constexpr int kFeatureEnabled = 1;

// nvmlGpuTopologyLevel_t: how far up the PCIe tree two GPUs' common ancestor is.
inline constexpr int kTopologyInternal = 0;
inline constexpr int kTopologySingle = 10;
inline constexpr int kTopologyMultiple = 20;
inline constexpr int kTopologyHostbridge = 30;
inline constexpr int kTopologyNode = 40;
inline constexpr int kTopologySystem = 50;
// nvmlGpuP2PCapsIndex_t and nvmlGpuP2PStatus_t (NVML_P2P_STATUS_OK).
inline constexpr int kP2pCapsRead = 0;
inline constexpr int kP2pCapsNvlink = 2;
inline constexpr int kP2pStatusOk = 0;
// NVML_NVLINK_MAX_LINKS of NVML 12.8 and later (18 on Hopper and Blackwell).
inline constexpr unsigned kNvlinkMaxLinks = 18;

// Buffer sizes NVML documents for its string getters.
inline constexpr unsigned kDeviceNameBufferSize = 96;      // NVML_DEVICE_NAME_V2_BUFFER_SIZE
inline constexpr unsigned kDeviceUuidBufferSize = 80;      // NVML_DEVICE_UUID_V2_BUFFER_SIZE
inline constexpr unsigned kSystemVersionBufferSize = 80;   // NVML_SYSTEM_*_VERSION_BUFFER_SIZE
inline constexpr unsigned kPciBusIdBufferSize = 32;        // NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE
inline constexpr unsigned kPciBusIdLegacyBufferSize = 16;  // NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE

struct Memory {  // nvmlMemory_t (v1)
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

struct MemoryV2 {  // nvmlMemory_v2_t
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};
// NVML_STRUCT_VERSION(Memory, 2): the size in the low bits, the version in the top byte.
inline constexpr unsigned int kMemoryV2Version =
    static_cast<unsigned int>(sizeof(MemoryV2)) | (2U << 24);

struct Utilization {  // nvmlUtilization_t
  unsigned int gpu;
  unsigned int memory;
};

struct PciInfo {  // nvmlPciInfo_t as filled by nvmlDeviceGetPciInfo_v3
  char busIdLegacy[kPciBusIdLegacyBufferSize];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[kPciBusIdBufferSize];
};

// nvmlDeviceGet{Compute,Graphics}RunningProcesses (no suffix) fill this.
struct ProcessInfoV1 {
  unsigned int pid;
  unsigned long long usedGpuMemory;
};
// The _v2 and _v3 entry points both fill nvmlProcessInfo_v2_t. Driver 530's header briefly gave
// nvmlProcessInfo_t a fifth field (usedGpuCcProtectedMemory) for _v3; 535 moved that field to
// nvmlProcessDetail_v1_t and restored this layout, which is what drivers 535+ (and 580) write.
struct ProcessInfoV2 {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

struct ProcessUtilizationSample {  // nvmlProcessUtilizationSample_t
  unsigned int pid;
  unsigned long long timeStamp;  // CPU timestamp in microseconds
  unsigned int smUtil;
  unsigned int memUtil;
  unsigned int encUtil;
  unsigned int decUtil;
};

static_assert(sizeof(MemoryV2) == 40);
static_assert(sizeof(PciInfo) == 68);
static_assert(sizeof(ProcessInfoV1) == 16);
static_assert(sizeof(ProcessInfoV2) == 24);
static_assert(sizeof(ProcessUtilizationSample) == 32);

extern "C" {
using InitFn = Return (*)();
using ShutdownFn = Return (*)();
using ErrorStringFn = const char* (*)(Return);
using SystemGetStringFn = Return (*)(char*, unsigned int);
using SystemGetCudaDriverVersionFn = Return (*)(int*);
using DeviceGetCountFn = Return (*)(unsigned int*);
using DeviceGetHandleByIndexFn = Return (*)(unsigned int, Device*);
using DeviceGetStringFn = Return (*)(Device, char*, unsigned int);
using DeviceGetPciInfoFn = Return (*)(Device, PciInfo*);
using DeviceGetMemoryInfoFn = Return (*)(Device, Memory*);
using DeviceGetMemoryInfoV2Fn = Return (*)(Device, MemoryV2*);
using DeviceGetUintFn = Return (*)(Device, unsigned int*);
using DeviceGetUllFn = Return (*)(Device, unsigned long long*);
using DeviceGetClockFn = Return (*)(Device, int, unsigned int*);  // clock type enum
using DeviceGetCudaComputeCapabilityFn = Return (*)(Device, int*, int*);
using DeviceGetEnableStateFn = Return (*)(Device, int*);
using DeviceGetEnableStatePairFn = Return (*)(Device, int*, int*);  // current, pending
using DeviceGetUintPairFn = Return (*)(Device, unsigned int*, unsigned int*);
using DeviceGetUtilizationRatesFn = Return (*)(Device, Utilization*);
using DeviceGetTemperatureFn = Return (*)(Device, int, unsigned int*);
using DeviceGetPcieThroughputFn = Return (*)(Device, int, unsigned int*);
using DeviceGetProcessesV1Fn = Return (*)(Device, unsigned int*, ProcessInfoV1*);
using DeviceGetProcessesV2Fn = Return (*)(Device, unsigned int*, ProcessInfoV2*);
using DeviceGetTopologyCommonAncestorFn = Return (*)(Device, Device, int*);
using DeviceGetP2PStatusFn = Return (*)(Device, Device, int, int*);
using DeviceGetNvLinkStateFn = Return (*)(Device, unsigned int, int*);  // link, nvmlEnableState_t
using DeviceGetProcessUtilizationFn = Return (*)(Device, ProcessUtilizationSample*, unsigned int*,
                                                 unsigned long long);
}

}  // namespace dlprobe::nvml::abi
