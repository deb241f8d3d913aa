// SVG plots for geist bench (svg_plot.h). Everything is drawn with plain SVG 1.1
// elements (rect, line, polyline, polygon, circle, text) so the file renders the same in
// browsers and in converters such as rsvg; coordinates are printed with 2 decimals.
#include "svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace geist::cli {
namespace {

constexpr const char *kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd",
                                    "#8c564b", "#e377c2", "#17becf", "#7f7f7f"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);
constexpr const char *kFlagColor = "#d62728";
constexpr const char *kFont = "font-family=\"DejaVu Sans, Arial, Helvetica, sans-serif\"";

// printf into a std::string.
template <typename... Args>
std::string fmt(const char *f, Args... args) {
  char buf[256];
  int n = std::snprintf(buf, sizeof buf, f, args...);
  if (n < 0) return {};
  if (static_cast<size_t>(n) < sizeof buf) return std::string(buf, static_cast<size_t>(n));
  std::string s(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(s.data(), s.size(), f, args...);
  s.resize(static_cast<size_t>(n));
  return s;
}

// A coordinate in user units. Inputs are finite by construction; a non-finite one would
// make the file invalid, so it prints as 0 instead of "nan".
std::string coord(double v) {
  return std::isfinite(v) ? fmt("%.2f", v) : std::string("0");
}

// Text for XML character data and attribute values: the five markup characters as
// entities, C0 controls (not allowed in XML 1.0) and ill-formed UTF-8 as U+FFFD.
std::string xml_escape(const std::string &s) {
  static const char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(s.size());
  const auto *p = reinterpret_cast<const unsigned char *>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      const char *entity = c == '&'    ? "&amp;"
                           : c == '<'  ? "&lt;"
                           : c == '>'  ? "&gt;"
                           : c == '"'  ? "&quot;"
                           : c == '\'' ? "&apos;"
                                       : nullptr;
      if (entity)
        out += entity;
      else if (c == '\t' || c == '\n' || c == '\r')
        out += ' ';  // one line of text
      else if (c < 0x20 || c == 0x7F)
        out += kReplacement;
      else
        out += static_cast<char>(c);
      ++i;
      continue;
    }
    // Length and the allowed range of the second byte (rejects overlongs and surrogates).
    size_t len = 0;
    unsigned char lo2 = 0x80, hi2 = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
      len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo2 = 0xA0;
      if (c == 0xED) hi2 = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo2 = 0x90;
      if (c == 0xF4) hi2 = 0x8F;
    }
    bool ok = len > 0 && i + len <= n && p[i + 1] >= lo2 && p[i + 1] <= hi2;
    for (size_t k = 2; ok && k < len; ++k) ok = (p[i + k] & 0xC0) == 0x80;
    // U+FFFE and U+FFFF are not XML characters either.
    if (ok && len == 3 && c == 0xEF && p[i + 1] == 0xBF && p[i + 2] >= 0xBE) ok = false;
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out += kReplacement;
      ++i;
    }
  }
  return out;
}

// Milliseconds for labels: about 3 significant digits, never "nan".
std::string fmt_ms(double v) {
  if (!std::isfinite(v)) return "-";
  const double a = std::fabs(v);
  if (a == 0) return "0";
  if (a >= 1e6 || a < 1e-3) return fmt("%.3g", v);
  if (a >= 100) return fmt("%.0f", v);
  if (a >= 10) return fmt("%.1f", v);
  if (a >= 1) return fmt("%.2f", v);
  return fmt("%.3f", v);
}

// A tick label: as many decimals as the tick step needs.
std::string fmt_tick(double v, double step) {
  if (!std::isfinite(v)) return "-";
  const double a = std::fabs(v);
  if (a < step * 1e-9) return "0";
  if (a >= 1e6 || a < 1e-3) return fmt("%.3g", v);
  const int decimals = std::clamp(static_cast<int>(std::ceil(-std::log10(step) - 1e-9)), 0, 6);
  return fmt("%.*f", decimals, v);
}

// Linear interpolation between closest ranks (numpy's default); sorted must be non-empty.
double percentile(const std::vector<double> &sorted, double p) {
  const double pos = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(pos);
  if (i + 1 >= sorted.size()) return sorted.back();
  const double t = pos - static_cast<double>(i);
  return sorted[i] + t * (sorted[i + 1] - sorted[i]);
}

// The finite values of v, sorted.
std::vector<double> finite_sorted(const std::vector<double> &v) {
  std::vector<double> out;
  out.reserve(v.size());
  for (double x : v)
    if (std::isfinite(x)) out.push_back(x);
  std::sort(out.begin(), out.end());
  return out;
}

// 1, 2 or 5 times a power of ten, close to x > 0.
double nice_step(double x) {
  const double e = std::floor(std::log10(x));
  const double p = std::pow(10.0, e);
  const double f = x / p;
  const double nf = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
  const double s = nf * p;
  return std::isfinite(s) && s > 0 ? s : x;
}

// A value axis mapped to [0, 1]. Spans are computed from halves (hi/2 - lo/2) so that
// values near +-DBL_MAX do not overflow.
struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double step = 1;            // linear tick step (log axes: unused)
  std::vector<double> ticks;  // values, ascending, inside [lo, hi]

  double frac(double v) const {
    double f;
    if (log) {
      f = v > 0 ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : 0;
    } else {
      const double half = hi / 2 - lo / 2;
      f = half > 0 ? (v / 2 - lo / 2) / half : 0.5;
    }
    return std::isfinite(f) ? std::clamp(f, 0.0, 1.0) : 0.0;
  }
  std::string label(double v) const { return log ? fmt_ms(v) : fmt_tick(v, step); }
};

// Axis over [mn, mx] (finite, mn <= mx). include_zero: start at 0 when the data is
// positive and its minimum is small next to its maximum. extend: widen to whole ticks
// (else a 2 % margin). allow_log: a log axis when positive data spans >= 4 decades.
Axis make_axis(double mn, double mx, bool include_zero, bool extend, bool allow_log) {
  Axis a;
  if (allow_log && mn > 0 && mx / mn >= 1e4) {
    a.log = true;
    const double e0 = std::floor(std::log10(mn)), e1 = std::ceil(std::log10(mx));
    const double every = std::max(1.0, std::ceil((e1 - e0) / 10));
    a.lo = std::pow(10.0, e0);
    a.hi = std::pow(10.0, e1);
    if (!(a.lo > 0) || !std::isfinite(a.hi)) {  // beyond the double range: fall back
      a.log = false;
    } else {
      for (double e = e0; e <= e1; e += every) a.ticks.push_back(std::pow(10.0, e));
      return a;
    }
  }
  if (include_zero && mn > 0 && mn <= 0.3 * mx) mn = 0;
  if (include_zero && mx < 0 && mx >= 0.3 * mn) mx = 0;
  if (mn == mx) {
    const double pad = mn == 0 ? 1.0 : std::fabs(mn) * 0.1;
    mn = (include_zero && mn > 0) ? 0 : mn - pad;
    mx = mx + pad;
    if (!std::isfinite(mx)) mx = mn + pad;
  }
  const double half = mx / 2 - mn / 2;
  double step = nice_step(half / 2.5);  // about five intervals
  if (!(step > 0) || !std::isfinite(step)) {
    a.lo = mn;
    a.hi = mx;
    a.step = half;
    a.ticks = {mn, mx};
    return a;
  }
  if (extend) {
    a.lo = std::floor(mn / step) * step;
    a.hi = std::ceil(mx / step) * step;
    if (!std::isfinite(a.lo)) a.lo = mn;
    if (!std::isfinite(a.hi)) a.hi = mx;
  } else {
    const double pad = half * 0.04;
    a.lo = mn - pad;
    a.hi = mx + pad;
    if (!std::isfinite(a.lo)) a.lo = mn;
    if (!std::isfinite(a.hi)) a.hi = mx;
  }
  a.step = step;
  const double first = std::ceil(a.lo / step - 1e-9) * step;
  for (int i = 0; i <= 60; ++i) {
    const double t = first + i * step;
    if (!std::isfinite(t) || t > a.hi + step * 1e-9) break;
    a.ticks.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  }
  return a;
}

// The document's opening: size, a white background and the title.
std::string svg_open(int w, int h, const std::string &title) {
  std::string s;
  s += "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n";
  s +=
      fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" "
          "viewBox=\"0 0 %d %d\">\n",
          w, h, w, h);
  const std::string t = xml_escape(title);
  s += "<title>" + t + "</title>\n";
  s += std::string(kSvgPlotMarker) + "\n";  // geist bench --plot may replace only its own files
  s += fmt("<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", w, h);
  // Shrink a long title to fit the width (bold glyphs average about 0.62 em).
  const double fit = (w - 24) / (0.62 * double(std::max<size_t>(title.size(), 1)));
  const double size = std::max(9.0, std::min(17.0, fit));
  s +=
      fmt("<text x=\"%d\" y=\"28\" %s font-size=\"%.1f\" font-weight=\"bold\" text-anchor=\"middle\" "
          "fill=\"#222222\">",
          w / 2, kFont, size);
  s += t + "</text>\n";
  return s;
}

// A <text> element; body is escaped here.
std::string text(double x, double y, int size, const char *anchor, const char *color,
                 const std::string &body, const char *extra = "") {
  return "<text x=\"" + coord(x) + "\" y=\"" + coord(y) + "\" " + kFont +
         fmt(" font-size=\"%d\" text-anchor=\"%s\" fill=\"%s\"%s>", size, anchor, color, extra) +
         xml_escape(body) + "</text>\n";
}

std::string line(double x1, double y1, double x2, double y2, const char *color, double width,
                 const char *extra = "") {
  return "<line x1=\"" + coord(x1) + "\" y1=\"" + coord(y1) + "\" x2=\"" + coord(x2) + "\" y2=\"" +
         coord(y2) + fmt("\" stroke=\"%s\" stroke-width=\"%g\"%s/>\n", color, width, extra);
}

constexpr size_t kMaxNameChars = 34;  // longer series names are cut, with an ellipsis

// s cut to at most max characters (UTF-8 lead bytes), "..." marking a cut.
std::string clip_name(const std::string &s, size_t max) {
  size_t chars = 0, cut = s.size();
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;
    if (chars++ == max - 1) cut = i;
  }
  return chars <= max ? s : s.substr(0, cut) + "\xE2\x80\xA6";
}

// Width in pixels of a series name (bold, font size 13): an estimate, no font metrics.
double name_width(const std::string &s) {
  size_t chars = 0;
  for (unsigned char c : s) chars += (c & 0xC0) != 0x80;  // count UTF-8 lead bytes
  return 8.6 * static_cast<double>(chars);
}

}  // namespace

std::string svg_latency_plot(const std::string &title, const std::vector<PlotSeries> &series) {
  // Layout: names on the left, one band per series, statistics on the right, the axis
  // and a legend below.
  constexpr int kWidth = 980, kTop = 50, kRow = 58, kRight = 210, kBottom = 78;
  const size_t n_rows = std::max<size_t>(series.size(), 1);
  double name_w = 0;
  for (const PlotSeries &s : series)
    name_w = std::max(name_w, name_width(clip_name(s.name, kMaxNameChars)));
  const double left = std::clamp(name_w + 20, 90.0, 320.0);
  const double plot_w = kWidth - left - kRight;
  const int height = kTop + static_cast<int>(n_rows) * kRow + kBottom;
  const double plot_bottom = kTop + static_cast<double>(n_rows) * kRow;

  std::vector<std::vector<double>> sorted;
  double mn = INFINITY, mx = -INFINITY;
  for (const PlotSeries &s : series) {
    sorted.push_back(finite_sorted(s.values_ms));
    if (!sorted.back().empty()) {
      mn = std::min(mn, sorted.back().front());
      mx = std::max(mx, sorted.back().back());
    }
  }
  const bool any = mn <= mx;
  const Axis ax = any ? make_axis(mn, mx, true, true, true) : make_axis(0, 1, true, true, false);
  auto X = [&](double v) { return left + ax.frac(v) * plot_w; };

  std::string s = svg_open(kWidth, height, title);
  // Bands and the grid.
  for (size_t i = 0; i < n_rows; ++i)
    if (i % 2 == 0)
      s += "<rect x=\"" + coord(left) + "\" y=\"" + coord(kTop + static_cast<double>(i) * kRow) +
           "\" width=\"" + coord(plot_w) + fmt("\" height=\"%d\" fill=\"#f4f6f8\"/>\n", kRow);
  for (double t : ax.ticks) {
    const double x = X(t);
    s += line(x, kTop, x, plot_bottom, "#dddddd", 1);
    s += line(x, plot_bottom, x, plot_bottom + 5, "#444444", 1);
    s += text(x, plot_bottom + 19, 11, "middle", "#333333", ax.label(t));
  }
  s += line(left, plot_bottom, left + plot_w, plot_bottom, "#444444", 1);
  s += text(left + plot_w / 2, plot_bottom + 38, 12, "middle", "#333333",
            ax.log ? "latency (ms, log scale)" : "latency (ms)");

  if (series.empty())
    s += text(left + plot_w / 2, kTop + kRow / 2.0 + 4, 13, "middle", "#888888", "no data");
  for (size_t i = 0; i < series.size(); ++i) {
    const std::vector<double> &v = sorted[i];
    const char *color = kPalette[i % kPaletteSize];
    const double yc = kTop + (static_cast<double>(i) + 0.5) * kRow;
    s += text(left - 10, yc - 2, 13, "end", "#222222", clip_name(series[i].name, kMaxNameChars),
              " font-weight=\"bold\"");
    const size_t skipped = series[i].values_ms.size() - v.size();
    s += text(left - 10, yc + 13, 10, "end", "#666666",
              fmt("n=%zu", v.size()) + (skipped ? fmt(" (%zu skipped)", skipped) : ""));
    if (v.empty()) {
      s += text(left + 8, yc + 4, 12, "start", "#888888", "no finite samples");
      continue;
    }
    const double p5 = percentile(v, 5), p25 = percentile(v, 25), p50 = percentile(v, 50);
    const double p75 = percentile(v, 75), p95 = percentile(v, 95), vmax = v.back();
    constexpr double kBoxH = 22;
    s += fmt("<g><title>%s</title>\n", xml_escape(series[i].name).c_str());
    // Whiskers P5..P25 and P75..P95 with end caps, then the box and the median.
    s += line(X(p5), yc, X(p25), yc, color, 1.5);
    s += line(X(p75), yc, X(p95), yc, color, 1.5);
    s += line(X(p5), yc - 7, X(p5), yc + 7, color, 1.5);
    s += line(X(p95), yc - 7, X(p95), yc + 7, color, 1.5);
    s += "<rect x=\"" + coord(X(p25)) + "\" y=\"" + coord(yc - kBoxH / 2) + "\" width=\"" +
         coord(std::max(X(p75) - X(p25), 1.0)) + "\" height=\"" + coord(kBoxH) +
         fmt("\" fill=\"%s\" fill-opacity=\"0.22\" stroke=\"%s\" stroke-width=\"1.2\"/>\n", color,
             color);
    s += line(X(p50), yc - kBoxH / 2 - 3, X(p50), yc + kBoxH / 2 + 3, "#111111", 2.5);
    // Every sample, in its input order, with a deterministic vertical jitter (golden ratio
    // sequence) so that equal values stay distinguishable.
    size_t j = 0;
    for (double x : series[i].values_ms) {
      if (!std::isfinite(x)) continue;
      const double u = std::fmod(static_cast<double>(j++) * 0.6180339887498949, 1.0);
      s += "<circle cx=\"" + coord(X(x)) + "\" cy=\"" + coord(yc + (u - 0.5) * 2 * 13) +
           fmt("\" r=\"2.4\" fill=\"%s\" fill-opacity=\"0.55\"/>\n", color);
    }
    // The max: a downward triangle above the band.
    const double xm = X(vmax), yt = yc - kBoxH / 2 - 5;
    s += "<polygon points=\"" + coord(xm - 5) + "," + coord(yt - 8) + " " + coord(xm + 5) + "," +
         coord(yt - 8) + " " + coord(xm) + "," + coord(yt) + fmt("\" fill=\"%s\"/>\n", kFlagColor);
    s += "</g>\n";
    s += text(left + plot_w + 12, yc - 3, 11, "start", "#222222",
              "P50 " + fmt_ms(p50) + "   P95 " + fmt_ms(p95));
    s += text(left + plot_w + 12, yc + 12, 11, "start", "#555555",
              "max " + fmt_ms(vmax) + "   P5 " + fmt_ms(p5) + " ms");
  }
  s += text(left + plot_w / 2, height - 14, 11, "middle", "#555555",
            "box: P25-P75, whiskers: P5-P95, black bar: median, dots: every sample, "
            "red triangle: max");
  s += "</svg>\n";
  return s;
}

std::string svg_rows_plot(const std::string &title, const std::vector<int> &n,
                          const std::vector<double> &ms_per_row, const std::vector<bool> &flagged) {
  constexpr int kWidth = 980, kHeight = 500, kLeft = 86, kRight = 30, kTop = 50, kBottom = 76;
  constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;
  struct Point {
    int n;
    double ms;
    bool flag;
  };
  std::vector<Point> pts;
  const size_t count = std::min(n.size(), ms_per_row.size());
  for (size_t i = 0; i < count; ++i)
    if (std::isfinite(ms_per_row[i]))
      pts.push_back({n[i], ms_per_row[i], i < flagged.size() && flagged[i]});
  std::stable_sort(pts.begin(), pts.end(),
                   [](const Point &a, const Point &b) { return a.n < b.n; });

  Axis ax = make_axis(0, 1, false, true, false), ay = make_axis(0, 1, true, true, false);
  if (!pts.empty()) {
    double ymn = INFINITY, ymx = -INFINITY;
    for (const Point &p : pts) {
      ymn = std::min(ymn, p.ms);
      ymx = std::max(ymx, p.ms);
    }
    ax = make_axis(pts.front().n, pts.back().n, false, false, false);
    ay = make_axis(ymn, ymx, true, true, false);
  }
  auto X = [&](double v) { return kLeft + ax.frac(v) * kPlotW; };
  auto Y = [&](double v) { return kTop + (1 - ay.frac(v)) * kPlotH; };
  constexpr double kBottomY = kTop + kPlotH;

  std::string s = svg_open(kWidth, kHeight, title);
  s += fmt(
      "<rect x=\"%d\" y=\"%d\" width=\"%g\" height=\"%g\" fill=\"#f8f9fb\" stroke=\"#444444\"/>\n",
      kLeft, kTop, kPlotW, kPlotH);
  for (double t : ax.ticks) {
    const double x = X(t);
    s += line(x, kTop, x, kBottomY, "#e2e2e2", 1);
    s += line(x, kBottomY, x, kBottomY + 5, "#444444", 1);
    s += text(x, kBottomY + 19, 11, "middle", "#333333", ax.label(t));
  }
  for (double t : ay.ticks) {
    const double y = Y(t);
    s += line(kLeft, y, kLeft + kPlotW, y, "#e2e2e2", 1);
    s += line(kLeft - 5, y, kLeft, y, "#444444", 1);
    s += text(kLeft - 8, y + 4, 11, "end", "#333333", ay.label(t));
  }
  s += text(kLeft + kPlotW / 2, kBottomY + 40, 12, "middle", "#333333", "rows per call (n)");
  s += "<text x=\"18\" y=\"" + coord(kTop + kPlotH / 2) + "\" " + kFont +
       " font-size=\"12\" text-anchor=\"middle\" fill=\"#333333\" transform=\"rotate(-90 18 " +
       coord(kTop + kPlotH / 2) + ")\">ms per row</text>\n";
  if (pts.empty())
    s += text(kLeft + kPlotW / 2, kTop + kPlotH / 2, 13, "middle", "#888888", "no data");

  if (pts.size() > 1) {
    s += "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.4\" points=\"";
    for (size_t i = 0; i < pts.size(); ++i) {
      if (i) s += ' ';
      s += coord(X(pts[i].n));
      s += ',';
      s += coord(Y(pts[i].ms));
    }
    s += "\"/>\n";
  }
  size_t n_flag = 0;
  for (const Point &p : pts) {
    const double x = X(p.n), y = Y(p.ms);
    const std::string tip = fmt("n=%d: ", p.n) + fmt_ms(p.ms) + " ms per row";
    if (p.flag) {
      s += "<circle class=\"flag\" cx=\"" + coord(x) + "\" cy=\"" + coord(y) +
           fmt("\" r=\"4.5\" fill=\"%s\"><title>", kFlagColor) + xml_escape(tip + " (flagged)") +
           "</title></circle>\n";
      // Labels alternate between two heights so that neighbouring flags stay readable.
      s += text(x, y - (n_flag++ % 2 ? 20 : 9), 10, "middle", kFlagColor, fmt("%d", p.n));
    } else {
      s += "<circle cx=\"" + coord(x) + "\" cy=\"" + coord(y) +
           "\" r=\"2.6\" fill=\"#1f77b4\"><title>" + xml_escape(tip) + "</title></circle>\n";
    }
  }
  s += text(kLeft + kPlotW / 2, kHeight - 12, 11, "middle", "#555555",
            fmt("%zu points; red, labelled with n: %zu flagged (per-row cost above the trend)",
                pts.size(), n_flag));
  s += "</svg>\n";
  return s;
}

}  // namespace geist::cli
