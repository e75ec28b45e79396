// gradwire-trace svg: a job's timeline as a standalone SVG. One row per worker and thread
// (nested spans stacked in lanes), spans as rectangles colored by category with their
// names where they fit, rpc flows as arrows from the call to its serving, a time axis.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "trace_report.h"

namespace gradwire::tools::trace {

namespace {

constexpr double kWidth = 1400;
constexpr double kLabel = 230;  // the row labels' column
constexpr double kPlot = kWidth - kLabel - 20;
constexpr double kLane = 16;
constexpr double kTop = 50;
constexpr double kCharWidth = 6.2;  // of the 10px sans-serif labels, roughly

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        // Control characters are not allowed in XML 1.0.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t') out += c;
    }
  }
  return out;
}

std::string color_of(const std::string& category) {
  static const std::map<std::string, std::string> known = {
      {"train", "#4e79a7"},         {"rpc", "#f28e2b"},     {"c10d", "#59a14f"},
      {"dist_autograd", "#e15759"}, {"rref", "#76b7b2"},    {"ddp", "#edc948"},
      {"dist_optim", "#b07aa1"},    {"autograd", "#ff9da7"}};
  static const char* const others[] = {"#9c755f", "#bab0ac", "#8cd17d", "#86bcb6", "#d4a6c8"};
  auto it = known.find(category);
  if (it != known.end()) return it->second;
  size_t h = 0;
  for (char c : category)
    h = h * 31 + static_cast<unsigned char>(c);
  return others[h % (sizeof(others) / sizeof(others[0]))];
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

std::string duration(int64_t ns) {
  char buf[32];
  if (ns >= 1'000'000) {
    std::snprintf(buf, sizeof(buf), "%.3f ms", static_cast<double>(ns) / 1e6);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f us", static_cast<double>(ns) / 1e3);
  }
  return buf;
}

// A tick step of 1, 2 or 5 times a power of ten giving about `want` ticks over `span`.
int64_t tick_step(int64_t span, int want) {
  const double raw = static_cast<double>(std::max<int64_t>(span, 1)) / want;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * power >= raw) return std::max<int64_t>(1, static_cast<int64_t>(m * power));
  }
  return static_cast<int64_t>(10 * power);
}

struct Row {
  size_t worker;
  int64_t tid;
  int lanes{1};
  double y{0};
  std::vector<std::pair<size_t, int>> events;  // event index, lane
};

// The span of time drawn, [t0, t1], and where a time falls on the plot.
struct Window {
  int64_t t0 = 0;
  int64_t t1 = 1;
  double scale = 1;
  double x(int64_t t) const { return kLabel + static_cast<double>(t - t0) * scale; }
};

// The rows with something in the window, and where each drawn event went.
struct Layout {
  std::vector<Row> rows;
  std::map<std::pair<size_t, size_t>, std::pair<size_t, int>> placed;  // (worker, event) ->
                                                                       // row, lane
  double bottom = kTop;                                                // below the last row
};

// The whole job, or step `only_step`'s spans (of `step_worker`, or of every worker) padded
// by a fiftieth on each side.
Window window_of(const Job& job, std::optional<int64_t> only_step, const std::string& step_worker) {
  int64_t t0 = std::numeric_limits<int64_t>::max();
  int64_t t1 = std::numeric_limits<int64_t>::min();
  for (const Worker& w : job.workers) {
    if (only_step && !step_worker.empty() && w.name != step_worker) continue;
    for (const Event& e : w.events) {
      if (only_step && !(e.phase == 'X' && e.name == "step" && e.category == "train" &&
                         e.int_arg("step") == only_step)) {
        continue;
      }
      t0 = std::min(t0, e.ts_ns);
      t1 = std::max(t1, e.ts_ns + e.dur_ns);
    }
  }
  if (t0 > t1) {
    if (only_step) {
      throw TraceInputError(
          (step_worker.empty() ? std::string("no worker") : "worker '" + step_worker + "'") +
          " has no step span (name \"step\", category \"train\") with step " +
          std::to_string(*only_step));
    }
    t0 = 0;
    t1 = 1;
  }
  if (only_step) {
    const int64_t pad = (t1 - t0) / 50;
    t0 -= pad;
    t1 += pad;
  }
  t1 = std::max(t1, t0 + 1);
  return Window{t0, t1, kPlot / static_cast<double>(t1 - t0)};
}

// Rows: each worker's threads with something in the window, nested spans in lanes.
Layout lay_out(const Job& job, const Window& win) {
  Layout layout;
  double y = kTop;
  for (size_t wi = 0; wi < job.workers.size(); ++wi) {
    const Worker& w = job.workers[wi];
    std::map<int64_t, std::vector<size_t>> by_thread;
    for (size_t i = 0; i < w.events.size(); ++i) {
      const Event& e = w.events[i];
      if (e.ts_ns + e.dur_ns < win.t0 || e.ts_ns > win.t1) continue;
      by_thread[e.tid].push_back(i);
    }
    for (auto& [tid, indices] : by_thread) {
      std::sort(indices.begin(), indices.end(), [&](size_t a, size_t b) {
        const Event& x = w.events[a];
        const Event& z = w.events[b];
        return x.ts_ns != z.ts_ns ? x.ts_ns < z.ts_ns : x.dur_ns > z.dur_ns;
      });
      Row row{wi, tid, 1, 0, {}};
      std::vector<int64_t> open;  // ends of the enclosing spans
      for (size_t i : indices) {
        const Event& e = w.events[i];
        while (!open.empty() && open.back() <= e.ts_ns)
          open.pop_back();
        const int lane = static_cast<int>(open.size());
        row.lanes = std::max(row.lanes, lane + 1);
        row.events.emplace_back(i, lane);
        if (e.phase == 'X') open.push_back(e.ts_ns + e.dur_ns);
      }
      row.y = y;
      y += row.lanes * kLane + 6;
      for (const auto& [i, lane] : row.events)
        layout.placed[{wi, i}] = {layout.rows.size(), lane};
      layout.rows.push_back(std::move(row));
    }
    y += 6;
  }
  layout.bottom = y;
  return layout;
}

void draw_header(std::ostringstream& svg, const Job& job, std::optional<int64_t> only_step,
                 const std::string& step_worker, const Window& win, double height) {
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\""
      << number(height) << "\" viewBox=\"0 0 " << kWidth << " " << number(height)
      << "\" font-family=\"sans-serif\" font-size=\"10\">\n";
  svg << "<defs><marker id=\"arrow\" viewBox=\"0 0 6 6\" refX=\"6\" refY=\"3\" "
         "markerWidth=\"6\" markerHeight=\"6\" orient=\"auto\"><path d=\"M0,0 L6,3 L0,6 z\" "
         "fill=\"#333\"/></marker></defs>\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg << "<text x=\"10\" y=\"20\" font-size=\"14\">gradwire trace: "
      << (only_step ? "step " + std::to_string(*only_step) : std::string("whole job"))
      << (only_step && !step_worker.empty() ? " of " + escape(step_worker) : std::string()) << ", "
      << job.workers.size() << " workers, " << escape(duration(win.t1 - win.t0)) << "</text>\n";
}

// Time axis and grid.
void draw_axis(std::ostringstream& svg, const Window& win, double axis_y) {
  const int64_t step = tick_step(win.t1 - win.t0, 10);
  for (int64_t t = win.t0; t <= win.t1; t += step) {
    const double x = win.x(t);
    svg << "<line x1=\"" << number(x) << "\" y1=\"" << kTop - 8 << "\" x2=\"" << number(x)
        << "\" y2=\"" << number(axis_y) << "\" stroke=\"#eee\"/>\n";
    svg << "<text x=\"" << number(x) << "\" y=\"" << number(axis_y + 14)
        << "\" text-anchor=\"middle\">" << escape(duration(t - win.t0)) << "</text>\n";
  }
  svg << "<line x1=\"" << kLabel << "\" y1=\"" << number(axis_y) << "\" x2=\"" << kLabel + kPlot
      << "\" y2=\"" << number(axis_y) << "\" stroke=\"#333\"/>\n";
}

// One event of a row: an instant as a diamond, a span as a rectangle named where it fits.
void draw_event(std::ostringstream& svg, const Event& e, double ly, const Window& win) {
  const std::string tip = e.name + " (" + e.category + ") " + duration(e.dur_ns) + " " +
                          (e.args.empty() ? std::string() : e.args.dump());
  if (e.phase == 'i') {
    const double x = win.x(e.ts_ns);
    svg << "<path d=\"M" << number(x) << "," << number(ly + 2) << " l4,6 l-4,6 l-4,-6 z\" "
        << "fill=\"" << color_of(e.category) << "\"><title>" << escape(tip) << "</title></path>\n";
    return;
  }
  const double x = win.x(std::max(e.ts_ns, win.t0));
  const double x2 = win.x(std::min(e.ts_ns + e.dur_ns, win.t1));
  const double width = std::max(0.5, x2 - x);
  svg << "<rect x=\"" << number(x) << "\" y=\"" << number(ly + 1) << "\" width=\"" << number(width)
      << "\" height=\"" << kLane - 2 << "\" fill=\"" << color_of(e.category)
      << "\" stroke=\"white\" stroke-width=\"0.3\"><title>" << escape(tip) << "</title></rect>\n";
  if (width > kCharWidth * static_cast<double>(e.name.size()) + 4) {
    svg << "<text x=\"" << number(x + 2) << "\" y=\"" << number(ly + 11) << "\" fill=\"white\">"
        << escape(e.name) << "</text>\n";
  }
}

// The rows, labelled; returns the categories drawn.
std::set<std::string> draw_rows(std::ostringstream& svg, const Job& job, const Layout& layout,
                                const Window& win) {
  std::set<std::string> categories;
  for (const Row& row : layout.rows) {
    const Worker& w = job.workers[row.worker];
    auto thread = w.threads.find(row.tid);
    const std::string label =
        w.name + " / " + (thread != w.threads.end() ? thread->second : std::to_string(row.tid));
    svg << "<text x=\"8\" y=\"" << number(row.y + 11) << "\">" << escape(label) << "</text>\n";
    svg << "<line x1=\"" << kLabel << "\" y1=\"" << number(row.y + row.lanes * kLane + 3)
        << "\" x2=\"" << kLabel + kPlot << "\" y2=\"" << number(row.y + row.lanes * kLane + 3)
        << "\" stroke=\"#ddd\"/>\n";
    for (const auto& [i, lane] : row.events) {
      const Event& e = w.events[i];
      categories.insert(e.category);
      draw_event(svg, e, row.y + lane * kLane, win);
    }
  }
  return categories;
}

// Flows: from the call's start to the serving's start.
void draw_flows(std::ostringstream& svg, const Job& job, const Layout& layout, const Window& win) {
  for (const Flow& f : job.flows) {
    auto from = layout.placed.find({f.caller, f.call});
    auto to = layout.placed.find({f.callee, f.serve});
    if (from == layout.placed.end() || to == layout.placed.end()) continue;
    const Event& call = job.workers[f.caller].events[f.call];
    const Event& serve = job.workers[f.callee].events[f.serve];
    if (call.ts_ns < win.t0 || serve.ts_ns < win.t0 || call.ts_ns > win.t1 ||
        serve.ts_ns > win.t1) {
      continue;
    }
    const double y1 = layout.rows[from->second.first].y + from->second.second * kLane + kLane / 2;
    const double y2 = layout.rows[to->second.first].y + to->second.second * kLane + kLane / 2;
    svg << "<line x1=\"" << number(win.x(call.ts_ns)) << "\" y1=\"" << number(y1) << "\" x2=\""
        << number(win.x(serve.ts_ns)) << "\" y2=\"" << number(y2)
        << "\" stroke=\"#333\" stroke-width=\"0.8\" marker-end=\"url(#arrow)\"/>\n";
  }
}

void draw_legend(std::ostringstream& svg, const std::set<std::string>& categories, double axis_y) {
  double lx = kLabel;
  for (const std::string& c : categories) {
    svg << "<rect x=\"" << number(lx) << "\" y=\"" << number(axis_y + 28)
        << "\" width=\"12\" height=\"12\" fill=\"" << color_of(c) << "\"/>";
    svg << "<text x=\"" << number(lx + 16) << "\" y=\"" << number(axis_y + 38) << "\">"
        << escape(c.empty() ? "(none)" : c) << "</text>\n";
    lx += 30 + kCharWidth * static_cast<double>(std::max<size_t>(c.size(), 6));
  }
  svg << "<text x=\"" << number(lx + 10) << "\" y=\"" << number(axis_y + 38)
      << "\">arrows: rpc call to its serving</text>\n";
}

}  // namespace

std::string render_svg(const Job& job, std::optional<int64_t> only_step,
                       const std::string& step_worker) {
  const Window win = window_of(job, only_step, step_worker);
  const Layout layout = lay_out(job, win);
  const double axis_y = layout.bottom + 10;
  const double height = axis_y + 60;
  std::ostringstream svg;
  draw_header(svg, job, only_step, step_worker, win, height);
  draw_axis(svg, win, axis_y);
  const std::set<std::string> categories = draw_rows(svg, job, layout, win);
  draw_flows(svg, job, layout, win);
  draw_legend(svg, categories, axis_y);
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace gradwire::tools::trace
