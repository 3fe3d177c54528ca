# Every dependency is a Debian package (tools/setup.sh installs them); nothing is vendored.
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(PkgConfig REQUIRED)
find_package(yaml-cpp REQUIRED)          # target: yaml-cpp (0.7 has no namespace)
find_package(zstd QUIET)
if(NOT TARGET zstd::libzstd_shared)
  pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
  add_library(zstd::libzstd_shared ALIAS PkgConfig::ZSTD)
endif()
find_package(ucx REQUIRED)               # targets: ucx::ucp, ucx::ucs
find_package(nlohmann_json REQUIRED)
find_package(CLI11 REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(OpenSSL REQUIRED)           # HMAC-SHA256 for the inter-site handshake
find_package(prometheus-cpp CONFIG REQUIRED)  # run.metrics_port: the text format (prometheus-cpp::core)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)  # run.metrics_port: the HTTP server
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
find_package(Gloo REQUIRED PATHS /usr/share/cmake/Gloo)
if(GEOLOCO_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
