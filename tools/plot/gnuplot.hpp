// geoloco::plot: figures drawn by gnuplot (Debian's gnuplot-nox), the plotting library that
// `geoloco budget --plot` and `geoloco report` render with. This file owns running gnuplot
// on a script and the small pieces every script needs: the terminal for an output file,
// quoting, inline data blocks.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace geoloco::plot {

enum class Format { Svg, Png };

// From the output file's extension (.svg, .png); InputError naming `flag` otherwise.
Format format_for(const std::string& path, const std::string& flag);

// A gnuplot single-quoted string literal ('' doubles a quote; nothing else is special).
std::string quote(const std::string& s);

// `set terminal ...` for a figure of width x height pixels.
std::string terminal(Format f, int width, int height);

// One series of (x, y) points; NaN y values are written as missing points.
struct Series {
  std::string title;
  std::vector<std::pair<double, double>> points;
};

// `$name << EOD` ... `EOD`: the series as blocks separated by two blank lines, so that
// `plot $name index i` draws series i.
std::string datablock(const std::string& name, const std::vector<Series>& series);

// Runs gnuplot on `script`. The script writes its own output (`set output`). Throws Error
// naming `what` and gnuplot's message when gnuplot is missing or reports an error.
void run(const std::string& script, const std::string& what);

// Renders `script` (which sets neither terminal nor output) into `path`, SVG or PNG by its
// extension, width x height pixels: written to a temporary file beside it and renamed into
// place, so a failed render leaves no partial figure.
void render_to_file(const std::string& script, const std::string& path, const std::string& what, int width, int height);

// Renders `script` (which sets neither terminal nor output) as SVG and returns the text.
std::string render_svg(const std::string& script, const std::string& what, int width, int height);

}  // namespace geoloco::plot
