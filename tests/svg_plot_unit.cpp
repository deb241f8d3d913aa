// svg_plot: the SVG text is well-formed XML (checked by a small parser below), escapes
// names, draws one <circle> per finite sample or point, highlights exactly the flagged
// points and never prints a non-finite number, whatever the input.
#include "svg_plot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace geist::cli {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ':' ||
         c == '.';
}

// "" if s is valid UTF-8, else the offset of the first bad byte.
std::string utf8_error(const std::string &s) {
  const auto *p = reinterpret_cast<const unsigned char *>(s.data());
  for (size_t i = 0; i < s.size();) {
    size_t len = p[i] < 0x80         ? 1
                 : (p[i] >> 5) == 6  ? 2
                 : (p[i] >> 4) == 14 ? 3
                 : (p[i] >> 3) == 30 ? 4
                                     : 0;
    if (len == 0 || i + len > s.size()) return "bad UTF-8 at " + std::to_string(i);
    for (size_t k = 1; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return "bad UTF-8 at " + std::to_string(i);
    i += len;
  }
  return "";
}

// Checks character data or an attribute value: '<' never appears raw, '&' only starts a
// predefined or numeric entity, no C0 control other than tab and newlines.
std::string check_chars(const std::string &s, size_t begin, size_t end, bool attr) {
  static const char *kEntities[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
  for (size_t i = begin; i < end; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '<') return "raw '<' at " + std::to_string(i);
    if (attr && c == '"') return "raw '\"' in attribute at " + std::to_string(i);
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r')
      return "control char at " + std::to_string(i);
    if (c != '&') continue;
    bool ok = false;
    for (const char *e : kEntities) ok = ok || s.compare(i, std::strlen(e), e) == 0;
    if (!ok && s.compare(i, 2, "&#") == 0) {
      size_t j = i + 2;
      while (j < end && std::isxdigit(static_cast<unsigned char>(s[j]))) ++j;
      ok = j > i + 2 && j < end && s[j] == ';';
    }
    if (!ok) return "bad entity at " + std::to_string(i);
  }
  return "";
}

// A small XML well-formedness check: one root element, balanced and matching tags,
// quoted attributes, escaped text. Returns "" when well-formed, else what is wrong.
std::string xml_error(const std::string &s) {
  if (std::string e = utf8_error(s); !e.empty()) return e;
  std::vector<std::string> stack;
  int roots = 0;
  size_t i = 0;
  if (s.compare(0, 5, "<?xml") == 0) {
    i = s.find("?>");
    if (i == std::string::npos) return "unterminated XML declaration";
    i += 2;
  }
  while (i < s.size()) {
    if (s[i] != '<') {
      const size_t next = std::min(s.find('<', i), s.size());
      if (std::string e = check_chars(s, i, next, false); !e.empty()) return e;
      if (stack.empty() && s.find_first_not_of(" \t\r\n", i) < next) return "text outside the root";
      i = next;
      continue;
    }
    const bool closing = i + 1 < s.size() && s[i + 1] == '/';
    size_t j = i + (closing ? 2 : 1);
    const size_t name_begin = j;
    while (j < s.size() && is_name_char(s[j])) ++j;
    const std::string name = s.substr(name_begin, j - name_begin);
    if (name.empty()) return "tag without a name at " + std::to_string(i);
    if (closing) {
      if (j >= s.size() || s[j] != '>') return "bad closing tag at " + std::to_string(i);
      if (stack.empty() || stack.back() != name) return "mismatched </" + name + ">";
      stack.pop_back();
      i = j + 1;
      continue;
    }
    // Attributes: name="value" separated by whitespace, then '>' or '/>'.
    bool self_closing = false;
    for (;;) {
      while (j < s.size() && std::isspace(static_cast<unsigned char>(s[j]))) ++j;
      if (j >= s.size()) return "unterminated tag <" + name;
      if (s[j] == '>') break;
      if (s.compare(j, 2, "/>") == 0) {
        self_closing = true;
        ++j;
        break;
      }
      const size_t a = j;
      while (j < s.size() && is_name_char(s[j])) ++j;
      if (j == a || s.compare(j, 2, "=\"") != 0) return "bad attribute in <" + name + ">";
      const size_t v = j + 2, q = s.find('"', v);
      if (q == std::string::npos) return "unterminated attribute in <" + name + ">";
      if (std::string e = check_chars(s, v, q, true); !e.empty()) return e;
      j = q + 1;
      if (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j])) && s[j] != '>' &&
          s[j] != '/')
        return "attributes not separated in <" + name + ">";
    }
    if (stack.empty() && ++roots > 1) return "more than one root";
    if (!self_closing) stack.push_back(name);
    i = j + 1;
  }
  if (!stack.empty()) return "unclosed <" + stack.back() + ">";
  if (roots != 1) return "no root element";
  return "";
}

size_t count(const std::string &s, const std::string &what) {
  size_t n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + what.size())) ++n;
  return n;
}

// Every numeric attribute is a finite number inside the picture; no "nan" or "inf" text.
void expect_sane(const std::string &svg) {
  EXPECT_EQ(xml_error(svg), "");
  EXPECT_EQ(svg.compare(0, 5, "<?xml"), 0);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\""),
            std::string::npos);
  std::string lower = svg;
  for (char &c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  EXPECT_EQ(lower.find("nan"), std::string::npos);
  EXPECT_EQ(lower.find("inf"), std::string::npos);
  EXPECT_EQ(lower.find("<script"), std::string::npos);
  EXPECT_EQ(lower.find("href"), std::string::npos);
  // Every numeric attribute: ' NAME="VALUE"' for the geometric attribute names.
  for (const char *name : {"cx", "cy", "x", "y", "x1", "x2", "y1", "y2", "width", "height"}) {
    const std::string key = std::string(" ") + name + "=\"";
    for (size_t at = svg.find(key); at != std::string::npos; at = svg.find(key, at + 1)) {
      const size_t v = at + key.size(), q = svg.find('"', v);
      ASSERT_NE(q, std::string::npos);
      const std::string value = svg.substr(v, q - v);
      char *end = nullptr;
      const double d = std::strtod(value.c_str(), &end);
      ASSERT_TRUE(end && *end == '\0') << name << "=\"" << value << "\"";
      EXPECT_TRUE(std::isfinite(d));
      EXPECT_GE(d, 0) << name;
      EXPECT_LE(d, 2000) << name;
    }
  }
}

TEST(SvgPlot, XmlCheckerRejectsBrokenDocuments) {
  EXPECT_EQ(xml_error("<svg><g></g></svg>"), "");
  EXPECT_NE(xml_error("<svg><g></svg>"), "");
  EXPECT_NE(xml_error("<svg>a < b</svg>"), "");
  EXPECT_NE(xml_error("<svg>a & b</svg>"), "");
  EXPECT_NE(xml_error("<svg x=\"1></svg>"), "");
  EXPECT_NE(xml_error("<svg/><svg/>"), "");
  EXPECT_NE(xml_error("<svg>\xff</svg>"), "");
}

TEST(SvgPlot, LatencyOneCirclePerFiniteSample) {
  std::vector<PlotSeries> series = {{"full", {}}, {"pin", {}}, {"snapshot", {}}};
  for (int i = 0; i < 20; ++i) {
    series[0].values_ms.push_back(100 + i);
    series[1].values_ms.push_back(40 + 0.5 * i);
    series[2].values_ms.push_back(45 + 0.25 * i);
  }
  series[1].values_ms.push_back(kNaN);
  series[2].values_ms.push_back(kInf);
  series[2].values_ms.push_back(-kInf);
  const std::string svg = svg_latency_plot("pinned: request latency", series);
  expect_sane(svg);
  EXPECT_EQ(count(svg, "<circle"), 60u);
  EXPECT_EQ(count(svg, "<polygon"), 3u);  // one max marker per series
  EXPECT_NE(svg.find(">full</text>"), std::string::npos);
  EXPECT_NE(svg.find(">snapshot</text>"), std::string::npos);
  EXPECT_NE(svg.find("n=20 (2 skipped)"), std::string::npos);
  EXPECT_NE(svg.find("latency (ms)"), std::string::npos);
}

TEST(SvgPlot, LatencyNiceTicks) {
  // 0..10 ms: ticks every 2 ms from 0.
  const std::string svg = svg_latency_plot("t", {{"a", {0, 2.5, 5, 7.5, 10}}});
  expect_sane(svg);
  for (const char *t :
       {">0</text>", ">2</text>", ">4</text>", ">6</text>", ">8</text>", ">10</text>"})
    EXPECT_NE(svg.find(t), std::string::npos) << t;
  EXPECT_EQ(svg.find(">12</text>"), std::string::npos);
  // 0.1..0.35 ms: decimals follow the step.
  const std::string small = svg_latency_plot("t", {{"a", {0.1, 0.2, 0.35}}});
  expect_sane(small);
  EXPECT_NE(small.find(">0.05</text>"), std::string::npos);
}

TEST(SvgPlot, EscapesTitleAndNames) {
  const std::string svg =
      svg_latency_plot("a <b> & \"c\" 'd'", {{"<&>", {1, 2, 3}}, {"x\x01y\xff", {4}}});
  expect_sane(svg);
  EXPECT_NE(svg.find("a &lt;b&gt; &amp; &quot;c&quot; &apos;d&apos;"), std::string::npos);
  EXPECT_NE(svg.find("&lt;&amp;&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("<&>"), std::string::npos);
  EXPECT_NE(svg.find("x\xEF\xBF\xBDy\xEF\xBF\xBD"), std::string::npos);  // U+FFFD twice
  const std::string rows = svg_rows_plot("rows <&>", {1}, {1.0}, {false});
  expect_sane(rows);
  EXPECT_NE(rows.find("rows &lt;&amp;&gt;"), std::string::npos);
}

TEST(SvgPlot, LongNamesAreCut) {
  const std::string name(60, 'm');
  const std::string svg =
      svg_latency_plot("t", {{name, {1}}, {"\xC3\xA9" + std::string(33, 'e'), {2}}});
  expect_sane(svg);
  EXPECT_NE(svg.find(">" + name.substr(0, 33) + "\xE2\x80\xA6</text>"), std::string::npos);
  // 34 characters (the first one two bytes long) fit as they are.
  EXPECT_NE(svg.find(">\xC3\xA9" + std::string(33, 'e') + "</text>"), std::string::npos);
}

TEST(SvgPlot, LatencyDegenerateInputs) {
  const std::string none = svg_latency_plot("", {});
  expect_sane(none);
  EXPECT_EQ(count(none, "<circle"), 0u);
  EXPECT_NE(none.find("no data"), std::string::npos);

  const std::string empty = svg_latency_plot("e", {{"a", {}}, {"b", {kNaN, kInf}}});
  expect_sane(empty);
  EXPECT_EQ(count(empty, "<circle"), 0u);
  EXPECT_EQ(count(empty, "no finite samples"), 2u);

  for (const std::vector<double> &v : std::vector<std::vector<double>>{
           {0},
           {0, 0, 0},
           {5},
           {-3, -1},
           {-1e308, 1e308, 0},
           {std::numeric_limits<double>::max(), std::numeric_limits<double>::lowest()},
           {1e-300, 1e300},
           {std::numeric_limits<double>::denorm_min(),
            2 * std::numeric_limits<double>::denorm_min()},
           {1e-3, 1, 1e3, 1e6},
           {1e15, 1e15 + 1}}) {
    const std::string svg = svg_latency_plot("d", {{"a", v}, {"b", {kNaN}}});
    SCOPED_TRACE(v.size() ? v.back() : 0);
    expect_sane(svg);
    EXPECT_EQ(count(svg, "<circle"), v.size());
  }
  // Positive values over many decades switch to a log axis.
  const std::string log = svg_latency_plot("log", {{"a", {0.01, 0.1, 1, 10, 100, 1000}}});
  expect_sane(log);
  EXPECT_NE(log.find("log scale"), std::string::npos);
}

TEST(SvgPlot, LatencyManySeriesAndSamples) {
  std::vector<PlotSeries> series;
  size_t total = 0;
  for (int k = 0; k < 12; ++k) {
    PlotSeries s{"mode " + std::to_string(k), {}};
    for (int i = 0; i < 500; ++i) s.values_ms.push_back(1 + k + std::sin(i) * 0.5);
    total += s.values_ms.size();
    series.push_back(s);
  }
  const std::string svg = svg_latency_plot("many", series);
  expect_sane(svg);
  EXPECT_EQ(count(svg, "<circle"), total);
}

TEST(SvgPlot, RowsFlaggedPoints) {
  std::vector<int> n;
  std::vector<double> ms;
  std::vector<bool> flag;
  for (int i = 1; i <= 64; ++i) {
    n.push_back(i);
    ms.push_back(0.5 + 2.0 / i + (i % 16 == 3 ? 0.3 : 0));
    flag.push_back(i % 16 == 3);
  }
  const std::string svg = svg_rows_plot("rows sweep", n, ms, flag);
  expect_sane(svg);
  EXPECT_EQ(count(svg, "<circle"), 64u);
  EXPECT_EQ(count(svg, "class=\"flag\""), 4u);
  EXPECT_EQ(count(svg, "<polyline"), 1u);
  EXPECT_NE(svg.find(">19</text>"), std::string::npos);  // a flagged point's label
  EXPECT_NE(svg.find("ms per row"), std::string::npos);
  EXPECT_NE(svg.find("rows per call (n)"), std::string::npos);
}

TEST(SvgPlot, RowsDegenerateInputs) {
  const std::string empty = svg_rows_plot("", {}, {}, {});
  expect_sane(empty);
  EXPECT_EQ(count(empty, "<circle"), 0u);
  EXPECT_NE(empty.find("no data"), std::string::npos);

  // Non-finite points are skipped (flagged or not); lengths differ; flagged is short.
  const std::string mixed =
      svg_rows_plot("m", {4, 1, 2, 3, 5, 6}, {1.0, kNaN, 2.0, kInf, 0.0}, {true, true, false});
  expect_sane(mixed);
  EXPECT_EQ(count(mixed, "<circle"), 3u);
  EXPECT_EQ(count(mixed, "class=\"flag\""), 1u);

  const std::string one = svg_rows_plot("one", {7}, {0.25}, {true});
  expect_sane(one);
  EXPECT_EQ(count(one, "<circle"), 1u);
  EXPECT_EQ(count(one, "<polyline"), 0u);

  const std::string huge = svg_rows_plot(
      "huge", {1, 2, 3, 1 << 30}, {1e-300, 1e300, std::numeric_limits<double>::max(), 0}, {});
  expect_sane(huge);
  EXPECT_EQ(count(huge, "<circle"), 4u);
  EXPECT_EQ(count(huge, "class=\"flag\""), 0u);
}

}  // namespace
}  // namespace geist::cli
