// Q4_1 and Q8_0 products on row tiles: the arrangement RepackForProducts gives these types where the
// build has integer vectors (AVX2 or AVX-512), and the products that read it.
//
// A tile is kTileRows consecutive rows (16 with AVX-512, 8 with AVX2: one per 32-bit lane), stored
// block by block: for each block of 32 values, the rows' quants as vectors of 4 bytes per row, then
// the rows' f16 scales d (and Q4_1's mins m). Q4_1: vector c (of 4) holds bytes 4c..4c+3 of each
// row's 16, values 4c.. in the low nibbles and 16 + 4c.. in the high ones. Q8_0: vector c (of 8)
// holds values 4c..4c+3. A product broadcasts 4 activation bytes per u8 x s8 dot product (vpdpbusd,
// or vpmaddubsw + vpmaddwd) and so accumulates every row of the tile at once, one row per lane: no
// horizontal sums, no partial units, and each unpacked block serves up to 16 tokens from registers.
// Per row and token, summed over blocks in order (idot = sum w x, x: the token's int8 values, dx
// their scale, sum their sum):
//   Q4_1: y += (d dx) idot + m (dx sum)           Q8_0: y += (d dx) idot
// (Q8_0 with VNNI: vpdpbusd wants unsigned weights, so they go in as w + 128 and idot - 128 sum.)
//
// Rows past the matrix's last (the last tile's) are zeros. A token's outputs are the same bits
// whatever the tokens and threads around it. They differ from the GGUF arrangement's products
// (kernels/cpu/quant_units.cc) by float rounding only: the same integer dot products, summed in
// another order.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/quant_gemm.h"

namespace specula::cpu {

// w (GGUF Q4_1 or Q8_0 blocks) in tiles, as above: ceil(rows / kTileRows) tiles of kTileRows rows'
// bytes each. Empty for other types and without tiles (builds without AVX2).
std::vector<uint8_t> RepackTiles(const QuantMatrix& w);

// out[cols] = row r of a tiled matrix, dequantized: DequantizeRow's values, bit for bit.
void TileRow(const QuantMatrix& w, int64_t r, float* out);

// outs[i].y = x w_i^T + bias_i for tiled matrices of one type (at most 4) with one activation term,
// x quantized once for all of them.
void TileProducts(const float* x, int32_t m, int32_t k, const QuantOut* outs, int32_t num_outs);

// AMX's tiles serve products of this many activation rows and more (tokens; twice as many with two
// activation terms). Reasoned, not measured (no machine with AMX has run them yet): a tile product
// (~16 cycles a block) does 16 rows' work whatever the count, and adds Q4_1's unpacking to memory
// and a store and reload of its sums, where VNNI spends 8 dot products a row and block: about even
// at 4 rows, ahead past it. A two-term decode (2 rows) stays on the vector path.
constexpr int32_t kAmxMinTokens = 4;

// What runs TileProducts for kAmxMinTokens or more: the vector path above, AMX's int8 tiles (one tile
// product per block does the integer dots of 16 tokens with the tile's 16 rows; kernels/cpu/amx.h),
// or the AMX path on emulated tiles (for the tests of machines without AMX). All three give the same
// bits: the integer dots are exact and the float steps the same. The default is kAmx where
// amx::Usable() (the CPU has AMX, Linux permits it, SPECULA_NO_AMX is unset), else kVector.
enum class TileEngine { kVector, kAmx, kAmxEmulated };
// kAmx and kAmxEmulated need the AVX-512 build (16-row tiles); kAmx needs amx::Usable() too.
bool TileEngineAvailable(TileEngine e);
// Process-wide, for tests and benchmarks. False, and nothing changed, where e is not available.
bool SetTileEngine(TileEngine e);
TileEngine CurrentTileEngine();
// Whether a product of `rows` activation rows runs on AMX's tiles (real or emulated) now.
bool AmxServes(int32_t rows);

}  // namespace specula::cpu
