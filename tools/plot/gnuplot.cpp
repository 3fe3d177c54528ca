#include "tools/plot/gnuplot.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "core/fd.hpp"

extern char** environ;

namespace geoloco::plot {
namespace fs = std::filesystem;

namespace {

std::string lower_extension(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  for (auto& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

// A file in the temporary directory, removed on destruction.
class TempFile {
 public:
  explicit TempFile(const char* stem) {
    std::string tmpl = (fs::temp_directory_path() / (std::string(stem) + "-XXXXXX")).string();
    Fd fd(::mkstemp(tmpl.data()));
    if (!fd) throw Error(fmt::format("plot: cannot create a temporary file in {}: {}", tmpl, std::strerror(errno)));
    path_ = tmpl;
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string number(double v) {
  if (!std::isfinite(v)) return "NaN";
  return fmt::format("{:.10g}", v);
}

}  // namespace

Format format_for(const std::string& path, const std::string& flag) {
  const std::string ext = lower_extension(path);
  if (ext == ".svg") return Format::Svg;
  if (ext == ".png") return Format::Png;
  throw InputError(fmt::format("{} {}: the file name must end in .svg or .png", flag, path));
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "''";
    else if (c == '\n')
      out += ' ';
    else
      out += c;
  }
  return out + "'";
}

std::string terminal(Format f, int width, int height) {
  if (f == Format::Svg)
    return fmt::format("set terminal svg size {},{} dynamic enhanced font 'sans,11' background rgb 'white'\n", width,
                       height);
  return fmt::format("set terminal pngcairo size {},{} enhanced font 'sans,10' background rgb 'white'\n", width,
                     height);
}

std::string datablock(const std::string& name, const std::vector<Series>& series) {
  std::string out = fmt::format("${} << EOD\n", name);
  for (size_t i = 0; i < series.size(); ++i) {
    if (i > 0) out += "\n\n";
    for (const auto& [x, y] : series[i].points) out += number(x) + " " + number(y) + "\n";
    if (series[i].points.empty()) out += "NaN NaN\n";  // keeps `index i` aligned with series i
  }
  return out + "EOD\n";
}

void run(const std::string& script, const std::string& what) {
  TempFile script_file("geoloco-plot");
  TempFile err_file("geoloco-plot-err");
  {
    std::ofstream out(script_file.path(), std::ios::binary);
    out << script;
    if (!out) throw Error(fmt::format("{}: cannot write the gnuplot script to {}", what, script_file.path()));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_file.path().c_str(), O_WRONLY | O_TRUNC, 0);
  std::string prog = "gnuplot", arg = script_file.path();
  char* argv[] = {prog.data(), arg.data(), nullptr};
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    throw Error(fmt::format("{}: cannot run gnuplot ({}); tools/setup.sh installs it (Debian package gnuplot-nox)",
                            what, std::strerror(rc)));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw Error(fmt::format("{}: waiting for gnuplot: {}", what, std::strerror(errno)));
  }
  std::string err = read_all(err_file.path());
  while (!err.empty() && (err.back() == '\n' || err.back() == ' ')) err.pop_back();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
    throw Error(fmt::format("{}: gnuplot not found; tools/setup.sh installs it (Debian package gnuplot-nox)", what));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error(fmt::format("{}: gnuplot failed (status {}): {}", what, status, err.empty() ? "no message" : err));
}

void render_to_file(const std::string& script, const std::string& path, const std::string& what, int width,
                    int height) {
  const Format f = format_for(path, what);
  const fs::path target(path);
  const fs::path tmp = target.parent_path() / ("." + target.filename().string() + ".tmp");
  std::error_code ec;
  run(fmt::format("{}set output {}\n{}\nset output\n", terminal(f, width, height), quote(tmp.string()), script), what);
  // gnuplot reports a file it cannot open as a warning, not an error.
  if (!fs::exists(tmp, ec) || fs::file_size(tmp, ec) == 0) {
    fs::remove(tmp, ec);
    throw Error(fmt::format("{}: gnuplot wrote nothing to {} (is its folder writable?)", what, path));
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw Error(fmt::format("{}: cannot write {}: {}", what, path, ec.message()));
  }
}

std::string render_svg(const std::string& script, const std::string& what, int width, int height) {
  TempFile out("geoloco-plot-svg");
  run(fmt::format("{}set output {}\n{}\nset output\n", terminal(Format::Svg, width, height), quote(out.path()), script),
      what);
  std::string svg = read_all(out.path());
  if (svg.find("<svg") == std::string::npos) throw Error(fmt::format("{}: gnuplot produced no SVG", what));
  return svg;
}

}  // namespace geoloco::plot
