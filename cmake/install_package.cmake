# `cmake --install`: libexactjit.so with its versioned soname, the public headers (the C ABI and its
# header-only C++ wrapper), the exactjit command, a CMake package (find_package(exactjit) gives
# exactjit::exactjit) and a pkg-config file. The static core and the headers that need LLVM are
# not installed: users reach exactjit through the C ABI only.
include(CMakePackageConfigHelpers)

set(EXACTJIT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/exactjit)

install(TARGETS exactjit EXPORT exactjitTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} NAMELINK_COMPONENT Development)
install(FILES ${PROJECT_SOURCE_DIR}/include/exactjit/exactjit.h ${PROJECT_SOURCE_DIR}/include/exactjit/exactjit.hpp
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/exactjit)
if(EXACTJIT_BUILD_CLI)
  install(TARGETS exactjit_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

install(EXPORT exactjitTargets NAMESPACE exactjit:: DESTINATION ${EXACTJIT_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/exactjitConfig.cmake.in
  ${PROJECT_BINARY_DIR}/exactjitConfig.cmake INSTALL_DESTINATION ${EXACTJIT_CMAKE_DIR})
# Before 1.0 only the same minor release is compatible (the soname says so too).
write_basic_package_version_file(${PROJECT_BINARY_DIR}/exactjitConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/exactjitConfig.cmake ${PROJECT_BINARY_DIR}/exactjitConfigVersion.cmake
  DESTINATION ${EXACTJIT_CMAKE_DIR})

# Relocatable: exactjit.pc finds the prefix from its own folder, so `cmake --install --prefix` works.
file(RELATIVE_PATH EXACTJIT_PC_TO_PREFIX /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" EXACTJIT_PC_TO_PREFIX "${EXACTJIT_PC_TO_PREFIX}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/exactjit.pc.in ${PROJECT_BINARY_DIR}/exactjit.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/exactjit.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
