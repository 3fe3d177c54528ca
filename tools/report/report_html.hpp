// geoloco::report HTML: one self-contained page (inline SVG figures, inline CSS, no script,
// nothing fetched at view time) with the runs' status, figures, events, summary, plans, lane
// split, notes and config.
#pragma once

#include <string>
#include <vector>

#include "tools/report/report_figures.hpp"
#include "tools/report/run_data.hpp"

namespace geoloco::report {

std::string html_escape(const std::string& s);

// `figures` must have been rendered (render_figures).
std::string report_html(const std::vector<RunData>& runs, const FigureSet& figures);

}  // namespace geoloco::report
