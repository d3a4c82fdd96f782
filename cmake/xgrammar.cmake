# xgrammar's C++ core (pinned at 0.2.9), built as our own static target: its own CMake forces
# -Werror -flto=auto -O3 into the flags and turns on Python bindings that need tvm_ffi. The sources
# live outside the repository, in the scripts' cache (scripts/fetch_xgrammar.sh, run here when they
# are missing), so the project's size and layout checks do not apply to them. The target takes the
# preset's flags, so it is instrumented in the ASan/UBSan, fuzz and TSan trees (TSan must see its
# thread pool). Only constrain/ links it; its types never leave that folder.
set(SPECULA_XGRAMMAR_DIR "" CACHE PATH "xgrammar 0.2.9's unpacked sources (empty: fetch into the cache)")
if(NOT SPECULA_XGRAMMAR_DIR)
  execute_process(
    COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/fetch_xgrammar.sh
    OUTPUT_VARIABLE _xgrammar_dir OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _xgrammar_rc)
  if(NOT _xgrammar_rc EQUAL 0)
    message(FATAL_ERROR "scripts/fetch_xgrammar.sh failed (${_xgrammar_rc}): xgrammar 0.2.9's "
                        "sources are needed by constrain/; run it by hand to see why")
  endif()
  set(SPECULA_XGRAMMAR_DIR "${_xgrammar_dir}" CACHE PATH "xgrammar 0.2.9's unpacked sources" FORCE)
endif()
if(NOT EXISTS "${SPECULA_XGRAMMAR_DIR}/include/xgrammar/xgrammar.h")
  message(FATAL_ERROR "SPECULA_XGRAMMAR_DIR=${SPECULA_XGRAMMAR_DIR} holds no xgrammar sources")
endif()

file(GLOB_RECURSE _xgrammar_sources CONFIGURE_DEPENDS "${SPECULA_XGRAMMAR_DIR}/cpp/*.cc")
list(FILTER _xgrammar_sources EXCLUDE REGEX "/cpp/tvm_ffi/")
add_library(specula_xgrammar STATIC ${_xgrammar_sources})
target_include_directories(specula_xgrammar SYSTEM PUBLIC "${SPECULA_XGRAMMAR_DIR}/include"
  "${SPECULA_XGRAMMAR_DIR}/3rdparty/dlpack/include" "${SPECULA_XGRAMMAR_DIR}/3rdparty/picojson")
target_include_directories(specula_xgrammar PRIVATE "${SPECULA_XGRAMMAR_DIR}/cpp")
set_target_properties(specula_xgrammar PROPERTIES CXX_STANDARD 17 CXX_EXTENSIONS OFF)
# Its log lines go through constrain/xgrammar_log.cc (XGRAMMAR_LOG_CUSTOMIZE): a warning, which
# xgrammar prints when it ignores part of a schema, is counted there instead of printed.
target_compile_definitions(specula_xgrammar
  PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0 XGRAMMAR_ENABLE_INTERNAL_CHECK=0
  PRIVATE XGRAMMAR_LOG_CUSTOMIZE=1)
target_compile_options(specula_xgrammar PRIVATE -w)
target_link_libraries(specula_xgrammar PUBLIC Threads::Threads)
