// AMX's int8 tiles (Intel Sapphire Rapids and later): whether this process may use them, and the
// five tile operations the row-tile products (kernels/cpu/tile_gemm.cc) need, on the hardware and
// emulated in plain C++ (the same arithmetic, for the tests of machines without AMX).
//
// The products use three tiles, configured once per thread (a tile instruction in a thread that has
// not loaded a configuration raises #UD, SIGILL):
//   tmm0 C [16 rows, 16 int32]   tmm1 A [16 rows, 32 int8]   tmm2 B [8 rows, 64 bytes]
// Dp: C[i][n] += sum over j < 8, t < 4 of A[i][4j + t] * B[j][4n + t], B's bytes signed (DpSS) or
// unsigned (DpSU): for a block of 32 values, A's rows are tokens and B's row j is the row tile's
// vector of values 4j..4j+3, 4 bytes per weight row n.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

namespace specula::cpu::amx {

// The CPU lists amx_tile and amx_int8, Linux granted this process the tile data state
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)), and SPECULA_NO_AMX is unset. Asked once.
bool Usable();

// The configuration above, loaded in the calling thread.
void LoadConfig();

// Tile operations on the hardware. The compiler sees none of the tiles' memory traffic, hence the
// memory clobbers: B's bytes are written just before the load that reads them.
struct Hw {
  static void Configure() {
    thread_local bool configured = false;
    if (!configured) LoadConfig(), configured = true;
  }
  static void LoadA(const int8_t* p) { asm volatile("tileloadd (%0,%1,1), %%tmm1" ::"r"(p), "r"(32L) : "memory"); }
  static void LoadB(const void* p) { asm volatile("tileloadd (%0,%1,1), %%tmm2" ::"r"(p), "r"(64L) : "memory"); }
  static void ZeroC() { asm volatile("tilezero %%tmm0" ::); }
  static void DpSU() { asm volatile("tdpbsud %%tmm2, %%tmm1, %%tmm0" ::); }
  static void DpSS() { asm volatile("tdpbssd %%tmm2, %%tmm1, %%tmm0" ::); }
  static void StoreC(int32_t* p) { asm volatile("tilestored %%tmm0, (%0,%1,1)" ::"r"(p), "r"(64L) : "memory"); }
};

// The same operations on arrays, as the instructions define them.
struct Emulated {
  struct Tiles {
    int8_t a[16][32];
    uint8_t b[8][64];
    int32_t c[16][16];
  };
  static Tiles& T() {
    thread_local Tiles t;
    return t;
  }
  static inline std::atomic<int64_t> products{0};  // Dp calls, so that tests see the path ran
  static void Configure() {}
  static void LoadA(const int8_t* p) { std::memcpy(T().a, p, sizeof(Tiles::a)); }
  static void LoadB(const void* p) { std::memcpy(T().b, p, sizeof(Tiles::b)); }
  static void ZeroC() { std::memset(T().c, 0, sizeof(Tiles::c)); }
  template <bool kSignedB>
  static void Dp() {
    products.fetch_add(1, std::memory_order_relaxed);
    Tiles& t = T();
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < 8; ++j) {
        for (int n = 0; n < 16; ++n) {
          for (int u = 0; u < 4; ++u) {
            const int32_t b = kSignedB ? static_cast<int8_t>(t.b[j][4 * n + u]) : t.b[j][4 * n + u];
            t.c[i][n] += static_cast<int32_t>(t.a[i][4 * j + u]) * b;
          }
        }
      }
    }
  }
  static void DpSU() { Dp<false>(); }
  static void DpSS() { Dp<true>(); }
  static void StoreC(int32_t* p) { std::memcpy(p, T().c, sizeof(Tiles::c)); }
};

}  // namespace specula::cpu::amx
