// geoloco::report figures: the plots of a report, each a gnuplot script over the runs' data
// rendered to inline SVG (tools/plot). One series per site (per run and site when several
// runs are overlaid); a figure without data is left out and named in `missing`.
#pragma once

#include <string>
#include <vector>

#include "tools/plot/gnuplot.hpp"
#include "tools/report/run_data.hpp"

namespace geoloco::report {

struct Figure {
  std::string id;  // stable anchor: loss_step, loss_time, val_loss, tokens, ...
  std::string title;
  std::string caption;  // what it shows, with units
  std::vector<plot::Series> series;
  std::string script;  // gnuplot commands (no terminal, no output)
  std::string svg;     // filled by render_figures
};

struct FigureSet {
  std::vector<Figure> figures;
  std::vector<std::string> missing;  // "sync time per round: no outer rounds in these runs"
};

// The figures' data and scripts (no gnuplot run: testable on its own).
FigureSet build_figures(const std::vector<RunData>& runs);

// Runs gnuplot for every figure (Error naming the figure when gnuplot fails).
void render_figures(FigureSet& set);

}  // namespace geoloco::report
