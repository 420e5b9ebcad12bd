// GPU energy between two points of a run, from NVML's total-energy counter (millijoules since the
// driver loaded; Volta and newer). At the power cap a steady run's time follows its energy per
// step, not its speed at a fixed clock (docs/perf.md v0.29.0), so the benches report both.
// NVML comes from the driver (libnvidia-ml.so.1), opened at run time: the build needs no NVML
// header or stub library, and where it is missing ok() is false and why() says so.
//   bench::EnergyMeter em(device_index);
//   const long long mj = em.measure([&] { work(); sync(); });  // -1: unavailable
#pragma once
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <string>

namespace dt::bench {

class EnergyMeter {
 public:
  explicit EnergyMeter(int cuda_device) {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) {
      why_ = "libnvidia-ml.so.1 not found";
      return;
    }
    // The NVML entry points used, with their C signatures (nvml.h; the device handle is opaque).
    using Init = int (*)();
    using ByPci = int (*)(const char*, void**);
    init_ = reinterpret_cast<Init>(dlsym(lib_, "nvmlInit_v2"));
    shutdown_ = reinterpret_cast<Init>(dlsym(lib_, "nvmlShutdown"));
    auto by_pci = reinterpret_cast<ByPci>(dlsym(lib_, "nvmlDeviceGetHandleByPciBusId_v2"));
    energy_ = reinterpret_cast<Energy>(dlsym(lib_, "nvmlDeviceGetTotalEnergyConsumption"));
    if (!init_ || !shutdown_ || !by_pci || !energy_) {
      why_ = "an NVML entry point is missing";
      return;
    }
    if (int rc = init_(); rc != 0) {
      why_ = "nvmlInit_v2 returned " + std::to_string(rc);
      return;
    }
    inited_ = true;
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), cuda_device) != cudaSuccess) {
      (void)cudaGetLastError();
      why_ = "cudaDeviceGetPCIBusId failed";
      return;
    }
    if (int rc = by_pci(bus, &dev_); rc != 0) {
      why_ = "no NVML device at PCI bus " + std::string(bus) + " (" + std::to_string(rc) + ")";
      return;
    }
    unsigned long long mj = 0;
    if (int rc = energy_(dev_, &mj); rc != 0) {
      why_ = "nvmlDeviceGetTotalEnergyConsumption returned " + std::to_string(rc);
      return;
    }
    ok_ = true;
  }
  ~EnergyMeter() {
    if (inited_) shutdown_();
    if (lib_) dlclose(lib_);
  }
  EnergyMeter(const EnergyMeter&) = delete;
  EnergyMeter& operator=(const EnergyMeter&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  // The counter in mJ, or -1 where NVML is unavailable.
  long long read_mj() const {
    unsigned long long mj = 0;
    return ok_ && energy_(dev_, &mj) == 0 ? static_cast<long long>(mj) : -1;
  }
  // The energy of f() in mJ (f must leave the GPU synchronised), or -1 where a read failed. f runs
  // either way.
  template <class F>
  long long measure(F&& f) const {
    const long long e0 = read_mj();
    f();
    const long long e1 = read_mj();
    return e0 >= 0 && e1 >= e0 ? e1 - e0 : -1;
  }

 private:
  using Energy = int (*)(void*, unsigned long long*);
  void* lib_ = nullptr;
  void* dev_ = nullptr;
  int (*init_)() = nullptr;
  int (*shutdown_)() = nullptr;
  Energy energy_ = nullptr;
  bool inited_ = false, ok_ = false;
  std::string why_;
};

}  // namespace dt::bench
