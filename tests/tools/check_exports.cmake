# Checks that libexactjit.so exports the C ABI and nothing else: every dynamic symbol it defines is
# one of the XJ_API functions of exactjit.h, and each of those is defined (so no LLVM, fmt or
# libstdc++ symbol leaks out to clash with another copy in the process, e.g. Triton's LLVM).
#   cmake -DNM=nm -DLIBRARY=libexactjit.so -DHEADER=exactjit.h -P check_exports.cmake
execute_process(COMMAND ${NM} -D --defined-only ${LIBRARY} OUTPUT_VARIABLE listing RESULT_VARIABLE failed)
if(failed)
  message(FATAL_ERROR "${NM} -D --defined-only ${LIBRARY} failed")
endif()
string(REGEX MATCHALL "[^\n]+" lines "${listing}")
set(exported "")
foreach(line IN LISTS lines)
  string(REGEX REPLACE "^.* " "" symbol "${line}")
  list(APPEND exported ${symbol})
endforeach()

file(READ ${HEADER} header)
string(REGEX MATCHALL "XJ_API[^(]*[ *](xj_[a-z_]+)\\(" declarations "${header}")
set(declared "")
foreach(declaration IN LISTS declarations)
  string(REGEX MATCH "(xj_[a-z_]+)\\($" _ "${declaration}")
  list(APPEND declared ${CMAKE_MATCH_1})
endforeach()

list(SORT exported)
list(SORT declared)
if(NOT exported STREQUAL declared)
  set(extra ${exported})
  list(REMOVE_ITEM extra ${declared})
  set(missing ${declared})
  list(REMOVE_ITEM missing ${exported})
  message(FATAL_ERROR "${LIBRARY} exports other symbols than exactjit.h declares.\n"
                      "  exported, not declared: ${extra}\n  declared, not exported: ${missing}")
endif()
list(LENGTH exported count)
message(STATUS "${LIBRARY}: exactly the ${count} xj_* functions of exactjit.h")
