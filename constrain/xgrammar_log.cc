// xgrammar's log sink (it is built with XGRAMMAR_LOG_CUSTOMIZE=1, cmake/xgrammar.cmake): a fatal
// error becomes an exception the wrappers in constrain/ catch, and a warning, which xgrammar prints
// when it ignores part of a schema, is kept for the compiling thread to read instead of printed.
#include "constrain/xgrammar_log.h"

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace xgrammar {

[[noreturn]] void LogFatalImpl(const std::string& file, int lineno, const std::string& message);
void LogMessageImpl(const std::string& file, int lineno, int level, const std::string& message);

namespace {
thread_local std::vector<std::string> warnings;
constexpr int kWarningLevel = 2;  // XGRAMMAR_LOG_LEVEL_WARNING in xgrammar's support/logging.h
}  // namespace

void LogFatalImpl(const std::string& file, int lineno, const std::string& message) {
  throw std::runtime_error(message);
}

void LogMessageImpl(const std::string& file, int lineno, int level, const std::string& message) {
  if (level == kWarningLevel) warnings.push_back(message);
}

}  // namespace xgrammar

namespace specula::constrain {

std::vector<std::string> TakeXgrammarWarnings() { return std::exchange(xgrammar::warnings, {}); }

}  // namespace specula::constrain
