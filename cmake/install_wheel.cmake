# The wheel (scikit-build-core, pyproject.toml): libexactjit.so (and libexactjit_torch.so when
# built) inside the exactjit package, beside the Python files that load it; the exactjit command
# into the wheel's scripts, so it is on PATH after `pip install`. Nothing else: the wheel serves
# Python, and C/C++ users install the CMake package.
install(TARGETS exactjit LIBRARY DESTINATION exactjit)
if(TARGET exactjit_torch)
  install(TARGETS exactjit_torch LIBRARY DESTINATION exactjit)
endif()
if(NOT EXACTJIT_BUILD_CLI)
  message(FATAL_ERROR "the wheel holds the exactjit command: EXACTJIT_BUILD_CLI must be ON")
endif()
install(TARGETS exactjit_cli RUNTIME DESTINATION ${SKBUILD_SCRIPTS_DIR})
