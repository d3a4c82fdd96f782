// Q4_1 products on row tiles: the arrangement RepackForProducts gives Q4_1 matrices where the build
// has integer vectors (AVX2 or AVX-512), and the products that read it.
//
// A tile is kTileRows consecutive rows (16 with AVX-512, 8 with AVX2: one per 32-bit lane), stored
// block by block: for each block of 32 values, 4 vectors of nibble bytes, dword r of vector c holding
// bytes 4c..4c+3 of row r's 16 (low nibbles: values 4c..4c+3, high: 16 + 4c..), then the kTileRows
// f16 scales d, then the mins m. A product broadcasts 4 activation bytes per u8 x s8 dot product
// (vpdpbusd, or vpmaddubsw + vpmaddwd) and so accumulates every row of the tile at once, one row per
// lane: no horizontal sums, no partial units, and each unpacked block serves up to 16 tokens from
// registers. Per row and token, y = sum over blocks of (d dx) idot + m (dx sum), in block order.
//
// Rows past the matrix's last (the last tile's) are zeros. A token's outputs are the same bits
// whatever the tokens and threads around it. They differ from the GGUF arrangement's products
// (kernels/cpu/quant_gemm.cc) by float rounding only: the same integer dot products, summed in
// another order.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/quant_gemm.h"

namespace specula::cpu {

// Rows per tile in this build; 0 where it has no integer vectors (no tiles).
int Q4_1TileRows();

// w (GGUF Q4_1 blocks) in tiles, as above: ceil(rows / Q4_1TileRows()) tiles of Q4_1TileRows()
// rows' bytes each. Empty without tiles.
std::vector<uint8_t> Q4_1Tiles(const QuantMatrix& w);

// out[cols] = row r of a tiled matrix, dequantized: DequantizeRow's values, bit for bit.
void Q4_1TileRow(const QuantMatrix& w, int64_t r, float* out);

// outs[i].y = x w_i^T + bias_i for tiled Q4_1 matrices (at most 4) with one activation term, x
// quantized once for all of them.
void Q4_1TileProducts(const float* x, int32_t m, int32_t k, const QuantOut* outs, int32_t num_outs);

}  // namespace specula::cpu
