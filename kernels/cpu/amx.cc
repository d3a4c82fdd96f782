// AMX's availability and tile configuration (kernels/cpu/amx.h).
#include "kernels/cpu/amx.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>

namespace specula::cpu::amx {
namespace {

bool Detect() {
  if (std::getenv("SPECULA_NO_AMX") != nullptr) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  constexpr unsigned kAmxTile = 1u << 24, kAmxInt8 = 1u << 25;  // CPUID.(7, 0):EDX
  if ((d & kAmxTile) == 0 || (d & kAmxInt8) == 0) return false;
  // Linux (5.16+) hands out the 8 KB tile state only on request, once per process.
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

bool Usable() {
  static const bool usable = Detect();
  return usable;
}

void LoadConfig() {
  // Palette 1; per tile, its bytes per row (colsb, 2 bytes each from offset 16) and rows (from 48).
  alignas(64) uint8_t config[64] = {};
  config[0] = 1;
  const auto tile = [&](int t, uint16_t colsb, uint8_t rows) {
    std::memcpy(&config[16 + 2 * t], &colsb, 2);
    config[48 + t] = rows;
  };
  tile(0, 64, 16);  // C
  tile(1, 32, 16);  // A
  tile(2, 64, 8);   // B
  asm volatile("ldtilecfg %0" ::"m"(config) : "memory");
}

}  // namespace specula::cpu::amx
