// SVG pictures for `geist bench --plot`: self-contained SVG 1.1 text (generic font family,
// no scripts, no external references) that any browser or image viewer renders.
// Pure functions of their arguments: thread-safe, no I/O. Non-finite values (NaN, inf)
// are skipped; empty input draws an empty, labelled plot. Titles and names are
// XML-escaped (invalid UTF-8 becomes U+FFFD). Cost: O(samples log samples).
#pragma once

#include <string>
#include <vector>

namespace geist::cli {

// The description every plot carries after its title: marks the file as geist's.
inline constexpr const char *kSvgPlotMarker = "<desc>geist bench plot</desc>";

// One row of a latency plot: a name (a mode, e.g. "pin") and its samples in milliseconds.
struct PlotSeries {
  std::string name;
  std::vector<double> values_ms;
};

// Latency distribution per mode: one horizontal row per series with a box P25-P75,
// whiskers to P5/P95, a median line, every finite sample as a jittered dot (exactly one
// <circle> per sample) and the max marked; a shared x axis in ms with nice ticks (log
// scale when positive values span four decades or more), labels, a legend and the title.
std::string svg_latency_plot(const std::string &title, const std::vector<PlotSeries> &series);

// Row sweep: x = rows n, y = ms per row, a line through the points in order of n; points
// with flagged[i] are red and labelled with their n (exactly one <circle> per finite
// point, class "flag" on flagged ones). Uses the common length of the three vectors
// (flagged may be shorter: missing entries are not flagged).
std::string svg_rows_plot(const std::string &title, const std::vector<int> &n,
                          const std::vector<double> &ms_per_row, const std::vector<bool> &flagged);

}  // namespace geist::cli
