// geoloco::test::TempDir: the one temporary-directory helper of the tests. A fresh directory
// under $TMPDIR (or /tmp) made by mkdtemp, so tests running in parallel never share one;
// removed with everything in it on destruction.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace geoloco::test {

class TempDir {
 public:
  // `prefix` names the directory: <tmp>/<prefix>-XXXXXX.
  explicit TempDir(const std::string& prefix = "geoloco-test") {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/" + prefix + "-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp " + tmpl + " failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  // The path of `name` inside the directory (nothing is created).
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // Writes `content` (bytes, as given) to `name`, creating its parent directories; returns
  // its path. Throws when the file cannot be written.
  std::string file(const std::string& name, const std::string& content) const {
    const std::filesystem::path p = path_ / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << content;
    out.close();
    if (!out) throw std::runtime_error("cannot write " + p.string());
    return p.string();
  }

 private:
  std::filesystem::path path_;
};

}  // namespace geoloco::test
