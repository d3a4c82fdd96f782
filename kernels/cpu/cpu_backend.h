// The reference backend: plain loops, OpenBLAS for the matrix products.
#pragma once

#include <memory>

#include "kernels/backend.h"

namespace specula {

std::unique_ptr<Backend> MakeCpuBackend();

}  // namespace specula
