// What xgrammar logged on this thread since the last call.
#pragma once

#include <string>
#include <vector>

namespace specula::constrain {

// xgrammar's warnings on the calling thread since the last call (a warning means it ignored part of
// a schema or grammar). Compilation runs on one thread (the compiler is built with one), so what a
// compile logged is read on the thread that compiled.
std::vector<std::string> TakeXgrammarWarnings();

}  // namespace specula::constrain
