// Status propagation helpers, in the style of Abseil's internal macros.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SPECULA_CONCAT_INNER_(a, b) a##b
#define SPECULA_CONCAT_(a, b) SPECULA_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` is not OK.
#define RETURN_IF_ERROR(expr)                   \
  do {                                          \
    ::absl::Status _specula_st = (expr);        \
    if (!_specula_st.ok()) return _specula_st;  \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());` assigns the value or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(SPECULA_CONCAT_(_specula_sor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()
