# Warnings and sanitizers for every geoloco target (applied through geoloco_options).
add_library(geoloco_options INTERFACE)
target_compile_options(geoloco_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
# GCC 12 reports -Wrestrict false positives inside libstdc++'s std::string for ordinary
# concatenations and short assignments (GCC bugs 105329, 105651; fixed in 13).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12
   AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(geoloco_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
endif()
# No FMA contraction (GCC contracts by default even in ISO mode, -march=native makes FMA
# available): results must not depend on the ISA of the machine that built the binary (the
# outer step's bits across sites), and the GPU's AdamW (explicit _rn operations) then matches
# the CPU update bit for bit.
target_compile_options(geoloco_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off>)
# Test executables (property GEOLOCO_TEST_CODE, set by geoloco_add_test) compile their own
# sources at -O1: they drive the libraries, which keep -O3, and -O3 made a test source take
# 16 s to compile against 12 s (the test build was the largest part of CI). Without contraction
# and without -ffast-math the optimisation level does not change any float result.
if(CMAKE_BUILD_TYPE STREQUAL "Release")
  target_compile_options(geoloco_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:$<IF:$<BOOL:$<TARGET_PROPERTY:GEOLOCO_TEST_CODE>>,-O1,-O3>>)
endif()
# Pin the ISA to what this machine class has; portable builds can override.
set(GEOLOCO_MARCH "native" CACHE STRING "-march value for CPU kernels ('' to omit)")
if(GEOLOCO_MARCH)
  target_compile_options(geoloco_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=${GEOLOCO_MARCH}>)
endif()

if(GEOLOCO_SANITIZE STREQUAL "address")
  target_compile_options(geoloco_options INTERFACE -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  target_link_options(geoloco_options INTERFACE -fsanitize=address,undefined)
elseif(GEOLOCO_SANITIZE STREQUAL "thread")
  target_compile_options(geoloco_options INTERFACE -fsanitize=thread -fno-omit-frame-pointer)
  target_link_options(geoloco_options INTERFACE -fsanitize=thread)
elseif(NOT GEOLOCO_SANITIZE STREQUAL "")
  message(FATAL_ERROR "GEOLOCO_SANITIZE must be '', 'address' or 'thread', got '${GEOLOCO_SANITIZE}'")
endif()
